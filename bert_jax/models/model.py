"""BERT (Devlin et al., 2018) in pure flax.linen: encoder, pooler, MLM and NSP heads, built from
small blocks that config fields choose.

Read top to bottom: config -> block registries -> embeddings -> attention -> MLP -> layer (norm
placement) -> encoder (the layers in one `jax.lax.scan`) -> BertModel -> pretraining heads.
Shapes: B batch, L sequence length, H hidden size, N heads, D head size, F intermediate size,
P predictions per sequence, V vocabulary size, V' the padded vocabulary
(`BertConfig.padded_vocab_size`), S layers.

Variants: the position encoding (`position_embedding`), the MLP (`mlp`) and where the norms sit
(`norm_placement`) are looked up by name in `POSITION_BLOCKS`, `MLP_BLOCKS` and
`NORM_PLACEMENTS`; a new block is one class here plus its name, and a config that names it.
Exact BERT is the default ("learned", "dense", "post", biases everywhere, every layer global).
The modern encoder (ModernBERT: `configs/modern_*.py`) is "rotary" (θ per layer kind), "glu"
(GeGLU), "pre" (pre-LN with a final norm, none before layer 0's attention), no biases but the
decoder's, and local attention (`local_attention` tokens wide) with a global layer every
`global_attn_every_n_layers`; field names follow HF's ModernBertConfig where it has them.
Initialisation: one table of the σ per parameter kind (`INIT_STDS`), BERT's (0.02 everywhere)
or HF ModernBERT's (`initializer`; "auto" picks ModernBERT's for its architecture).
The encoder runs its S layers in one `jax.lax.scan` over repeats of the layer pattern (one layer
for BERT; one global and n - 1 local ones for ModernBERT), so compile time does not grow with
depth and each layer's kind is static, with a remat policy (`remat`); their params are stacked,
[S, ...] under `bert/encoder/layers`.

Packed rows: several [CLS] A [SEP] B [SEP] examples share a row; `segment_ids` keep attention
inside each example, `position_ids` restart at 0 in each, and the pooler and NSP head read each
example's [CLS] at `cls_positions`. An unpacked batch is the one-example case (segment ids = the
attention mask, positions 0..L-1, [CLS] at 0).

Vocabulary padding: the word-embedding table (and the tied MLM decoder) and the MLM bias hold
V' >= V rows, V rounded up to `vocab_pad_multiple`, so that the vocabulary splits over a tensor
axis of 4 or 8; padded rows are never looked up and never predicted (logits are cut to V).
Weights enter and leave that layout in `bert_jax/weights/layout.py`.

Every parameter carries logical axis names (the constants below); `bert_jax/training/sharding.py`
maps them onto the mesh with `config.mesh.logical_axis_rules`. Whatever the compute `dtype`: softmax
and norm statistics run in float32, and the MLM and NSP logits come out of their matmuls in
float32, so the losses never see bf16-rounded logits.
"""

import dataclasses
import functools
import math
import types
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import splash
from bert_jax.models.target import target_device

# Logical axis names of parameters and activations.
BATCH = "batch"
LENGTH = "length"
EMBED = "embed"
VOCAB = "vocab"
MLP = "mlp"
HEADS = "heads"
KV = "kv"
LAYERS = "layers"  # The stacked (scanned) layer dimension of the encoder's params.
# What a mesh error says of each parameter axis: (what it is, the config fields it comes from).
# The axes and their sizes are read from the params themselves (`sharding.sharded_dims`).
AXIS_SOURCES = {
    HEADS: ("the attention heads are",
            lambda c: f"config.model.num_attention_heads={c.num_attention_heads}"),
    MLP: ("the MLP width is", lambda c: f"config.model.intermediate_size={c.intermediate_size}"),
    VOCAB: ("the vocabulary is",
            lambda c: f"config.model.vocab_size={c.vocab_size} padded to a multiple of "
                      f"config.model.vocab_pad_multiple={c.vocab_pad_multiple} "
                      f"({c.padded_vocab_size} rows)"),
    EMBED: ("the hidden width is", lambda c: f"config.model.hidden_size={c.hidden_size}"),
    KV: ("the head size is",
         lambda c: f"config.model.hidden_size / num_attention_heads = {c.head_dim}"),
    LAYERS: ("the layers are", lambda c: f"config.model.num_hidden_layers={c.num_hidden_layers}"),
}

Dtype = Any
# Compute and parameter dtypes, by name. float16 is left out: it would need loss scaling.
DTYPES = ("float32", "bfloat16")
# What a field is: "shape" and "architecture" fields are the weights' own (a checkpoint and the
# model that loads it agree on them); "run" fields are the run's choice (dtypes, dropout,
# kernels, padding), so a fine-tuning run may set them for a pretrained encoder.
SHAPE, ARCHITECTURE, RUN = "shape", "architecture", "run"


def _field(default, role: str, **kwargs):
  return dataclasses.field(default=default, metadata={"role": role}, **kwargs)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Model hyper-parameters, with HuggingFace's field names plus compute/param dtypes."""
  vocab_size: int = _field(30522, SHAPE)
  hidden_size: int = _field(768, SHAPE)
  num_hidden_layers: int = _field(12, SHAPE)
  num_attention_heads: int = _field(12, SHAPE)
  intermediate_size: int = _field(3072, SHAPE)
  max_position_embeddings: int = _field(512, SHAPE)
  type_vocab_size: int = _field(2, SHAPE)  # 0: no token-type (segment A/B) embeddings.
  # E: the width of the embedding tables, of the MLM head's transform and of the tied decoder
  # (0: hidden_size). E != hidden_size projects the embeddings to hidden_size (ELECTRA's
  # `embeddings_project`; its small models and generators, ALBERT).
  embedding_size: int = _field(0, SHAPE)
  hidden_act: str = _field("gelu", ARCHITECTURE)  # A key of ACTIVATIONS.
  layer_norm_eps: float = _field(1e-12, ARCHITECTURE)
  position_embedding: str = _field("learned", ARCHITECTURE)  # A key of POSITION_BLOCKS.
  mlp: str = _field("dense", ARCHITECTURE)  # A key of MLP_BLOCKS.
  norm_placement: str = _field("post", ARCHITECTURE)  # A key of NORM_PLACEMENTS.
  norm: str = _field("layer_norm", ARCHITECTURE)  # A key of NORMS: every normalisation layer.
  attention_bias: bool = _field(True, ARCHITECTURE)  # Biases of the q/k/v/output projections.
  mlp_bias: bool = _field(True, ARCHITECTURE)  # Biases of the MLP's matmuls.
  norm_bias: bool = _field(True, ARCHITECTURE)  # The shift of every LayerNorm.
  classifier_bias: bool = _field(True, ARCHITECTURE)  # Bias of the MLM head's dense transform.
  global_rope_theta: float = _field(160_000.0, ARCHITECTURE)  # "rotary": θ of global layers.
  local_rope_theta: float = _field(10_000.0, ARCHITECTURE)  # "rotary": θ of local layers.
  # Local attention: a token attends to the tokens at most local_attention / 2 rows away (of its
  # own packed example); 0 = every layer global. Layers 0, n, 2n, ... (n =
  # global_attn_every_n_layers) stay global.
  local_attention: int = _field(0, ARCHITECTURE)
  global_attn_every_n_layers: int = _field(1, ARCHITECTURE)
  hidden_dropout_prob: float = _field(0.1, RUN)
  attention_probs_dropout_prob: float = _field(0.1, RUN)
  initializer_range: float = _field(0.02, RUN)
  dtype: Dtype = _field(jnp.float32, RUN)
  param_dtype: Dtype = _field(jnp.float32, RUN)
  dropout_rng: str = _field("hash", RUN)  # Random bits of dropout masks (see `dropout`).
  # Attention where no attention dropout applies: jax.nn.dot_product_attention's "xla"
  # (anywhere) or "cudnn" (NVIDIA GPUs, fused), Pallas "splash" (TPUs, fused; `splash.py`),
  # "auto" (`resolve_attention_impl`: splash on TPUs where L is a multiple of 128, cudnn on
  # NVIDIA GPUs in bfloat16, else xla) or "einsum" (the explicit scores + softmax path that
  # attention dropout always takes).
  attention_impl: str = _field("auto", RUN)
  splash_block_q: int = _field(0, RUN)  # "splash": query rows per block (0: min(512, L)).
  splash_block_kv: int = _field(0, RUN)  # "splash": key rows per block (0: min(512, L)).
  # The embedding table and MLM bias get vocab_size rounded up to a multiple of this many rows
  # (1 = no padding; the layout of exchange formats and of configs saved before the field
  # existed); configs/base.py sets 128.
  vocab_pad_multiple: int = _field(1, RUN)
  remat: str = _field("none", RUN)  # A key of REMAT_POLICIES: what the backward pass recomputes.
  # Repeats of the layer pattern per iteration of the encoder's scan (jax.lax.scan's `unroll`);
  # at or above the repeats the layers run as straight-line code. The params stay stacked.
  scan_unroll: int = _field(1, RUN)
  # The vector a fine-tuning head (and NSP) reads of each example: its [CLS] ("cls", BERT) or
  # the mean over its tokens ("mean").
  classifier_pooling: str = _field("cls", RUN)
  # The σ of each parameter kind at init (`INIT_STDS`): "bert" (initializer_range everywhere),
  # "modernbert" (HF ModernBERT's table) or "auto" (ModernBERT's for its architecture,
  # `is_modernbert`; BERT's otherwise). Only fresh params see it.
  initializer: str = _field("auto", RUN)

  def __post_init__(self):
    for name, table in choices().items():
      if getattr(self, name) not in table:
        raise ValueError(f"{name}={getattr(self, name)!r} is not supported; use one of "
                         f"{list(table)}")
    problem = relation_problem(self)
    if problem:
      raise ValueError(problem)
    if self.local_attention < 0 or self.local_attention % 2:
      raise ValueError(f"local_attention={self.local_attention} must be 0 (no local layers) or "
                       "an even window width")
    if not isinstance(self.vocab_pad_multiple, int) or self.vocab_pad_multiple < 1:
      raise ValueError(f"vocab_pad_multiple={self.vocab_pad_multiple!r} must be an integer >= 1 "
                       "(1: no padding)")
    for name in ("dtype", "param_dtype"):  # Accept "bfloat16" etc. from configs.
      object.__setattr__(self, name, _parse_dtype(name, getattr(self, name)))

  @property
  def embedding_width(self) -> int:
    """E: `embedding_size`, or hidden_size when it is 0."""
    return self.embedding_size or self.hidden_size

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def is_global_layer(self, layer_index):
    """Whether layer `layer_index` attends globally (the pattern of `layer_pattern`)."""
    if not self.local_attention:
      return True
    return layer_index % self.global_attn_every_n_layers == 0

  @property
  def num_global_layers(self) -> int:
    return sum(bool(self.is_global_layer(i)) for i in range(self.num_hidden_layers))

  @property
  def init_scheme(self) -> str:
    """`initializer` with "auto" decided: "modernbert" or "bert" (a key of `INIT_STDS`)."""
    if self.initializer != "auto":
      return self.initializer
    return "modernbert" if is_modernbert(self) else "bert"

  @property
  def padded_vocab_size(self) -> int:
    """V': rows of the word-embedding table and the MLM bias."""
    return padded_size(self.vocab_size, self.vocab_pad_multiple)

  @classmethod
  def fields_of(cls, *roles: str) -> tuple[str, ...]:
    """Names of the fields with one of `roles` (SHAPE, ARCHITECTURE, RUN)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["role"] in roles)

  @classmethod
  def from_config(cls, model_config) -> "BertConfig":
    """Builds the frozen model config from the `config.model` ConfigDict section."""
    values = dict(model_config)
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f"Unknown config.model fields: {unknown}")
    return cls(**values)


def padded_size(size: int, multiple: int) -> int:
  """`size` rounded up to a multiple of `multiple`."""
  return -(-size // multiple) * multiple


def _parse_dtype(name: str, value) -> jnp.dtype:
  """A `DTYPES` name (or dtype) -> the dtype; anything else is a ValueError naming the field
  (jnp.dtype alone raises TypeError on "fp32" and accepts integer types)."""
  try:
    dtype = jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None or dtype.name not in DTYPES:
    raise ValueError(f"{name}={value!r} is not supported; use one of {list(DTYPES)}")
  return dtype


# ----------------------------------------------------------------------- small functions


def _gelu(x):
  """BERT's exact GELU, x * Phi(x), written with erf as HF/PyTorch do: XLA's erf is one rational
  polynomial, cheaper than the erfc (two branches and an exp) of `nn.gelu(approximate=False)`."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


ACTIVATIONS = {"gelu": _gelu, "gelu_new": lambda x: nn.gelu(x, approximate=True),
               "relu": nn.relu}
DROPOUT_RNGS = ("hash", "threefry")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "einsum")
POOLINGS = ("cls", "mean")
# What a layer's backward pass recomputes instead of keeping from the forward pass: "none"
# keeps everything, "full" recomputes the whole layer, "dots" keeps the matmul outputs of the
# weights (no batch dimension) and recomputes the rest.
REMAT_POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
# Added to the float32 scores of masked keys: finite (a row with no key to attend to gets a
# uniform softmax, not NaN), as jax.nn.dot_product_attention's own mask value.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _fmix32(x):
  """murmur3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def _random_uint16(key, shape: tuple[int, ...], rng: str):
  """Uniform uint16 [*shape], two per 32-bit word when the last dimension is even.

  "threefry": `jax.random.bits`. "hash": each row (leading dimension) draws two 32-bit seeds
  with `jax.random.bits`, then word i of the row is fmix32(fmix32(i ^ seed0) ^ seed1), a keyed
  counter-based hash (a permutation of the 32-bit counters for each row key).
  """
  paired = shape[-1] % 2 == 0
  words_shape = (*shape[:-1], shape[-1] // 2) if paired else shape
  if rng == "threefry":
    words = jax.random.bits(key, words_shape, jnp.uint32)
  else:
    seeds = jax.random.bits(key, (shape[0], 2), jnp.uint32)  # [rows, 2]
    seeds = seeds.reshape(shape[0], *([1] * (len(shape) - 1)), 2)
    counter = jnp.zeros(words_shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(1, len(shape))):  # Row-local flat index of each word.
      counter = counter + jax.lax.broadcasted_iota(jnp.uint32, words_shape, axis) * stride
      stride *= words_shape[axis]
    words = _fmix32(_fmix32(counter ^ seeds[..., 0]) ^ seeds[..., 1])
  if paired:
    return jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(shape)
  return (words >> 16).astype(jnp.uint16)


def dropout(x, rate: float, key, rng: str = "hash"):
  """Inverted dropout: zeroes each element with probability `rate`, scales the kept ones.

  The mask uses 16 random bits per element, so `rate` is rounded to a multiple of 2**-16 (0.1 ->
  0.100006; the scale is 1 / the exact keep probability, so expectations are unchanged). Random
  bits were most of dropout's cost on CPU (threefry: ~20 rounds per 32-bit word; the attention
  mask alone is [B, N, L, L]); "hash" (see `_random_uint16`) is several times cheaper than
  "threefry", and both are pure functions of `key`, so resumed runs draw the same masks.
  """
  if rate <= 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  threshold = min(round(rate * 65536), 65535)
  shape = x.shape if x.ndim > 1 else (1, *x.shape)
  bits = _random_uint16(key, shape, rng).reshape(x.shape)
  scale = 65536 / (65536 - threshold)
  return jnp.where(bits >= threshold, x * scale, jnp.zeros((), x.dtype)).astype(x.dtype)


def _dropout(module: nn.Module, x, rate: float, deterministic: bool):
  """`dropout` with the key from the module's "dropout" RNG stream (a new key per call)."""
  if deterministic or rate <= 0.0:
    return x
  return dropout(x, rate, module.make_rng("dropout"), module.config.dropout_rng)


# ------------------------------------------------------------------------- initialisation
# The σ of every weight's truncated normal by kind, per scheme (`BertConfig.initializer`); r =
# initializer_range, S = num_hidden_layers, H = hidden_size. Values are cut at ±INIT_CUTOFF σ
# (google-research/bert's truncated_normal; HF ModernBERT's initializer_cutoff_factor 2.0).
# Norm scales start at 1, biases at 0. The MLM decoder is the word-embedding table (tied), so
# it has the embeddings' σ in both (HF's own `out` init of the decoder is overwritten by the tie).
#   kind        parameters                                              bert  modernbert
#   embedding   word / position / token-type tables                     r     r
#   in          q, k, v; MLP in (intermediate, wi_0, wi_1); pooler, NSP r     r
#   out         attention output; MLP out (output, wo)                  r     r / sqrt(2 S)
#   transform   MLM head dense; ModernBERT's fine-tuning head dense     r     r / sqrt(2 S)
#   classifier  fine-tuning classifier, qa_outputs                      r     H ** -0.5
INIT_CUTOFF = 2.0
_DEPTH_SCALED = lambda c: c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
INIT_STDS: dict[str, dict[str, Any]] = {
    "bert": dict.fromkeys(("embedding", "in", "out", "transform", "classifier"),
                          lambda c: c.initializer_range),
    "modernbert": {"embedding": lambda c: c.initializer_range,
                   "in": lambda c: c.initializer_range, "out": _DEPTH_SCALED,
                   "transform": _DEPTH_SCALED, "classifier": lambda c: c.hidden_size ** -0.5},
}
INITIALIZERS = ("auto", *INIT_STDS)
# The BertConfig fields that make an encoder HF's ModernBERT (the rest: sizes and options);
# `initializer` "auto" and the fine-tuning heads (`tasks/finetuning.py`) follow them.
MODERNBERT_ARCHITECTURE = {"position_embedding": "rotary", "mlp": "glu", "norm_placement": "pre",
                           "norm": "layer_norm", "type_vocab_size": 0}


def is_modernbert(config: BertConfig) -> bool:
  """Whether `config` is the architecture HF's ModernBERT computes."""
  return all(getattr(config, k) == v for k, v in MODERNBERT_ARCHITECTURE.items())


def init_std(config: BertConfig, kind: str) -> float:
  """The σ of a weight of `kind` (a key of `INIT_STDS`' tables) under `config`'s scheme."""
  return float(INIT_STDS[config.init_scheme][kind](config))


def weight_init(config: BertConfig, axes: tuple[str | None, ...], kind: str = "in"):
  """The truncated-normal initializer of a weight of `kind`, with its logical axes."""
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(
      init_std(config, kind), lower=-INIT_CUTOFF, upper=INIT_CUTOFF), axes)


def _zeros(axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class LayerNorm(nn.Module):
  """LayerNorm with f32 statistics and f32 scale (and shift, when `config.norm_bias`); returns
  `config.dtype`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), (EMBED,)),
                       (x.shape[-1],), c.param_dtype)
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(variance + c.layer_norm_eps) * scale.astype(jnp.float32)
    if c.norm_bias:
      y = y + self.param("bias", _zeros((EMBED,)), (x.shape[-1],), c.param_dtype).astype(
          jnp.float32)
    return y.astype(c.dtype)


# Normalisation layers by name (`config.model.norm`): a module of (config, name=...) over the last
# axis, returning `config.dtype`. A new one is a class and a line here (or an entry added from a
# user's module); HF export refuses any but "layer_norm".
NORMS: dict[str, type[nn.Module]] = {"layer_norm": LayerNorm}


def norm_layer(config: BertConfig, name: str) -> nn.Module:
  """The config's normalisation layer, named `name`."""
  return NORMS[config.norm](config, name=name)


def _dense(config: BertConfig, features: int, axes: tuple[str | None, str | None], name: str,
           use_bias: bool = True, kind: str = "in"):
  return nn.Dense(
      features, use_bias=use_bias, dtype=config.dtype, param_dtype=config.param_dtype,
      kernel_init=weight_init(config, axes, kind), bias_init=_zeros((axes[1],)), name=name)


# ----------------------------------------------------------------------- position encodings


class LearnedPositions(nn.Module):
  """BERT's learned absolute positions: a [max_position_embeddings, H] table whose rows are
  added to the token embeddings. Attention is left as it is (`rotate`)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, position_ids):
    """x [B, L, H], position_ids [B, L] -> x [B, L, H] with the positions' rows added."""
    c = self.config
    if x.shape[1] > c.max_position_embeddings:
      raise ValueError(f"Sequence length {x.shape[1]} exceeds max_position_embeddings="
                       f"{c.max_position_embeddings}")
    table = self.param("embedding", weight_init(c, (None, EMBED), "embedding"),
                       (c.max_position_embeddings, c.embedding_width), c.param_dtype)
    return x + jnp.take(table, position_ids, axis=0).astype(c.dtype)

  @staticmethod
  def rotate(config: BertConfig, query, key, position_ids, local: bool):
    """query/key [B, L, N, D] as attention sees them: unchanged (positions are in x already)."""
    del config, position_ids, local
    return query, key


class RotaryPositions(nn.Module):
  """Rotary position embedding (RoFormer, Su et al. 2021), as ModernBERT: nothing is added to
  the embeddings; every layer rotates its queries and keys by their positions, with θ =
  `global_rope_theta` in global layers and `local_rope_theta` in local ones."""
  config: BertConfig

  def __call__(self, x, position_ids):
    del position_ids
    return x

  @staticmethod
  def rotate(config: BertConfig, query, key, position_ids, local: bool):
    """query/key [B, L, N, D] rotated (in float32, then back to their dtype): pairs (i, i + D/2)
    turn by position x θ^(-2i/D) (HF's rotate_half layout), θ of the layer's kind."""
    theta = config.local_rope_theta if local else config.global_rope_theta
    dim = query.shape[-1]
    inv_freq = 1.0 / theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)  # [D/2]
    angles = position_ids[..., None].astype(jnp.float32) * inv_freq  # [B, L, D/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, L, 1, D]
    cos, sin = jnp.cos(angles), jnp.sin(angles)

    def rotated(x):
      x32 = x.astype(jnp.float32)
      half = dim // 2
      turned = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
      return (x32 * cos + turned * sin).astype(x.dtype)
    return rotated(query), rotated(key)


# Position encoding by name (config.model.position_embedding): a module called on the token
# embeddings (x [B, L, H], position_ids [B, L]) -> x, with a static `rotate(config, query, key,
# position_ids, local) -> (query, key)` that every attention layer applies (`local`: whether the
# layer is a local one, a Python bool).
POSITION_BLOCKS: dict[str, type[nn.Module]] = {"learned": LearnedPositions,
                                               "rotary": RotaryPositions}


class Embeddings(nn.Module):
  """Token + position + segment embeddings, then LayerNorm and dropout."""
  config: BertConfig

  def setup(self):
    c = self.config
    self.word_embeddings = nn.Embed(  # [V', E]
        c.padded_vocab_size, c.embedding_width, dtype=c.dtype, param_dtype=c.param_dtype,
        embedding_init=weight_init(c, (VOCAB, EMBED), "embedding"), name="word_embeddings")
    self.positions = POSITION_BLOCKS[c.position_embedding](c, name="position_embeddings")
    if c.type_vocab_size:
      self.token_type_embeddings = nn.Embed(
          c.type_vocab_size, c.embedding_width, dtype=c.dtype, param_dtype=c.param_dtype,
          embedding_init=weight_init(c, (None, EMBED), "embedding"),
          name="token_type_embeddings")
    self.norm = norm_layer(c, "norm")

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    # Rows are looked up in the params' dtype, then cast: the same values as nn.Embed's lookup
    # in `dtype`, but the gradient's scatter-add into the table stays float32. A bfloat16
    # scatter-add on a GPU (many tokens into a few rows: [CLS], [SEP], 2 segment rows) made the
    # small model's bf16 step 17x slower than with this (H200, 49.7 vs 2.8 ms, 2026-12-04).
    c = self.config
    lookup = lambda table, ids: jnp.take(table, ids, axis=0).astype(c.dtype)
    x = lookup(self.word_embeddings.embedding, input_ids)  # [B, L, E]
    if c.type_vocab_size:
      x = x + lookup(self.token_type_embeddings.embedding, token_type_ids)
    x = self.positions(x, position_ids)  # Restart at 0 in each packed example.
    return _dropout(self, self.norm(x), self.config.hidden_dropout_prob, deterministic)

  def attend(self, x):
    """Scores of vectors [..., E] against every row of the embedding table (the tied MLM
    decoder) -> [..., V'] float32: `dtype` inputs, float32 accumulation and output."""
    c = self.config
    table = self.word_embeddings.embedding  # [V', E]
    return jnp.einsum("...h,vh->...v", x.astype(c.dtype), table.astype(c.dtype),
                      preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- attention


class _Einsum(nn.Module):
  """A dense layer with a multi-dimensional kernel (per-head projections), via einsum.
  (flax's DenseGeneral builds its kernel flat and reshapes, which breaks logical axis boxes.)"""
  config: BertConfig
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str | None, ...]
  equation: str
  kind: str = "in"  # Of `INIT_STDS`.

  @nn.compact
  def __call__(self, x):
    c = self.config
    kernel = self.param("kernel", weight_init(c, self.kernel_axes, self.kind), self.kernel_shape,
                        c.param_dtype)
    y = jnp.einsum(self.equation, x.astype(c.dtype), kernel.astype(c.dtype))
    if not c.attention_bias:
      return y
    bias = self.param("bias", _zeros(self.bias_axes), self.bias_shape, c.param_dtype)
    return y + bias.astype(c.dtype)


def einsum_attention(query, key, value, mask, dropout_probs=lambda probs: probs):
  """Attention written out: query/key/value [B, L, N, D] (compute dtype), mask [B, 1, L, L]
  bool -> context [B, L, N, D]. Scores and softmax in float32; `dropout_probs` maps the
  probabilities [B, N, L, L] f32 (attention dropout) before they weight the values."""
  scores = jnp.einsum("bqnd,bknd->bnqk", query, key,
                      preferred_element_type=jnp.float32) / jnp.sqrt(query.shape[-1])
  scores = jnp.where(mask, scores, _MASK_VALUE)
  probs = dropout_probs(jax.nn.softmax(scores, axis=-1))  # [B, N, L, L] f32
  return jnp.einsum("bnqk,bknd->bqnd", probs.astype(value.dtype), value)


def local_attention(query, key, value, segment_ids, half_window: int,
                    dropout_probs=lambda probs: probs):
  """Sliding-window attention without the L x L scores: a query attends to the keys of its own
  segment at most `half_window` rows away (padding queries: to any real key that near).
  query/key/value [B, L, N, D], segment_ids [B, L] -> context [B, L, N, D].

  The rows are cut into blocks of C = half_window; block b's queries see the keys of blocks
  b - 1, b and b + 1 (every key within C rows), so the scores are [B, N, L/C, C, 3C]: 3C per
  query instead of L. Equal to `einsum_attention` with the window mask (tests)."""
  batch, length, heads, dim = query.shape
  size = half_window
  blocks = -(-length // size)
  pad = blocks * size - length

  def blocked(x, fill=0):  # [B, L, ...] -> [B, nb, C, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
    return x.reshape(batch, blocks, size, *x.shape[2:])

  def neighbours(x, fill=0):  # [B, nb, C, ...] -> [B, nb, 3C, ...]: blocks b-1, b, b+1.
    edge = [(0, 0), (1, 1)] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, edge, constant_values=fill)
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)

  rows = jnp.arange(blocks * size).reshape(1, blocks, size)  # [1, nb, C]
  seg_q, seg_k = blocked(segment_ids), neighbours(blocked(segment_ids))  # [B, nb, C|3C]
  row_k = neighbours(rows, fill=-2 * size)  # Rows outside the sequence: never near.
  near = jnp.abs(rows[..., :, None] - row_k[..., None, :]) <= size  # [1, nb, C, 3C]
  same = (seg_k[:, :, None, :] > 0) & (
      (seg_q[..., None] == seg_k[:, :, None, :]) | (seg_q[..., None] == 0))
  mask = (near & same)[:, None]  # [B, 1, nb, C, 3C]
  q, k, v = blocked(query), neighbours(blocked(key)), neighbours(blocked(value))
  scores = jnp.einsum("bxqnd,bxknd->bnxqk", q, k,
                      preferred_element_type=jnp.float32) / jnp.sqrt(dim)
  scores = jnp.where(mask, scores, _MASK_VALUE)
  probs = dropout_probs(jax.nn.softmax(scores, axis=-1))  # [B, N, nb, C, 3C] f32
  context = jnp.einsum("bnxqk,bxknd->bxqnd", probs.astype(value.dtype), v)
  return context.reshape(batch, blocks * size, heads, dim)[:, :length]


def window_mask(segment_ids, half_window: int):
  """[B, 1, L, L] bool: `attention_mask_from_segments` and at most `half_window` rows apart
  (the dense form of `local_attention`'s pattern, for the fused kernels and references)."""
  rows = jnp.arange(segment_ids.shape[1])
  near = jnp.abs(rows[:, None] - rows[None, :]) <= half_window  # [L, L]
  return attention_mask_from_segments(segment_ids) & near[None, None]


class SelfAttention(nn.Module):
  """Bidirectional multi-head self-attention within segments, output projection included; in a
  local layer (`local`) within the sliding window too."""
  config: BertConfig
  deterministic: bool
  local: bool = False

  @nn.compact
  def __call__(self, x, mask, segment_ids, position_ids):
    """x [B, L, H], mask [B, 1, L, L] bool (query attends to key), segment_ids and
    position_ids [B, L] -> [B, L, H]."""
    c = self.config
    heads = (c.num_attention_heads, c.head_dim)
    proj = lambda name: _Einsum(c, (c.hidden_size, *heads), (EMBED, HEADS, KV), heads,
                                (HEADS, KV), "blh,hnd->blnd", name=name)
    query, key, value = proj("query")(x), proj("key")(x), proj("value")(x)  # [B, L, N, D]
    query, key = POSITION_BLOCKS[c.position_embedding].rotate(c, query, key, position_ids,
                                                              self.local)
    rate = 0.0 if self.deterministic else c.attention_probs_dropout_prob
    dropout_key = self.make_rng("dropout") if rate > 0.0 else None
    impl = resolve_attention_impl(c, length=x.shape[1])
    context = _attend(c, impl, rate, segment_ids, mask, self.local)(
        query, key, value, dropout_key)  # [B, L, N, D]
    return _Einsum(c, (*heads, c.hidden_size), (HEADS, KV, EMBED), (c.hidden_size,), (EMBED,),
                   "blnd,ndh->blh", "out", name="output")(context)  # [B, L, H]


def resolve_attention_impl(config: BertConfig, device=None, length: int | None = None) -> str:
  """config.attention_impl with "auto" decided for `device` (default: `target_device()`):
  "splash" on a TPU (for rows of `length` tokens when given: a multiple of the kernel's 128
  lanes, else "xla"), "cudnn" on an NVIDIA GPU when the compute dtype is bfloat16 and the head
  size one cuDNN takes (<= 128, a multiple of 8; it refuses float32), else "xla"."""
  if config.attention_impl != "auto":
    return config.attention_impl
  device = target_device() if device is None else device
  if device.platform == "tpu":
    return "splash" if length is None or length % splash.LANES == 0 else "xla"
  if (device.platform == "gpu" and "nvidia" in device.device_kind.lower()
      and config.dtype == jnp.bfloat16 and config.head_dim <= 128 and config.head_dim % 8 == 0):
    return "cudnn"
  return "xla"


def check_attention_impl(impl: str, dtype: str, head_dim: int | None = None,
                         device=None) -> None:
  """Refuses a fused kernel this process cannot run, before the workdir is touched or anything
  compiles (cuDNN's own refusal came as a traceback from inside the compile): "cudnn" needs an
  NVIDIA GPU, bfloat16 compute and a head size cuDNN takes (<= 128, a multiple of 8)."""
  if impl != "cudnn":
    return
  device = target_device() if device is None else device
  problem = None
  if device.platform != "gpu" or "nvidia" not in device.device_kind.lower():
    problem = (f"needs an NVIDIA GPU (with cuDNN); the devices it compiles for are "
                 f"{device.platform} ({device.device_kind})")
  elif dtype != "bfloat16":
    problem = f"needs config.model.dtype='bfloat16' (cuDNN's fused attention refuses {dtype})"
  elif head_dim is not None and (head_dim > 128 or head_dim % 8):
    problem = (f"needs a head size <= 128 and a multiple of 8 (hidden_size / "
               f"num_attention_heads is {head_dim})")
  if problem:
    raise ValueError(f"config.model.attention_impl='cudnn' {problem}; use 'auto' (cudnn where "
                     "it runs, else xla) or 'xla'")


def attention_note(config: BertConfig, length: int | None = None) -> str:
  """One log line: the attention a run of rows of `length` tokens uses, with and without
  attention dropout."""
  impl = resolve_attention_impl(config, length=length)
  chosen = f"{impl!r} (attention_impl='auto')" if config.attention_impl == "auto" else repr(impl)
  rate = config.attention_probs_dropout_prob
  training = f"; training with attention dropout {rate} takes 'einsum'" if rate > 0.0 else ""
  return f"Attention: {chosen} where no attention dropout applies{training}"


def _attend(config: BertConfig, impl: str, rate: float, segment_ids, mask, local: bool):
  """The attention of one layer kind as a pure function (query, key, value, dropout key) ->
  context [B, L, N, D]: with `impl` (resolved) "splash" or "cudnn", a fused kernel where no
  attention dropout applies (both skip what a local window excludes); else the einsum forms,
  or `jax.nn.dot_product_attention`'s "xla" for global layers without dropout."""
  half = config.local_attention // 2

  def attend(query, key, value, dropout_key):
    if rate == 0.0 and impl == "splash":
      return splash.splash_attention(
          query, key, value, segment_ids, half_window=half if local else 0,
          block_q=config.splash_block_q, block_kv=config.splash_block_kv,
          axes=(BATCH, LENGTH, HEADS, KV))
    if rate == 0.0 and impl == "cudnn":
      return jax.nn.dot_product_attention(
          query, key, value, mask=mask, implementation="cudnn",
          local_window_size=(half, half) if local else None)
    if local:
      return local_attention(query, key, value, segment_ids, half,
                             lambda probs: dropout(probs, rate, dropout_key, config.dropout_rng))
    if rate == 0.0 and impl == "xla":
      return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")
    return einsum_attention(query, key, value, mask,
                            lambda probs: dropout(probs, rate, dropout_key, config.dropout_rng))
  return attend


# ----------------------------------------------------------------------------------- MLP


class DenseMLP(nn.Module):
  """BERT's feed-forward block: dense to F, activation, dense back to H."""
  config: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    """x [B, L, H] -> [B, L, H]."""
    c = self.config
    h = _dense(c, c.intermediate_size, (EMBED, MLP), "intermediate", c.mlp_bias)(x)  # [B, L, F]
    h = nn.with_logical_constraint(ACTIVATIONS[c.hidden_act](h), (BATCH, LENGTH, MLP))
    return _dense(c, c.hidden_size, (MLP, EMBED), "output", c.mlp_bias, "out")(h)  # [B, L, H]


class GatedMLP(nn.Module):
  """A gated MLP (GeGLU with "gelu", as ModernBERT; Shazeer 2020): act(x W_0) * (x W_1), then
  back to H; F = intermediate_size is the width of each half (HF ModernBERT's Wi holds both)."""
  config: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    """x [B, L, H] -> [B, L, H]."""
    c = self.config
    up = lambda name: _dense(c, c.intermediate_size, (EMBED, MLP), name, c.mlp_bias)(x)
    h = ACTIVATIONS[c.hidden_act](up("wi_0")) * up("wi_1")  # [B, L, F]
    h = nn.with_logical_constraint(h, (BATCH, LENGTH, MLP))
    return _dense(c, c.hidden_size, (MLP, EMBED), "wo", c.mlp_bias, "out")(h)  # [B, L, H]


# MLP block by name (config.model.mlp): a module (config, deterministic) called on x [B, L, H].
MLP_BLOCKS: dict[str, type[nn.Module]] = {"dense": DenseMLP, "glu": GatedMLP}


# --------------------------------------------------------------------------------- layers


class PostNorm:
  """BERT's post-LN: x = LN(x + Attn(x)); x = LN(x + MLP(x)). No final norm."""
  final_norm = False

  @staticmethod
  def layer(x, attention, mlp, attention_norm, mlp_norm, dropout, layer_index):
    del layer_index
    x = attention_norm(x + dropout(attention(x)))
    return mlp_norm(x + dropout(mlp(x)))


class PreNorm:
  """Pre-LN (ModernBERT): x = x + Attn(LN(x)); x = x + MLP(LN(x)); a final LN after the last
  layer. Layer 0's attention reads the (already normed) embeddings as they are."""
  final_norm = True

  @staticmethod
  def layer(x, attention, mlp, attention_norm, mlp_norm, dropout, layer_index):
    normed = jnp.where(layer_index == 0, x, attention_norm(x))
    x = x + dropout(attention(normed))
    return x + dropout(mlp(mlp_norm(x)))


# Where the norms sit by name (config.model.norm_placement): `layer(x, attention, mlp,
# attention_norm, mlp_norm, dropout, layer_index) -> x`, each block a function of [B, L, H], and
# whether the encoder ends with a norm (`final_norm`).
NORM_PLACEMENTS = {"post": PostNorm, "pre": PreNorm}


# ------------------------------------------------------------------------- the model's rules
# Checked where a BertConfig is built (a config read from a checkpoint or converted from HF too)
# and, on a config, by bert_jax/config_checks.py before anything runs: one definition each.


def choices() -> dict[str, Any]:
  """Each field whose value names an entry of a table of this module -> that table (a new block
  field is a line here)."""
  return {"hidden_act": ACTIVATIONS, "position_embedding": POSITION_BLOCKS, "mlp": MLP_BLOCKS,
          "norm_placement": NORM_PLACEMENTS, "norm": NORMS, "dropout_rng": DROPOUT_RNGS,
          "attention_impl": ATTENTION_IMPLS, "remat": REMAT_POLICIES,
          "classifier_pooling": POOLINGS, "initializer": INITIALIZERS}


def relation_problem(c, prefix: str = "") -> str | None:
  """The first broken rule between fields of `c` (a BertConfig, or a config's model section),
  each field named with `prefix` ("config.model." for a config), or None."""
  if c.embedding_size < 0:
    return f"{prefix}embedding_size={c.embedding_size} must be >= 0 (0: hidden_size)"
  if c.hidden_size % c.num_attention_heads:
    return (f"{prefix}hidden_size={c.hidden_size} is not divisible by "
            f"{prefix}num_attention_heads={c.num_attention_heads}")
  if c.local_attention and c.global_attn_every_n_layers < 2:
    return (f"{prefix}local_attention={c.local_attention} needs "
            f"{prefix}global_attn_every_n_layers >= 2 (it is {c.global_attn_every_n_layers}: "
            "every layer would be global; ModernBERT: 3)")
  return None


class Layer(nn.Module):
  """One transformer layer: attention (global, or `local`) and MLP blocks with the norms where
  the config puts them. `layer_index` (int32, traced) is its place in the stack."""
  config: BertConfig
  deterministic: bool
  local: bool = False

  @nn.compact
  def __call__(self, x, mask, segment_ids, position_ids, layer_index):
    c = self.config
    attention = SelfAttention(c, self.deterministic, self.local, name="attention")
    mlp = MLP_BLOCKS[c.mlp](c, self.deterministic, name="mlp")
    x = NORM_PLACEMENTS[c.norm_placement].layer(
        x, lambda y: attention(y, mask, segment_ids, position_ids), mlp,
        norm_layer(c, "attention_norm"), norm_layer(c, "mlp_norm"),
        lambda y: _dropout(self, y, c.hidden_dropout_prob, self.deterministic), layer_index)
    return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))


def layer_pattern(config: BertConfig) -> tuple[bool, ...]:
  """Whether each layer of one repeat of the stack's pattern is local: (False,) when every
  layer is global (BERT), else one global layer then local ones (ModernBERT: (False, True,
  True)), so layer i is local iff pattern[i % len(pattern)]."""
  if not config.local_attention:
    return (False,)
  return (False,) + (True,) * (config.global_attn_every_n_layers - 1)


class Encoder(nn.Module):
  """The S layers, their params stacked [S, ...] (one array per parameter, under
  `bert/encoder/layers`), run by one `jax.lax.scan` over repeats of the layer pattern
  (`layer_pattern`: one layer for BERT, global + local ones for ModernBERT), so each layer's
  kind is static (a local layer never builds L x L scores) and compile time does not grow with
  depth. Layers after the last whole repeat (ModernBERT-base: 22 = 7 x 3 + 1) run after the
  scan. Each repeat is rematerialised as `config.model.remat` says; a pre-LN stack ends with
  its final norm. A one-layer pattern scans the stacked params as they are; a longer one views
  them [S / n, n, ...], and assembling their gradient costs one params-sized buffer (measured:
  modern_base +0.68 GiB at L=256, B=8)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, segment_ids, position_ids, deterministic: bool):
    # Init needs only the params' shapes, which no attention kind changes, so it always traces
    # "xla": "splash" needs L a multiple of 128 (shape checks init with L = 2), and flax traces
    # the init at every apply too (its shape check), under the init's vmap over layers, where
    # jax's cuDNN attention cannot batch a [B, 1, L, L] mask (jax 0.11: a reshape TypeError).
    # The init's own forward pass (its output is discarded) takes "xla" too: it runs on a batch
    # of 1, which splash's shard_map cannot split over a data x fsdp mesh axis > 1.
    c = self.config
    init_config = dataclasses.replace(c, attention_impl="xla")
    layer_config = init_config if self.is_initializing() else c
    inputs = (mask, segment_ids, position_ids)
    params = self.param("layers", functools.partial(_stacked_layer_params, init_config), x,
                        *inputs)
    rate = max(c.hidden_dropout_prob, c.attention_probs_dropout_prob)
    dropout_key = None if deterministic or rate <= 0.0 else self.make_rng("dropout")
    pattern = layer_pattern(c)
    repeats, rest = divmod(c.num_hidden_layers, len(pattern))

    def run(x, layers: tuple, first: jax.Array, kinds: tuple[bool, ...]):
      """The layers `kinds` (local or not) with their params `layers` (one tree each)."""
      for j, (local, layer_params) in enumerate(zip(kinds, layers)):
        index = first + j
        rngs = None if dropout_key is None else {"dropout": jax.random.fold_in(dropout_key,
                                                                               index)}
        x = Layer(layer_config, deterministic, local, parent=None).apply(
            {"params": layer_params}, x, *inputs, index, rngs=rngs)
      return x

    policy = REMAT_POLICIES[c.remat]
    if policy is not None:
      run = jax.checkpoint(run, policy=policy, prevent_cse=False, static_argnums=(3,))
    size = len(pattern)
    unroll = max(1, min(c.scan_unroll, repeats))
    split = lambda tree, n: tuple(jax.tree.map(lambda p, j=j: p[j], tree) for j in range(n))
    if size == 1:  # Scanned as they are stacked: no reshaped copy of the params.
      x, _ = jax.lax.scan(lambda x, xs: (run(x, (xs[0],), xs[1], pattern), None), x,
                          (params, jnp.arange(repeats, dtype=jnp.int32)), unroll=unroll)
    else:  # [S / size, size, ...]: one repeat of the pattern per iteration.
      grouped = jax.tree.map(
          lambda p: p[:repeats * size].reshape(repeats, size, *p.shape[1:]), params)
      x, _ = jax.lax.scan(
          lambda x, xs: (run(x, split(xs[0], size), xs[1] * size, pattern), None), x,
          (grouped, jnp.arange(repeats, dtype=jnp.int32)), unroll=unroll)
    if rest:
      x = run(x, split(jax.tree.map(lambda p: p[repeats * size:], params), rest),
              jnp.int32(repeats * size), pattern[:rest])
    if NORM_PLACEMENTS[c.norm_placement].final_norm:
      x = norm_layer(c, "final_norm")(x)
    return x


def _stacked_layer_params(config: BertConfig, rng, x, mask, segment_ids, position_ids):
  """Init of the encoder's layers: each layer's params from its own key, stacked [S, ...] with
  the logical axis LAYERS in front (never split: the mesh rule ("layers", None)); a param
  without axis names (a block from outside may have one) stays without (replicated)."""
  def one(key):
    return Layer(config, True, parent=None).init(key, x, mask, segment_ids, position_ids,
                                                 jnp.int32(0))["params"]
  stacked = jax.vmap(one)(jax.random.split(rng, config.num_hidden_layers))
  boxed = lambda leaf: isinstance(leaf, nn.Partitioned)
  return jax.tree.map(
      lambda leaf: leaf.add_axis(0, {nn.PARTITION_NAME: LAYERS}) if boxed(leaf) else leaf,
      stacked, is_leaf=boxed)


def attention_mask_from_segments(segment_ids):
  """[B, L] segment ids (1..K per packed example, 0 on padding; an attention mask of 1s and 0s
  is the one-example case) -> [B, 1, L, L] bool, query attends to key: keys of the query's own
  segment only, never padding. Padding queries attend to every real key (their outputs are
  never read, and with one segment this is exactly HuggingFace's padding mask)."""
  query = segment_ids[:, :, None]  # [B, L, 1]
  key = segment_ids[:, None, :]  # [B, 1, L]
  return ((key > 0) & ((query == key) | (query == 0)))[:, None]


class BertModel(nn.Module):
  """The encoder: returns (sequence_output [B, L, H], pooled_output [B, H] or [B, K, H])."""
  config: BertConfig
  add_pooling_layer: bool = True

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c, name="embeddings")
    if c.embedding_width != c.hidden_size:
      self.embeddings_project = _dense(c, c.hidden_size, (None, EMBED), "embeddings_project")
    self.encoder = Encoder(c, name="encoder")
    if self.add_pooling_layer:
      self.pooler = _dense(c, c.hidden_size, (EMBED, None), "pooler")

  def __call__(self, input_ids, token_type_ids=None, segment_ids=None,
               deterministic: bool = True, *, position_ids=None, cls_positions=None,
               embedded=None):
    """input_ids [B, L]; token_type_ids [B, L] (A 0, B 1); segment_ids [B, L] (packed example
    1..K, 0 padding; an attention mask is the K = 1 case); position_ids [B, L] (default
    0..L-1); cls_positions [B, K] ([CLS] of each packed example; default: position 0 only,
    pooled [B, H]); embedded [B, L, E]: the embeddings' output computed elsewhere (a table
    shared with another encoder, `models/rtd.py`), used instead of `embeddings`."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if segment_ids is None:
      segment_ids = jnp.ones_like(input_ids)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    mask = attention_mask_from_segments(segment_ids)  # [B, 1, L, L], built once.
    x = (self.embeddings(input_ids, token_type_ids, position_ids, deterministic)
         if embedded is None else embedded)  # [B, L, E]
    if self.config.embedding_width != self.config.hidden_size:
      x = self.embeddings_project(x)  # [B, L, H]
    x = nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))
    x = self.encoder(x, mask, segment_ids, position_ids, deterministic)
    if not self.add_pooling_layer:
      return x, None
    pooled = pool(x, segment_ids, cls_positions, self.config.classifier_pooling)
    return x, jnp.tanh(self.pooler(pooled))  # [B, H] or [B, K, H]

  def attend(self, x):
    return self.embeddings.attend(x)


def gather_positions(sequence, positions):
  """sequence [B, L, H], positions [B, P] -> [B, P, H] (the original's gather_indexes)."""
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


def pool(sequence, segment_ids, cls_positions, pooling: str):
  """Each example's vector: sequence [B, L, H] -> [B, H] (cls_positions None: one example per
  row, [CLS] at 0) or [B, K, H] (the K packed examples of `cls_positions` [B, K]). "cls": the
  [CLS] row; "mean": the mean over the example's rows (segment k + 1 for slot k)."""
  if pooling == "cls":
    return sequence[:, 0] if cls_positions is None else gather_positions(sequence, cls_positions)
  slots = 1 if cls_positions is None else cls_positions.shape[1]
  member = (segment_ids[:, :, None] == jnp.arange(1, slots + 1)).astype(jnp.float32)  # [B, L, K]
  sums = jnp.einsum("blk,blh->bkh", member, sequence.astype(jnp.float32))
  means = (sums / jnp.maximum(member.sum(axis=1), 1.0)[..., None]).astype(sequence.dtype)
  return means[:, 0] if cls_positions is None else means  # [B, H] or [B, K, H]


def _transform(config: BertConfig, hidden, dense: str, norm: str, features: int = 0):
  """Dense (H -> `features`, default H; bias as `classifier_bias`) + activation + LayerNorm,
  its params named `dense` and `norm` in the calling module."""
  h = _dense(config, features or config.hidden_size, (EMBED, None), dense,
             config.classifier_bias, "transform")(hidden)
  return norm_layer(config, norm)(ACTIVATIONS[config.hidden_act](h))


class PredictionHead(nn.Module):
  """HF's `ModernBertPredictionHead` (dense + activation + norm, [..., H] -> [..., H]): what
  ModernBERT's fine-tuning heads put on the pooled vector or on every token before their
  classifier; the MLM head's transform is the same computation."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    return _transform(self.config, x, "dense", "norm")


class MaskedLMHead(nn.Module):
  """Dense + activation + LayerNorm, then the decoder tied to the word embeddings + own bias."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden, bert: BertModel):
    c = self.config
    h = _transform(c, hidden, "transform", "transform_norm", c.embedding_width)  # [..., E]
    bias = self.param("bias", _zeros((VOCAB,)), (c.padded_vocab_size,), c.param_dtype)
    logits = bert.attend(h) + bias.astype(jnp.float32)  # [B, P, V'] f32
    return logits[..., :c.vocab_size]  # [B, P, V]: padded entries are never predicted.


class BertForPreTraining(nn.Module):
  """BERT with the MLM head (evaluated at `masked_lm_positions` only) and the NSP head."""
  config: BertConfig

  def setup(self):
    self.bert = BertModel(self.config, name="bert")
    self.mlm = MaskedLMHead(self.config, name="mlm")
    # Two outputs: computed in float32 outright (the cost is nil).
    self.nsp = _dense(dataclasses.replace(self.config, dtype=jnp.float32), 2, (EMBED, None), "nsp")

  def __call__(self, input_ids, token_type_ids, segment_ids, masked_lm_positions,
               deterministic: bool = True, *, position_ids=None, cls_positions=None):
    """input_ids/token_type_ids/segment_ids [B, L], masked_lm_positions [B, P] (and, for packed
    rows, position_ids [B, L] and cls_positions [B, K]; see `BertModel`) -> {"mlm_logits":
    [B, P, V] f32, "nsp_logits": [B, 2] f32, or [B, K, 2] with cls_positions}."""
    sequence, pooled = self.bert(input_ids, token_type_ids, segment_ids, deterministic,
                                 position_ids=position_ids, cls_positions=cls_positions)
    masked = gather_positions(sequence, masked_lm_positions)  # [B, P, H]
    return {
        "mlm_logits": self.mlm(masked, self.bert),
        "nsp_logits": self.nsp(pooled),
    }


@functools.lru_cache(maxsize=32)
def param_shapes(config: BertConfig) -> types.MappingProxyType:
  """Path -> shape of every `BertForPreTraining` parameter of `config`, from the model itself
  (traced, nothing computed or allocated; cached per config, read-only)."""
  ids = jax.ShapeDtypeStruct((1, 2), jnp.int32)
  abstract = jax.eval_shape(lambda i: BertForPreTraining(config).init(
      jax.random.key(0), i, i, i, i), ids)["params"]
  is_boxed = lambda x: isinstance(x, nn.Partitioned)
  leaves = jax.tree_util.tree_flatten_with_path(abstract, is_leaf=is_boxed)[0]
  return types.MappingProxyType({
      tuple(k.key for k in path): tuple((leaf.value if is_boxed(leaf) else leaf).shape)
      for path, leaf in leaves})
