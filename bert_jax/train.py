"""Pretraining (MLM + NSP): the data, the task and what checkpoints record, handed to the one
trainer (`bert_jax/training/trainer.py`). `train_and_evaluate(config, workdir)` is all
`launch/train.py` calls. Every check that can fail on bad input (config, data vs model, batch size
vs mesh,
checkpoint vs model) runs before any device work.
"""

import dataclasses
import os
from typing import Any

import jax
from jax.experimental import multihost_utils

from bert_jax import config_checks
from bert_jax.checkpoints import checkpointing
from bert_jax.training import aot, programs, sharding, trainer
from bert_jax.runtime import storage
from bert_jax.runtime.metrics_writer import console
from bert_jax.data import batching, builtin, mixture, packing, pipeline, prepare
from bert_jax.data.vocab import Vocab
from bert_jax.objectives.masking import MaskingConfig
from bert_jax.models import rtd as rtd_model
from bert_jax.models.model import BertConfig
from bert_jax.objectives.diffusion import DiffusionSettings
from bert_jax.objectives.diffusion import eval_points as diffusion_eval_points
from bert_jax.tasks import PretrainingTask
from bert_jax.tasks.diffusion import DiffusionTask
from bert_jax.tasks.rtd import RtdSettings, RtdTask
from bert_jax.training.settings import TrainSettings

# Synthetic data uses sentencepiece's special-token layout (see WORKSPACE.md).
SYNTHETIC_SPECIALS = dict(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


def check(config) -> None:
  """Every value of `config`, the model and batch sizes against the mesh, and a prepared dataset
  (readable shards, a non-empty validation split, the model's vocabulary and length): one clear
  error before the workdir is touched or anything is compiled. The built-in corpus is checked
  once prepared (into the workdir)."""
  _check_config(config)
  if config.data.source == "prepared":
    # A prepared dataset is read, never written.
    pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), workdir="")
  elif config.data.source == "mixture":
    mixture.resolve(_mixture_spec(config), pipeline.DataSpec.from_config(config))


def _check_config(config) -> None:
  """The config's values, and the model and batch sizes against the mesh (no I/O)."""
  config_checks.check_pretraining(config)
  settings = TrainSettings.from_config(config)
  programs.check_mesh(settings, BertConfig.from_config(config.model),
                      sharding.make_mesh(settings.mesh))
  for field in ("batch_size", "eval_batch_size"):
    batching.per_host_batch_size(config.train[field], jax.process_count(), f"config.train.{field}")


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Pretrains `config` in `workdir`, resuming from its latest checkpoint. Returns the final
  metrics (and state)."""
  _check_config(config)  # The dataset is checked where it is resolved (_resolve_data).
  model_config = BertConfig.from_config(config.model)
  if config.data.source == "mixture":
    dirs, metas = mixture.resolve(_mixture_spec(config), pipeline.DataSpec.from_config(config))
    dataset_dir, meta = dirs[0], metas[0]  # The sources share vocabulary and row format.
    train_iter, eval_batches = _mixture_data(config, dirs)
    data = {"source": "mixture", "datasets": dict(zip(map(mixture.name_of, dirs), dirs))}
  else:
    dataset_dir, meta = _resolve_data(config, workdir)
    train_iter = _train_iterator(config, dataset_dir, model_config.vocab_size)
    eval_batches = _eval_batches(config, dataset_dir) if dataset_dir else None
    data = {"source": config.data.source, "dataset_dir": dataset_dir}
  task = pretraining_task(config, model_config, meta if dataset_dir else None)
  vocab = Vocab.load(prepare.vocab_dir(dataset_dir, meta)) if dataset_dir else None
  run = trainer.Run(
      task=task, train_iter=train_iter, eval_batches=eval_batches, eval_data=None,
      meta={"config": config.to_dict(), "model_config": dataclasses.asdict(model_config),
            "data": data},
      data_report=(mixture.MixtureIterator.report if config.data.source == "mixture"
                   else None),
      vocab=vocab,
      initial_params=(_initial_params(config, model_config, vocab)
                      if config.init_from else None),
      initial_source=config.init_from)
  return trainer.train(TrainSettings.from_config(config), workdir, run)


def compile_report(config, target: "aot.Target | None" = None,
                   steps: tuple[str, ...] = aot.STEPS) -> dict[str, Any]:
  """The init, train and eval steps (`steps`) compiled for `target` (default: this process's
  devices) against abstract shapes only: memory per chip, FLOPs, collectives, the step-time
  bound (`training/aot.py`). Nothing is allocated and no data is read."""
  config_checks.check_pretraining(config)
  model_config = BertConfig.from_config(config.model)
  return aot.report(TrainSettings.from_config(config),
                    pretraining_task(config, model_config, None), target or aot.host_target(),
                    steps)


def examples_per_row(config) -> int:
  """K of the batch contract: the packing of the NSP objective; MLM-only rows are one sequence."""
  return packing.examples_per_row(packing.row_format(config.data.objective),
                                  config.data.max_examples_per_row)


def pretraining_task(config, model_config: BertConfig, meta: dict | None) -> PretrainingTask:
  """The task of `config` on a prepared dataset's vocabulary (its bert_meta.json), or on the
  synthetic data's special ids when `meta` is None."""
  ids = meta if meta is not None else SYNTHETIC_SPECIALS
  special_ids = meta["special_ids"] if meta is not None else SYNTHETIC_SPECIALS.values()
  masking = MaskingConfig.from_config(
      config.masking, vocab_size=model_config.vocab_size, mask_token_id=ids["mask_id"],
      special_token_ids=tuple(special_ids), unk_token_id=ids["unk_id"])
  eval_rate = config.masking.eval_mask_prob or config.masking.mask_prob
  common = dict(eval_masking=dataclasses.replace(masking, mask_prob=eval_rate),
                span_warmup_steps=config.data.span_warmup_steps,
                span_warmup_start=config.data.span_warmup_start,
                rate_stages=rate_stages(config.masking, config.train.num_train_steps),
                diffusion=DiffusionSettings(config.diffusion.schedule, diffusion_eval_points(
                    config.diffusion.eval_points, config.data.objective)))
  shape = (model_config, masking, config.data.max_seq_length, examples_per_row(config))
  if config.data.objective == "diffusion":
    return DiffusionTask(*shape, **{**common, "rate_stages": ()})
  if config.data.objective.startswith("rtd"):
    r = config.rtd
    generator = rtd_model.generator_config(model_config, r.generator_hidden_fraction,
                                           r.generator_layers, r.generator_heads,
                                           r.embedding_sharing)
    settings = RtdSettings(generator, r.embedding_sharing, float(r.disc_weight),
                           float(r.temperature), nsp=config.data.objective == "rtd_nsp")
    # The discriminator has no MLM head: no held-out bound.
    return RtdTask(*shape, **{**common, "diffusion": DiffusionSettings(eval_points=0)},
                   rtd=settings)
  return PretrainingTask(*shape, **common)


def rate_stages(masking, num_train_steps: int) -> tuple[tuple[int, float], ...]:
  """config.masking's "stages" schedule as (first step, rate) pairs; () for "constant"."""
  if masking.rate_schedule == "constant":
    return ()
  return tuple((int(round(start * num_train_steps)), float(rate))
               for start, rate in zip(masking.stage_starts, masking.stage_rates))


def _builtin_root(config, workdir: str) -> str:
  """Where the built-in corpus is prepared (<root>/data/builtin-<key>): the workdir, or, for a
  workdir in a bucket, a local directory on each host (ArrayRecord reads local files only):
  config.data.builtin_cache_dir, else ~/.cache/bert_jax."""
  if config.data.builtin_cache_dir:
    return config.data.builtin_cache_dir
  if storage.is_remote(workdir):
    return os.path.join(os.path.expanduser("~"), ".cache", "bert_jax")
  return workdir


def _resolve_data(config, workdir: str) -> tuple[str | None, dict]:
  """(dataset dir, its bert_meta.json) for prepared / builtin data, checked against the model;
  (None, {}) for synthetic data. The built-in corpus is prepared once and cached: by process 0
  in a shared workdir, by every host in its own local cache when the workdir is a bucket; then
  every process reads it."""
  spec = pipeline.DataSpec.from_config(config)
  if spec.source == "synthetic":
    return None, {}
  root, prepared = _builtin_root(config, workdir), None
  builtin_data = spec.source == "builtin"
  settings = spec.builtin
  if builtin_data and (jax.process_index() == 0 or storage.is_remote(workdir)):
    # The directory it prepared (or the run's own, on a restart): the corpus key is not
    # computed twice (a package installed in between would name another directory).
    prepared = builtin.run_dataset(root, settings, workdir, record=jax.process_index() == 0)
  multihost_utils.sync_global_devices("bert_jax: dataset ready")
  if builtin_data and prepared is None:  # Process 0's choice, prepared and recorded by now.
    prepared = builtin.run_dataset(root, settings, workdir, record=False)
  return pipeline.resolve_dataset(spec, root, builtin_dir=prepared)


def _train_iterator(config, dataset_dir: str | None, vocab_size: int):
  common = dict(global_batch_size=config.train.batch_size, seed=config.seed,
                process_index=jax.process_index(), process_count=jax.process_count())
  if dataset_dir is None:
    s = SYNTHETIC_SPECIALS
    return pipeline.make_synthetic_iterator(
        seq_len=config.data.max_seq_length, vocab_size=vocab_size, pad_id=s["pad_id"],
        cls_id=s["cls_id"], sep_id=s["sep_id"], special_ids=tuple(s.values()),
        max_examples_per_row=examples_per_row(config), **common)
  return pipeline.make_train_iterator(dataset_dir, num_workers=config.data.num_workers, **common)


def _mixture_spec(config) -> mixture.MixtureSpec:
  return mixture.MixtureSpec.parse(config.data.mixture, config.data.mixture_temperature,
                                   config.data.mixture_phases)


def _mixture_data(config, dirs: list[str]):
  """(train iterator, eval sets by source name) of a mixture."""
  phases = mixture.phase_weights(_mixture_spec(config), mixture.sizes(dirs),
                                 config.train.num_train_steps)
  shown = ", ".join(f"{mixture.name_of(d)} {w:.3f}" for d, w in zip(dirs, phases[0][1]))
  console(f"Mixture: {shown}" + "".join(
      f"; from step {start}: " + ", ".join(f"{w:.3f}" for w in weights)
      for start, weights in phases[1:]))
  train_iter = mixture.MixtureIterator(
      dirs, phases, global_batch_size=config.train.batch_size, seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count(), log=console)
  return train_iter, lambda: {mixture.name_of(d): _eval_batches(config, d)() for d in dirs}


def _eval_batches(config, dataset_dir: str):
  return lambda: pipeline.make_eval_batches(
      dataset_dir, global_batch_size=config.train.eval_batch_size,
      process_index=jax.process_index(), process_count=jax.process_count(),
      max_batches=config.train.eval_max_batches)


def _initial_params(config, model_config: BertConfig, vocab: Vocab | None):
  """-> a loader of the weights to continue pretraining from (read only for a fresh start),
  checked against the model (shape) and the data's vocabulary (the same pieces in the same
  order, unless config.checkpoint.allow_vocab_change)."""
  def load() -> dict:
    from bert_jax import weights  # Imports HF/TF readers only when needed.
    source = config.init_from
    # The heads this objective reads: a missing pooler and NSP head are no news to an MLM run.
    uses = ("pooler", "mlm", "nsp") if config.data.objective.endswith("nsp") else ("mlm",)
    loaded_config, params, loaded_vocab = weights.load_pretrained(source, uses)
    _check_positions(loaded_config, config, source)
    checkpointing.check_compatible(dataclasses.asdict(loaded_config),
                                   dataclasses.asdict(model_config), source)
    checkpointing.check_same_vocab(
        checkpointing.vocab_fingerprint(loaded_vocab), checkpointing.vocab_fingerprint(vocab),
        source, config.checkpoint.allow_vocab_change)
    return params
  return load


def _check_positions(loaded_config: BertConfig, config, source: str) -> None:
  """A later phase at a longer length (BERT's 512 after 128) reads rows of the learned position
  table the earlier phase must already have: the table cannot grow when the weights carry over."""
  rows, length = loaded_config.max_position_embeddings, config.data.max_seq_length
  if loaded_config.position_embedding == "learned" and rows < length:
    raise ValueError(
        f"{source} has max_position_embeddings={rows}, fewer than config.data.max_seq_length="
        f"{length}: its position table cannot grow. Pretrain the first phase with "
        f"--config.model.max_position_embeddings>={length} (the original has 512 rows from the "
        "start: trained at 128 tokens, then at 512)")
