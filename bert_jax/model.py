"""BERT (Devlin et al., 2018) in pure flax.linen: encoder, pooler, MLM and NSP heads.

Read top to bottom: config -> embeddings -> attention -> layer -> encoder -> BertModel ->
pretraining heads. Shapes: B batch, L sequence length, H hidden size, N heads, D head size,
F intermediate size, P predictions per sequence, V vocabulary size, V' the padded vocabulary
(`BertConfig.padded_vocab_size`).

Vocabulary padding: the word-embedding table (and with it the tied MLM decoder) and the MLM bias
hold V' >= V rows, V rounded up to `vocab_pad_multiple`, so that the vocabulary dimension splits
over a tensor axis of 4 or 8 (30,522 does not; Megatron and MaxText pad to 128). The padded rows
are never looked up (ids are < V) and never predicted (the MLM logits are cut to V), so losses
and predictions are those of the unpadded model with the same real rows. Weights enter and leave
the padded layout through `pad_vocab` / `unpad_vocab`: exchange formats hold the V real rows.

Packed rows: several [CLS] A [SEP] B [SEP] examples share a row; `segment_ids` keep attention
inside each example, `position_ids` restart at 0 in each, and the pooler and NSP head read each
example's [CLS] at `cls_positions`. An unpacked batch is the one-example case (segment ids = the
attention mask, positions 0..L-1, [CLS] at 0).

Every parameter carries logical axis names (see the constants below); `bert_jax/sharding.py`
maps them onto the device mesh with the rules in `config.mesh.logical_axis_rules`.
Whatever the compute `dtype` (e.g. bfloat16): softmax and LayerNorm statistics run in float32,
and the MLM and NSP logits come out of their matmuls in float32 (inputs in `dtype`, float32
accumulation and output), so the losses never see bf16-rounded logits.
"""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# Logical axis names of parameters and activations.
BATCH = "batch"
LENGTH = "length"
EMBED = "embed"
VOCAB = "vocab"
MLP = "mlp"
HEADS = "heads"
KV = "kv"

Dtype = Any


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Model hyper-parameters, with HuggingFace's field names plus compute/param dtypes."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  dropout_rng: str = "hash"  # Random bits of dropout masks: "hash" or "threefry" (see `dropout`).
  # Attention where no attention dropout applies: jax.nn.dot_product_attention's "xla"
  # (anywhere) or "cudnn" (NVIDIA GPUs, fused), or "einsum" (the explicit scores + softmax
  # path that attention dropout always takes; a reference).
  attention_impl: str = "xla"
  # The embedding table and MLM bias get vocab_size rounded up to a multiple of this many rows
  # (1 = no padding; see the module docstring). 1 is also the layout of exchange formats and of
  # configs saved before the field existed; configs/base.py sets 128.
  vocab_pad_multiple: int = 1

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f"hidden_size={self.hidden_size} is not divisible by "
          f"num_attention_heads={self.num_attention_heads}")
    if self.hidden_act not in HIDDEN_ACTS:
      raise ValueError(
          f"hidden_act={self.hidden_act!r} is not supported; use one of {list(HIDDEN_ACTS)}")
    if self.dropout_rng not in DROPOUT_RNGS:
      raise ValueError(f"dropout_rng={self.dropout_rng!r} is not supported; use one of "
                       f"{list(DROPOUT_RNGS)}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl={self.attention_impl!r} is not supported; use one of "
                       f"{list(ATTENTION_IMPLS)}")
    if not isinstance(self.vocab_pad_multiple, int) or self.vocab_pad_multiple < 1:
      raise ValueError(f"vocab_pad_multiple={self.vocab_pad_multiple!r} must be an integer >= 1 "
                       "(1: no padding)")
    for name in ("dtype", "param_dtype"):  # Accept "bfloat16" etc. from configs.
      object.__setattr__(self, name, _parse_dtype(name, getattr(self, name)))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def padded_vocab_size(self) -> int:
    """V': rows of the word-embedding table and the MLM bias."""
    return padded_size(self.vocab_size, self.vocab_pad_multiple)

  @classmethod
  def from_config(cls, model_config) -> "BertConfig":
    """Builds the frozen model config from the `config.model` ConfigDict section."""
    fields = {f.name for f in dataclasses.fields(cls)}
    values = dict(model_config)
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"Unknown config.model fields: {unknown}")
    return cls(**values)


def padded_size(size: int, multiple: int) -> int:
  """`size` rounded up to a multiple of `multiple`."""
  return -(-size // multiple) * multiple


def _gelu(x):
  """BERT's exact GELU, x * Phi(x), written with erf as HF/PyTorch do: XLA's erf is one rational
  polynomial, cheaper than the erfc (two branches and an exp) of `nn.gelu(approximate=False)`."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * (1.0 / math.sqrt(2.0))))


_ACTIVATIONS = {
    "gelu": _gelu,
    "gelu_new": lambda x: nn.gelu(x, approximate=True),
    "relu": nn.relu,
}


HIDDEN_ACTS = tuple(_ACTIVATIONS)
DROPOUT_RNGS = ("hash", "threefry")
ATTENTION_IMPLS = ("xla", "cudnn", "einsum")
# Compute and parameter dtypes, by name. float16 is left out: it would need loss scaling.
DTYPES = ("float32", "bfloat16")


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


def _init(config: BertConfig, axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), axes)


def _zeros(axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class LayerNorm(nn.Module):
  """LayerNorm with f32 statistics and f32 scale/shift; returns `config.dtype`."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), (EMBED,)),
                       (x.shape[-1],), c.param_dtype)
    bias = self.param("bias", _zeros((EMBED,)), (x.shape[-1],), c.param_dtype)
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(variance + c.layer_norm_eps)
    y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(c.dtype)


def _dense(config: BertConfig, features: int, axes: tuple[str | None, str | None], name: str):
  return nn.Dense(
      features, dtype=config.dtype, param_dtype=config.param_dtype,
      kernel_init=_init(config, axes), bias_init=_zeros((axes[1],)), name=name)


class Embeddings(nn.Module):
  """Token + learned position + segment embeddings, then LayerNorm and dropout."""
  config: BertConfig

  def setup(self):
    c = self.config
    embed = lambda n, name: nn.Embed(
        n, c.hidden_size, dtype=c.dtype, param_dtype=c.param_dtype,
        embedding_init=_init(c, (VOCAB, EMBED) if name == "word_embeddings" else (None, EMBED)),
        name=name)
    self.word_embeddings = embed(c.padded_vocab_size, "word_embeddings")  # [V', H]
    self.position_embeddings = embed(c.max_position_embeddings, "position_embeddings")
    self.token_type_embeddings = embed(c.type_vocab_size, "token_type_embeddings")
    self.layer_norm = LayerNorm(c, name="LayerNorm")

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    length = input_ids.shape[1]
    if length > self.config.max_position_embeddings:
      raise ValueError(f"Sequence length {length} exceeds max_position_embeddings="
                       f"{self.config.max_position_embeddings}")
    x = (self.word_embeddings(input_ids)  # [B, L, H]
         + self.position_embeddings(position_ids)  # Restart at 0 in each packed example.
         + self.token_type_embeddings(token_type_ids))
    x = self.layer_norm(x)
    return _dropout(self, x, self.config.hidden_dropout_prob, deterministic)

  def attend(self, x):
    """Scores of hidden states [..., H] against every row of the embedding table (the tied MLM
    decoder) -> [..., V'] float32: `dtype` inputs, float32 accumulation and output."""
    c = self.config
    table = self.word_embeddings.embedding  # [V', H]
    return jnp.einsum("...h,vh->...v", x.astype(c.dtype), table.astype(c.dtype),
                      preferred_element_type=jnp.float32)


class _Einsum(nn.Module):
  """A dense layer with a multi-dimensional kernel (per-head projections), via einsum.
  (flax's DenseGeneral builds its kernel flat and reshapes, which breaks logical axis boxes.)"""
  config: BertConfig
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str | None, ...]
  equation: str

  @nn.compact
  def __call__(self, x):
    c = self.config
    kernel = self.param("kernel", _init(c, self.kernel_axes), self.kernel_shape, c.param_dtype)
    bias = self.param("bias", _zeros(self.bias_axes), self.bias_shape, c.param_dtype)
    y = jnp.einsum(self.equation, x.astype(c.dtype), kernel.astype(c.dtype))
    return y + bias.astype(c.dtype)


class SelfAttention(nn.Module):
  """Bidirectional multi-head self-attention within segments, output projection included."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    """x [B, L, H], mask [B, 1, L, L] bool (query attends to key) -> [B, L, H]."""
    c = self.config
    heads = (c.num_attention_heads, c.head_dim)
    proj = lambda name: _Einsum(c, (c.hidden_size, *heads), (EMBED, HEADS, KV), heads,
                                (HEADS, KV), "blh,hnd->blnd", name=name)
    query = proj("query")(x)  # [B, L, N, D]
    key = proj("key")(x)
    value = proj("value")(x)
    dropout_rate = 0.0 if deterministic else c.attention_probs_dropout_prob
    if dropout_rate == 0.0 and c.attention_impl != "einsum":
      # The fused path; it has no attention-probability dropout.
      context = jax.nn.dot_product_attention(
          query, key, value, mask=mask, implementation=c.attention_impl)  # [B, L, N, D]
    else:
      context = einsum_attention(
          query, key, value, mask,
          lambda probs: _dropout(self, probs, dropout_rate, deterministic=False))
    return _Einsum(c, (*heads, c.hidden_size), (HEADS, KV, EMBED), (c.hidden_size,), (EMBED,),
                   "blnd,ndh->blh", name="output")(context)  # [B, L, H]


def einsum_attention(query, key, value, mask, dropout_probs=lambda probs: probs):
  """Attention written out: query/key/value [B, L, N, D] (compute dtype), mask [B, 1, L, L]
  bool -> context [B, L, N, D]. Scores and softmax in float32; `dropout_probs` maps the
  probabilities [B, N, L, L] f32 (attention dropout) before they weight the values."""
  scores = jnp.einsum("bqnd,bknd->bnqk", query, key,
                      preferred_element_type=jnp.float32) / jnp.sqrt(query.shape[-1])
  scores = jnp.where(mask, scores, _MASK_VALUE)
  probs = dropout_probs(jax.nn.softmax(scores, axis=-1))  # [B, N, L, L] f32
  return jnp.einsum("bnqk,bknd->bqnd", probs.astype(value.dtype), value)


class Layer(nn.Module):
  """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + MLP(x))."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    c = self.config
    dropout = lambda y: _dropout(self, y, c.hidden_dropout_prob, deterministic)
    attended = SelfAttention(c, name="attention")(x, mask, deterministic)
    x = LayerNorm(c, name="attention_LayerNorm")(x + dropout(attended))
    h = _dense(c, c.intermediate_size, (EMBED, MLP), "intermediate")(x)  # [B, L, F]
    h = nn.with_logical_constraint(_ACTIVATIONS[c.hidden_act](h), (BATCH, LENGTH, MLP))
    h = _dense(c, c.hidden_size, (MLP, EMBED), "output")(h)  # [B, L, H]
    x = LayerNorm(c, name="output_LayerNorm")(x + dropout(h))
    return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))


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
    self.layers = [Layer(c, name=f"layer_{i}") for i in range(c.num_hidden_layers)]
    if self.add_pooling_layer:
      self.pooler = _dense(c, c.hidden_size, (EMBED, None), "pooler")

  def __call__(self, input_ids, token_type_ids=None, segment_ids=None,
               deterministic: bool = True, *, position_ids=None, cls_positions=None):
    """input_ids [B, L]; token_type_ids [B, L] (A 0, B 1); segment_ids [B, L] (packed example
    1..K, 0 padding; an attention mask is the K = 1 case); position_ids [B, L] (default
    0..L-1); cls_positions [B, K] ([CLS] of each packed example; default: position 0 only,
    pooled [B, H])."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if segment_ids is None:
      segment_ids = jnp.ones_like(input_ids)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    mask = attention_mask_from_segments(segment_ids)  # [B, 1, L, L], built once.
    x = self.embeddings(input_ids, token_type_ids, position_ids, deterministic)  # [B, L, H]
    x = nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))
    for layer in self.layers:
      x = layer(x, mask, deterministic)
    if not self.add_pooling_layer:
      return x, None
    cls = x[:, 0] if cls_positions is None else gather_positions(x, cls_positions)
    return x, jnp.tanh(self.pooler(cls))  # [B, H] or [B, K, H]

  def attend(self, x):
    return self.embeddings.attend(x)


def gather_positions(sequence, positions):
  """sequence [B, L, H], positions [B, P] -> [B, P, H] (the original's gather_indexes)."""
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLMHead(nn.Module):
  """Dense + activation + LayerNorm, then the decoder tied to the word embeddings + own bias."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden, bert: BertModel):
    c = self.config
    h = _dense(c, c.hidden_size, (EMBED, None), "transform")(hidden)
    h = LayerNorm(c, name="transform_LayerNorm")(_ACTIVATIONS[c.hidden_act](h))
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


# --------------------------------------------------------------------------- vocabulary padding

# Params with one row per vocabulary entry (the tied decoder reuses the word embeddings).
VOCAB_PARAMS = (("bert", "embeddings", "word_embeddings", "embedding"), ("mlm", "bias"))


def _at(tree, path: tuple[str, ...]):
  """The leaf of a nested params dict at `path`, or None when a part of the path is absent."""
  for key in path:
    if not hasattr(tree, "keys") or key not in tree:
      return None
    tree = tree[key]
  return tree


def _replace_at(tree, path: tuple[str, ...], fn) -> dict:
  """Copy of a nested dict with `fn` applied to the leaf at `path` (the nodes along the path are
  copied, the rest shared); `tree` itself when the path is absent."""
  if path[0] not in tree:
    return tree
  value = tree[path[0]]
  return {**tree, path[0]: fn(value) if len(path) == 1 else _replace_at(value, path[1:], fn)}


def _with_vocab_rows(params, vocab_size: int, rows: int) -> dict:
  """Copy of a params tree whose `VOCAB_PARAMS` hold `rows` rows: their first `vocab_size`
  rows, then zeros. Parts absent from `params` (e.g. the MLM head) stay absent. numpy leaves
  stay numpy, jax arrays stay jax arrays."""
  def resize(path, table):
    if table.shape[0] < vocab_size:
      raise ValueError(f"{'/'.join(path)} has {table.shape[0]} rows, fewer than "
                       f"vocab_size={vocab_size}")
    xp = jnp if isinstance(table, jax.Array) else np
    padding = xp.zeros((rows - vocab_size, *table.shape[1:]), table.dtype)
    return xp.concatenate([table[:vocab_size], padding])

  for path in VOCAB_PARAMS:
    params = _replace_at(params, path, lambda table, path=path: resize(path, table))
  return dict(params)


def pad_vocab(params, config: BertConfig) -> dict:
  """Params of the same model at any vocabulary padding (e.g. the V real rows of a HuggingFace
  import) -> the layout of `config`: `config.padded_vocab_size` rows, zeros after the real V."""
  return _with_vocab_rows(params, config.vocab_size, config.padded_vocab_size)


def unpad_vocab(config: BertConfig, params) -> tuple[BertConfig, dict]:
  """(config, params) of a padded model -> the real-vocabulary model (vocab_pad_multiple 1,
  V rows), as exchange formats hold it."""
  real = dataclasses.replace(config, vocab_pad_multiple=1)
  return real, _with_vocab_rows(params, config.vocab_size, config.vocab_size)


def num_params(params, config: BertConfig) -> int:
  """Parameters of a params tree (arrays or shape structs) over the real vocabulary: the padded
  rows are layout, not model, so BERT-Base counts HuggingFace's 110,106,428 at any padding.
  Boxed (logically partitioned) leaves, as `init` returns them, count as their values."""
  params = nn.meta.unbox(params)
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  for path in VOCAB_PARAMS:
    table = _at(params, path)
    if table is not None:
      total -= (table.shape[0] - config.vocab_size) * int(np.prod(table.shape[1:]))
  return total
