"""Where metrics go: the console, `<workdir>/metrics.jsonl` and TensorBoard; process 0 only.
The workdir may be a bucket (gs://): metrics.jsonl is then uploaded every 30 s, before every
checkpoint (`flush`) and at the end (objects cannot be appended to: each upload rewrites it)."""

import json
import logging
import sys
import time

import jax

from bert_jax.runtime import storage


def console(message: str) -> None:
  """A line on the console (process 0 only), copied to the log file when there is one."""
  if jax.process_index() == 0:
    print(message, file=sys.stdout, flush=True)
  logging.getLogger("bert_jax.progress").info(message)


def _summary_writer():
  """tensorboardX's SummaryWriter (light: no TensorFlow needed; writes gs:// too), imported
  without torch: tensorboardX imports torch at import when it is installed, only to accept its
  tensors (bert_jax logs floats), which cost every launcher ~2 s (0.7 s without). A torch
  imported before, or after, is untouched."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile.
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Writes one record per logged step. On processes other than 0 every call is a no-op."""

  def __init__(self, workdir: str, tensorboard: bool):
    self.enabled = jax.process_index() == 0
    self._jsonl = None
    self._tensorboard = None
    if not self.enabled:
      return
    storage.makedirs(workdir)
    self._jsonl = storage.Appender(storage.join(workdir, "metrics.jsonl"), flush_seconds=30.0)
    if tensorboard:
      # Its own thread writes the events, at least every 30 s: a step never waits for storage.
      self._tensorboard = _summary_writer()(storage.join(workdir, "tensorboard"), flush_secs=30)

  def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": step, "split": split, **metrics, "time": time.time()}
    self._jsonl.write(json.dumps(record) + "\n")
    if self._tensorboard is not None:
      for name, value in metrics.items():
        if isinstance(value, (int, float)):
          self._tensorboard.add_scalar(f"{split}/{name}", value, step)

  def log(self, message: str) -> None:
    console(message)

  def flush(self) -> None:
    """Everything written so far is in storage (before a checkpoint: a resume after it then
    finds every step it starts after)."""
    if self._jsonl is not None:
      self._jsonl.flush()
    if self._tensorboard is not None:
      self._tensorboard.flush()

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tensorboard is not None:
      self._tensorboard.close()
