"""HuggingFace ModernBERT (`ModernBertModel` / `ModernBertForMaskedLM`) state dicts and configs
<-> the modern encoder's params (`configs/modern_*.py`): rotary positions, a gated MLP, pre-LN,
no biases but the decoder's, local attention with a global layer every n.

The encoder's layers are stacked [S, ...] here and one module per layer there: q/k/v are three
[H, N, D] kernels here and one fused `Wqkv` [3H, H] there, the gated MLP's halves are `wi_0`
and `wi_1` here and one `Wi` [2F, H] there (first half the activation's input, second the
gate), and layer 0 has no attention norm there (the embeddings are normed already; the model
here skips its own, which stays at its init and is never exported). A ModernBERT that bert_jax
cannot compute (another RoPE type, an untied decoder, a layer pattern other than "global every
n from layer 0", ...) is refused naming the field.
"""

import math
import numbers
from typing import Any, Mapping

import numpy as np

from bert_jax.models.model import (ACTIVATIONS, MODERNBERT_ARCHITECTURE as ARCHITECTURE, POOLINGS,
                            BertConfig, is_modernbert, param_shapes)
from bert_jax.weights.layout import pad_vocab, unpad_vocab

MODEL_TYPE = "modernbert"
_LAYERS = ("bert", "encoder", "layers")
MAX_SIZE = 2**31 - 1  # As hf_bert: jax takes no larger Python int for an int32 argument.
# HF ModernBertConfig's defaults of the sizes bert_jax reads.
_SIZES = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
          "num_hidden_layers": 22, "num_attention_heads": 12, "max_position_embeddings": 8192}


def _whole(name: str, value: Any, low: int = 1) -> int:
  if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
      or value != int(value) or not low <= value <= MAX_SIZE):
    raise ValueError(f"{name} is {value!r}; it must be a whole number in [{low}, {MAX_SIZE}]")
  return int(value)


def _real(name: str, value: Any, high: float = math.inf) -> float:
  """A number in [0, high] (dropouts: 1), named when it is not."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value)
      or not 0 <= value <= high):
    raise ValueError(f"{name} is {value!r}; it must be a number in [0, {high}]")
  return float(value)


def _flag(hf_config: Mapping[str, Any], name: str, default: bool) -> bool:
  value = hf_config.get(name, default)
  if not isinstance(value, bool):
    raise ValueError(f"{name} is {value!r}; it must be true or false")
  return value


def _every_n(layer_types: Any, num_layers: int) -> int:
  """n of a layer_types list that is "full_attention" exactly at layers 0, n, 2n, ... (n =
  num_layers when layer 0 is the only global one; 1 when every layer is); a ValueError for any
  other pattern (bert_jax's local layers follow that rule)."""
  if not isinstance(layer_types, list) or len(layer_types) != num_layers:
    raise ValueError(f"layer_types is {str(layer_types)[:60]}: it must list one kind per layer "
                     f"(num_hidden_layers={num_layers})")
  unknown = sorted(set(map(str, layer_types)) - {"full_attention", "sliding_attention"})
  if unknown:
    raise ValueError(f"layer_types holds {unknown}: only full_attention and sliding_attention")
  full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
  every = full[1] if len(full) > 1 else num_layers
  if not full or full[0] != 0 or full != list(range(0, num_layers, max(every, 1))):
    raise ValueError(f"layer_types puts global (full_attention) layers at {full}: bert_jax "
                     "needs them at layers 0, n, 2n, ... (global_attn_every_n_layers)")
  return every


def _rope_theta(hf_config: Mapping[str, Any], kind: str, legacy: str, default: float) -> float:
  params = (hf_config.get("rope_parameters") or {}).get(kind) or {}
  if not isinstance(params, Mapping):
    raise ValueError(f"rope_parameters.{kind} is {params!r}; it must be an object")
  if params.get("rope_type", "default") != "default":
    raise ValueError(f"rope_parameters.{kind}.rope_type is {params['rope_type']!r}: bert_jax "
                     "computes the default RoPE only")
  theta = params.get("rope_theta", hf_config.get(legacy, default))
  if isinstance(theta, bool) or not isinstance(theta, numbers.Real) or not theta > 0:
    raise ValueError(f"rope_parameters.{kind}.rope_theta is {theta!r}; it must be a number > 0")
  return float(theta)


def _check_representable(hf_config: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
  """What bert_jax's modern encoder cannot compute, named by field: an untied or bias-less
  decoder, an activation bert_jax lacks, another head size, a RoPE scaling."""
  for name in ("tie_word_embeddings", "decoder_bias"):
    if not _flag(hf_config, name, True):
      raise ValueError(f"{name} is false: bert_jax's MLM decoder is tied to the word "
                       "embeddings and has a bias")
  act = hf_config.get("hidden_activation", "gelu")
  if act not in ACTIVATIONS:
    raise ValueError(f"hidden_activation is {act!r}: bert_jax has {sorted(ACTIVATIONS)}")
  if hf_config.get("classifier_activation", act) != act:
    raise ValueError(f"classifier_activation is {hf_config['classifier_activation']!r}: "
                     f"bert_jax's MLM head uses hidden_activation ({act!r})")
  heads = sizes["num_attention_heads"]
  if sizes["hidden_size"] % heads or hf_config.get("head_dim") not in (
      None, sizes["hidden_size"] // heads):
    raise ValueError(f"head_dim is {hf_config.get('head_dim')} with hidden_size="
                     f"{sizes['hidden_size']} and num_attention_heads={heads}: bert_jax's head "
                     "size is hidden_size / num_attention_heads, a whole number")
  if hf_config.get("rope_scaling"):
    raise ValueError(f"rope_scaling is {hf_config['rope_scaling']!r}: bert_jax computes the "
                     "default RoPE only")


def _layer_pattern(hf_config: Mapping[str, Any], layers: int) -> tuple[int, int]:
  """(local_attention, global_attn_every_n_layers) of bert_jax: (0, 1) when every layer is
  global."""
  if hf_config.get("layer_types") is not None:
    every = _every_n(hf_config["layer_types"], layers)
  else:  # Configs older than layer_types: the global layer every n from layer 0.
    every = _whole("global_attn_every_n_layers", hf_config.get("global_attn_every_n_layers", 3))
  if every == 1 or layers == 1:
    return 0, 1
  window = _whole("local_attention", hf_config.get("local_attention", 128), low=2)
  if window % 2:
    raise ValueError(f"local_attention is {window}: bert_jax needs an even window width (a "
                     "token sees local_attention / 2 rows each way)")
  return window, every


def config_from_hf(hf_config: Mapping[str, Any]) -> BertConfig:
  """A HF ModernBertConfig dict (`config.json`, HF's defaults for absent fields) -> the modern
  encoder's BertConfig; a ValueError naming the field bert_jax cannot represent."""
  if not isinstance(hf_config, Mapping):
    raise ValueError(f"the config is a {type(hf_config).__name__}, not an object of fields")
  sizes = {name: _whole(name, hf_config.get(name, default)) for name, default in _SIZES.items()}
  _check_representable(hf_config, sizes)
  window, every = _layer_pattern(hf_config, sizes["num_hidden_layers"])
  pooling = hf_config.get("classifier_pooling", "cls")
  if pooling not in POOLINGS:
    raise ValueError(f"classifier_pooling is {pooling!r}: bert_jax has {list(POOLINGS)}")
  return BertConfig(
      **sizes, type_vocab_size=0, hidden_act=hf_config.get("hidden_activation", "gelu"),
      layer_norm_eps=_real("norm_eps", hf_config.get("norm_eps", 1e-5)),
      position_embedding="rotary", mlp="glu", norm_placement="pre",
      attention_bias=_flag(hf_config, "attention_bias", False),
      mlp_bias=_flag(hf_config, "mlp_bias", False), norm_bias=_flag(hf_config, "norm_bias", False),
      classifier_bias=_flag(hf_config, "classifier_bias", False),
      global_rope_theta=_rope_theta(hf_config, "full_attention", "global_rope_theta", 160_000.0),
      local_rope_theta=_rope_theta(hf_config, "sliding_attention", "local_rope_theta", 10_000.0),
      local_attention=window, global_attn_every_n_layers=every,
      hidden_dropout_prob=_real("mlp_dropout", hf_config.get("mlp_dropout", 0.0), 1.0),
      attention_probs_dropout_prob=_real("attention_dropout",
                                         hf_config.get("attention_dropout", 0.0), 1.0),
      initializer_range=_real("initializer_range", hf_config.get("initializer_range", 0.02)),
      classifier_pooling=pooling)


def check_is_modernbert(config: BertConfig) -> None:
  """Refuses (naming the fields) a config HF's ModernBERT cannot compute."""
  wrong = {k: getattr(config, k) for k, v in ARCHITECTURE.items() if getattr(config, k) != v}
  if wrong:
    raise ValueError(f"HF's ModernBERT cannot compute this model ({wrong}; ModernBERT has "
                     f"{ARCHITECTURE})")


def config_to_hf(config: BertConfig, special_ids: Mapping[str, int | None]) -> dict[str, Any]:
  """The config.json of `config` as ModernBertForMaskedLM (HF v5 field names); `special_ids`:
  pad/cls/sep/bos/eos_token_id (None without a vocabulary: HF's defaults are ModernBERT's own
  50k vocabulary's)."""
  check_is_modernbert(config)
  layer_types = ["full_attention" if config.is_global_layer(i) else "sliding_attention"
                 for i in range(config.num_hidden_layers)]
  return {
      "architectures": ["ModernBertForMaskedLM"], "model_type": MODEL_TYPE,
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size,
      "num_hidden_layers": config.num_hidden_layers,
      "num_attention_heads": config.num_attention_heads, "hidden_activation": config.hidden_act,
      "classifier_activation": config.hidden_act,
      "max_position_embeddings": config.max_position_embeddings,
      "norm_eps": config.layer_norm_eps, "norm_bias": config.norm_bias,
      "attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias,
      "classifier_bias": config.classifier_bias, "decoder_bias": True,
      "tie_word_embeddings": True, "local_attention": config.local_attention or 2,
      "layer_types": layer_types, "initializer_range": config.initializer_range,
      "rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_theta},
          "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}},
      "classifier_pooling": config.classifier_pooling, "attention_dropout": 0.0,
      "mlp_dropout": 0.0, "embedding_dropout": 0.0, "dtype": "float32", **special_ids}


# --------------------------------------------------------------------------------- params


def _names(config: BertConfig) -> dict[str, tuple[tuple[str, ...], int | None]]:
  """HF name -> (path here, layer index or None) of every parameter but the fused ones."""
  names = {"embeddings.tok_embeddings.weight": (("bert", "embeddings", "word_embeddings",
                                                 "embedding"), None)}
  norms = [("embeddings.norm", ("bert", "embeddings", "norm"), None),
           ("final_norm", ("bert", "encoder", "final_norm"), None),
           ("head.norm", ("mlm", "transform_norm"), None)]
  for i in range(config.num_hidden_layers):
    if i:  # Layer 0 has no attention norm in ModernBERT.
      norms.append((f"layers.{i}.attn_norm", (*_LAYERS, "attention_norm"), i))
    norms.append((f"layers.{i}.mlp_norm", (*_LAYERS, "mlp_norm"), i))
  for hf, path, layer in norms:
    names[f"{hf}.weight"] = ((*path, "scale"), layer)
    if config.norm_bias:
      names[f"{hf}.bias"] = ((*path, "bias"), layer)
  return names


def _linear_names(config: BertConfig) -> dict[str, tuple[tuple[str, ...], int | None, bool]]:
  """HF Linear name (no .weight) -> (path here, layer, has a bias) of the unfused linears."""
  names = {"head.dense": (("mlm", "transform"), None, config.classifier_bias)}
  for i in range(config.num_hidden_layers):
    names[f"layers.{i}.attn.Wo"] = ((*_LAYERS, "attention", "output"), i, config.attention_bias)
    names[f"layers.{i}.mlp.Wo"] = ((*_LAYERS, "mlp", "wo"), i, config.mlp_bias)
  return names


def _get(params, path, layer):
  node = params
  for key in path:
    if key not in node:
      raise ValueError(f"params lack {'/'.join(path)}")
    node = node[key]
  array = np.asarray(node, np.float32)
  return array if layer is None else array[layer]


def params_to_hf(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """The modern encoder's params (with its MLM head; `config`'s vocabulary padding) ->
  ModernBertForMaskedLM's state dict (numpy, the real vocabulary, `decoder.weight` tied)."""
  config, params = unpad_vocab(config, params)
  h, n, d = config.hidden_size, config.num_attention_heads, config.head_dim
  out = {name: _get(params, path, layer) for name, (path, layer) in _names(config).items()}
  for name, (path, layer, bias) in _linear_names(config).items():
    kernel = _get(params, (*path, "kernel"), layer)
    out[f"{name}.weight"] = kernel.reshape(-1, kernel.shape[-1]).T
    if bias:
      out[f"{name}.bias"] = _get(params, (*path, "bias"), layer).reshape(-1)
  attention, mlp = (*_LAYERS, "attention"), (*_LAYERS, "mlp")
  for i in range(config.num_hidden_layers):
    qkv = [_get(params, (*attention, p, "kernel"), i).reshape(h, n * d).T
           for p in ("query", "key", "value")]
    out[f"layers.{i}.attn.Wqkv.weight"] = np.concatenate(qkv)  # [3H, H]
    if config.attention_bias:
      out[f"layers.{i}.attn.Wqkv.bias"] = np.concatenate(
          [_get(params, (*attention, p, "bias"), i).reshape(-1) for p in ("query", "key",
                                                                           "value")])
    halves = [_get(params, (*mlp, p, "kernel"), i).T for p in ("wi_0", "wi_1")]
    out[f"layers.{i}.mlp.Wi.weight"] = np.concatenate(halves)  # [2F, H]
    if config.mlp_bias:
      out[f"layers.{i}.mlp.Wi.bias"] = np.concatenate(
          [_get(params, (*mlp, p, "bias"), i) for p in ("wi_0", "wi_1")])
  state = {(f"model.{k}" if not k.startswith("head.") else k): np.ascontiguousarray(v)
           for k, v in out.items()}
  state["decoder.bias"] = _get(params, ("mlm", "bias"), None)
  state["decoder.weight"] = state["model.embeddings.tok_embeddings.weight"]
  return state


def _normalise_keys(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """ModernBertForMaskedLM keys (`model.` prefix, `head.`, `decoder.`) or ModernBertModel keys
  -> the encoder's without the prefix; numpy arrays."""
  out = {}
  for key, value in state.items():
    if hasattr(value, "detach"):  # A torch tensor, without importing torch.
      value = value.detach().cpu().float().numpy()
    out[key[len("model."):] if key.startswith("model.") else key] = np.asarray(value, np.float32)
  return out


def params_from_hf(state: Mapping[str, Any], config: BertConfig) -> dict:
  """ModernBertModel / ModernBertForMaskedLM state dict -> the modern encoder's params in
  `config`'s vocabulary padding (heads the checkpoint lacks stay absent; unknown keys, missing
  keys and wrong shapes are ValueErrors naming the key)."""
  padded, config = config, unpad_vocab(config, {})[0]
  tensors = _normalise_keys(state)
  shapes = param_shapes(config)
  has_head = any(k.startswith(("head.", "decoder.")) for k in tensors)
  h, n, d, f = config.hidden_size, config.num_attention_heads, config.head_dim, \
      config.intermediate_size
  stacked: dict[tuple[str, ...], dict[int, np.ndarray]] = {}
  flat: dict[tuple[str, ...], np.ndarray] = {}

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in tensors:
      raise ValueError(f"Missing key in the checkpoint: {name}")
    array = tensors.pop(name)
    if array.shape != shape:
      raise ValueError(f"Shape mismatch for {name}: checkpoint has {array.shape}, the config "
                       f"expects {shape}")
    return array

  def put(path, layer, value):
    if layer is None:
      flat[path] = value
    else:
      stacked.setdefault(path, {})[layer] = value

  for name, (path, layer) in _names(config).items():
    if path[0] == "mlm" and not has_head:
      continue
    shape = shapes[path] if layer is None else shapes[path][1:]
    put(path, layer, take(name, shape))
  for name, (path, layer, bias) in _linear_names(config).items():
    if path[0] == "mlm" and not has_head:
      continue
    kernel_shape = shapes[(*path, "kernel")][0 if layer is None else 1:]
    fan_out = kernel_shape[-1]
    weight = take(f"{name}.weight", (fan_out, int(np.prod(kernel_shape[:-1]))))
    put((*path, "kernel"), layer, weight.T.reshape(kernel_shape))
    if bias:
      put((*path, "bias"), layer, take(f"{name}.bias", (fan_out,)))
  _take_fused(take, put, config, h, n, d, f)
  if has_head:
    flat[("mlm", "bias")] = take("decoder.bias", (config.vocab_size,))
    decoder = tensors.pop("decoder.weight", None)
    if decoder is not None and not np.allclose(
        decoder, flat[("bert", "embeddings", "word_embeddings", "embedding")], atol=1e-6):
      raise ValueError("decoder.weight differs from the word embeddings; bert_jax ties them")
  if tensors:
    raise ValueError(f"Unknown keys in the checkpoint (not part of ModernBERT): "
                     f"{sorted(tensors)[:10]}")
  # Layer 0's attention norm: unused by the model, ones as at init.
  stacked.setdefault((*_LAYERS, "attention_norm", "scale"), {})[0] = np.ones((h,), np.float32)
  if config.norm_bias:
    stacked.setdefault((*_LAYERS, "attention_norm", "bias"), {})[0] = np.zeros((h,), np.float32)
  for path, layers in stacked.items():
    flat[path] = np.stack([layers[i] for i in range(config.num_hidden_layers)])
  params: dict = {}
  for path, value in flat.items():
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return pad_vocab(params, padded)


def _take_fused(take, put, config: BertConfig, h: int, n: int, d: int, f: int) -> None:
  """The fused Wqkv and Wi of every layer, split into this model's kernels."""
  attention, mlp = (*_LAYERS, "attention"), (*_LAYERS, "mlp")
  for i in range(config.num_hidden_layers):
    qkv = take(f"layers.{i}.attn.Wqkv.weight", (3 * h, h))
    for part, rows in zip(("query", "key", "value"), np.split(qkv, 3)):
      put((*attention, part, "kernel"), i, rows.T.reshape(h, n, d))
    if config.attention_bias:
      bias = take(f"layers.{i}.attn.Wqkv.bias", (3 * h,))
      for part, values in zip(("query", "key", "value"), np.split(bias, 3)):
        put((*attention, part, "bias"), i, values.reshape(n, d))
    wi = take(f"layers.{i}.mlp.Wi.weight", (2 * f, h))
    for part, rows in zip(("wi_0", "wi_1"), np.split(wi, 2)):
      put((*mlp, part, "kernel"), i, rows.T)
    if config.mlp_bias:
      bias = take(f"layers.{i}.mlp.Wi.bias", (2 * f,))
      for part, values in zip(("wi_0", "wi_1"), np.split(bias, 2)):
        put((*mlp, part, "bias"), i, values)
