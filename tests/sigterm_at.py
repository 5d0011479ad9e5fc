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
