"""Pallas splash attention (`bert_jax/models/splash.py`, interpreted on CPU) against the einsum paths:
forward and gradients for padded, packed and local-window masks, packed rows against their
examples alone, under the mesh; "auto"'s choice per device; block sizes refused in one line;
lowering for a TPU without one (tests/test_tpu_compile.py compiles it for one)."""

import dataclasses
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_checks
from bert_jax.models import model, splash
from bert_jax.training import sharding
from bert_jax.models.model import (BertConfig, BertModel, attention_mask_from_segments,
                            einsum_attention, local_attention)
from configs import base

HEADS, DIM = 2, 8  # Tiny: the interpreted kernel runs every block in Python-level loops.
HALF_WINDOW = 16  # ModernBERT's window is 128 wide (64 each way); scaled down with L.


def _segments(kind: str, length: int) -> np.ndarray:
  """[2, L] segment ids: "padded" (one example + padding, one full row) or "packed" / "local"
  (three examples + padding, two examples)."""
  quarter = length // 4
  if kind == "padded":
    first = [1] * (3 * quarter + 5) + [0] * (quarter - 5)
    second = [1] * length
  else:
    first = [1] * (quarter - 3) + [2] * (quarter + 7) + [3] * (quarter + 1)
    first += [0] * (length - len(first))
    second = [1] * (2 * quarter + 9) + [2] * (2 * quarter - 9)
  return np.array([first, second], np.int32)


def _reference(query, key, value, segment_ids, half_window: int):
  """The einsum forms the model takes with attention dropout (and "xla" / local layers)."""
  if half_window:
    return local_attention(query, key, value, segment_ids, half_window)
  return einsum_attention(query, key, value, attention_mask_from_segments(segment_ids))


def _loss_and_grads(attend, weights):
  """(context, d/dq,k,v of sum(weights * context)) of attend(q, k, v) -> [B, L, N, D]."""
  def loss(query, key, value):
    context = attend(query, key, value)
    return jnp.sum(weights * context), context
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("kind,length,block", [
    ("padded", 128, 0), ("packed", 128, 0), ("local", 128, 0),
    ("padded", 512, 0), ("packed", 512, 256), ("local", 512, 128)])
def test_splash_equals_the_einsum_path_forward_and_gradients(kind, length, block):
  rng = np.random.default_rng(length)
  segment_ids = jnp.asarray(_segments(kind, length))
  query, key, value = (jnp.asarray(rng.normal(size=(2, length, HEADS, DIM)), jnp.float32)
                       for _ in range(3))
  # Only real positions are read (a padding row's output differs: splash.py's docstring).
  real = (segment_ids > 0)[:, :, None, None]
  weights = jnp.asarray(rng.normal(size=query.shape), jnp.float32) * real
  half = HALF_WINDOW if kind == "local" else 0
  fused = _loss_and_grads(lambda q, k, v: splash.splash_attention(
      q, k, v, segment_ids, half_window=half, block_q=block, block_kv=block), weights)(
          query, key, value)
  explicit = _loss_and_grads(lambda q, k, v: _reference(q, k, v, segment_ids, half), weights)(
      query, key, value)
  (_, fused_context), fused_grads = fused
  (_, explicit_context), explicit_grads = explicit
  error = float(jnp.max(jnp.abs(jnp.where(real, fused_context - explicit_context, 0.0))))
  assert error <= 1e-5, error
  for name, got, want in zip("qkv", fused_grads, explicit_grads):
    error = float(jnp.max(jnp.abs(got - want)))
    assert error <= 1e-5, (name, error)


def _tiny_config(**overrides) -> BertConfig:
  """Two layers, global then local (window 32), no dropout: splash in both layer kinds."""
  values = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=HEADS,
                intermediate_size=32, max_position_embeddings=128, local_attention=32,
                global_attn_every_n_layers=2, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, attention_impl="splash")
  return BertConfig(**{**values, **overrides})


def test_a_packed_row_equals_each_example_alone_and_the_xla_model():
  """Row 0 packs three examples (40, 50, 30 tokens, then padding); rows 1-3 hold each alone."""
  length, sizes = 128, (40, 50, 30)
  rng = np.random.default_rng(0)
  ids, segments, positions = (np.zeros((4, length), np.int32) for _ in range(3))
  start = 0
  for k, size in enumerate(sizes):
    example = rng.integers(1, 50, size)
    ids[0, start:start + size], ids[k + 1, :size] = example, example
    segments[0, start:start + size], segments[k + 1, :size] = k + 1, 1
    positions[0, start:start + size] = positions[k + 1, :size] = np.arange(size)
    start += size
  config = _tiny_config()
  shapes = jax.eval_shape(BertModel(config, add_pooling_layer=False).init, jax.random.key(0),
                          ids, None, segments)
  params = jax.tree.map(lambda x: (0.3 * rng.normal(size=x.shape)).astype(x.dtype),
                        nn.meta.unbox(shapes["params"]))

  def run(model_config):
    module = BertModel(model_config, add_pooling_layer=False)
    return np.asarray(jax.jit(lambda p: module.apply(
        {"params": p}, ids, None, segments, position_ids=positions)[0])(params))  # [4, L, H]

  fused, xla = run(config), run(dataclasses.replace(config, attention_impl="xla"))
  real = segments > 0
  assert np.abs(fused - xla)[real].max() <= 1e-5
  start = 0
  for k, size in enumerate(sizes):
    assert np.abs(fused[0, start:start + size] - fused[k + 1, :size]).max() <= 1e-5, k
    start += size


def test_splash_under_the_mesh_splits_batch_and_heads():
  """data 2 x fsdp 2 x tensor 2: each device runs its 1 row x 1 head."""
  config = base.get_config()
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:8])
  rules = sharding.logical_rules(config.mesh)
  segment_ids = jnp.asarray(np.concatenate([_segments("packed", 128)] * 2))  # [4, 128]
  rng = np.random.default_rng(1)
  query, key, value = (jnp.asarray(rng.normal(size=(4, 128, HEADS, DIM)), jnp.float32)
                       for _ in range(3))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    attend = jax.jit(lambda q, k, v, s: splash.splash_attention(q, k, v, s))
    text = attend.trace(query, key, value, segment_ids).lower().as_text()
    context = attend(query, key, value, segment_ids)
  assert '[{"data", "fsdp"}, {}, {"tensor"}, {}]' in text  # q, k, v and context per shard.
  want = _reference(query, key, value, segment_ids, 0)
  real = (segment_ids > 0)[:, :, None, None]
  assert float(jnp.max(jnp.abs(jnp.where(real, context - want, 0.0)))) <= 1e-5


def test_auto_is_splash_on_tpu_cudnn_on_nvidia_bfloat16_and_xla_elsewhere():
  device = lambda platform, kind: types.SimpleNamespace(platform=platform, device_kind=kind)
  auto = BertConfig()
  assert auto.attention_impl == "auto" == base.get_config().model.attention_impl
  assert model.resolve_attention_impl(auto) == "xla"  # This CPU: exact BERT's path unchanged.
  assert model.resolve_attention_impl(auto, device("tpu", "TPU v5 lite")) == "splash"
  # Rows the kernel's 128 lanes do not tile (a short fine-tuning length) take "xla" instead.
  assert model.resolve_attention_impl(auto, device("tpu", "TPU v5 lite"), length=384) == "splash"
  assert model.resolve_attention_impl(auto, device("tpu", "TPU v5 lite"), length=100) == "xla"
  bf16 = BertConfig(dtype="bfloat16")
  assert model.resolve_attention_impl(bf16, device("gpu", "NVIDIA H100 80GB HBM3")) == "cudnn"
  assert model.resolve_attention_impl(auto, device("gpu", "NVIDIA H100 80GB HBM3")) == "xla"
  assert model.resolve_attention_impl(bf16, device("gpu", "AMD Instinct MI300X")) == "xla"
  for impl in ("xla", "cudnn", "splash", "einsum"):  # An explicit choice stays.
    assert model.resolve_attention_impl(BertConfig(attention_impl=impl),
                                        device("tpu", "TPU v4")) == impl
  assert model.attention_note(auto) == (
      "Attention: 'xla' (attention_impl='auto') where no attention dropout applies; training "
      "with attention dropout 0.1 takes 'einsum'")


def test_a_bad_block_size_fails_in_one_line_naming_the_field():
  cases = [((128, 256, 0), "config.model.splash_block_q=256 must be 0"),
           ((512, 0, 384), "config.model.splash_block_kv=384 must be 0"),
           ((100, 0, 0), "needs config.data.max_seq_length to be a multiple of 128, got 100")]
  for args, message in cases:
    with pytest.raises(ValueError, match=message) as error:
      splash.block_sizes(*args)
    assert "\n" not in str(error.value)
  query = jnp.zeros((1, 128, HEADS, DIM), jnp.float32)
  with pytest.raises(ValueError, match="config.model.splash_block_kv=512"):
    splash.splash_attention(query, query, query, jnp.ones((1, 128), jnp.int32), block_kv=512)
  config = base.get_config()
  config.model.splash_block_kv = 100
  with pytest.raises(ValueError, match=r"^config.model.splash_block_kv=100 must be 0"):
    config_checks.check_pretraining(config)
  config.model.splash_block_kv, config.model.attention_impl = 256, "splash"
  with pytest.raises(ValueError, match=r"^config.model.splash_block_kv=256 must be 0 .* "
                                       r"divides the sequence length 128$"):
    config_checks.check_pretraining(config)


def test_splash_lowers_to_three_mosaic_kernels_for_a_tpu():
  """The kernel (interpret=False) lowers to Mosaic TPU custom calls, forward and backward, on
  a host without a TPU; tests/test_tpu_compile.py compiles them with the TPU compiler."""
  spec = jax.ShapeDtypeStruct((2, 256, HEADS, 64), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)
  attend = lambda q, k, v, s: splash.splash_attention(q, k, v, s, half_window=64,
                                                      block_q=128, interpret=False)
  loss = lambda q, k, v, s: jnp.sum(attend(q, k, v, s).astype(jnp.float32))
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(spec, spec, spec, ids).lower(
      lowering_platforms=("tpu",))
  assert lowered.as_text().count("tpu_custom_call") == 3  # Forward, dq and dkv kernels.
