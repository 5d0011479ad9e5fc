"""When to stop at a step boundary: a SIGTERM (a scheduler's preemption notice, `kill`) on one
process (`stop_signals.StopSignals`), or, with several processes, JAX's preemption sync point,
so that every host stops at the same step and their checkpoint shares match."""

import jax
from jax.experimental import multihost_utils

from bert_jax.runtime.stop_signals import StopSignals


class PreemptionFlag:
  """Whether to stop at this step boundary. With several processes JAX's own SIGTERM handler
  (installed by jax.distributed) feeds its sync point; a Python handler would replace it, so
  `StopSignals` is installed on a single process only."""

  def __init__(self, grace_seconds: float):
    self.signals = StopSignals(grace_seconds)
    if jax.process_count() == 1:
      self.signals.install()

  def should_stop(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step) or False
    self.signals.announce()
    return self.signals.requested

  def restore(self) -> None:
    """The signal handlers as they were before."""
    self.signals.restore()
