"""The one trainer, for pretraining and fine-tuning alike: a sharded state (born sharded from the
task's init, restored from the workdir's latest checkpoint, or filled with pretrained weights),
one compiled step, prefetch, metric sums with the finite check, periodic log / eval / save,
preemption agreed across hosts, and the export of the best params when the run picks one.
Progress is reported in real (non-padding) tokens, with the fill rate, MFU on real tokens and
the share of time spent waiting for input; `config.logging.profile_steps` traces a window of
steps.

A driver (`bert_jax/train.py`, `bert_jax/finetune.py`) builds a `Run` (task, data, metadata) and
calls `train(config, workdir, run)`. The config sections it reads: `seed`, `train` (batch_size,
num_train_steps, grad_accum_steps, optimizer fields, log_every_steps, eval_every_steps,
eval_batch_size), `data.prefetch`, `mesh`, `checkpoint` (save_every_steps, max_to_keep,
async_save, on_damaged) and `logging` (tensorboard, profile_steps).
"""

import collections
import contextlib
import dataclasses
import functools
import json
import time
from typing import Any, Callable, Iterable, Iterator

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import checkpointing, flops, optimizer as optimizer_lib, sharding, steps, storage
from bert_jax.data.vocab import Vocab
from bert_jax.metrics_writer import MetricWriter
from bert_jax.model import padded_size
from bert_jax.stop_signals import Interrupted, StopSignals
from bert_jax.tasks.base import Task
from bert_jax.weights import layout

# Training checkpoints of the params layout before the encoder was scanned restore converted.
LEGACY_LAYOUT = checkpointing.LegacyLayout(layout.holds_layout_1, layout.downgrade, layout.upgrade)

# The config.train fields the compiled step depends on (with the task, mesh and rules).
STEP_FIELDS = ("optimizer", "schedule", "learning_rate", "warmup_steps", "num_train_steps",
               "weight_decay", "b1", "b2", "eps", "max_grad_norm", "grad_accum_steps")


@dataclasses.dataclass
class Run:
  """What a driver hands the trainer."""
  task: Task
  train_iter: Any  # next() -> this process's rows of a global batch; get_state / set_state.
  eval_batches: Callable[[], Iterable[dict]] | None  # -> local batches with example_weight.
  eval_data: Any  # Passed to `task.scores` (the fine-tuning TaskData; None for pretraining).
  meta: dict[str, Any]  # Recorded in every checkpoint (config, model config, data...).
  vocab: Vocab | None  # Saved as files in every checkpoint.
  # -> host params (pretrained layout: bert, mlm, nsp) to start from; called only for a fresh
  # start (no checkpoint in the workdir yet).
  initial_params: Callable[[], dict] | None = None
  initial_source: str = ""  # Where the initial params come from (for the log).
  best_metric: str | None = None  # Export the params whenever this eval metric improves.


@dataclasses.dataclass(frozen=True)
class Program:
  """What one task + optimizer fields + mesh compile to; cached, so runs in one process that
  differ only in data or starting weights (a sweep, the tests) share the compilations."""
  state_shardings: Any  # NamedShardings of the TrainState.
  abstract_state: Any  # Its unboxed ShapeDtypeStructs.
  init: Any  # key -> TrainState, born sharded.
  train_step: Any  # (state, batch, key) -> (state, metrics); state donated.
  eval_step: Any  # (params, batch, key) -> (outputs, sums).


@functools.lru_cache(maxsize=8)
def program(task: Task, step_items: tuple[tuple[str, Any], ...], mesh, rules) -> Program:
  """The jitted functions of `task` with the `STEP_FIELDS` of config.train on `mesh`."""
  train_config = ml_collections.ConfigDict(dict(step_items))
  optimizer = optimizer_lib.make_optimizer(train_config, task.frozen)
  init_fn = functools.partial(steps.init_state, task=task, optimizer=optimizer)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init_fn, jax.random.key(0))
    shardings = sharding.logical_to_shardings(abstract, mesh, rules)
  unboxed = jax.tree.map(lambda x: x.unbox(apply_constraint=False)
                         if isinstance(x, nn.Partitioned) else x, abstract,
                         is_leaf=lambda x: isinstance(x, nn.Partitioned))
  step_fn = functools.partial(
      steps.train_step, task=task, optimizer=optimizer,
      schedule=optimizer_lib.learning_rate_schedule(train_config),
      grad_accum_steps=train_config.grad_accum_steps)
  return Program(
      state_shardings=shardings, abstract_state=unboxed,
      init=jax.jit(lambda key: nn.meta.unbox(init_fn(key)), out_shardings=shardings),
      train_step=jax.jit(step_fn, in_shardings=(shardings, None, None),
                         out_shardings=(shardings, None), donate_argnums=0),
      eval_step=jax.jit(functools.partial(steps.eval_step, task=task)))


def make_program(config, task: Task, mesh) -> Program:
  items = tuple((name, config.train[name]) for name in STEP_FIELDS)
  return program(task, items, mesh, sharding.logical_rules(config.mesh))


def check_mesh(config, model_config, mesh) -> None:
  """The model's sharded dimensions and the batch sizes against the mesh, before compiling."""
  sharding.check_divisibility(model_config, dict(mesh.shape), sharding.logical_rules(config.mesh))
  check_batch_sizes(config, mesh)


def check_batch_sizes(config, mesh) -> None:
  """Batch sizes against the mesh, before any device work (the values themselves, and the
  batch against grad accumulation, are `config_checks`')."""
  train = config.train
  microbatch = ("config.train.batch_size" if train.grad_accum_steps == 1 else
                "config.train.batch_size / config.train.grad_accum_steps")
  sharding.batch_size_per_shard(train.batch_size // train.grad_accum_steps, mesh, microbatch)
  sharding.batch_size_per_shard(train.eval_batch_size, mesh, "config.train.eval_batch_size")


# --------------------------------------------------------------------------- compiling


def batch_spec(task: Task, batch_size: int, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract global train batch of `task`, split over data x fsdp."""
  return {name: jax.ShapeDtypeStruct((batch_size, *shape), dtype,
                                     sharding=sharding.batch_sharding(mesh, 1 + len(shape)))
          for name, (shape, dtype) in task.batch_signature().items()}


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


def compile_step(config, task: Task, mesh, prog: Program, log: Callable[[str], None]):
  """The train step compiled against abstract shapes; logs time, memory and FLOPs."""
  target = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                        prog.abstract_state, prog.state_shardings)
  start = time.time()
  compiled = prog.train_step.lower(target, batch_spec(task, config.train.batch_size, mesh),
                                   jax.random.key(0)).compile()
  log(f"Compiled the train step in {time.time() - start:.1f} s on {jax.device_count()} "
             f"devices, mesh {dict(mesh.shape)}")
  report = memory_report(compiled)
  if "total_gib" in report:
    log(
        f"Compiled train step, per device: arguments {report['arguments_gib']:.3f} GiB, "
        f"temporaries {report['temporaries_gib']:.3f} GiB, code {report['code_gib']:.3f} GiB; "
        f"about {report['total_gib']:.3f} GiB in all")
  flops_per_example = task.flops_per_example()
  if flops_per_example:
    log(f"FLOPs per step: {config.train.batch_size * flops_per_example:.4g} (model "
               f"count, all devices); XLA's count {report['xla_flops_per_device']:.4g} per device")
  return compiled


def compile_report(config, task: Task) -> dict[str, Any]:
  """Compiles the train step of `config` on this process's mesh against abstract shapes only
  (nothing allocated, no data read) -> per-device memory and FLOPs, to tell before a long run
  whether a config fits a chip."""
  mesh = sharding.make_mesh(config.mesh)
  check_mesh(config, task.model_config, mesh)
  prog = make_program(config, task, mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    start = time.time()
    compiled = compile_step(config, task, mesh, prog, log=lambda message: None)
  return {"compile_seconds": time.time() - start, "devices": jax.device_count(),
          "mesh": dict(mesh.shape), **memory_report(compiled),
          "model_flops_per_step": config.train.batch_size * (task.flops_per_example() or 0.0)}


# ------------------------------------------------------------------------------ state


def _merge_initial(fresh: dict, initial: dict, source: str) -> tuple[dict, list[str]]:
  """Fresh params with every leaf `initial` has put in place (shapes checked) -> (params,
  sorted names of the top-level parts left fresh, e.g. a head the source lacks)."""
  flat_initial = {path: value for path, value in
                  jax.tree_util.tree_flatten_with_path(initial)[0]}
  fresh_parts, leaves = set(), []
  for path, leaf in jax.tree_util.tree_flatten_with_path(fresh)[0]:
    if path not in flat_initial:  # Named by part: "mlm", "classifier", "pooler" (of bert).
      fresh_parts.add(path[1].key if path[0].key == "bert" else path[0].key)
      leaves.append(leaf)
      continue
    value = np.asarray(flat_initial[path])
    if value.shape != leaf.shape:
      name = "/".join(k.key for k in path)
      raise ValueError(f"{source}: {name} has shape {value.shape}, the model {leaf.shape}; "
                       "the checkpoint is of another model shape")
    leaves.append(value.astype(leaf.dtype))
  return jax.tree.unflatten(jax.tree.structure(fresh), leaves), sorted(fresh_parts)


def initial_state(config, run: Run, prog: Program, checkpointer: checkpointing.Checkpointer,
                  writer: MetricWriter, initial: dict | None
                  ) -> tuple[steps.TrainState, bytes | None, dict]:
  """(state, data-iterator state or None, best eval so far): restored from the latest
  checkpoint, else born sharded, with the `initial` (pretrained) params put in place if given."""
  if checkpointer.latest_step() is not None:
    target = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                          prog.abstract_state, prog.state_shardings)
    restored = checkpointer.restore(target, LEGACY_LAYOUT)
    if restored is None:
      raise ValueError(f"No checkpoint in {checkpointer.directory} could be restored (each was "
                       "set aside as <step>.damaged); start a new --workdir, or initialise from "
                       "weights you trust with --config.checkpoint.init_from")
    latest, state, data_state = restored
    writer.log(f"Resumed from {checkpointer.directory}/{latest}")
    return state, data_state, checkpointer.read_meta(latest).get("best", {})
  state = prog.init(jax.random.key(config.seed))
  if initial is None:
    return state, None, {}
  params, fresh = _merge_initial(jax.device_get(state.params), run.task.initial_params(initial),
                                 run.initial_source)
  writer.log(f"Initialised from {run.initial_source}"
             + (f" (fresh: {', '.join(fresh)})" if fresh else ""))
  return state.replace(params=jax.device_put(params, prog.state_shardings.params)), None, {}


def check_resumable(checkpointer: checkpointing.Checkpointer, run: Run,
                    allow_vocab_change: bool) -> None:
  """Refuses a workdir whose checkpoint is of another task, model shape, vocabulary or label
  list, before device work."""
  latest = checkpointer.latest_step()
  if latest is None:
    return
  saved = checkpointer.read_meta(latest)
  saved_task = saved.get("task", {}).get("name")
  if saved_task != run.task.name:
    raise ValueError(f"{checkpointer.directory}/{latest} is a checkpoint of task {saved_task!r}, "
                     f"this run is {run.task.name!r}; use another --workdir")
  checkpointing.check_compatible(saved["model_config"], run.meta["model_config"],
                                 checkpointer.directory)
  checkpointing.check_same_vocab(
      saved.get("vocab_fingerprint"), run.meta.get("vocab_fingerprint"),
      f"{checkpointer.directory}/{latest}", allow_vocab_change)
  saved_labels = saved["task"].get("labels")
  labels = run.task.meta().get("labels")
  if saved_labels is not None and list(saved_labels) != list(labels or ()):
    raise ValueError(f"{checkpointer.directory}/{latest} was trained with the labels "
                     f"{list(saved_labels)}, this run has {list(labels or ())}: the classifier's "
                     "rows would mean other labels. Give --config.data.labels in the saved order, "
                     "or use another --workdir")
  # Checkpoints from before vocabulary padding record no vocab_pad_multiple: they are unpadded.
  saved_multiple = saved["model_config"].get("vocab_pad_multiple", 1)
  model_config = run.task.model_config
  if padded_size(model_config.vocab_size, saved_multiple) != model_config.padded_vocab_size:
    raise ValueError(f"{checkpointer.directory}/{latest} was trained with vocab_pad_multiple="
                     f"{saved_multiple}, this run's config.model.vocab_pad_multiple is "
                     f"{model_config.vocab_pad_multiple}; set it to {saved_multiple} to resume")


# ------------------------------------------------------------------------ loop helpers


class PreemptionFlag:
  """Whether to stop at this step boundary: SIGTERM on one process (`StopSignals`); with several
  processes, JAX's preemption sync point (its own SIGTERM handler, installed by
  jax.distributed, feeds it; a Python handler would replace it), so all hosts stop at one step."""

  def __init__(self, grace_seconds: float):
    self.signals = StopSignals(grace_seconds)
    if jax.process_count() == 1:
      self.signals.install()

  def should_stop(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step) or False
    self.signals.announce()
    return self.signals.requested

  def restore(self):
    self.signals.restore()


class MetricSums:
  """Host-side sums of step metrics; checks every step's loss is finite."""

  def __init__(self, task: Task):
    self.task = task
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
    report = self.task.report(self.sums)
    report["loss"] = self.sums["loss"] / max(self.steps, 1)
    report["grad_norm"] = self.sums["grad_norm"] / max(self.steps, 1)
    report["learning_rate"] = self.last.get("learning_rate", 0.0)
    report["real_tokens"] = self.sums["real_tokens"]  # Over the interval's steps.
    self.sums.clear()
    self.steps = 0
    return report


def prefetched(train_iter, mesh, depth: int) -> Iterator[tuple[dict, bytes]]:
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


def _to_host(tree):
  """Global (batch-sharded) arrays -> numpy on every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def evaluate(params, config, run: Run, prog: Program, mesh) -> dict[str, float]:
  """The task's scores over every eval batch: sums added exactly; per-row outputs (if the task
  keeps any) gathered in order, padding rows dropped."""
  eval_key = jax.random.fold_in(jax.random.key(config.seed), 1)  # Same draws every eval.
  pending = [prog.eval_step(params, sharding.global_batch_from_local(local, mesh),
                            jax.random.fold_in(eval_key, index))
             for index, local in enumerate(run.eval_batches())]
  sums: dict[str, float] = collections.defaultdict(float)
  gathered: dict[str, list[np.ndarray]] = collections.defaultdict(list)
  for outputs, batch_sums in pending:
    for name, value in jax.device_get(batch_sums).items():
      sums[name] += float(value)
    if len(outputs) > 1:  # More than example_weight: the task scores per-row outputs.
      outputs = _to_host(outputs)
      keep = np.asarray(outputs.pop("example_weight")) > 0
      for name, value in outputs.items():
        gathered[name].append(np.asarray(value)[keep])
  outputs = {name: np.concatenate(parts) for name, parts in gathered.items()}
  return run.task.scores(outputs, dict(sums), run.eval_data)


# ------------------------------------------------------------------------------- loop


@dataclasses.dataclass
class _Loop:
  """The state of a running loop and its periodic actions (log, save, eval, export)."""
  config: Any
  workdir: str
  run: Run
  prog: Program
  mesh: Any
  writer: MetricWriter
  checkpointer: checkpointing.Checkpointer
  best_export: checkpointing.BestExport | None
  best: dict[str, Any]
  result: dict[str, Any] = dataclasses.field(default_factory=dict)

  def log_progress(self, step: int, sums: MetricSums, interval: "_Interval",
                   peak: float | None) -> None:
    total, steps_done = self.config.train.num_train_steps, interval.steps
    elapsed = time.time() - interval.start
    report = sums.report()
    batch_size = self.config.train.batch_size
    slots = steps_done * batch_size * self.run.task.batch_signature()["input_ids"][0][0]
    # Slots are not work: throughput and MFU count the real (non-padding) tokens.
    report["fill_rate"] = report.pop("real_tokens") / slots
    report["tokens_per_sec"] = slots / elapsed
    report["real_tokens_per_sec"] = report["fill_rate"] * slots / elapsed
    report["steps_per_sec"] = steps_done / elapsed
    # Near 0: the input keeps up; near 1: the accelerator waits for data (input-bound).
    report["input_wait_fraction"] = interval.input_wait / elapsed
    flops_per_example = self.run.task.flops_per_example()
    if flops_per_example and peak:
      # The model FLOPs of the real tokens: those of the slots times the fill rate.
      report["mfu"] = (steps_done * batch_size * flops_per_example * report["fill_rate"]
                       / elapsed / peak)
    self.writer.write(step, "train", report)
    shown = " ".join(f"{k} {report[k]:.4f}" for k in ("loss", *self.run.task.log_keys))
    mfu = f" mfu {report['mfu']:.1%}" if "mfu" in report else ""
    self.writer.log(f"step {step}/{total} {shown} lr {report['learning_rate']:.3g} "
                    f"{report['real_tokens_per_sec']:,.0f} real tok/s (fill "
                    f"{report['fill_rate']:.0%}){mfu} eta "
                    f"{(total - step) * elapsed / steps_done / 60:.1f} min")
    self.result["train"] = report

  def save(self, step: int, state, data_state: bytes) -> None:
    meta = {**self.run.meta, "task": self.run.task.meta(), "best": self.best}

    def save():
      self.writer.flush()  # A bucket's metrics.jsonl then holds every step a resume starts after.
      self.checkpointer.save(step, state, data_state, meta, self.run.vocab)
    # Storage may hang (a bucket that stops answering): SIGTERM and SIGINT are honoured.
    self.checkpointer.stop.wait(save, f"checkpoint {step}")

  def evaluate_and_export(self, step: int, params) -> None:
    report = evaluate(params, self.config, self.run, self.prog, self.mesh)
    self.writer.write(step, "validation", report)
    self.writer.log(f"eval step {step}: " + " ".join(
        f"{k} {v:.4f}" for k, v in report.items() if k not in ("examples", "windows"))
        + f" over {report.get('examples', 0):.0f} examples")
    self.result["validation"] = report
    metric = self.run.best_metric
    if metric is None:
      return
    if metric not in report:
      raise ValueError(f"config.train.best_metric={metric!r} is not a metric of this task; use "
                       f"one of {sorted(k for k in report if k not in ('examples', 'windows'))}")
    if report[metric] > self.best.get(metric, -float("inf")):
      self.best = {"step": step, **report}
      self.export(step, params, report)

  def export(self, step: int, params, report: dict[str, float]) -> None:
    meta = {**self.run.meta, "task": self.run.task.meta(), "step": step, "metrics": report}
    self.best_export.save(step, params, meta, self.run.vocab)


@dataclasses.dataclass
class _Interval:
  """Wall time, steps and input wait since the last progress line (evaluation excluded)."""
  start: float = dataclasses.field(default_factory=time.time)
  steps: int = 0
  input_wait: float = 0.0  # Seconds the loop waited for its next batch.


class _Profiler:
  """A jax.profiler trace of steps (start, start + count] under `<workdir>/profile`, for
  TensorBoard's profile plugin or Perfetto; `config.logging.profile_steps` = (start, count)."""

  def __init__(self, config, workdir: str, first_step: int):
    self.start, self.count = (int(x) for x in config.logging.profile_steps)
    self.directory = storage.join(storage.absolute(workdir), "profile")
    self.active = False
    if self.count > 0 and self.start < first_step:
      logging.warning("config.logging.profile_steps starts at step %d, before this run's first "
                      "step %d: no profile", self.start, first_step)

  def before_step(self, step: int) -> None:
    if self.count > 0 and step == self.start:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after_step(self, step: int, state, log: Callable[[str], None]) -> None:
    if self.active and step == self.start + self.count:
      jax.block_until_ready(state)
      jax.profiler.stop_trace()
      self.active = False
      log(f"Profiled steps {self.start + 1}-{step} into {self.directory}")


def _run_loop(loop: _Loop, state, step_key, preemption: PreemptionFlag, peak) -> steps.TrainState:
  config, run = loop.config, loop.run
  total, step = config.train.num_train_steps, int(jax.device_get(state.step))
  batches = prefetched(run.train_iter, loop.mesh, config.data.prefetch)
  sums, pending, interval = MetricSums(run.task), [], _Interval()
  profiler = _Profiler(config, loop.workdir, step)
  while step < total:
    profiler.before_step(step)
    waiting = time.time()
    batch, data_state = next(batches)
    interval.input_wait += time.time() - waiting
    state, metrics = loop.prog.train_step(state, batch, step_key)
    step += 1
    interval.steps += 1
    profiler.after_step(step, state, loop.writer.log)
    pending.append((step, metrics))
    stop = preemption.should_stop(step)
    log_now = step % config.train.log_every_steps == 0 or step == total
    save_now = loop.checkpointer.should_save(step) or step == total or stop
    if log_now or save_now:
      sums.add(pending)  # Raises on a non-finite loss, before any save of this state.
      pending = []
    if log_now:
      loop.log_progress(step, sums, interval, peak)
      interval = _Interval()
    if not stop and _eval_due(config, run, step):
      eval_start = time.time()
      loop.evaluate_and_export(step, state.params)
      interval.start += time.time() - eval_start  # Evaluation is not train time.
    if save_now:
      loop.save(step, state, data_state)
    if stop:
      loop.checkpointer.wait_until_finished()
      loop.writer.log(f"Preempted: saved step {step} and stopping")
      loop.result["preempted_at"] = step
      break
  loop.result["step"] = step
  return state


def _eval_due(config, run: Run, step: int) -> bool:
  every = config.train.eval_every_steps
  return run.eval_batches is not None and (
      step == config.train.num_train_steps or (every > 0 and step % every == 0))


def train(config, workdir: str, run: Run) -> dict[str, Any]:
  """Trains `run.task` in `workdir`, resuming from its latest checkpoint. Returns the final
  train report, evaluation, best evaluation, step and state."""
  mesh = sharding.make_mesh(config.mesh)
  check_mesh(config, run.task.model_config, mesh)
  # Recorded in every checkpoint and export: a resume or init with other pieces is refused.
  run = dataclasses.replace(run, meta={
      **run.meta, "vocab_fingerprint": checkpointing.vocab_fingerprint(run.vocab)})
  with contextlib.ExitStack() as cleanup:  # Closed in reverse order, whatever happens.
    # From the start: a SIGTERM during setup stops at step 1.
    preemption = PreemptionFlag(config.checkpoint.stop_grace_seconds)
    cleanup.callback(preemption.restore)
    stop = preemption.signals
    checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint, stop)
    cleanup.push(_closing(checkpointer))  # Waits for a save in flight (not after a signal).
    check_resumable(checkpointer, run, config.checkpoint.allow_vocab_change)
    best_export = checkpointing.BestExport(workdir, stop) if run.best_metric else None
    if best_export is not None:
      cleanup.push(_closing(best_export))
    writer = MetricWriter(workdir, config.logging.tensorboard)
    cleanup.push(_closing(writer))
    # Read outside the mesh context: readers may trace the model to check their shapes.
    fresh_start = checkpointer.latest_step() is None
    initial = run.initial_params() if fresh_start and run.initial_params else None
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
      prog = make_program(config, run.task, mesh)
      state, data_state, best = initial_state(config, run, prog, checkpointer, writer, initial)
      if data_state is not None:
        run.train_iter.set_state(json.loads(data_state))
      compile_step(config, run.task, mesh, prog, writer.log)
      loop = _Loop(config, workdir, run, prog, mesh, writer, checkpointer, best_export, best,
                   {"start_step": int(jax.device_get(state.step))})
      state = _run_loop(loop, state, jax.random.fold_in(jax.random.key(config.seed), 2),
                        preemption, _peak_flops(run.task))
      _finish(loop, state, config, mesh)
  return {**loop.result, "best": loop.best, "state": state}


def _closing(writer: "checkpointing.Checkpointer | checkpointing.BestExport | MetricWriter"):
  """An exit callback: close `writer` (waiting for its save or upload in flight), except when
  a signal stopped a wait; then nothing more is waited for (the launcher exits at once)."""
  def close(error_type, error, traceback) -> bool:
    del error, traceback
    if error_type is None:
      writer.close()
    elif not issubclass(error_type, Interrupted):
      try:  # The error under way is the one to report (a failed save fails again here).
        writer.close()
      except Exception:  # pylint: disable=broad-except
        logging.info("While stopping on an error, closing %s failed:", type(writer).__name__,
                     exc_info=True)
    return False
  return close


def _finish(loop: _Loop, state, config, mesh) -> None:
  """A run already trained to its last step still reports its evaluation; with no eval data,
  the final params are the best export."""
  if "preempted_at" in loop.result:
    return
  if "validation" not in loop.result and loop.run.eval_batches is not None:
    loop.result["validation"] = evaluate(state.params, config, loop.run, loop.prog, mesh)
  if loop.best_export is None:
    return
  if loop.run.eval_batches is None and loop.result["step"] > loop.result["start_step"]:
    loop.best = {"step": loop.result["step"]}
    loop.export(loop.result["step"], state.params, {})
  loop.best_export.wait_until_finished()


def _peak_flops(task: Task) -> float | None:
  """All devices' peak FLOP/s for MFU (`flops.total_peak_flops`); None when the task does not
  count its FLOPs or the chip's peak is unknown (logged)."""
  if not task.flops_per_example():
    return None
  peak, source = flops.total_peak_flops(jax.devices())
  (logging.info if peak else logging.warning)("Peak for MFU: %s", source)
  return peak
