"""The pretraining loop: data, a sharded state, one compiled step, checkpoints, eval and logs.

`train_and_evaluate(config, workdir)` is all `launch/train.py` calls. Every check that can fail
on bad input (config, batch size vs mesh, vocabulary vs model, checkpoint vs model) runs before
any device work.
"""

import collections
import dataclasses
import functools
import json
import os
import signal
import time
from typing import Any, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from bert_jax import checkpointing, flops, losses, optimizer as optimizer_lib, sharding, steps
from bert_jax.data import pipeline
from bert_jax.masking import MaskingConfig
from bert_jax.metrics_writer import MetricWriter
from bert_jax.model import BertConfig, BertForPreTraining

# Per-example fields of a training batch (WORKSPACE.md): name -> (shape without batch, dtype).
def _batch_signature(seq_len: int) -> dict[str, tuple[tuple[int, ...], Any]]:
  tokens = ((seq_len,), jnp.int32)
  return {"input_ids": tokens, "token_type_ids": tokens, "attention_mask": tokens,
          "word_starts": tokens, "next_sentence_label": ((), jnp.int32)}


# Synthetic data uses sentencepiece's special-token layout (see WORKSPACE.md).
_SYNTHETIC_SPECIALS = dict(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What the loop needs to know about its input."""
  source: str
  dataset_dir: str | None  # None for synthetic data.
  vocab_size: int
  mask_id: int
  unk_id: int  # Selected for MLM like any token (the original does); the other specials not.
  special_ids: tuple[int, ...]
  vocab_dir: str | None


def resolve_data(config, workdir: str) -> DataSpec:
  """Prepares (builtin: process 0, once, cached in the workdir) or locates the dataset, and
  checks that it fits the model."""
  if config.data.source == "synthetic":
    specials = _SYNTHETIC_SPECIALS
    return DataSpec("synthetic", None, config.model.vocab_size, specials["mask_id"],
                    specials["unk_id"], tuple(sorted(specials.values())), None)
  if config.data.source == "builtin" and jax.process_index() == 0:
    pipeline.resolve_dataset(config, workdir)
  multihost_utils.sync_global_devices("bert_jax: dataset ready")
  dataset_dir, meta = pipeline.resolve_dataset(config, workdir)
  return DataSpec(config.data.source, dataset_dir, meta["vocab_size"], meta["mask_id"],
                  meta["unk_id"], tuple(sorted(set(meta["special_ids"]))),
                  os.path.join(dataset_dir, meta["vocab_dir"]))


def _train_iterator(config, data: DataSpec):
  common = dict(global_batch_size=config.train.batch_size, seed=config.seed,
                process_index=jax.process_index(), process_count=jax.process_count())
  if data.dataset_dir is None:
    return pipeline.make_synthetic_iterator(
        seq_len=config.data.max_seq_length, vocab_size=data.vocab_size,
        pad_id=_SYNTHETIC_SPECIALS["pad_id"], cls_id=_SYNTHETIC_SPECIALS["cls_id"],
        sep_id=_SYNTHETIC_SPECIALS["sep_id"], special_ids=data.special_ids, **common)
  return pipeline.make_train_iterator(data.dataset_dir, num_workers=config.data.num_workers,
                                      **common)


def _validate(config) -> None:
  train = config.train
  if train.batch_size % train.grad_accum_steps:
    raise ValueError(f"config.train.batch_size={train.batch_size} is not divisible by "
                     f"config.train.grad_accum_steps={train.grad_accum_steps}")
  if config.data.max_seq_length > config.model.max_position_embeddings:
    raise ValueError(f"config.data.max_seq_length={config.data.max_seq_length} exceeds "
                     f"config.model.max_position_embeddings={config.model.max_position_embeddings}")
  if train.num_train_steps <= 0:
    raise ValueError(f"config.train.num_train_steps must be positive, got {train.num_train_steps}")


class _PreemptionFlag:
  """SIGTERM sets a flag the loop reads at the next step boundary. On several hosts the hosts
  agree through JAX's preemption sync point instead, so that all of them stop at one step."""

  def __init__(self):
    self.requested = False
    # With several processes, JAX's own SIGTERM handler (installed by jax.distributed) feeds
    # the sync point; a Python handler would replace it.
    self._previous = None
    if jax.process_count() == 1:
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def should_stop(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step) or False
    return self.requested

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class _MetricSums:
  """Host-side sums of step metrics; checks every step's loss is finite."""

  def __init__(self):
    self.sums: dict[str, float] = collections.defaultdict(float)
    self.steps = 0
    self.last: dict[str, float] = {}

  def add(self, pending: list[tuple[int, dict]]) -> None:
    for step, metrics in jax.device_get(pending):
      if not np.isfinite(metrics["loss"]):
        raise FloatingPointError(
            f"Non-finite loss ({metrics['loss']}) at step {step}; training stopped and no "
            "checkpoint of this state was written. Lower config.train.learning_rate or check "
            "the data.")
      for name, value in metrics.items():
        self.sums[name] += float(value)
      self.steps += 1
      self.last = {k: float(v) for k, v in metrics.items()}

  def report(self) -> dict[str, float]:
    report = losses.means(self.sums)
    report["loss"] = self.sums["loss"] / max(self.steps, 1)
    report["grad_norm"] = self.sums["grad_norm"] / max(self.steps, 1)
    report["learning_rate"] = self.last.get("learning_rate", 0.0)
    self.sums.clear()
    self.steps = 0
    return report


def _meta(config, model_config: BertConfig, data: DataSpec) -> dict[str, Any]:
  return {
      "config": checkpointing.to_json(config.to_dict()),
      "model_config": checkpointing.to_json(dataclasses.asdict(model_config)),
      "data": {"source": data.source, "dataset_dir": data.dataset_dir},
      "vocab": checkpointing.encode_files(data.vocab_dir) if data.vocab_dir else None,
  }


def evaluate(params, config, data: DataSpec, eval_fn, mesh) -> dict[str, float]:
  """Exact means over the whole validation split (or config.train.eval_max_batches batches)."""
  totals: dict[str, float] = collections.defaultdict(float)
  batches = pipeline.make_eval_batches(
      data.dataset_dir, global_batch_size=config.train.eval_batch_size,
      process_index=jax.process_index(), process_count=jax.process_count(),
      max_batches=config.train.eval_max_batches)
  eval_key = jax.random.fold_in(jax.random.key(config.seed), 1)  # Same masks every eval.
  pending = []
  for index, local in enumerate(batches):
    batch = sharding.global_batch_from_local(local, mesh)
    pending.append(eval_fn(params, batch, jax.random.fold_in(eval_key, index)))
  for sums in jax.device_get(pending):
    for name, value in sums.items():
      totals[name] += float(value)
  return {**losses.means(totals), "examples": totals["nsp_count"]}


def _batch_spec(config, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  return {name: jax.ShapeDtypeStruct((config.train.batch_size, *shape), dtype,
                                     sharding=sharding.batch_sharding(mesh, 1 + len(shape)))
          for name, (shape, dtype) in _batch_signature(config.data.max_seq_length).items()}


def memory_report(compiled) -> dict[str, float]:
  """Per-device memory of a compiled step in GiB (XLA's memory analysis) and XLA's FLOPs."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  gib = 1 / 2**30
  report = {"xla_flops_per_device": float(cost.get("flops", 0.0)) if cost else 0.0}
  if memory is not None:
    report.update(
        arguments_gib=memory.argument_size_in_bytes * gib,
        outputs_gib=memory.output_size_in_bytes * gib,
        temporaries_gib=memory.temp_size_in_bytes * gib,
        code_gib=memory.generated_code_size_in_bytes * gib,
        # Donated state: outputs reuse the argument buffers.
        total_gib=(memory.argument_size_in_bytes + memory.temp_size_in_bytes
                   + memory.generated_code_size_in_bytes) * gib)
  return report


def _describe_compiled(compiled, writer: MetricWriter, flops_per_step: float) -> None:
  report = memory_report(compiled)
  if "total_gib" in report:
    writer.log(
        f"Compiled train step, per device: arguments {report['arguments_gib']:.3f} GiB, "
        f"temporaries {report['temporaries_gib']:.3f} GiB, code {report['code_gib']:.3f} GiB; "
        f"about {report['total_gib']:.3f} GiB in all")
  writer.log(f"FLOPs per step: {flops_per_step:.4g} (model count, all devices); XLA's count "
             f"{report['xla_flops_per_device']:.4g} per device")


def compile_report(config) -> dict[str, Any]:
  """Compiles the train step of `config` on this process's mesh against abstract shapes only
  (nothing is allocated, no data is read) -> per-device memory and FLOPs, to tell before a long
  run whether a config fits a chip."""
  _validate(config)
  model_config = BertConfig.from_config(config.model)
  mesh = sharding.make_mesh(config.mesh)
  sharding.batch_size_per_shard(config.train.batch_size // config.train.grad_accum_steps, mesh)
  model = BertForPreTraining(model_config)
  optimizer = optimizer_lib.make_optimizer(config.train)
  masking_config = MaskingConfig.from_config(
      config.masking, vocab_size=config.model.vocab_size,
      mask_token_id=_SYNTHETIC_SPECIALS["mask_id"],
      special_token_ids=tuple(_SYNTHETIC_SPECIALS.values()),
      unk_token_id=_SYNTHETIC_SPECIALS["unk_id"])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    state_shardings, abstract_state = state_shardings_and_shapes(config, model, optimizer, mesh)
    target = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                          abstract_state, state_shardings)
    start = time.time()
    compiled = jit_train_step(config, model, optimizer, masking_config, state_shardings).lower(
        target, _batch_spec(config, mesh), jax.random.key(0)).compile()
  return {"compile_seconds": time.time() - start, "devices": jax.device_count(),
          "mesh": dict(mesh.shape), **memory_report(compiled),
          "model_flops_per_step": config.train.batch_size * flops.train_flops_per_sequence(
              model_config, config.data.max_seq_length, config.masking.max_predictions_per_seq)}


def _init_fn(config, model, optimizer):
  return functools.partial(
      steps.init_state, model=model, optimizer=optimizer, seq_len=config.data.max_seq_length,
      num_predictions=config.masking.max_predictions_per_seq)


def state_shardings_and_shapes(config, model, optimizer, mesh):
  """-> (NamedShardings of the TrainState from the logical-axis rules, its unboxed shapes).
  Nothing is allocated: shapes come from `jax.eval_shape`."""
  abstract = jax.eval_shape(_init_fn(config, model, optimizer), jax.random.key(0))
  shardings = sharding.logical_to_shardings(abstract, mesh, sharding.logical_rules(config.mesh))
  unboxed = jax.tree.map(lambda x: x.unbox(apply_constraint=False)
                         if isinstance(x, nn.Partitioned) else x, abstract,
                         is_leaf=lambda x: isinstance(x, nn.Partitioned))
  return shardings, unboxed


def init_sharded_state(config, model, optimizer, state_shardings, key) -> steps.TrainState:
  """Random init compiled with the target shardings: parameters are born sharded and never
  materialise whole on one host."""
  init_fn = _init_fn(config, model, optimizer)
  return jax.jit(lambda k: nn.meta.unbox(init_fn(k)), out_shardings=state_shardings)(key)


def jit_train_step(config, model, optimizer, masking_config, state_shardings):
  """The one jitted (pjit) train step: state donated, batch split over data x fsdp."""
  step_fn = functools.partial(
      steps.train_step, model=model, optimizer=optimizer, masking_config=masking_config,
      schedule=optimizer_lib.learning_rate_schedule(config.train),
      grad_accum_steps=config.train.grad_accum_steps)
  return jax.jit(step_fn, in_shardings=(state_shardings, None, None),
                 out_shardings=(state_shardings, None), donate_argnums=0)


def train_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Trains `config` in `workdir`, resuming from its latest checkpoint. Returns final metrics."""
  _validate(config)
  preemption = _PreemptionFlag()  # From the start: a SIGTERM during setup stops at step 1.
  try:
    return _train_and_evaluate(config, workdir, preemption)
  finally:
    preemption.restore()


def _train_and_evaluate(config, workdir: str, preemption: "_PreemptionFlag") -> dict[str, Any]:
  model_config = BertConfig.from_config(config.model)
  mesh = sharding.make_mesh(config.mesh)
  sharding.batch_size_per_shard(config.train.batch_size // config.train.grad_accum_steps, mesh)
  rules = sharding.logical_rules(config.mesh)
  data = resolve_data(config, workdir)
  writer = MetricWriter(workdir, config.logging.tensorboard)
  checkpointer = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"),
                                            config.checkpoint)
  latest = checkpointer.latest_step()
  if latest is not None:
    checkpointing.check_compatible(checkpointer.read_meta(latest),
                                   dataclasses.asdict(model_config), checkpointer.directory)

  initial_params = None
  if latest is None and config.checkpoint.init_from:
    initial_params = _read_initial_params(config, model_config, data)
  model = BertForPreTraining(model_config)
  optimizer = optimizer_lib.make_optimizer(config.train)
  masking_config = MaskingConfig.from_config(
      config.masking, vocab_size=data.vocab_size, mask_token_id=data.mask_id,
      special_token_ids=data.special_ids, unk_token_id=data.unk_id)

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    init_key, step_key = jax.random.split(jax.random.key(config.seed))
    state_shardings, abstract_state = state_shardings_and_shapes(config, model, optimizer, mesh)
    data_state = None
    if latest is None:
      state = init_sharded_state(config, model, optimizer, state_shardings, init_key)
      if initial_params is not None:
        state = _with_initial_params(state, initial_params[0], state_shardings)
        writer.log(f"Initialised from {config.checkpoint.init_from}" + (
            f" (fresh {', '.join(initial_params[1])})" if initial_params[1] else ""))
    else:
      target = jax.tree.map(
          lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
          abstract_state, state_shardings)
      state, data_state, _ = checkpointer.restore(latest, target)
      writer.log(f"Resumed from {checkpointer.directory}/{latest}")

    train_iter = _train_iterator(config, data)
    if data_state is not None:
      train_iter.set_state(json.loads(data_state))

    seq_len = config.data.max_seq_length
    compile_start = time.time()
    compiled = jit_train_step(config, model, optimizer, masking_config, state_shardings).lower(
        state, _batch_spec(config, mesh), step_key).compile()
    writer.log(f"Compiled the train step in {time.time() - compile_start:.1f} s on "
               f"{jax.device_count()} devices, mesh {dict(mesh.shape)}")
    tokens_per_step = config.train.batch_size * seq_len
    flops_per_step = config.train.batch_size * flops.train_flops_per_sequence(
        model_config, seq_len, config.masking.max_predictions_per_seq)
    _describe_compiled(compiled, writer, flops_per_step)
    device_peak = flops.peak_flops_per_device(jax.devices()[0].device_kind)
    # Unknown chips (CPUs): a matmul peak measured now; forced CPU devices share the host's cores.
    peak = device_peak * jax.device_count() if device_peak else flops.measure_matmul_peak()

    eval_fn = jax.jit(functools.partial(steps.eval_step, model=model,
                                        masking_config=masking_config))
    result = _loop(config, state, compiled, step_key, train_iter, checkpointer, writer, mesh,
                   data, model_config, eval_fn, tokens_per_step, flops_per_step, peak,
                   preemption)
  writer.close()
  checkpointer.close()
  return result


def _read_initial_params(config, model_config: BertConfig, data: DataSpec) -> tuple[dict, list]:
  """Pretrained params for continued pretraining (host numpy), checked against the model and
  the data's vocabulary. -> (params, names of the heads the source lacks)."""
  from bert_jax import pretrained  # Imports HF/TF readers only when needed.
  source = config.checkpoint.init_from
  loaded_config, params, _ = pretrained.load_pretrained(source)
  checkpointing.check_compatible({"model_config": dataclasses.asdict(loaded_config)},
                                 dataclasses.asdict(model_config), source)
  if loaded_config.vocab_size != data.vocab_size:
    raise ValueError(f"{source} has a vocabulary of {loaded_config.vocab_size} tokens, the data "
                     f"{data.vocab_size}; prepare the data with the checkpoint's vocabulary")
  missing = [head for head, present in pretrained.heads_present(params).items() if not present]
  return params, missing


def _with_initial_params(state, initial_params: dict, state_shardings) -> steps.TrainState:
  """The freshly initialised state with the pretrained params in place; heads the source lacks
  keep their fresh initialisation."""
  from bert_jax import pretrained
  params = pretrained.fill_missing_heads(initial_params, jax.device_get(state.params))
  params = jax.tree.map(lambda x, ref: np.asarray(x, ref.dtype), params, state.params)
  return state.replace(params=jax.device_put(params, state_shardings.params))


def _prefetched(train_iter, mesh, depth: int) -> Iterator[tuple[dict, bytes]]:
  """Yields (global device batch, iterator state after it). Keeps `depth` batches in flight so
  host input work overlaps the (asynchronously dispatched) step. The state is recorded per batch:
  a checkpoint must resume after the last *consumed* batch, not the last prefetched one."""
  queue = collections.deque()
  while True:
    while len(queue) <= depth:
      local = next(train_iter)
      state = json.dumps(train_iter.get_state()).encode()
      queue.append((sharding.global_batch_from_local(local, mesh), state))
    yield queue.popleft()


def _loop(config, state, compiled, step_key, train_iter, checkpointer, writer, mesh, data,
          model_config, eval_fn, tokens_per_step, flops_per_step, peak,
          preemption) -> dict[str, Any]:
  total = config.train.num_train_steps
  step = int(jax.device_get(state.step))
  meta = _meta(config, model_config, data)
  batches = _prefetched(train_iter, mesh, config.data.prefetch)
  sums, pending = _MetricSums(), []
  result: dict[str, Any] = {"start_step": step}
  interval_start, interval_steps = time.time(), 0
  try:
    while step < total:
      batch, data_state = next(batches)
      state, metrics = compiled(state, batch, step_key)
      step += 1
      interval_steps += 1
      pending.append((step, metrics))
      stop = preemption.should_stop(step)
      log_now = step % config.train.log_every_steps == 0 or step == total
      save_now = checkpointer.should_save(step) or step == total or stop
      if log_now or save_now:
        sums.add(pending)  # Raises on a non-finite loss, before any save of this state.
        pending = []
      if log_now:
        elapsed = time.time() - interval_start
        report = sums.report()
        tokens_per_sec = interval_steps * tokens_per_step / elapsed
        report.update(tokens_per_sec=tokens_per_sec,
                      mfu=interval_steps * flops_per_step / elapsed / peak)
        writer.write(step, "train", report)
        eta = (total - step) * elapsed / interval_steps
        writer.log(f"step {step}/{total} loss {report['loss']:.4f} mlm_acc "
                   f"{report['mlm_accuracy']:.4f} nsp_acc {report['nsp_accuracy']:.4f} lr "
                   f"{report['learning_rate']:.3g} {tokens_per_sec:,.0f} tok/s mfu "
                   f"{report['mfu']:.1%} eta {eta / 60:.1f} min")
        result["train"] = report
        interval_start, interval_steps = time.time(), 0
      if save_now:
        checkpointer.save(step, state, data_state, meta)
      if stop:
        checkpointer.wait_until_finished()
        writer.log(f"Preempted: saved step {step} and stopping")
        result["preempted_at"] = step
        break
      eval_every = config.train.eval_every_steps
      if data.dataset_dir and eval_every and (step % eval_every == 0 or step == total):
        eval_start = time.time()
        report = evaluate(state.params, config, data, eval_fn, mesh)
        interval_start += time.time() - eval_start  # Keep eval time out of tokens/s.
        writer.write(step, "validation", report)
        writer.log(f"eval step {step}: mlm_loss {report['mlm_loss']:.4f} mlm_acc "
                   f"{report['mlm_accuracy']:.4f} nsp_loss {report['nsp_loss']:.4f} nsp_acc "
                   f"{report['nsp_accuracy']:.4f} over {report['examples']:.0f} examples")
        result["validation"] = report
  finally:
    checkpointer.wait_until_finished()
  result["step"] = step
  return result
