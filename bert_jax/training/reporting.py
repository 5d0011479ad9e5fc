"""What a run reports while it trains: the step metrics summed on the host (each step's loss
checked finite before any checkpoint of it), the progress line and `metrics.jsonl` record per
logged interval in real (non-padding) tokens, with the fill rate, MFU on real tokens and the
share of time spent waiting for input, the evaluation line, and a jax.profiler trace of a window
of steps (`config.logging.profile_steps`).
"""

import collections
import dataclasses
import time
from typing import Any, Callable

import jax
import numpy as np
from absl import logging

from bert_jax.models import flops
from bert_jax.runtime import storage
from bert_jax.runtime.metrics_writer import MetricWriter
from bert_jax.training.settings import TrainSettings
from bert_jax.tasks.base import Scores, Task


def peak_flops(task: Task) -> float | None:
  """All devices' peak FLOP/s for MFU (`flops.total_peak_flops`); None when the task does not
  count its FLOPs or the chip's peak is unknown (logged)."""
  if not task.flops_per_example():
    return None
  peak, source = flops.total_peak_flops(jax.devices())
  (logging.info if peak else logging.warning)("Peak for MFU: %s", source)
  return peak


class MetricSums:
  """Host-side sums of step metrics (`steps.train_step`'s: the task's sums and counts, loss,
  grad_norm, learning_rate, real_tokens, slots, examples); checks every step's loss is finite."""

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
    report["slots"] = self.sums["slots"]
    # batch_size counts rows, and a row packs up to K examples: the examples a step learns from.
    report["examples_per_step"] = self.sums["examples"] / max(self.steps, 1)
    self.sums.clear()
    self.steps = 0
    return report


@dataclasses.dataclass
class Interval:
  """Wall time, steps and input wait since the last progress line (evaluation excluded)."""
  start: float = dataclasses.field(default_factory=time.time)
  steps: int = 0
  input_wait: float = 0.0  # Seconds the loop waited for its next batch.


class Profiler:
  """A jax.profiler trace of steps (start, start + count] under `<workdir>/profile`, for
  TensorBoard's profile plugin or Perfetto; `config.logging.profile_steps` = (start, count)."""

  def __init__(self, profile_steps, workdir: str, first_step: int):
    self.start, self.count = (int(x) for x in profile_steps)
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


class Reporter:
  """The reporting of one run: `add` the metrics of finished steps, `log` a progress line,
  `validation` an evaluation; time spent evaluating is not train time (`exclude`)."""

  def __init__(self, settings: TrainSettings, task: Task, writer: MetricWriter, workdir: str,
               first_step: int):
    self.settings, self.task, self.writer = settings, task, writer
    self.sums, self.interval = MetricSums(task), Interval()
    self.profiler = Profiler(settings.profile_steps, workdir, first_step)
    self.peak = peak_flops(task)

  def add(self, pending: list[tuple[int, dict]]) -> None:
    """Raises on a non-finite loss, before any save of this state."""
    self.sums.add(pending)

  def waited(self, seconds: float) -> None:
    self.interval.input_wait += seconds

  def stepped(self) -> None:
    self.interval.steps += 1

  def exclude(self, seconds: float) -> None:
    self.interval.start += seconds

  def log(self, step: int, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The interval's record (metrics.jsonl, TensorBoard) and progress line -> the record;
    `data`: fields of the data's own (a mixture's rows drawn per source)."""
    interval, total = self.interval, self.settings.num_train_steps
    elapsed, steps_done = time.time() - interval.start, interval.steps
    report = self.sums.report()
    # Slots are not work: throughput and MFU count the real (non-padding) tokens.
    real, slots = report.pop("real_tokens"), report.pop("slots")
    report["fill_rate"] = real / slots
    report["tokens_per_sec"] = slots / elapsed
    report["real_tokens_per_sec"] = real / elapsed
    report["steps_per_sec"] = steps_done / elapsed
    # Near 0: the input keeps up; near 1: the accelerator waits for data (input-bound).
    report["input_wait_fraction"] = interval.input_wait / elapsed
    flops_per_example = self.task.flops_per_example()
    if flops_per_example and self.peak:
      # The model FLOPs of the real tokens: an example's FLOPs per slot, times the real tokens.
      report["mfu"] = real * flops_per_example / self.task.seq_len / elapsed / self.peak
    report.update(data or {})
    self.writer.write(step, "train", report)
    shown = " ".join(f"{k} {report[k]:.4f}" for k in ("loss", *self.task.log_keys))
    mfu = f" mfu {report['mfu']:.1%}" if "mfu" in report else ""
    self.writer.log(f"step {step}/{total} {shown} lr {report['learning_rate']:.3g} "
                    f"{report['real_tokens_per_sec']:,.0f} real tok/s (fill "
                    f"{report['fill_rate']:.0%}){mfu} eta "
                    f"{(total - step) * elapsed / steps_done / 60:.1f} min")
    self.interval = Interval()
    return report

  def validation(self, step: int, scores: Scores) -> dict[str, float]:
    """The evaluation's record and line ("eval step 500: mlm_loss ... over 954 examples")."""
    record = {**scores.metrics, **scores.counts}
    self.writer.write(step, "validation", record)
    over = ", ".join(f"{value:.0f} {name}" for name, value in scores.counts.items())
    self.writer.log(f"eval step {step}: " + " ".join(
        f"{k} {v:.4f}" for k, v in scores.metrics.items()) + (f" over {over}" if over else ""))
    return record
