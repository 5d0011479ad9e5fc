"""A train iterator that sends this process SIGTERM when its `at`-th batch is read: the
in-process preemption of the resume tests (the trainer saves the step under way and returns)."""

import os
import signal


class SigtermAt:
  """Wraps a train iterator (`next`, `get_state`, `set_state`)."""

  def __init__(self, inner, at: int):
    self.inner, self.at, self.read = inner, at, 0

  def __next__(self):
    batch = next(self.inner)
    self.read += 1
    if self.read == self.at:
      os.kill(os.getpid(), signal.SIGTERM)
    return batch

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


def train_losses(workdir: str) -> dict[int, float]:
  """{step: loss} of a pretraining workdir's train lines."""
  import json  # pylint: disable=import-outside-toplevel
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if r["split"] == "train"}


def preempted_and_resumed(config, tmp_path, monkeypatch, at: int = 3) -> tuple[str, str]:
  """Pretrains `config` whole in tmp_path/whole, then in tmp_path/stopped with SIGTERM at the
  `at`-th batch, then again there (the resume) -> (whole, stopped). Asserts the stopped run
  saved exactly one checkpoint before the last step."""
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
  train.train_and_evaluate(config, whole)
  original = train._train_iterator  # pylint: disable=protected-access
  monkeypatch.setattr(train, "_train_iterator", lambda *a: SigtermAt(original(*a), at=at))
  train.train_and_evaluate(config, stopped)
  monkeypatch.setattr(train, "_train_iterator", original)
  (saved,) = [int(name) for name in os.listdir(os.path.join(stopped, "checkpoints"))
              if name.isdigit()]
  assert 1 <= saved < config.train.num_train_steps
  train.train_and_evaluate(config, stopped)
  return whole, stopped
