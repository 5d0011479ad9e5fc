"""The one trainer, for pretraining and fine-tuning alike: it runs the loop. A driver
(`bert_jax/train.py`, `bert_jax/finetune.py`) builds a `Run` (task, data, metadata) and calls
`train(settings, workdir, run)`; each step's batch comes prefetched, the compiled step runs, and
at their intervals the progress is logged, the task evaluated (its best params exported) and a
checkpoint saved; a preemption saves the step under way and stops.

What the loop calls, each in its own module: `programs` (the compiled init / train / eval
steps, mesh checks), `resume` (where the run starts: checkpoint, or fresh with pretrained
weights), `prefetch`, `reporting` (metric sums, progress line, MFU, profiler), `evaluation`,
`preemption`, `checkpointing` (saves, the best export). What it reads of the run's config comes
typed, as `settings.TrainSettings` (the driver builds it once; no ConfigDict reaches the loop).
"""

import collections
import contextlib
import dataclasses
import json
import time
from typing import Any, Callable, Iterable

import flax.linen as nn
import jax
import numpy as np
from absl import logging

from bert_jax.checkpoints import checkpointing
from bert_jax.training import evaluation, programs, resume, sharding
from bert_jax.models import model
from bert_jax.data.vocab import Vocab
from bert_jax.runtime.metrics_writer import MetricWriter
from bert_jax.training.preemption import PreemptionFlag
from bert_jax.training.prefetch import prefetched
from bert_jax.training.reporting import Reporter
from bert_jax.training.settings import TrainSettings
from bert_jax.runtime.stop_signals import Interrupted
from bert_jax.tasks.base import Task


@dataclasses.dataclass
class Run:
  """What a driver hands the trainer."""
  task: Task
  train_iter: Any  # next() -> this process's rows of a global batch; get_state / set_state.
  # -> local batches with example_weight; or {name: batches} of several sets (a mixture's
  # sources), scored together and each apart ("name/metric").
  eval_batches: Callable[[], Iterable[dict] | dict[str, Iterable[dict]]] | None
  eval_data: Any  # Passed to `task.scores` (the fine-tuning TaskData; None for pretraining).
  meta: dict[str, Any]  # Recorded in every checkpoint (config, model config, data...).
  vocab: Vocab | None  # Saved as files in every checkpoint.
  # -> host params (pretrained layout: bert, mlm, nsp) to start from; called only for a fresh
  # start (no checkpoint in the workdir yet).
  initial_params: Callable[[], dict] | None = None
  initial_source: str = ""  # Where the initial params come from (for the log).
  best_metric: str | None = None  # Export the params whenever this eval metric improves.
  # The train iterator's state after a logged step -> fields of its train record.
  data_report: Callable[[dict], dict] | None = None


@dataclasses.dataclass
class _Loop:
  """The state of a running loop and its periodic actions (log, save, eval, export)."""
  settings: TrainSettings
  run: Run
  prog: programs.Program
  mesh: Any
  reporter: Reporter
  checkpointer: checkpointing.Checkpointer
  best_export: checkpointing.BestExport | None
  best: dict[str, Any]
  result: dict[str, Any] = dataclasses.field(default_factory=dict)

  def save(self, step: int, state, data_state: bytes) -> None:
    meta = {**self.run.meta, "task": self.run.task.meta(), "best": self.best}

    def save():
      self.reporter.writer.flush()  # metrics.jsonl then holds every step a resume starts after.
      self.checkpointer.save(step, state, data_state, meta, self.run.vocab)
    # Storage may hang (a bucket that stops answering): SIGTERM and SIGINT are honoured.
    self.checkpointer.stop.wait(save, f"checkpoint {step}")

  def scores(self, params):
    """The task's scores over every eval batch; of several sets, over all of them together
    (their sums added) and each apart, as "name/metric"."""
    task = self.run.task
    batches = self.run.eval_batches()
    sets = batches if isinstance(batches, dict) else {"": batches}
    parts = {name: evaluation.evaluate(params, self.prog.eval_step, local, self.mesh,
                                       self.settings.seed, task.keeps_eval_outputs)
             for name, local in sets.items()}
    outputs = {key: np.concatenate([o[key] for o, _ in parts.values()])
               for key in next(iter(parts.values()))[0]}
    sums = collections.Counter()
    for _, part_sums in parts.values():
      sums.update(part_sums)
    scores = task.scores(outputs, dict(sums), self.run.eval_data)
    if isinstance(batches, dict):
      for name, (part_outputs, part_sums) in parts.items():
        scores.metrics.update({f"{name}/{key}": value for key, value in task.scores(
            part_outputs, part_sums, self.run.eval_data).metrics.items()})
    return scores

  def evaluate_and_export(self, step: int, params) -> None:
    scores = self.scores(params)
    self.result["validation"] = self.reporter.validation(step, scores)
    metric = self.run.best_metric
    if metric is None:
      return
    if metric not in scores.metrics:
      raise ValueError(f"config.train.best_metric={metric!r} is not a metric of this task; use "
                       f"one of {sorted(scores.metrics)}")
    if scores.metrics[metric] > self.best.get(metric, -float("inf")):
      self.best = {"step": step, **self.result["validation"]}
      self.export(step, params, self.result["validation"])

  def export(self, step: int, params, report: dict[str, float]) -> None:
    meta = {**self.run.meta, "task": self.run.task.meta(), "step": step, "metrics": report}
    self.best_export.save(step, params, meta, self.run.vocab)


def _run_loop(loop: _Loop, state, step_key, preemption: PreemptionFlag) -> Any:
  settings, run, reporter = loop.settings, loop.run, loop.reporter
  total, step = settings.num_train_steps, int(jax.device_get(state.step))
  batches = prefetched(run.train_iter, loop.mesh, settings.prefetch)
  pending = []
  while step < total:
    reporter.profiler.before_step(step)
    waiting = time.time()
    batch, data_state = next(batches)
    reporter.waited(time.time() - waiting)
    state, metrics = loop.prog.train_step(state, batch, step_key)
    step += 1
    reporter.stepped()
    reporter.profiler.after_step(step, state, reporter.writer.log)
    pending.append((step, metrics))
    stop = preemption.should_stop(step)
    log_now = step % settings.log_every_steps == 0 or step == total
    save_now = loop.checkpointer.should_save(step) or step == total or stop
    if log_now or save_now:
      reporter.add(pending)  # Raises on a non-finite loss, before any save of this state.
      pending = []
    if log_now:
      loop.result["train"] = reporter.log(step, run.data_report(json.loads(data_state))
                                          if run.data_report else None)
    if not stop and _eval_due(settings, run, step):
      eval_start = time.time()
      loop.evaluate_and_export(step, state.params)
      reporter.exclude(time.time() - eval_start)  # Evaluation is not train time.
    if save_now:
      loop.save(step, state, data_state)
    if stop:
      loop.checkpointer.wait_until_finished()
      reporter.writer.log(f"Preempted: saved step {step} and stopping")
      loop.result["preempted_at"] = step
      break
  loop.result["step"] = step
  return state


def _eval_due(settings: TrainSettings, run: Run, step: int) -> bool:
  every = settings.eval_every_steps
  return run.eval_batches is not None and (
      step == settings.num_train_steps or (every > 0 and step % every == 0))


def train(settings: TrainSettings, workdir: str, run: Run) -> dict[str, Any]:
  """Trains `run.task` in `workdir`, resuming from its latest checkpoint. Returns the final
  train report, evaluation, best evaluation, step and state."""
  mesh = sharding.make_mesh(settings.mesh)
  programs.check_mesh(settings, run.task.model_config, mesh)
  # Recorded in every checkpoint and export: a resume or init with other pieces is refused.
  run = dataclasses.replace(run, meta={
      **run.meta, "vocab_fingerprint": checkpointing.vocab_fingerprint(run.vocab)})
  with contextlib.ExitStack() as cleanup:  # Closed in reverse order, whatever happens.
    # From the start: a SIGTERM during setup stops at step 1.
    preemption = PreemptionFlag(settings.checkpoint.stop_grace_seconds)
    cleanup.callback(preemption.restore)
    checkpointer = checkpointing.Checkpointer(workdir, settings.checkpoint, preemption.signals)
    cleanup.push(_closing(checkpointer))  # Waits for a save in flight (not after a signal).
    resume.check_resumable(checkpointer, run.task, run.meta,
                           settings.checkpoint.allow_vocab_change)
    best_export = (checkpointing.BestExport(workdir, preemption.signals) if run.best_metric
                   else None)
    if best_export is not None:
      cleanup.push(_closing(best_export))
    writer = MetricWriter(workdir, settings.tensorboard)
    cleanup.push(_closing(writer))
    # Read outside the mesh context: readers may trace the model to check their shapes.
    fresh_start = checkpointer.latest_step() is None
    initial = run.initial_params() if fresh_start and run.initial_params else None
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(settings.mesh)):
      prog = programs.make_program(settings, run.task, mesh)
      state, data_state, best = resume.initial_state(settings.seed, run.task, prog, checkpointer,
                                                     initial, run.initial_source, writer.log,
                                                     run.meta["config"])
      if data_state is not None:
        run.train_iter.set_state(json.loads(data_state))
      programs.compile_step(settings.batch_size, run.task, mesh, prog, writer.log,
                            settings.step.grad_accum_steps)
      writer.log(model.attention_note(run.task.model_config, run.task.seq_len))
      first_step = int(jax.device_get(state.step))
      reporter = Reporter(settings, run.task, writer, workdir, first_step)
      loop = _Loop(settings, run, prog, mesh, reporter, checkpointer, best_export, best,
                   {"start_step": first_step})
      state = _run_loop(loop, state, jax.random.fold_in(jax.random.key(settings.seed), 2),
                        preemption)
      _finish(loop, state)
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


def _finish(loop: _Loop, state) -> None:
  """A run already trained to its last step still reports its evaluation; with no eval data,
  the final params are the best export."""
  if "preempted_at" in loop.result:
    return
  if "validation" not in loop.result and loop.run.eval_batches is not None:
    scores = loop.scores(state.params)
    loop.result["validation"] = {**scores.metrics, **scores.counts}
  if loop.best_export is None:
    return
  if loop.run.eval_batches is None and loop.result["step"] > loop.result["start_step"]:
    loop.best = {"step": loop.result["step"]}
    loop.export(loop.result["step"], state.params, {})
  loop.best_export.wait_until_finished()
