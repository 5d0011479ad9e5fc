"""Pretrained BERTs in and out: the bert_jax pretrained directory, HuggingFace and TF imports,
HuggingFace export, and BERT's [CLS] A [SEP] B [SEP] input encoding.

A bert_jax pretrained directory holds
- `params/`: the `BertForPreTraining` params tree (orbax, float32), heads the source lacked
  simply absent (never invented);
- `bert_config.json`: the model config with HuggingFace's field names;
- `vocab/`: the vocabulary (`Vocab.save`), when known;
- `bert_jax_pretrained.json`: format version, which heads are present, where it came from.

`load_pretrained(path)` reads that, a training workdir (params of its latest checkpoint), a
HuggingFace directory or a google-research/bert TF checkpoint, and returns float32 numpy params
with a float32 `BertConfig` (`dataclasses.replace(config, dtype="bfloat16")` for bf16 compute).
Heads that are missing are named in a warning; `heads_present(params)` tells, and
`fill_missing_heads` takes them from freshly initialised params when the caller decides to.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import warnings
from typing import Any, Mapping

import numpy as np

from bert_jax import convert
from bert_jax.data.vocab import Vocab
from bert_jax.model import BertConfig

logger = logging.getLogger(__name__)

FORMAT_NAME = "bert_jax_pretrained"
FORMAT_VERSION = 1
FORMAT_FILE = "bert_jax_pretrained.json"
CONFIG_FILE = "bert_config.json"
PARAMS_DIR = "params"
VOCAB_DIR = "vocab"

# Optional parts of the params tree: name -> path prefix.
HEADS = {"pooler": ("bert", "pooler"), "mlm": ("mlm",), "nsp": ("nsp",)}
_HEAD_TITLES = {"pooler": "pooler", "mlm": "MLM head", "nsp": "NSP head"}

HF_CONFIG = "config.json"
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")
HF_VOCABS = ("tokenizer.json", "vocab.txt")  # tokenizer.json first, as BertTokenizerFast.
TF_CONFIG = "bert_config.json"
TF_VOCAB = "vocab.txt"


# ------------------------------------------------------------------------------------ params


def _flatten(params: Mapping, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
  flat = {}
  for key, value in params.items():
    if isinstance(value, Mapping):
      flat.update(_flatten(value, prefix + (str(key),)))
    else:
      flat[prefix + (str(key),)] = value
  return flat


def _unflatten(flat: Mapping[tuple[str, ...], Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def _head_of(path: tuple[str, ...]) -> str | None:
  for head, prefix in HEADS.items():
    if path[:len(prefix)] == prefix:
      return head
  return None


def heads_present(params: Mapping) -> dict[str, bool]:
  """{"pooler": bool, "mlm": bool, "nsp": bool}: which optional parts the params tree holds."""
  present = {_head_of(path) for path in _flatten(params)}
  return {head: head in present for head in HEADS}


def check_params(params: Mapping, config: BertConfig, source: str) -> dict:
  """float32 numpy copy of `params` after checking it against `config`: every encoder
  parameter present, each head whole or absent, no unknown path, every shape right."""
  import jax  # Local: jax arrays (maybe sharded) come back to the host here.
  import flax.linen as nn

  expected = convert._expected_shapes(config)  # pylint: disable=protected-access
  flat = _flatten(nn.meta.unbox(params))
  unknown = sorted("/".join(p) for p in set(flat) - set(expected))
  if unknown:
    raise ValueError(f"{source}: parameters that BertForPreTraining does not have: {unknown[:10]}")
  for head in HEADS:
    names = [p for p in expected if _head_of(p) == head]
    have = [p for p in names if p in flat]
    if have and len(have) < len(names):
      missing = next("/".join(p) for p in names if p not in flat)
      raise ValueError(f"{source}: the {_HEAD_TITLES[head]} is incomplete (no {missing})")
  out = {}
  for path, shape in expected.items():
    if path not in flat:
      if _head_of(path) is None:
        raise ValueError(f"{source}: missing parameter {'/'.join(path)}")
      continue
    array = np.asarray(jax.device_get(flat[path]), dtype=np.float32)
    if array.shape != shape:
      raise ValueError(f"{source}: {'/'.join(path)} has shape {array.shape}, the config "
                       f"expects {shape}")
    if not np.isfinite(array).all():
      raise ValueError(f"{source}: {'/'.join(path)} holds NaN or infinite values")
    out[path] = array
  return _unflatten(out)


def fill_missing_heads(params: Mapping, initial_params: Mapping) -> dict:
  """`params` plus the heads it lacks, taken from `initial_params` (e.g. a fresh
  `BertForPreTraining.init`), for continued pretraining of an encoder-only checkpoint. The
  caller decides to initialise them; this logs which ones it took."""
  import flax.linen as nn

  flat = _flatten(params)
  missing = [h for h, present in heads_present(params).items() if not present]
  for path, value in _flatten(nn.meta.unbox(initial_params)).items():
    if _head_of(path) in missing:
      flat[path] = value
  if missing:
    logger.info("Initialised the %s from the given initial params",
                ", ".join(_HEAD_TITLES[h] for h in missing))
  return _unflatten(flat)


def _warn_missing_heads(params: Mapping, source: str) -> None:
  missing = [_HEAD_TITLES[h] for h, present in heads_present(params).items() if not present]
  if missing:
    warnings.warn(f"{source} has no {', '.join(missing)}: those parameters are absent from the "
                  "params (never invented); initialise them before use, e.g. by fine-tuning",
                  UserWarning, stacklevel=3)


def _config_from_dict(values: Mapping[str, Any], source: str) -> BertConfig:
  """HF-named config dict -> float32 BertConfig (dtype fields and unknown fields dropped)."""
  try:
    return convert.config_from_hf(values)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{source}: {e}") from e


def _config_dict(config: BertConfig) -> dict[str, Any]:
  values = dataclasses.asdict(config)
  values.pop("dtype")
  values.pop("param_dtype")
  return values


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e


# ------------------------------------------------------------------------------- orbax I/O


def _restore_numpy(directory: str, subtree: str | None = None) -> dict:
  """An orbax PyTree checkpoint (or one subtree of it, e.g. a TrainState's `params`) as numpy,
  without knowing the rest of its structure (no optimizer state needed)."""
  import jax
  import orbax.checkpoint as ocp

  from etils import epath  # orbax's path type.

  checkpointer = ocp.PyTreeCheckpointer()
  try:
    # The handler's metadata: the tree alone (the checkpointer's also looks for step metadata,
    # which lives one level up in a training checkpoint, and warns that it is missing).
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(directory))
    if subtree is not None:
      if subtree not in tree:
        raise ValueError(f"no '{subtree}' in the checkpoint (it holds {sorted(tree)})")
      tree = {subtree: tree[subtree]}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
        item=tree, restore_args=restore_args, partial_restore=subtree is not None))
  except (OSError, ValueError, KeyError, RuntimeError) as e:
    raise ValueError(f"cannot restore the orbax checkpoint {directory} ({e})") from e
  return restored[subtree] if subtree is not None else restored


# ------------------------------------------------------------------------- bert_jax format


def _as_vocab(vocab_dir: str | Vocab | None) -> Vocab | None:
  if vocab_dir is None or isinstance(vocab_dir, Vocab):
    return vocab_dir
  return Vocab.load(vocab_dir)


def save_pretrained(directory: str, params: Mapping, model_config: BertConfig,
                    vocab_dir: str | Vocab | None, note: str = "",
                    overwrite: bool = False) -> str:
  """Writes a bert_jax pretrained directory (see the module docstring); returns its path.

  `params` may lack heads (then recorded as absent); `vocab_dir` is a vocabulary directory or
  file (anything `Vocab.load` reads) or a loaded `Vocab`, or None when there is none.
  """
  import orbax.checkpoint as ocp

  directory = os.path.abspath(directory)
  params = check_params(params, model_config, "params to save")
  vocab = _as_vocab(vocab_dir)
  if vocab is not None and vocab.size > model_config.vocab_size:
    raise ValueError(f"The vocabulary has {vocab.size} tokens but the model only "
                     f"vocab_size={model_config.vocab_size} embeddings")
  if os.path.exists(directory) and os.listdir(directory):
    if not overwrite:
      raise ValueError(f"{directory} exists and is not empty; choose another directory or "
                       "pass overwrite=True (--overwrite)")
    shutil.rmtree(directory)
  os.makedirs(directory, exist_ok=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(directory, PARAMS_DIR), params)
    checkpointer.wait_until_finished()
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump({**_config_dict(model_config), "model_type": "bert"}, f, indent=2)
  if vocab is not None:
    vocab.save(os.path.join(directory, VOCAB_DIR))
  info = {
      "format": FORMAT_NAME,
      "format_version": FORMAT_VERSION,
      "heads": heads_present(params),
      "source": note,
      "param_dtype": "float32",
      "num_params": int(sum(x.size for x in _flatten(params).values())),
      "vocab": None if vocab is None else {"kind": vocab.kind, "size": vocab.size,
                                           "lowercase": vocab.lowercase},
  }
  with open(os.path.join(directory, FORMAT_FILE), "w") as f:
    json.dump(info, f, indent=2)
  return directory


def _load_bert_jax(directory: str) -> tuple[BertConfig, dict, Vocab | None]:
  info = _read_json(os.path.join(directory, FORMAT_FILE))
  if info.get("format") != FORMAT_NAME or info.get("format_version", 0) > FORMAT_VERSION:
    raise ValueError(f"{directory}: {FORMAT_FILE} says format {info.get('format')!r} version "
                     f"{info.get('format_version')}; this bert_jax reads {FORMAT_NAME} version "
                     f"<= {FORMAT_VERSION}")
  config_file = os.path.join(directory, CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise ValueError(f"{directory}: no {CONFIG_FILE}")
  config = _config_from_dict(_read_json(config_file), config_file)
  params = check_params(_restore_numpy(os.path.join(directory, PARAMS_DIR)), config,
                        os.path.join(directory, PARAMS_DIR))
  recorded = info.get("heads")
  if recorded is not None and recorded != heads_present(params):
    raise ValueError(f"{directory}: {FORMAT_FILE} records heads {recorded}, the params hold "
                     f"{heads_present(params)}")
  vocab_dir = os.path.join(directory, VOCAB_DIR)
  vocab = Vocab.load(vocab_dir) if os.path.isdir(vocab_dir) else None
  return config, params, vocab


# ------------------------------------------------------------------ training workdirs


def _training_step_dir(path: str) -> str | None:
  """The latest complete checkpoint of a workdir, its checkpoints/ dir, or a step dir itself.
  orbax renames a step's temporary directory to the bare step number only once it is complete."""
  if os.path.isdir(os.path.join(path, "state")) and os.path.isdir(os.path.join(path, "meta")):
    return path
  checkpoints = os.path.join(path, "checkpoints")
  if not os.path.isdir(checkpoints):
    checkpoints = path
  steps = [int(n) for n in os.listdir(checkpoints)
           if n.isdigit() and os.path.isdir(os.path.join(checkpoints, n, "state"))]
  if not steps:
    return None
  return os.path.join(checkpoints, str(max(steps)))


def _load_training_checkpoint(step_dir: str) -> tuple[BertConfig, dict, Vocab | None]:
  from bert_jax import checkpointing

  meta_file = os.path.join(step_dir, "meta", "metadata")  # orbax's JsonSave file.
  if not os.path.isfile(meta_file):
    raise ValueError(f"{step_dir}: no meta item ({meta_file}); was it written by "
                     "bert_jax/checkpointing.py?")
  meta = _read_json(meta_file)
  if "model_config" not in meta:
    raise ValueError(f"{meta_file} has no model_config")
  config = _config_from_dict(meta["model_config"], f"{meta_file} model_config")
  params = check_params(_restore_numpy(os.path.join(step_dir, "state"), "params"), config,
                        os.path.join(step_dir, "state"))
  vocab = None
  if meta.get("vocab"):
    with tempfile.TemporaryDirectory() as tmp:  # Vocab holds its model in memory.
      vocab = Vocab.load(checkpointing.decode_files(meta["vocab"], tmp))
  return config, params, vocab


# -------------------------------------------------------------------------- HuggingFace


def _hf_vocab(directory: str, lowercase: bool | None = None) -> Vocab:
  """tokenizer.json or vocab.txt of a HF directory; casing from tokenizer_config.json."""
  if lowercase is None:
    tokenizer_config = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(tokenizer_config):
      lowercase = _read_json(tokenizer_config).get("do_lower_case")
  for name in HF_VOCABS:
    if os.path.isfile(os.path.join(directory, name)):
      return Vocab.load(os.path.join(directory, name), lowercase)
  raise ValueError(f"{directory}: no vocabulary (expected {' or '.join(HF_VOCABS)})")


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  import safetensors
  import safetensors.numpy

  try:
    try:
      return safetensors.numpy.load_file(path)
    except TypeError:  # bfloat16, which numpy lacks: read through jax (ml_dtypes) instead.
      with safetensors.safe_open(path, framework="flax") as f:
        return {k: np.asarray(f.get_tensor(k), dtype=np.float32) for k in f.keys()}
  except Exception as e:  # safetensors' SafetensorError is not importable to catch by name.
    raise ValueError(f"{path} is not a readable safetensors file ({e}); is it truncated or "
                     "corrupted?") from e


def _load_torch_bin(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise ValueError(f"Reading {path} needs PyTorch (pip install torch), or convert the "
                     "checkpoint to model.safetensors") from e
  try:
    # weights_only: never unpickle arbitrary objects from a downloaded file.
    state = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as e:  # Corrupt zip, unpickling errors, refused globals...
    raise ValueError(f"{path} is not a readable PyTorch state dict ({type(e).__name__}: "
                     f"{e})") from e
  if not isinstance(state, Mapping):
    raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict")
  return {k: v.detach().float().numpy() if str(v.dtype) == "torch.bfloat16"
          else v.detach().numpy() for k, v in state.items()}


def read_hf_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
  """(state dict as numpy, file it came from) of a HF directory: model.safetensors, else
  pytorch_model.bin (each also sharded with an .index.json)."""
  for name in HF_WEIGHTS:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
      continue
    load = _load_safetensors if ".safetensors" in name else _load_torch_bin
    if not name.endswith(".index.json"):
      return load(path), path
    files = sorted(set(_read_json(path).get("weight_map", {}).values()))
    state = {}
    for file in files:
      if not os.path.isfile(os.path.join(directory, file)):
        raise ValueError(f"{path} names {file}, which does not exist")
      state.update(load(os.path.join(directory, file)))
    return state, path
  raise ValueError(f"{directory}: no weights (expected one of {', '.join(HF_WEIGHTS)})")


def load_hf(directory: str, lowercase: bool | None = None
            ) -> tuple[BertConfig, dict, Vocab]:
  """A HuggingFace BERT directory (config.json, weights, vocab.txt or tokenizer.json) ->
  (config, float32 params, vocab). BertModel, BertForMaskedLM and BertForPreTraining work;
  heads they lack are absent from the params (see `heads_present`)."""
  directory = os.path.abspath(directory)
  if not os.path.isdir(directory):
    raise ValueError(f"HuggingFace directory {directory} does not exist")
  config_file = os.path.join(directory, HF_CONFIG)
  if not os.path.isfile(config_file):
    raise ValueError(f"{directory}: no {HF_CONFIG} (a HuggingFace BERT directory holds "
                     f"{HF_CONFIG}, model.safetensors or pytorch_model.bin, and "
                     f"{' or '.join(HF_VOCABS)})")
  config = _config_from_dict(_read_json(config_file), config_file)
  vocab = _hf_vocab(directory, lowercase)
  state, weights_file = read_hf_weights(directory)
  params = _params_from_state(state, config, f"{weights_file} (with {config_file})")
  _check_vocab_fits(vocab, config, directory)
  return config, params, vocab


def _params_from_state(state: Mapping[str, np.ndarray], config: BertConfig, source: str) -> dict:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Missing heads: reported once, by our own warning.
    try:
      params = convert.params_from_hf(state, config)
    except ValueError as e:
      raise ValueError(f"{source}: {e}") from e
  return check_params(params, config, source)


def _check_vocab_fits(vocab: Vocab, config: BertConfig, where: str) -> None:
  if vocab.size > config.vocab_size:
    raise ValueError(f"{where}: the vocabulary has {vocab.size} tokens, more than the model's "
                     f"vocab_size={config.vocab_size}")
  if vocab.size < config.vocab_size:
    logger.info("%s: vocabulary of %d tokens for vocab_size=%d (the extra rows are unused)",
                where, vocab.size, config.vocab_size)


def _tied_keys() -> tuple[str, ...]:
  return ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def hf_architecture(heads: Mapping[str, bool]) -> str:
  """The transformers class whose parameters are exactly these (for config.json)."""
  if heads["mlm"] and heads["nsp"]:
    return "BertForPreTraining"
  if heads["mlm"]:
    return "BertForMaskedLM"
  if heads["nsp"]:
    return "BertForNextSentencePrediction"
  return "BertModel"


def save_hf(output_dir: str, params: Mapping, config: BertConfig, vocab: Vocab | None,
            overwrite: bool = False) -> str:
  """Writes a HuggingFace directory: config.json, model.safetensors (BertForPreTraining names,
  tied decoder keys omitted as transformers' own save_pretrained does) and the vocabulary
  (vocab.txt + tokenizer_config.json for WordPiece; a sentencepiece model is copied as-is).
  Returns the transformers architecture written (heads decide it, see `hf_architecture`)."""
  import safetensors.numpy

  params = check_params(params, config, "params to export")
  heads = heads_present(params)
  # Absent heads are filled with zeros only to reuse convert's one table, then dropped again.
  expected = convert._expected_shapes(config)  # pylint: disable=protected-access
  flat = _flatten(params)
  filled = _unflatten({p: flat.get(p, np.zeros(s, np.float32)) for p, s in expected.items()})
  state = convert.params_to_hf(filled, config)
  prefixes = {"pooler": "bert.pooler.", "mlm": "cls.predictions.", "nsp": "cls.seq_relationship."}
  state = {k: np.ascontiguousarray(v) for k, v in state.items() if k not in _tied_keys()
           and not any(k.startswith(prefixes[h]) for h, present in heads.items() if not present)}

  output_dir = os.path.abspath(output_dir)
  if os.path.exists(output_dir) and os.listdir(output_dir):
    if not overwrite:
      raise ValueError(f"{output_dir} exists and is not empty; choose another directory or "
                       "pass overwrite=True (--overwrite)")
    shutil.rmtree(output_dir)
  os.makedirs(output_dir, exist_ok=True)
  architecture = hf_architecture(heads)
  hf_config = {
      "architectures": [architecture],
      "model_type": "bert",
      **_config_dict(config),
      "position_embedding_type": "absolute",
      "pad_token_id": vocab.pad_id if vocab is not None else 0,
      "tie_word_embeddings": True,
      "dtype": "float32",
  }
  with open(os.path.join(output_dir, HF_CONFIG), "w") as f:
    json.dump(hf_config, f, indent=2)
  safetensors.numpy.save_file(state, os.path.join(output_dir, "model.safetensors"),
                              metadata={"format": "pt"})
  if vocab is not None:
    _save_hf_vocab(output_dir, vocab, config)
  if not heads["pooler"] and architecture != "BertForMaskedLM":
    logger.warning("%s: the params have no pooler; transformers will initialise it randomly",
                   output_dir)
  if heads["pooler"] and architecture == "BertForMaskedLM":
    logger.info("%s: BertForMaskedLM does not use the pooler written with it", output_dir)
  return architecture


def _save_hf_vocab(output_dir: str, vocab: Vocab, config: BertConfig) -> None:
  if vocab.kind == "sentencepiece":
    with tempfile.TemporaryDirectory() as tmp:
      vocab.save(tmp)
      shutil.copyfile(os.path.join(tmp, "sentencepiece.model"),
                      os.path.join(output_dir, "sentencepiece.model"))
    logger.warning("%s: the vocabulary is a sentencepiece model (copied as sentencepiece.model);"
                   " HuggingFace's BertTokenizer cannot read it, tokenize with "
                   "sentencepiece or bert_jax.data.vocab.Vocab", output_dir)
    return
  with open(os.path.join(output_dir, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("".join(vocab.id_to_piece(i) + "\n" for i in range(vocab.size)))
  if vocab.path.endswith(".json"):  # Keep the exact tokenizer (normaliser settings) too.
    with tempfile.TemporaryDirectory() as tmp:
      vocab.save(tmp)
      shutil.copyfile(os.path.join(tmp, "tokenizer.json"),
                      os.path.join(output_dir, "tokenizer.json"))
  tokenizer_config = {"tokenizer_class": "BertTokenizer",
                      "model_max_length": config.max_position_embeddings}
  if vocab.lowercase is not None:
    tokenizer_config["do_lower_case"] = bool(vocab.lowercase)
  with open(os.path.join(output_dir, "tokenizer_config.json"), "w") as f:
    json.dump(tokenizer_config, f, indent=2)


# ------------------------------------------------------------------ TensorFlow (original BERT)


def load_tf(path: str, config_file: str | None = None, vocab_file: str | None = None,
            lowercase: bool | None = None) -> tuple[BertConfig, dict, Vocab]:
  """A google-research/bert checkpoint (`bert_model.ckpt` prefix, or its directory) with
  bert_config.json and vocab.txt beside it (or given) -> (config, float32 params, vocab)."""
  from bert_jax import tf_checkpoint

  prefix = tf_checkpoint.resolve_prefix(os.path.abspath(path))
  directory = os.path.dirname(prefix)
  reader = tf_checkpoint.BundleReader(prefix)  # Raises naming the missing .index first.
  config_file = config_file or os.path.join(directory, TF_CONFIG)
  if not os.path.isfile(config_file):
    raise ValueError(f"{directory}: no {TF_CONFIG} next to the checkpoint (pass its path)")
  config = _config_from_dict(_read_json(config_file), config_file)
  if vocab_file is None:
    if not os.path.isfile(os.path.join(directory, TF_VOCAB)):
      raise ValueError(f"{directory}: no vocabulary (expected {TF_VOCAB}; pass its path)")
    vocab_file = os.path.join(directory, TF_VOCAB)
  vocab = Vocab.load(vocab_file, lowercase)
  state = tf_checkpoint.hf_state_dict_from_tf(reader)
  params = _params_from_state(state, config, f"{reader.index_file} (with {config_file})")
  _check_vocab_fits(vocab, config, directory)
  return config, params, vocab


# ---------------------------------------------------------------------------- load_pretrained


def detect_format(path: str) -> str:
  """"bert_jax", "training", "huggingface" or "tensorflow" for `path`, or a ValueError."""
  if os.path.isdir(path):
    if os.path.isfile(os.path.join(path, FORMAT_FILE)):
      return "bert_jax"
    if any(os.path.isfile(os.path.join(path, n)) for n in (HF_CONFIG, *HF_WEIGHTS)):
      return "huggingface"  # (load_hf names a missing config.json.)
    if _training_step_dir(path) is not None:
      return "training"
    if os.path.isdir(os.path.join(path, "checkpoints")):
      raise ValueError(f"{path}: a training workdir without a complete checkpoint yet")
  from bert_jax import tf_checkpoint

  suffix = tf_checkpoint.INDEX_SUFFIX
  if os.path.isfile(path + suffix) or (path.endswith(suffix) and os.path.isfile(path)) or (
      os.path.isdir(path) and any(n.endswith(suffix) for n in os.listdir(path))):
    return "tensorflow"
  raise ValueError(
      f"{path}: not a pretrained BERT that bert_jax recognises. Expected a bert_jax pretrained "
      f"directory ({FORMAT_FILE}), a training workdir (checkpoints/<step>/state), a HuggingFace "
      f"directory ({HF_CONFIG} + weights) or a TensorFlow checkpoint prefix (<prefix>.index)")


def load_pretrained(path: str) -> tuple[BertConfig, dict, Vocab | None]:
  """(config, float32 numpy params, vocab or None) from a bert_jax pretrained directory, a
  training workdir (its latest checkpoint's params; optimizer state is not read), a HuggingFace
  directory or a google-research/bert TF checkpoint. Missing heads are absent from the params
  and named in a warning."""
  path = os.path.abspath(path)
  if not os.path.exists(path) and not os.path.exists(path + ".index"):
    raise ValueError(f"{path} does not exist")
  kind = detect_format(path)
  if kind == "bert_jax":
    config, params, vocab = _load_bert_jax(path)
  elif kind == "training":
    config, params, vocab = _load_training_checkpoint(_training_step_dir(path))
  elif kind == "huggingface":
    config, params, vocab = load_hf(path)
  else:
    config, params, vocab = load_tf(path)
  _warn_missing_heads(params, path)
  return config, params, vocab


# ----------------------------------------------------------------------------- input encoding


def _truncation_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """HF tokenizers' "longest_first" for a pair: the shorter keeps what it can, the longer gets
  the rest; when both exceed half, A gets floor(budget/2) and B the other ceil."""
  if len_a + len_b <= budget:
    return len_a, len_b
  swap = len_a > len_b
  short, long_ = (len_b, len_a) if swap else (len_a, len_b)
  long_ = short if short > budget else max(short, budget - short)
  if short + long_ > budget:
    short = budget // 2
    long_ = short + budget % 2
  return (long_, short) if swap else (short, long_)


def encode_pair(vocab: Vocab, text_a: str, text_b: str | None = None,
                max_length: int = 128) -> dict[str, np.ndarray]:
  """[CLS] A [SEP] (B [SEP]) padded to `max_length`: {input_ids, token_type_ids,
  attention_mask}, each int32 [max_length]. Truncation is longest-first and matches
  `BertTokenizerFast(text_a, text_b, truncation=True, max_length=..., padding="max_length")`
  (an empty `text_b` counts as none, as there)."""
  ids_a = vocab.encode(text_a)
  ids_b = vocab.encode(text_b) if text_b else None
  specials = 3 if ids_b is not None else 2
  if max_length < specials:
    raise ValueError(f"max_length={max_length} cannot hold the {specials} special tokens")
  budget = max_length - specials
  if ids_b is None:
    ids_a = ids_a[:budget]
    tokens = [vocab.cls_id, *ids_a, vocab.sep_id]
    types = [0] * len(tokens)
  else:
    len_a, len_b = _truncation_lengths(len(ids_a), len(ids_b), budget)
    ids_a, ids_b = ids_a[:len_a], ids_b[:len_b]
    tokens = [vocab.cls_id, *ids_a, vocab.sep_id, *ids_b, vocab.sep_id]
    types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
  padding = max_length - len(tokens)
  return {
      "input_ids": np.asarray(tokens + [vocab.pad_id] * padding, dtype=np.int32),
      "token_type_ids": np.asarray(types + [0] * padding, dtype=np.int32),
      "attention_mask": np.asarray([1] * len(tokens) + [0] * padding, dtype=np.int32),
  }
