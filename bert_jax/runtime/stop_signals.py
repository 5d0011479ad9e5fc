"""How a run reacts to SIGTERM and SIGINT, at step boundaries and inside every blocking wait.

- SIGTERM (a scheduler's graceful stop, a TPU preemption) asks the loop to save at the next step
  boundary and exit 0 (`StopSignals.requested`). With several processes JAX's own handler feeds
  its preemption sync point instead, so that every host stops at the same step.
- A wait that could block for long (a checkpoint write and its commit, in a bucket too) runs
  through `StopSignals.wait`: the main thread polls, so signals are handled while it waits. A
  SIGTERM that comes during the wait gives it `grace_seconds` to finish (a stuck write then
  gives up with `Interrupted`); a wait that began after the SIGTERM (the save it asked for) runs
  to its end. A second SIGTERM stops at once wherever the run is, and so does SIGINT (Ctrl-C).
- The handlers only record (and, for a second signal, raise): a handler that logged would take
  the log file's lock, which the main thread may hold when the signal comes, and the run would
  wait for itself forever. The notice is logged by the main thread (`announce`).
- `Interrupted` ends the launcher with one line and the exit status of the signal (128 + its
  number: 143 for SIGTERM, 130 for SIGINT); a write that was under way is not kept.
"""

import signal
import threading
import time
from typing import Callable, TypeVar

from absl import logging

T = TypeVar("T")
_POLL_SECONDS = 0.1  # How often a wait looks at the signals.


class Interrupted(Exception):
  """A signal stopped a blocking wait (or the run): reported in one line, exit 128 + signum."""

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum

  @property
  def exit_status(self) -> int:
    return 128 + self.signum


class StopSignals:
  """SIGTERM as a stop request, checked at step boundaries and honoured inside waits.

  Installed for one process only (`install`); with several processes the step-boundary stop
  comes from JAX's preemption sync point (see `bert_jax/training/trainer.py`), and waits still poll
  so that SIGINT stops them.
  """

  def __init__(self, grace_seconds: float):
    self.grace_seconds = grace_seconds
    self.requested_at: float | None = None  # When the (first) SIGTERM came.
    self._count = 0
    self._announced = False
    self._previous = None

  @property
  def requested(self) -> bool:
    return self.requested_at is not None

  def install(self) -> "StopSignals":
    """The SIGTERM handler of this process (main thread only); `restore` puts the old one back."""
    self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def restore(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def announce(self) -> None:
    """Logs the stop request once, from the caller's (main) thread: never from the handler."""
    if self.requested and not self._announced:
      self._announced = True
      logging.warning("SIGTERM (at %s): the run saves at the next step boundary and stops",
                      time.strftime("%H:%M:%S", time.localtime(self.requested_at)))

  def _handle(self, signum, frame) -> None:
    del frame  # No logging, no locks here (see the module docstring).
    self._count += 1
    if self.requested_at is None:
      self.requested_at = time.time()
    if self._count > 1:  # A second SIGTERM: stop now, wherever the run is.
      raise Interrupted(signum, "stopped by a second SIGTERM; a checkpoint write under way (if "
                        "any) is not kept, a restart resumes from the last complete one")

  def wait(self, blocking: Callable[[], T], what: str) -> T:
    """`blocking()` in a helper thread while the main thread stays free to handle signals.
    Raises `Interrupted` on a second SIGTERM, or when a SIGTERM that came during the wait has
    waited `grace_seconds`; KeyboardInterrupt on SIGINT."""
    return interruptible(blocking, what, self)


def interruptible(blocking: Callable[[], T], what: str, stop: "StopSignals | None" = None) -> T:
  """`blocking()` with signals handled while it runs (see `StopSignals.wait`); `what` names the
  operation in the messages. Its errors are re-raised in the caller's thread."""
  outcome: dict[str, object] = {}

  def target():
    try:
      outcome["value"] = blocking()
    except BaseException as e:  # pylint: disable=broad-except  (re-raised below)
      outcome["error"] = e

  worker = threading.Thread(target=target, daemon=True, name=f"wait: {what}")
  started = time.time()
  worker.start()
  while worker.is_alive():
    worker.join(_POLL_SECONDS)  # KeyboardInterrupt (SIGINT) and handler errors surface here.
    if stop is not None:
      stop.announce()
    # Only a SIGTERM that came during this wait limits it: one that came before it is the
    # stop this wait is part of (the graceful save), which a second SIGTERM can still cut.
    if stop is not None and stop.requested and stop.requested_at >= started and worker.is_alive():
      waited = time.time() - stop.requested_at
      if waited > stop.grace_seconds:
        raise Interrupted(signal.SIGTERM, f"stopped by SIGTERM while {what} had not finished "
                          f"after {waited:.0f} s (config.checkpoint.stop_grace_seconds="
                          f"{stop.grace_seconds:g}); it is not kept, a restart resumes from the "
                          "last complete checkpoint")
  if "error" in outcome:
    raise outcome["error"]  # pylint: disable=raising-bad-type
  return outcome.get("value")
