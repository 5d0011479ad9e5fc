"""HuggingFace BERT and ModernBERT directories in and out.

Import (`load_hf`): `config.json`, weights from `model.safetensors` or `pytorch_model.bin` (either
also sharded behind an `.index.json`), the vocabulary from `sentencepiece.model` (bert_jax's own
sentencepiece exports), `tokenizer.json` or `vocab.txt`. BertModel, BertForMaskedLM and
BertForPreTraining checkpoints load, and ModernBertModel / ModernBertForMaskedLM ones
(config.json's model_type "modernbert"); heads they lack stay absent. Task models of either
family (BertForSequenceClassification, ModernBertForTokenClassification, ...) give their encoder,
and `load_hf_with_head` their task head too (`weights.hf_heads`).
Export (`save_hf`): `config.json`, `model.safetensors` and the tokenizer files
(`weights.hf_tokenizer`: AutoTokenizer gives bert_jax's ids), readable by `transformers`'
`from_pretrained` without remote code: BertForPreTraining names for exact BERT, ModernBERT's for
the modern encoder (`hf_modernbert.is_modernbert`; no pooler or NSP head there), or a task model
with a fine-tuned head (`bert_jax/weights/hf_export.py`). Parameter names and layouts come from
`bert_jax.weights.hf_bert`'s one table, `hf_modernbert` and `hf_heads`.

Directories may be local or in a bucket (gs://, through `bert_jax.runtime.storage`): a bucket's
weight files are read into memory and written from it.
"""

import io
import logging
import os
import warnings
from typing import Mapping

import numpy as np
import safetensors
import safetensors.numpy

from bert_jax.models import model as model_lib
from bert_jax.runtime import storage
from bert_jax.data.vocab import SENTENCEPIECE_FILE, Vocab
from bert_jax.models.model import BertConfig
from bert_jax.weights import files, hf_bert, hf_heads, hf_modernbert, hf_tokenizer
from bert_jax.weights import params as params_lib

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")  # In order of preference.
VOCAB_FILES = ("tokenizer.json", "vocab.txt")  # tokenizer.json first, as BertTokenizerFast.
# Parameter name prefixes of the optional heads in a BertForPreTraining state dict.
_HEAD_PREFIXES = {"pooler": "bert.pooler.", "mlm": "cls.predictions.",
                  "nsp": "cls.seq_relationship."}
# Tied to the word embeddings and the MLM bias: transformers' own save_pretrained omits them.
_TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# What each family's forward takes (tokenizer_config.json's model_input_names).
_INPUT_NAMES = {"bert": ("input_ids", "token_type_ids", "attention_mask"),
                "modernbert": ("input_ids", "attention_mask")}


# ---------------------------------------------------------------------------------- import


def read_vocab(directory: str, lowercase: bool | None = None) -> Vocab:
  """sentencepiece.model (a bert_jax export's exact sentencepiece vocabulary, beside the
  tokenizer.json made from it), else tokenizer.json or vocab.txt of a HF directory (WordPiece;
  casing from tokenizer_config.json unless `lowercase` is given)."""
  if storage.isfile(storage.join(directory, SENTENCEPIECE_FILE)):
    return Vocab.from_sentencepiece(storage.join(directory, SENTENCEPIECE_FILE))
  if lowercase is None:
    tokenizer_config = storage.join(directory, "tokenizer_config.json")
    if storage.isfile(tokenizer_config):
      lowercase = files.read_json(tokenizer_config).get("do_lower_case")
      if lowercase is not None and not isinstance(lowercase, bool):
        raise ValueError(f"{tokenizer_config}: do_lower_case is {lowercase!r}; it must be true, "
                         "false or absent")
  for name in VOCAB_FILES:
    if storage.isfile(storage.join(directory, name)):
      return Vocab.load(storage.join(directory, name), lowercase)
  raise ValueError(f"{directory}: no vocabulary (expected {' or '.join(VOCAB_FILES)})")


# safetensors dtype names -> little-endian numpy dtypes, for files numpy's loader refuses.
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "bfloat16", "I64": "<i8",
                       "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def _safetensors_from_bytes(data: bytes) -> dict[str, np.ndarray]:
  """The tensors of a safetensors file's bytes (a bucket's file: safetensors opens local files
  only)."""
  try:
    return safetensors.numpy.load(data)
  except KeyError:  # bfloat16, which numpy lacks: decoded through ml_dtypes instead.
    import ml_dtypes  # pylint: disable=import-outside-toplevel  (a jax dependency)
    arrays = {}
    for name, view in safetensors.deserialize(data):
      if view["dtype"] not in _SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {name} has dtype {view['dtype']}, which bert_jax cannot "
                         "read") from None
      dtype = _SAFETENSORS_DTYPES[view["dtype"]]
      dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
      # float32, as load_file's bfloat16 fallback below gives.
      arrays[name] = np.frombuffer(view["data"], dtype).reshape(view["shape"]).astype(np.float32)
    return arrays


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  try:
    if storage.is_remote(path):
      return _safetensors_from_bytes(storage.read_bytes(path))
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
    import torch  # pylint: disable=import-outside-toplevel  (optional: only .bin files need it)
  except ImportError as e:
    raise ValueError(f"Reading {path} needs PyTorch (pip install torch), or convert the "
                     "checkpoint to model.safetensors") from e
  try:
    # A bucket's file as bytes (torch opens local files only); weights_only: never unpickle
    # arbitrary objects from a downloaded file.
    source = io.BytesIO(storage.read_bytes(path)) if storage.is_remote(path) else path
    state = torch.load(source, map_location="cpu", weights_only=True)
  except Exception as e:  # Corrupt zip, unpickling errors, refused globals...
    raise ValueError(f"{path} is not a readable PyTorch state dict ({type(e).__name__}: "
                     f"{e})") from e
  if not isinstance(state, Mapping):
    raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict")
  return {k: v.detach().float().numpy() if str(v.dtype) == "torch.bfloat16"
          else v.detach().numpy() for k, v in state.items()}


def read_weights(directory: str) -> tuple[dict[str, np.ndarray], str]:
  """(state dict as numpy, file it came from) of a HF directory: model.safetensors, else
  pytorch_model.bin (each also sharded with an .index.json)."""
  for name in WEIGHTS_FILES:
    path = storage.join(directory, name)
    if not storage.isfile(path):
      continue
    load = _load_safetensors if ".safetensors" in name else _load_torch_bin
    if not name.endswith(".index.json"):
      return load(path), path
    state = {}
    weight_map = files.read_json(path).get("weight_map", {})
    if not isinstance(weight_map, dict) or not all(
        isinstance(f, str) and f and "/" not in f for f in weight_map.values()):
      raise ValueError(f"{path}: weight_map must map parameter names to file names in "
                       f"{directory}")
    for file in sorted(set(weight_map.values())):
      if not storage.isfile(storage.join(directory, file)):
        raise ValueError(f"{path} names {file}, which does not exist")
      state.update(load(storage.join(directory, file)))
    return state, path
  raise ValueError(f"{directory}: no weights (expected one of {', '.join(WEIGHTS_FILES)})")


def params_from_state(state: Mapping[str, np.ndarray], config: BertConfig, source: str,
                      family: str = "bert") -> dict:
  """Checked float32 params of a state dict with HuggingFace BertForPreTraining (or BertModel)
  names, or ModernBERT's (`family` "modernbert"); errors start with `source`."""
  convert = hf_modernbert.params_from_hf if family == "modernbert" else hf_bert.params_from_hf
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Missing heads: reported once, by load_pretrained.
    try:
      params = convert(state, config)
    except ValueError as e:
      raise ValueError(f"{source}: {e}") from e
  return params_lib.check_params(params, config, source)


def read_config(config_file: str) -> tuple[BertConfig, str]:
  """(float32 config, family "bert" or "modernbert") of a HF config.json, by its model_type;
  errors name the file and the field."""
  return _read_config(files.read_json(config_file), config_file)


def _read_config(values: dict, config_file: str) -> tuple[BertConfig, str]:
  if not isinstance(values, dict) or values.get("model_type") != hf_modernbert.MODEL_TYPE:
    return params_lib.config_from_dict(values, config_file), "bert"
  try:
    return hf_modernbert.config_from_hf(values), "modernbert"
  except (TypeError, ValueError) as e:
    raise ValueError(f"{config_file}: {e}") from e


def load_hf(directory: str, lowercase: bool | None = None) -> tuple[BertConfig, dict, Vocab]:
  """A HuggingFace BERT or ModernBERT directory (config.json, weights, a vocabulary) ->
  (config, float32 params, vocab). BertModel, BertForMaskedLM, BertForPreTraining,
  ModernBertModel and ModernBertForMaskedLM work, and a task model's encoder (its head is left
  out: `load_hf_with_head` keeps it); heads they lack are absent from the params (see
  `heads_present`)."""
  config, params, vocab, head = load_hf_with_head(directory, lowercase)
  if head is not None:
    logger.warning("%s: left out the task head of its %s", directory, head.architecture)
  return config, params, vocab


def load_hf_with_head(directory: str, lowercase: bool | None = None
                      ) -> tuple[BertConfig, dict, Vocab, params_lib.TaskHead | None]:
  """`load_hf`'s (config, params, vocab), and the task head of a task model
  (BertForSequenceClassification, ModernBertForQuestionAnswering, ...: `hf_heads`), else
  None."""
  directory = storage.absolute(directory)
  if not storage.isdir(directory):
    raise ValueError(f"HuggingFace directory {directory} does not exist")
  config_file = storage.join(directory, CONFIG_FILE)
  if not storage.isfile(config_file):
    raise ValueError(f"{directory}: no {CONFIG_FILE} (a HuggingFace BERT directory holds "
                     f"{CONFIG_FILE}, model.safetensors or pytorch_model.bin, and "
                     f"{' or '.join(VOCAB_FILES)})")
  values = files.read_json(config_file)
  config, family = _read_config(values, config_file)
  vocab = read_vocab(directory, lowercase)
  state, weights_file = read_weights(directory)
  source = f"{weights_file} (with {config_file})"
  state, head = hf_heads.split_state(state, values, family, source)
  params = params_from_state(state, config, source, family)
  params_lib.check_vocab_fits(vocab, config, directory)
  return config, params, vocab, head


# ---------------------------------------------------------------------------------- export


def hf_architecture(heads: Mapping[str, bool]) -> str:
  """The transformers BERT class whose parameters are exactly these (for config.json)."""
  if heads["mlm"] and heads["nsp"]:
    return "BertForPreTraining"
  if heads["mlm"]:
    return "BertForMaskedLM"
  if heads["nsp"]:
    return "BertForNextSentencePrediction"
  return "BertModel"


def hf_family(config: BertConfig) -> str:
  """"bert" or "modernbert": the HF model that computes what `config` does; a ValueError naming
  the fields when neither does."""
  if hf_modernbert.is_modernbert(config):
    return "modernbert"
  try:
    hf_bert.check_is_bert(config)
  except ValueError as e:
    raise ValueError(f"{e}; nor can ModernBERT, which has {hf_modernbert.ARCHITECTURE}") from e
  return "bert"


def filled(params: Mapping, config: BertConfig) -> dict:
  """`params` with absent heads as zeros: the name tables convert whole trees only (the zeros
  are dropped again)."""
  flat = params_lib.flatten(params)
  return params_lib.unflatten({p: flat.get(p, np.zeros(s, np.float32))
                               for p, s in model_lib.param_shapes(config).items()})


def _state_to_save(params: Mapping, config: BertConfig,
                   heads: Mapping[str, bool]) -> dict[str, np.ndarray]:
  """The HF BERT state dict of checked `params`: absent heads and tied keys left out."""
  absent = tuple(_HEAD_PREFIXES[h] for h, present in heads.items() if not present)
  return {k: np.ascontiguousarray(v)
          for k, v in hf_bert.params_to_hf(filled(params, config), config).items()
          if k not in _TIED_KEYS and not k.startswith(absent)}


def _modern_state(params: Mapping, config: BertConfig,
                  heads: Mapping[str, bool]) -> tuple[dict[str, np.ndarray], str]:
  """(state dict, architecture) of the modern encoder: ModernBertForMaskedLM with the MLM head
  (the tied decoder.weight left out, as transformers' save_pretrained does), else
  ModernBertModel (its names carry no `model.` prefix)."""
  state = hf_modernbert.params_to_hf(filled(params, config), config)
  del state["decoder.weight"]
  if heads["mlm"]:
    return state, "ModernBertForMaskedLM"
  return {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}, \
      "ModernBertModel"


def _task_state(params: Mapping, config: BertConfig, family: str,
                head: params_lib.TaskHead) -> dict[str, np.ndarray]:
  """The state dict of a task model: the encoder under its prefix (BERT's pooler when the
  params hold it), no pretraining head, then the task head's parameters."""
  heads = {**params_lib.heads_present(params), "mlm": False, "nsp": False}
  if family == "modernbert":
    state = {f"model.{k}": v for k, v in _modern_state(params, config, heads)[0].items()}
  else:
    state = _state_to_save(params, config, heads)
  return {**state, **hf_heads.state_from_params(head.params)}


def bert_config_json(config: BertConfig, architecture: str, vocab: Vocab | None) -> dict:
  return {
      "architectures": [architecture],
      "model_type": "bert",
      **params_lib.config_dict(config),
      "position_embedding_type": "absolute",
      "pad_token_id": vocab.pad_id if vocab is not None else 0,
      "tie_word_embeddings": True,
      "dtype": "float32",
  }


def _modern_config(config: BertConfig, architecture: str, vocab: Vocab | None) -> dict:
  ids = ((vocab.pad_id, vocab.cls_id, vocab.sep_id) if vocab is not None else (None,) * 3)
  special_ids = dict(zip(("pad_token_id", "cls_token_id", "sep_token_id"), ids))
  # bos/eos as ModernBERT's own config: [CLS] and [SEP].
  special_ids.update(bos_token_id=ids[1], eos_token_id=ids[2])
  return {**hf_modernbert.config_to_hf(config, special_ids), "architectures": [architecture]}


# config.json's key naming the bert_jax task a pretraining-layout export was fine-tuned for
# (diffusion_sft: generation then follows that task's rows; `predict.conditional`).
TASK_KEY = "bert_jax_task"


def save_hf(output_dir: str, params: Mapping, config: BertConfig, vocab: Vocab | None,
            overwrite: bool = False, head: params_lib.TaskHead | None = None,
            task: str = "") -> str:
  """Writes a HuggingFace directory: config.json, model.safetensors (BertForPreTraining names,
  or ModernBERT's for the modern encoder; tied decoder keys omitted as transformers' own
  save_pretrained does) and the tokenizer (`hf_tokenizer.tokenizer_files`). With a task `head`
  (`FinetuneTask.hf_head`), its task model instead: the encoder (no pretraining heads), the
  head's parameters, and config.json's id2label / label2id / problem_type. `task` (a fine-tune
  kept in the pretraining layout) is recorded as config.json's TASK_KEY. Returns the
  transformers architecture written (heads decide it, see `hf_architecture`)."""
  if config.embedding_width != config.hidden_size:
    raise ValueError(f"embedding_size={config.embedding_size} differs from hidden_size="
                     f"{config.hidden_size}: transformers' BERT and ModernBERT have no "
                     "embeddings projection to load it into")
  params = params_lib.check_params(params, config, "params to export")
  heads = params_lib.heads_present(params)
  family = hf_family(config)
  if head is not None:
    state, architecture = _task_state(params, config, family, head), head.architecture
  elif family == "modernbert":
    state, architecture = _modern_state(params, config, heads)
  else:
    state, architecture = _state_to_save(params, config, heads), hf_architecture(heads)
  make_config = _modern_config if family == "modernbert" else bert_config_json
  hf_config = make_config(config, architecture, vocab)
  if head is not None:
    hf_config.update(hf_heads.config_fields(head))
  if task:
    hf_config[TASK_KEY] = task
  write_directory(output_dir, hf_config, state, vocab, config.max_position_embeddings, family,
                  overwrite)
  if head is None:
    _log_heads(output_dir, heads, architecture, family)
  return architecture


def write_directory(output_dir: str, hf_config: dict, state: Mapping[str, np.ndarray],
                    vocab: Vocab | None, max_length: int, family: str, overwrite: bool) -> str:
  """A fresh HF directory, written whole or not at all (`files.output_dir_in_place`): config.json, model.safetensors of `state`
  and, with a vocabulary, the tokenizer of `family`'s inputs; -> its absolute path."""
  final = files.check_output_dir(os.fspath(output_dir))
  with files.output_dir_in_place(final, overwrite) as output_dir:
    files.write_json(storage.join(output_dir, CONFIG_FILE), hf_config)
    save_safetensors(storage.join(output_dir, "model.safetensors"), state)
    if vocab is not None:
      for name, content in hf_tokenizer.tokenizer_files(vocab, max_length,
                                                        _INPUT_NAMES[family]).items():
        storage.write_bytes(storage.join(output_dir, name), content)
  return final


def save_safetensors(path: str, state: Mapping[str, np.ndarray]) -> None:
  """`state` as a safetensors file (PyTorch's metadata), local or in a bucket."""
  state = {k: np.ascontiguousarray(v) for k, v in state.items()}
  if storage.is_remote(path):  # One upload of the bytes (safetensors writes local files).
    storage.write_bytes(path, safetensors.numpy.save(state, metadata={"format": "pt"}))
  else:  # Streamed to disk, without a second copy of the weights in memory.
    with storage.local_file_in_place(path) as partial:
      try:
        safetensors.numpy.save_file(state, partial, metadata={"format": "pt"})
      except safetensors.SafetensorError as e:
        if "I/O error" not in str(e):
          raise
        raise OSError(f"Could not write {os.path.basename(path)} in "
                      f"{files.shown(os.path.dirname(path))}: {e}") from e


def _log_heads(output_dir: str, heads: Mapping[str, bool], architecture: str,
               family: str) -> None:
  """What the export leaves out, or what transformers will initialise."""
  output_dir = files.shown(output_dir)
  if family == "modernbert":
    if heads["pooler"] or heads["nsp"]:
      logger.info("%s: ModernBERT has no pooler or NSP head; the params' are left out",
                  output_dir)
    return
  if not heads["pooler"] and architecture != "BertForMaskedLM":
    logger.warning("%s: the params have no pooler; transformers will initialise it randomly",
                   output_dir)
  if heads["pooler"] and architecture == "BertForMaskedLM":
    logger.info("%s: BertForMaskedLM does not use the pooler written with it", output_dir)
