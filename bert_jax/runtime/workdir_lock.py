"""One writer per workdir: a run holds `<workdir>/bert_jax.lock` from its start to its end.

Two runs on one workdir would overwrite each other's checkpoints (orbax rotates the other's
away) and interleave metrics.jsonl, and a late one resumes from a checkpoint the other is still
writing. So a launcher takes the lock before it writes anything (`hold`), and a second start is
refused in one line naming the holder (host, pid, start time).

The lock file is created exclusively (O_EXCL locally; `ifGenerationMatch=0` in a bucket) and
holds JSON: host, pid, the process's start time, a random token and a heartbeat the holder
renews every `HEARTBEAT_SECONDS`. A lock left by a killed run is taken over, so automatic
restarts work: on the same host as soon as its process is gone, from another host once its
heartbeat is `STALE_SECONDS` old, and from anywhere when it stays empty or unparsable (a run
killed while writing it). A run whose lock was taken over (it was frozen longer than
that) stops before its next checkpoint write (`check_held`).
With several processes, process 0 holds the lock for the run.
"""

import contextlib
import datetime
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Iterator

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.runtime import storage
from bert_jax.runtime.stop_signals import Interrupted

LOCK_FILE = "bert_jax.lock"
HEARTBEAT_SECONDS = 15.0  # How often the holder renews the lock.
STALE_SECONDS = 120.0  # A lock of another host not renewed for this long is taken over.
_RELEASE_SECONDS = 5.0  # At most this long to remove the lock at the end.
# A lock file is written whole as it is created (a bucket's object at once, a local file just
# after its exclusive create): one still empty or not JSON after this long was left by a run
# killed while writing it (or spoiled by hand), and is taken over.
_UNREADABLE_SECONDS = 2.0

_held: dict[str, "WorkdirLock"] = {}  # Workdir -> the lock this process holds on it.


class LockedError(ValueError):
  """The workdir is in use by another run."""


class LockLostError(ValueError):
  """This run's lock was taken over by another run: it must not write any more."""


def _process_start(pid: int) -> str | None:
  """The kernel's start time of `pid` (Linux), so that a reused pid is not mistaken for the
  holder; None when unknown."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      return f.read().rsplit(b")", 1)[1].split()[19].decode()
  except (OSError, IndexError):
    return None


def _alive(pid: int, start: str | None) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process: it exists.
    return True
  return start is None or _process_start(pid) in (None, start)


class WorkdirLock:
  """The lock of one workdir, held by this process (see the module docstring)."""

  def __init__(self, workdir: str):
    self.workdir = storage.absolute(workdir)
    self.path = storage.join(self.workdir, LOCK_FILE)
    self.token = secrets.token_hex(8)
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "process_start": _process_start(os.getpid()),
                   "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   "token": self.token}
    self.lost: str | None = None  # Why the lock is no longer ours.
    self._stop = threading.Event()
    self._heartbeat: threading.Thread | None = None

  def _content(self) -> str:
    return json.dumps({**self.record, "heartbeat": time.time()}, indent=1)

  def _read(self) -> dict[str, Any] | None:
    """The current lock record; {} when unreadable (half-written, or not a record: not a JSON
    object, a heartbeat that is not a number); None when there is none."""
    try:
      record = json.loads(storage.read_text(self.path))
    except FileNotFoundError:
      return None
    except (OSError, ValueError):
      return {}
    if not isinstance(record, dict) or not isinstance(record.get("heartbeat", 0.0), (int, float)):
      return {}
    return record

  def _read_settled(self) -> dict[str, Any] | None:
    """The lock record, read again for `_UNREADABLE_SECONDS` while it is unreadable (a run may
    be writing it this moment); {} when it stays so."""
    deadline = time.time() + _UNREADABLE_SECONDS
    holder = self._read()
    while holder == {} and time.time() < deadline:
      time.sleep(0.1)
      holder = self._read()
    return holder

  def _stale(self, holder: dict[str, Any]) -> str | None:
    """Why the lock `holder` left can be taken over, or None while its run may be alive."""
    age = time.time() - float(holder.get("heartbeat", 0.0))
    if holder.get("host") == self.record["host"] and isinstance(holder.get("pid"), int):
      if not _alive(holder["pid"], holder.get("process_start")):
        return f"its process {holder['pid']} is gone"
      return None
    if age > STALE_SECONDS:
      return f"its heartbeat is {age:.0f} s old"
    return None

  def acquire(self) -> None:
    """Takes the lock, or raises `LockedError` naming the holder."""
    for _ in range(3):  # Another restart may take over a stale lock at the same moment.
      try:
        storage.makedirs(self.workdir)
        created = storage.create_exclusive(self.path, self._content())
      except OSError as e:
        raise OSError(f"Could not take the workdir lock {self.path}: "
                      f"{e.strerror or e} (free space, permissions)") from e
      if created:
        break
      holder = self._read_settled()
      if holder is None:
        continue  # Released meanwhile.
      reason = (self._stale(holder) if holder else
                f"{self.path} is empty or not a lock record (a run killed while writing it?)")
      if reason is None:
        raise LockedError(self._holder_message(holder))
      logging.warning("Taking over the lock of %s: %s%s", self.workdir, reason,
                      f" ({_describe(holder)})" if holder else "")
      storage.remove_tree(self.path)
    else:
      raise LockedError(f"{self.path}: could not take the workdir lock (it changed hands three "
                        "times meanwhile); is another run starting in this workdir?")
    _held[self.workdir] = self
    self._heartbeat = threading.Thread(target=self._renew, daemon=True, name="workdir-lock")
    self._heartbeat.start()

  def _holder_message(self, holder: dict[str, Any]) -> str:
    age = time.time() - float(holder.get("heartbeat", 0.0))
    return (f"{self.workdir} is in use by another run ({_describe(holder)}, alive {age:.0f} s "
            f"ago); use another --workdir, or stop that run first. A lock left by a killed run "
            f"is taken over by itself (at once on the same host, after {STALE_SECONDS:.0f} s "
            f"from another); remove {self.path} only if you are sure that run is gone")

  def _renew(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        holder = self._read()
        if holder and holder.get("token") != self.token:
          self.lost = f"taken over by another run ({_describe(holder)})"
          logging.error("The lock of %s was %s: this run writes no more checkpoints",
                        self.workdir, self.lost)
          return
        storage.write_text(self.path, self._content())
      except Exception as e:  # pylint: disable=broad-except  (a storage hiccup: try again)
        logging.warning("Could not renew the lock %s: %s", self.path, e)

  def abandon(self) -> None:
    """Stops the heartbeat and leaves the lock file (see `hold`)."""
    self._stop.set()
    _held.pop(self.workdir, None)

  def release(self) -> None:
    """Removes the lock file, if it is still ours. Bounded: after a signal the storage may be
    the thing that hangs; a lock left behind is taken over by the next start."""
    self._stop.set()
    _held.pop(self.workdir, None)
    if self.lost is not None:
      return

    def remove():
      if self._heartbeat is not None:
        self._heartbeat.join()  # A renewal under way would write the file again.
      with contextlib.suppress(OSError):
        holder = self._read()
        if holder and holder.get("token") == self.token:
          storage.remove_tree(self.path)
    remover = threading.Thread(target=remove, daemon=True, name="workdir-unlock")
    remover.start()
    remover.join(_RELEASE_SECONDS)


def _describe(holder: dict[str, Any]) -> str:
  return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
          f"{holder.get('started', '?')}")


def check_held(workdir: str) -> None:
  """Raises `LockLostError` when this process held the lock of `workdir` and lost it (a run
  that never took one, e.g. a library call without a launcher, is not checked)."""
  lock = _held.get(storage.absolute(workdir))
  if lock is not None and lock.lost is not None:
    raise LockLostError(f"The lock of {lock.workdir} was {lock.lost} while this run was frozen "
                        "or cut off; it stops without writing, so as not to overwrite that run")


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
  """The workdir's lock for the duration of the block, taken by process 0 for every process;
  every process raises `LockedError` when it is refused."""
  lock = WorkdirLock(workdir) if jax.process_index() == 0 else None
  error = None
  if lock is not None:
    try:
      lock.acquire()
    except (LockedError, OSError) as e:
      error = e
  if jax.process_count() > 1:
    refused = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
    if refused and error is None:
      error = LockedError(f"process 0 could not take the lock of {workdir} (see its log)")
  if error is not None:
    raise error
  interrupted = False
  try:
    yield
  except Interrupted:
    interrupted = True
    raise
  finally:
    if lock is not None:
      # After a signal stopped a stuck write the storage may hang, so the lock stays (its
      # process is gone: the next start takes it over at once).
      lock.abandon() if interrupted else lock.release()  # pylint: disable=expression-not-assigned
