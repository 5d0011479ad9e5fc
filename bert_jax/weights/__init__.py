"""Pretrained BERT weights in and out, one module per format:
- `bert_jax_dir`: bert_jax's own pretrained directory (`save_pretrained`);
- `training`: the checkpoints of bert_jax's pretraining and fine-tuning runs;
- `hf`: HuggingFace directories (`load_hf`, `save_hf`);
- `tf`: google-research/bert TF1 checkpoints (`load_tf`, over the `tf_bundle` reader);
- `params`: the params-tree checks they share (`check_params`, `heads_present`, ...).

`load_pretrained(path)` reads any of them, telling which by `detect_format` (the only place that
guesses a format), and returns float32 numpy params with a float32 `BertConfig`
(`dataclasses.replace(config, dtype="bfloat16")` for bf16 compute). Heads that are missing are
named in a warning; `heads_present(params)` tells, and `fill_missing_heads` takes them from
freshly initialised params when the caller decides to. `load_with_head` also returns the task
head of a HuggingFace task model (`TaskHead`; fine-tuning decides whether it fits its task).

Every path may be local or in a bucket (gs://): files go through `bert_jax.runtime.storage`,
checkpoints through orbax.
"""

import logging
from typing import Sequence

from bert_jax.checkpoints import checkpointing
from bert_jax.runtime import storage
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.weights import bert_jax_dir, hf, tf_bundle, training
from bert_jax.weights import sentence_transformers_dir as st_dir
from bert_jax.weights.bert_jax_dir import FORMAT_FILE, save_pretrained
from bert_jax.weights.hf import hf_architecture, load_hf, save_hf
from bert_jax.weights.params import (HEADS, TaskHead, check_params, fill_missing_heads,
                                     heads_present, warn_missing_heads)
from bert_jax.weights.tf import load_tf

__all__ = ["FORMAT_FILE", "HEADS", "TaskHead", "check_params", "detect_format",
           "fill_missing_heads", "heads_present", "hf_architecture", "load_hf",
           "load_pretrained", "load_tf", "load_with_head", "save_hf", "save_pretrained"]


def _is_tf_checkpoint(path: str) -> bool:
  """A bundle prefix, its `.index` file, or a directory holding an `.index` file."""
  suffix = tf_bundle.INDEX_SUFFIX
  return (storage.isfile(path + suffix) or (path.endswith(suffix) and storage.isfile(path))
          or any(n.endswith(suffix) for n in storage.listdir(path)))


def detect_format(path: str) -> str:
  """"bert_jax", "training", "huggingface" or "tensorflow" for `path`, or a ValueError."""
  if storage.isdir(path):
    if storage.isfile(storage.join(path, bert_jax_dir.FORMAT_FILE)):
      return "bert_jax"
    if any(storage.isfile(storage.join(path, n)) for n in (hf.CONFIG_FILE, *hf.WEIGHTS_FILES)):
      return "huggingface"  # (load_hf names a missing config.json.)
    if checkpointing.find_step_dir(path) is not None:
      return "training"
    if any(storage.isdir(storage.join(path, d))
           for d in (checkpointing.CHECKPOINTS_DIR, checkpointing.BEST_DIR)):
      raise ValueError(f"{path}: a training workdir without a complete checkpoint yet")
  if _is_tf_checkpoint(path):
    return "tensorflow"
  raise ValueError(
      f"{path}: not a pretrained BERT that bert_jax recognises. Expected a bert_jax pretrained "
      f"directory ({bert_jax_dir.FORMAT_FILE}), a training or fine-tuning workdir "
      f"({checkpointing.CHECKPOINTS_DIR}/<step>/ or {checkpointing.BEST_DIR}/<step>/), a "
      f"HuggingFace directory ({hf.CONFIG_FILE} + weights) or a TensorFlow checkpoint prefix "
      f"(<prefix>{tf_bundle.INDEX_SUFFIX})")


_LOADERS = {"bert_jax": bert_jax_dir.load, "training": training.load, "huggingface": load_hf,
            "tensorflow": load_tf}


def load_pretrained(path: str, uses: Sequence[str] = tuple(HEADS)
                    ) -> tuple[BertConfig, dict, Vocab | None]:
  """(config, float32 numpy params, vocab or None) from a bert_jax pretrained directory, a
  training or fine-tuning workdir (its checkpoint's params: the BertForPreTraining parts, no
  optimizer state, no task head), a HuggingFace directory (a task model's encoder) or a
  google-research/bert TF checkpoint. Missing heads are absent from the params; those of `uses`
  (the ones the caller reads: pooler, mlm, nsp) are named in a warning."""
  config, params, vocab, head = load_with_head(path, uses)
  if head is not None:
    logging.getLogger(__name__).warning("%s: left out the task head of its %s", path,
                                        head.architecture)
  return config, params, vocab


def load_with_head(path: str, uses: Sequence[str] = tuple(HEADS)
                   ) -> tuple[BertConfig, dict, Vocab | None, TaskHead | None]:
  """`load_pretrained`'s (config, params, vocab) and the task head of a HuggingFace task model
  (None for any other source)."""
  path = storage.absolute(path)
  if not storage.exists(path) and not storage.exists(path + tf_bundle.INDEX_SUFFIX):
    raise ValueError(f"{path} does not exist")
  source_format = detect_format(path)
  if source_format == "huggingface":
    config, params, vocab, head = hf.load_hf_with_head(path)
    if vocab is not None and st_dir.is_sentence_transformers(path):
      vocab = vocab.with_lower_text(st_dir.lowercases(path))  # Its do_lower_case.
  else:
    (config, params, vocab), head = _LOADERS[source_format](path), None
  warn_missing_heads(params, path, uses)
  return config, params, vocab, head
