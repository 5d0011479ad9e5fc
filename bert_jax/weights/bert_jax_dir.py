"""The bert_jax pretrained directory: what `launch/convert.py --from_hf/--from_tf` writes and
every loader reads fastest.

It holds
- `params/`: the `BertForPreTraining` params tree (an orbax checkpoint, float32; the encoder's
  layers stacked, `weights.layout`), heads the source lacked simply absent (never invented);
- `bert_config.json`: the model config with HuggingFace's field names;
- `vocab/`: the vocabulary (`Vocab.save`), when known;
- `bert_jax_pretrained.json`: format version, which heads are present, where it came from.

The directory may be local or in a bucket (gs://): every file goes through
`bert_jax.runtime.storage`, the params through orbax.
"""

import os
from typing import Mapping

from bert_jax.checkpoints import checkpointing
from bert_jax.runtime import storage
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.weights import files
from bert_jax.weights import params as params_lib

FORMAT_NAME = "bert_jax_pretrained"
# 2: the encoder's layers stacked [S, ...] (`weights.layout`); version 1 directories (one
# subtree per layer) still load, converted.
FORMAT_VERSION = 2
FORMAT_FILE = "bert_jax_pretrained.json"
CONFIG_FILE = "bert_config.json"
PARAMS_DIR = "params"
VOCAB_DIR = "vocab"


def _as_vocab(vocab_dir: str | Vocab | None) -> Vocab | None:
  if vocab_dir is None or isinstance(vocab_dir, Vocab):
    return vocab_dir
  return Vocab.load(os.fspath(vocab_dir))


def _format_info(params: Mapping, vocab: Vocab | None, note: str) -> dict:
  """The contents of FORMAT_FILE."""
  return {
      "format": FORMAT_NAME,
      "format_version": FORMAT_VERSION,
      "heads": params_lib.heads_present(params),
      "source": note,
      "param_dtype": "float32",
      "num_params": int(sum(x.size for x in params_lib.flatten(params).values())),
      "vocab": None if vocab is None else {"kind": vocab.kind, "size": vocab.size,
                                           "lowercase": vocab.lowercase},
  }


def save_pretrained(directory: str, params: Mapping, model_config: BertConfig,
                    vocab_dir: str | Vocab | None, note: str = "",
                    overwrite: bool = False) -> str:
  """Writes a bert_jax pretrained directory (see the module docstring); returns its path.

  `params` may lack heads (then recorded as absent); `vocab_dir` is a vocabulary directory or
  file (anything `Vocab.load` reads) or a loaded `Vocab`, or None when there is none. A
  non-empty `directory` is replaced only with `overwrite`.
  """
  params = params_lib.check_params(params, model_config, "params to save")
  vocab = _as_vocab(vocab_dir)
  if vocab is not None and vocab.size > model_config.vocab_size:
    raise ValueError(f"The vocabulary has {vocab.size} tokens but the model only "
                     f"vocab_size={model_config.vocab_size} embeddings")
  # Only now, with everything checked, may an existing directory go.
  final = files.check_output_dir(os.fspath(directory))
  with files.output_dir_in_place(final, overwrite) as directory:
    checkpointing.save_tree(storage.join(directory, PARAMS_DIR), params,
                            shown_as=storage.join(final, PARAMS_DIR))
    files.write_json(storage.join(directory, CONFIG_FILE),
                     {**params_lib.config_dict(model_config), "model_type": "bert"})
    if vocab is not None:
      vocab.save(storage.join(directory, VOCAB_DIR))
    # Last: a directory without it (an interrupted save in a bucket) is not taken for a
    # pretrained one.
    files.write_json(storage.join(directory, FORMAT_FILE), _format_info(params, vocab, note))
  return final


def _read_format_info(directory: str) -> dict:
  info = files.read_json(storage.join(directory, FORMAT_FILE))
  if info.get("format") != FORMAT_NAME or info.get("format_version", 0) > FORMAT_VERSION:
    raise ValueError(f"{directory}: {FORMAT_FILE} says format {info.get('format')!r} version "
                     f"{info.get('format_version')}; this bert_jax reads {FORMAT_NAME} version "
                     f"<= {FORMAT_VERSION}")
  return info


def load(directory: str) -> tuple[BertConfig, dict, Vocab | None]:
  """(config, float32 numpy params, vocab or None) of a bert_jax pretrained directory, checked
  against each other and against the heads its FORMAT_FILE records."""
  info = _read_format_info(directory)
  config_file = storage.join(directory, CONFIG_FILE)
  if not storage.isfile(config_file):
    raise ValueError(f"{directory}: no {CONFIG_FILE}")
  config = params_lib.config_from_dict(files.read_json(config_file), config_file)
  params_dir = storage.join(directory, PARAMS_DIR)
  params = params_lib.check_params(checkpointing.restore_tree(params_dir), config, params_dir)
  recorded = info.get("heads")
  if recorded is not None and recorded != params_lib.heads_present(params):
    raise ValueError(f"{directory}: {FORMAT_FILE} records heads {recorded}, the params hold "
                     f"{params_lib.heads_present(params)}")
  vocab_dir = storage.join(directory, VOCAB_DIR)
  vocab = Vocab.load(vocab_dir) if storage.isdir(vocab_dir) else None
  return config, params, vocab
