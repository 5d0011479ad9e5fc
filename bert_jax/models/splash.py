"""Pallas splash attention (TPU), the attention of `model.py`'s attention_impl "splash": packed
examples kept apart by `SegmentIds`, local layers by a `LocalMask`, split over the batch and
heads mesh axes by `jax.shard_map`, one example at a time (`jax.vmap`) inside each shard.

The kernel has no attention dropout: `model._attend` calls it only where none applies. It is
lowered by Mosaic when the devices compiled for are TPUs (`target.target_device`: also a TPU
slice compiled ahead of time from a CPU host), and interpreted elsewhere (`interpret=True`:
slow, for tests and CPU runs of a TPU config).
Shapes: B batch, L sequence length, N heads, D head size.

Padding (segment id 0) gets segment 0 here too, so padding queries attend to padding keys only,
where `model.attention_mask_from_segments` lets them see every real key; real queries see
exactly the same keys either way, and a padding row's output is never read.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernels
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from bert_jax.models.target import target_platform

LANES = 128  # The kernel's blocks span whole TPU lanes: multiples of 128 tokens.
DEFAULT_BLOCK = 512  # A block size of 0: min(512, L).


def block_sizes(length: int, block_q: int, block_kv: int) -> kernels.BlockSizes:
  """The kernel's tiles for L tokens from config.model.splash_block_q / splash_block_kv (0:
  min(512, L)); the backward pass uses the same. A one-line ValueError naming the field when
  a block is not a multiple of 128 that divides L."""
  if length % LANES:
    raise ValueError(f"config.model.attention_impl='splash' (or 'auto' on a TPU) needs "
                     f"config.data.max_seq_length to be a multiple of {LANES}, got {length}; "
                     "or use attention_impl='xla'")
  sizes = {}
  for field, value in (("splash_block_q", block_q), ("splash_block_kv", block_kv)):
    size = value or min(DEFAULT_BLOCK, length)
    if size % LANES or length % size:
      raise ValueError(f"config.model.{field}={value} must be 0 (min({DEFAULT_BLOCK}, L)) or a "
                       f"multiple of {LANES} that divides the sequence length {length}")
    sizes[field] = size
  q, kv = sizes["splash_block_q"], sizes["splash_block_kv"]
  return kernels.BlockSizes(block_q=q, block_kv=kv, block_kv_compute=kv,
                            block_q_dkv=q, block_kv_dkv=kv, block_kv_dkv_compute=kv,
                            block_q_dq=q, block_kv_dq=kv)


def _mesh_spec(axes: tuple[str, str, str, str], shape: tuple[int, ...]) -> PartitionSpec | None:
  """[B, L, N, D]'s split on the current mesh (logical `axes` through the current rules), only
  batch and heads kept (the kernel needs whole rows and head vectors); None without a mesh. A
  dimension that does not divide by its mesh axes (a batch of 1 at prediction) is not split:
  every shard then computes it whole, which is correct, only not divided."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  spec = nn.logical_to_mesh_axes(axes)

  def divisible(entry, size: int):
    names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return entry if size % math.prod(mesh.shape[name] for name in names) == 0 else None
  return PartitionSpec(divisible(spec[0], shape[0]), None, divisible(spec[2], shape[2]), None)


def splash_attention(query, key, value, segment_ids, *, half_window: int = 0,
                     block_q: int = 0, block_kv: int = 0,
                     axes: tuple[str, str, str, str] = ("batch", "length", "heads", "kv"),
                     interpret: bool | None = None):
  """query/key/value [B, L, N, D] (compute dtype), segment_ids [B, L] int32 (1..K per packed
  example, 0 padding) -> context [B, L, N, D] in query's dtype: softmax(q k / sqrt(D)) v over
  the keys of the query's segment, with `half_window` > 0 only those at most that many rows
  away. Scores and softmax in float32 inside the kernel. `axes`: the logical names of
  query's dimensions (the mesh split); `interpret`: None = unless compiling for a TPU."""
  length, dim = query.shape[1], query.shape[3]
  sizes = block_sizes(length, block_q, block_kv)
  if interpret is None:
    interpret = target_platform() != "tpu"

  def per_shard(query, key, value, segment_ids):  # [b, L, n, D] x 3, [b, L] -> [b, L, n, D]
    window = (masks.LocalMask((length, length), (half_window, half_window), 0) if half_window
              else masks.FullMask((length, length)))
    kernel = kernels.make_splash_mha(masks.MultiHeadMask((window,) * query.shape[2]),
                                     block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                     interpret=interpret)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [b, L, n, D] <-> [b, n, L, D]
    # The kernel does not scale: q / sqrt(D) first (exact in any dtype when D is 4^k: 16, 64).
    scaled = query * jnp.asarray(1.0 / math.sqrt(dim), query.dtype)
    one_example = lambda q, k, v, ids: kernel(q, k, v, segment_ids=kernels.SegmentIds(ids, ids))
    context = jax.vmap(one_example)(heads_first(scaled), heads_first(key), heads_first(value),
                                    segment_ids.astype(jnp.int32))  # [b, n, L, D]
    return heads_first(context)

  spec = _mesh_spec(axes, query.shape)
  if spec is None:
    return per_shard(query, key, value, segment_ids)
  return jax.shard_map(per_shard, in_specs=(spec, spec, spec, PartitionSpec(spec[0], None)),
                       out_specs=spec, check_vma=False)(query, key, value, segment_ids)
