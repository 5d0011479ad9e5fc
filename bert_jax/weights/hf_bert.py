"""HuggingFace BERT state dicts <-> bert_jax params: the one name mapping.

One table (`_param_table`) lists every parameter once: its HuggingFace name, its path in the
bert_jax tree (with the layer index for the encoder's stacked [S, ...] layer params) and the
layout change between them (PyTorch `Linear` stores [out, in]; Flax stores [in, out], with
attention kernels split per head). Both directions read the same table. HuggingFace state dicts
hold the real vocabulary; bert_jax params follow their config's padding
(`BertConfig.vocab_pad_multiple`; `layout.pad_vocab` / `layout.unpad_vocab` at the boundary).
"""

import dataclasses
import json
import math
import numbers
import re
import warnings
from typing import Any, Mapping

import numpy as np

from bert_jax.models.model import BertConfig, param_shapes
from bert_jax.weights.layout import pad_vocab, unpad_vocab

# HuggingFace keys that are buffers, not parameters: accepted and ignored.
_BUFFER_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
# Parameters of the pretraining heads (outside `bert`), by head, for the "missing heads" note.
_HEADS = {"MLM head": "cls.predictions.", "NSP head": "cls.seq_relationship."}


@dataclasses.dataclass(frozen=True)
class _Entry:
  hf_name: str  # BertForPreTraining name.
  path: tuple[str, ...]  # Path in the bert_jax params tree.
  layout: str  # "copy", "linear", "heads_in" (q/k/v kernel), "heads_bias", "heads_out".
  layer: int | None = None  # Index into the stacked [S, ...] leaf at `path` (encoder layers).


def _param_table(config: BertConfig) -> list[_Entry]:
  entries = []

  def add(hf, path, layout="copy", layer=None):
    entries.append(_Entry(hf, tuple(path.split("/")), layout, layer))

  def layer_norm(hf, path, layer=None):
    add(f"{hf}.weight", f"{path}/scale", layer=layer)
    add(f"{hf}.bias", f"{path}/bias", layer=layer)

  def linear(hf, path, kernel_layout="linear", bias_layout="copy", layer=None):
    add(f"{hf}.weight", f"{path}/kernel", kernel_layout, layer)
    add(f"{hf}.bias", f"{path}/bias", bias_layout, layer)

  e = "bert.embeddings"
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    add(f"{e}.{name}.weight", f"bert/embeddings/{name}/embedding")
  layer_norm(f"{e}.LayerNorm", "bert/embeddings/norm")
  ours = "bert/encoder/layers"
  for i in range(config.num_hidden_layers):
    hf = f"bert.encoder.layer.{i}"
    for name in ("query", "key", "value"):
      linear(f"{hf}.attention.self.{name}", f"{ours}/attention/{name}", "heads_in", "heads_bias",
             layer=i)
    linear(f"{hf}.attention.output.dense", f"{ours}/attention/output", "heads_out", layer=i)
    layer_norm(f"{hf}.attention.output.LayerNorm", f"{ours}/attention_norm", layer=i)
    linear(f"{hf}.intermediate.dense", f"{ours}/mlp/intermediate", layer=i)
    linear(f"{hf}.output.dense", f"{ours}/mlp/output", layer=i)
    layer_norm(f"{hf}.output.LayerNorm", f"{ours}/mlp_norm", layer=i)
  linear("bert.pooler.dense", "bert/pooler")
  linear("cls.predictions.transform.dense", "mlm/transform")
  layer_norm("cls.predictions.transform.LayerNorm", "mlm/transform_norm")
  add("cls.predictions.bias", "mlm/bias")
  linear("cls.seq_relationship", "nsp")
  return entries


def _hf_shape(entry: _Entry, config: BertConfig, ours_shape: tuple[int, ...]) -> tuple[int, ...]:
  if entry.layout == "linear":
    return ours_shape[::-1]
  if entry.layout == "heads_in":  # [H, N, D] <- [N*D, H]
    return (ours_shape[1] * ours_shape[2], ours_shape[0])
  if entry.layout == "heads_bias":
    return (ours_shape[0] * ours_shape[1],)
  if entry.layout == "heads_out":  # [N, D, H] <- [H, N*D]
    return (ours_shape[2], ours_shape[0] * ours_shape[1])
  return ours_shape


def _entry_shape(entry: _Entry, shapes) -> tuple[int, ...]:
  """The bert_jax shape of one entry: the leaf's, or one layer of a stacked leaf."""
  shape = shapes[entry.path]
  return shape if entry.layer is None else shape[1:]


def _to_ours(array: np.ndarray, entry: _Entry, ours_shape) -> np.ndarray:
  if entry.layout in ("linear", "heads_in", "heads_out"):
    return array.T.reshape(ours_shape)
  return array.reshape(ours_shape)


def _to_hf(array: np.ndarray, entry: _Entry, hf_shape) -> np.ndarray:
  if entry.layout in ("linear", "heads_in", "heads_out"):
    return array.reshape(hf_shape[::-1]).T
  return array.reshape(hf_shape)


# Sizes of the model: whole numbers in [1, MAX_SIZE] (768.0 passes as 768: some exporters write
# floats). MAX_SIZE: jax takes larger Python ints for no int32 argument (an OverflowError).
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size", "max_position_embeddings", "type_vocab_size")
MAX_SIZE = 2**31 - 1
# Real-valued fields: name -> (lowest, highest) allowed.
_REAL_FIELDS = {"hidden_dropout_prob": (0.0, 1.0), "attention_probs_dropout_prob": (0.0, 1.0),
                "initializer_range": (0.0, math.inf), "layer_norm_eps": (0.0, math.inf)}


def _json_value(value: Any) -> str:
  """A config value as its JSON text (null, true, "768"), cut short when long."""
  text = json.dumps(value, default=repr)
  return text if len(text) <= 40 else text[:37] + "..."


def _checked_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """The sizes and real-valued fields present in `hf_config`, checked (a ValueError naming the
  field and its JSON value: a null, a string or 768.5 would otherwise surface as a TypeError
  deep in the model, or as a hang when building a billion layers). Sizes come back as ints."""
  checked = {}
  for name in SIZE_FIELDS:
    if name not in hf_config:
      continue
    value = hf_config[name]
    low = 0 if name == "type_vocab_size" else 1  # 0: no token types (bert_jax's own configs).
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
        or not math.isfinite(value) or value != int(value) or not low <= value <= MAX_SIZE):
      raise ValueError(f"{name} is {_json_value(value)}; it must be a whole number in [{low}, "
                       f"{MAX_SIZE}]")
    checked[name] = int(value)
  for name, (low, high) in _REAL_FIELDS.items():
    if name not in hf_config:
      continue
    value = hf_config[name]
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
        or not low <= value <= high):
      bound = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
      raise ValueError(f"{name} is {_json_value(value)}; it must be a number {bound}")
  if "hidden_size" in checked or "num_attention_heads" in checked:
    defaults = BertConfig()  # HF's defaults fill what is absent.
    hidden = checked.get("hidden_size", defaults.hidden_size)
    heads = checked.get("num_attention_heads", defaults.num_attention_heads)
    if hidden % heads:
      raise ValueError(f"hidden_size={hidden} is not divisible by num_attention_heads={heads}")
  return checked


# What HF's BertModel computes: the fields a BERT export needs at these values.
BERT_ARCHITECTURE = {"position_embedding": "learned", "mlp": "dense", "norm_placement": "post",
                     "norm": "layer_norm", "attention_bias": True, "mlp_bias": True,
                     "norm_bias": True, "classifier_bias": True, "local_attention": 0}


def check_is_bert(config: BertConfig) -> None:
  """Refuses (naming the fields) a config HF's BERT classes cannot compute."""
  wrong = {k: getattr(config, k) for k, v in BERT_ARCHITECTURE.items() if getattr(config, k) != v}
  if config.type_vocab_size < 1:
    wrong["type_vocab_size"] = config.type_vocab_size
  if wrong:
    raise ValueError(f"HF's BERT cannot compute this model ({wrong}; BERT has "
                     f"{BERT_ARCHITECTURE} and type_vocab_size >= 1)")


def config_from_hf(hf_config: Mapping[str, Any]) -> BertConfig:
  """A HuggingFace BERT `config.json` dict (or bert_jax's own `bert_config.json`, which holds
  every BertConfig field) -> BertConfig (HF's defaults for absent fields); a ValueError naming
  the field when one is missing its type or range."""
  if not isinstance(hf_config, Mapping):
    raise ValueError(f"the config is a {type(hf_config).__name__}, not an object of fields")
  model_type = hf_config.get("model_type", "bert")
  if model_type != "bert":
    raise ValueError(f"config model_type is {model_type!r}, not 'bert'")
  position_type = hf_config.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise ValueError(f"position_embedding_type={position_type!r} is not supported (only "
                     "BERT's learned absolute positions)")
  fields = [f.name for f in dataclasses.fields(BertConfig)
            if f.name not in ("dtype", "param_dtype")]
  checked = _checked_fields(hf_config)
  return BertConfig(**{name: checked.get(name, hf_config[name]) for name in fields
                       if name in hf_config})


def _as_numpy(value) -> np.ndarray:
  if hasattr(value, "detach"):  # A torch tensor: no torch import needed.
    value = value.detach().cpu().float().numpy() if str(value.dtype) == "torch.bfloat16" \
        else value.detach().cpu().numpy()
  return np.asarray(value)


def _normalise_keys(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Accepts BertModel keys (no prefix) and BertForPreTraining/MaskedLM keys (`bert.` prefix)."""
  keys = list(state_dict)
  has_prefix = any(k.startswith(("bert.", "cls.")) for k in keys)
  out = {}
  for key, value in state_dict.items():
    if key.endswith(_BUFFER_SUFFIXES):
      continue
    name = key if has_prefix or key.startswith("cls.") else f"bert.{key}"
    out[name] = _as_numpy(value)
  return out


def params_from_hf(state_dict: Mapping[str, Any], config: BertConfig) -> dict:
  """HF `BertModel`/`BertForPreTraining`/`BertForMaskedLM` state dict -> bert_jax params (in
  `config`'s vocabulary padding; the state dict has the real vocabulary).

  Values may be numpy arrays or torch tensors. Parameters of heads the checkpoint lacks (the
  pooler, MLM or NSP head) are left out and named in a warning; they are never invented.
  Unknown keys, missing encoder keys and shape mismatches raise a ValueError naming the key.
  """
  padded_config, config = config, dataclasses.replace(config, vocab_pad_multiple=1)
  tensors = _normalise_keys(state_dict)
  check_layer_count(tensors, config)  # Before the table: a config may claim a billion layers.
  shapes = param_shapes(config)
  table = _param_table(config)
  known = {entry.hf_name for entry in table}
  decoder_weight = tensors.pop("cls.predictions.decoder.weight", None)
  decoder_bias = tensors.pop("cls.predictions.decoder.bias", None)
  if decoder_bias is not None and "cls.predictions.bias" not in tensors:
    tensors["cls.predictions.bias"] = decoder_bias
  unknown = sorted(set(tensors) - known)
  if unknown:
    raise ValueError(f"Unknown keys in the checkpoint (not part of BERT): {unknown[:10]}"
                     + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""))

  # Optional groups (pooler, heads) must be present whole or absent whole.
  groups = {"pooler": "bert.pooler.", **_HEADS}
  absent = []
  for group, prefix in groups.items():
    names = [e.hf_name for e in table if e.hf_name.startswith(prefix)]
    present = [n for n in names if n in tensors]
    if not present:
      absent.append(group)
    elif len(present) < len(names):
      raise ValueError(f"Missing key in the checkpoint: "
                       f"{next(n for n in names if n not in tensors)} (the {group} is incomplete)")
  skipped = tuple(groups[g] for g in absent)

  flat: dict[tuple[str, ...], Any] = {}  # Path -> array, or {layer: array} for stacked leaves.
  for entry in table:
    if entry.hf_name.startswith(skipped):
      continue
    if entry.hf_name not in tensors:
      raise ValueError(f"Missing key in the checkpoint: {entry.hf_name}")
    array = tensors[entry.hf_name]
    ours_shape = _entry_shape(entry, shapes)
    expected = _hf_shape(entry, config, ours_shape)
    if tuple(array.shape) != expected:
      raise ValueError(f"Shape mismatch for {entry.hf_name}: checkpoint has {tuple(array.shape)},"
                       f" the config expects {expected}")
    ours = _to_ours(array, entry, ours_shape).astype(config.param_dtype)
    if entry.layer is None:
      flat[entry.path] = ours
    else:
      flat.setdefault(entry.path, {})[entry.layer] = ours
  params: dict = {}
  for path, value in flat.items():
    if isinstance(value, dict):  # The layers of one stacked leaf, 0 .. S-1.
      value = np.stack([value[i] for i in range(len(value))])
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value

  if decoder_weight is not None and not np.allclose(
      decoder_weight, tensors["bert.embeddings.word_embeddings.weight"], atol=1e-6):
    raise ValueError("cls.predictions.decoder.weight differs from the word embeddings; bert_jax "
                     "ties the MLM decoder to the embeddings as BERT does")
  if absent:
    warnings.warn(f"The checkpoint has no {', '.join(absent)}; only the parameters present were "
                  "converted (the missing ones must be initialised, e.g. by fine-tuning)",
                  stacklevel=2)
  return pad_vocab(params, padded_config)


_LAYER_KEY = re.compile(r"^bert\.encoder\.layer\.(\d+)\.")


def check_layer_count(tensors: Mapping[str, Any], config: BertConfig) -> None:
  """Refuses a state dict (BertForPreTraining names) whose encoder layers are not exactly
  0 .. num_hidden_layers - 1, before anything is built per layer."""
  layers = {int(m.group(1)) for m in map(_LAYER_KEY.match, tensors) if m}
  n = config.num_hidden_layers
  # The first absent index is at most len(layers): never a loop or a set over `n` (it may be
  # a billion).
  first_absent = next(i for i in range(len(layers) + 1) if i not in layers)
  if first_absent < n:
    raise ValueError(f"Missing key in the checkpoint: bert.encoder.layer.{first_absent}.* (the "
                     f"config says num_hidden_layers={n}, the checkpoint has {len(layers)} "
                     "layers)")
  extra = sorted(i for i in layers if i >= n)
  if extra:
    raise ValueError(f"Unknown keys in the checkpoint (not part of BERT): "
                     f"bert.encoder.layer.{extra[0]}.* (the config says num_hidden_layers={n})")


def params_to_hf(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """bert_jax `BertForPreTraining` params (in `config`'s vocabulary padding) -> state dict with
  BertForPreTraining names (numpy, the real vocabulary), including the tied decoder weight and
  bias that `load_state_dict(strict=True)` expects."""
  check_is_bert(config)
  config, params = unpad_vocab(config, params)
  shapes = param_shapes(config)
  out = {}
  for entry in _param_table(config):
    node = params
    try:
      for key in entry.path:
        node = node[key]
    except KeyError as error:
      raise ValueError(f"params lack {'/'.join(entry.path)} (needed for {entry.hf_name})") \
          from error
    array = np.asarray(node, dtype=np.float32)
    if tuple(array.shape) != shapes[entry.path]:
      raise ValueError(f"Shape mismatch for {'/'.join(entry.path)}: {tuple(array.shape)} vs "
                       f"{shapes[entry.path]} from the config")
    if entry.layer is not None:
      array = array[entry.layer]
    out[entry.hf_name] = np.ascontiguousarray(
        _to_hf(array, entry, _hf_shape(entry, config, _entry_shape(entry, shapes))))
  out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
  out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
  return out
