"""Pretraining (MLM + NSP): the data, the task and what checkpoints record, handed to the one
trainer (`bert_jax/trainer.py`). `train_and_evaluate(config, workdir)` is all `launch/train.py`
calls. Every check that can fail on bad input (config, data vs model, batch size vs mesh,
checkpoint vs model) runs before any device work.
"""

import dataclasses
import os
from typing import Any

import jax
from jax.experimental import multihost_utils

from bert_jax import checkpointing, trainer
from bert_jax.data import pipeline
from bert_jax.data.vocab import Vocab
from bert_jax.masking import MaskingConfig
from bert_jax.model import BertConfig
from bert_jax.tasks import PretrainingTask

# Synthetic data uses sentencepiece's special-token layout (see WORKSPACE.md).
SYNTHETIC_SPECIALS = dict(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Pretrains `config` in `workdir`, resuming from its latest checkpoint. Returns the final
  metrics (and state)."""
  _validate(config)
  model_config = BertConfig.from_config(config.model)
  dataset_dir, meta = _resolve_data(config, workdir)
  ids = meta if dataset_dir else SYNTHETIC_SPECIALS
  task = _task(config, model_config, ids, meta.get("special_ids", SYNTHETIC_SPECIALS.values()))
  run = trainer.Run(
      task=task, train_iter=_train_iterator(config, dataset_dir, model_config.vocab_size),
      eval_batches=_eval_batches(config, dataset_dir) if dataset_dir else None, eval_data=None,
      meta={"config": config.to_dict(), "model_config": dataclasses.asdict(model_config),
            "data": {"source": config.data.source, "dataset_dir": dataset_dir}},
      vocab=Vocab.load(os.path.join(dataset_dir, meta["vocab_dir"])) if dataset_dir else None,
      initial_params=_initial_params(config, model_config) if config.checkpoint.init_from else None,
      initial_source=config.checkpoint.init_from)
  return trainer.train(config, workdir, run)


def compile_report(config) -> dict[str, Any]:
  """Per-device memory and FLOPs of the compiled train step, from abstract shapes only."""
  _validate(config)
  model_config = BertConfig.from_config(config.model)
  specials = SYNTHETIC_SPECIALS
  return trainer.compile_report(config, _task(config, model_config, specials, specials.values()))


def _validate(config) -> None:
  if config.data.max_seq_length > config.model.max_position_embeddings:
    raise ValueError(f"config.data.max_seq_length={config.data.max_seq_length} exceeds "
                     f"config.model.max_position_embeddings={config.model.max_position_embeddings}")


def _task(config, model_config: BertConfig, ids, special_ids) -> PretrainingTask:
  masking = MaskingConfig.from_config(
      config.masking, vocab_size=model_config.vocab_size, mask_token_id=ids["mask_id"],
      special_token_ids=tuple(special_ids), unk_token_id=ids["unk_id"])
  return PretrainingTask(model_config, masking, config.data.max_seq_length)


def _resolve_data(config, workdir: str) -> tuple[str | None, dict]:
  """(dataset dir, its bert_meta.json) for prepared / builtin data, prepared by process 0 once
  (cached in the workdir) and checked against the model; (None, {}) for synthetic data."""
  if config.data.source == "synthetic":
    return None, {}
  if config.data.source == "builtin" and jax.process_index() == 0:
    pipeline.resolve_dataset(config, workdir)
  multihost_utils.sync_global_devices("bert_jax: dataset ready")
  return pipeline.resolve_dataset(config, workdir)


def _train_iterator(config, dataset_dir: str | None, vocab_size: int):
  common = dict(global_batch_size=config.train.batch_size, seed=config.seed,
                process_index=jax.process_index(), process_count=jax.process_count())
  if dataset_dir is None:
    s = SYNTHETIC_SPECIALS
    return pipeline.make_synthetic_iterator(
        seq_len=config.data.max_seq_length, vocab_size=vocab_size, pad_id=s["pad_id"],
        cls_id=s["cls_id"], sep_id=s["sep_id"], special_ids=tuple(s.values()), **common)
  return pipeline.make_train_iterator(dataset_dir, num_workers=config.data.num_workers, **common)


def _eval_batches(config, dataset_dir: str):
  return lambda: pipeline.make_eval_batches(
      dataset_dir, global_batch_size=config.train.eval_batch_size,
      process_index=jax.process_index(), process_count=jax.process_count(),
      max_batches=config.train.eval_max_batches)


def _initial_params(config, model_config: BertConfig):
  """-> a loader of the weights to continue pretraining from (read only for a fresh start),
  checked against the model (shape and vocabulary)."""
  def load() -> dict:
    from bert_jax import weights  # Imports HF/TF readers only when needed.
    source = config.checkpoint.init_from
    loaded_config, params, _ = weights.load_pretrained(source)
    checkpointing.check_compatible(dataclasses.asdict(loaded_config),
                                   dataclasses.asdict(model_config), source)
    return params
  return load
