"""The one owner of bert_jax's checkpoint layout: orbax checkpoints of training runs (pretraining
and fine-tuning alike), the fine-tuned "best" export, and the readers everything else uses.

A training checkpoint `<workdir>/checkpoints/<step>/` holds four items:
- `state`: the TrainState (step, params, optimizer state; each process writes its shards);
- `data`: the input iterator's position, one JSON file per process (grain's handler), taken
  when the batch of the checkpointed step was consumed, not when it was prefetched;
- `meta`: JSON: the config, the model config and what the task needs to be rebuilt;
- `vocab`: the vocabulary files (`Vocab.save`), so a checkpoint is self-contained.
A fine-tuning run also exports its best params to `<workdir>/best/<step>/` (`params`, `meta`,
`vocab`; the newest best only), which prediction and export read.
Checkpoints are written asynchronously and appear only once complete (orbax renames a finished
temporary directory), so a crash mid-save never leaves one that a reader would pick.
"""

import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import re
import threading
import time
from typing import Any, Callable

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.checkpoints import integrity as checkpoint_integrity
from bert_jax.runtime import storage, workdir_lock
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import ARCHITECTURE, SHAPE, BertConfig
from bert_jax.runtime.stop_signals import StopSignals, interruptible

CHECKPOINTS_DIR = "checkpoints"
BEST_DIR = "best"
_TRAIN_ITEMS = ("state", "data", "meta", "vocab")
_COMMIT_MARKER = "commit_success.txt"  # Written by orbax when a checkpoint is complete.
_EXPORT_ITEMS = ("params", "meta", "vocab")


# ------------------------------------------------------------------- custom orbax items


class _IteratorStateItem:
  """Adapter for grain's orbax handler (one JSON file per process): carries the iterator state
  recorded when the checkpointed step's batch was consumed."""

  def __init__(self, state: bytes):
    self.state = state

  def get_state(self) -> bytes:
    return self.state


class VocabHandler(ocp.CheckpointHandler):
  """The vocabulary as its own files (`Vocab.save`) in the item directory; restores a Vocab."""

  def save(self, directory: epath.Path, args: "VocabSave") -> None:
    if jax.process_index() == 0:  # One copy; every process sees the same vocabulary.
      args.vocab.save(os.fspath(directory))

  def restore(self, directory: epath.Path, args: "VocabRestore | None" = None) -> Vocab:
    del args
    return Vocab.load(os.fspath(directory))

  def metadata(self, directory: epath.Path) -> None:
    del directory

  def finalize(self, directory: epath.Path) -> None:
    del directory

  def close(self) -> None:
    pass


@ocp.args.register_with_handler(VocabHandler, for_save=True)
@dataclasses.dataclass
class VocabSave(ocp.args.CheckpointArgs):
  vocab: Vocab


@ocp.args.register_with_handler(VocabHandler, for_restore=True)
@dataclasses.dataclass
class VocabRestore(ocp.args.CheckpointArgs):
  pass


# ------------------------------------------------------------------- training checkpoints


@dataclasses.dataclass(frozen=True)
class LegacyLayout:
  """How a state saved in an older params layout is recognised and converted (the params layout
  is `bert_jax.weights.layout`'s; the trainer hands its functions over)."""
  is_old: Callable[[Any], bool]  # Saved tree (orbax metadata) -> in the older layout?
  to_old: Callable[[Any], Any]  # Abstract state of today's layout -> the older layout's.
  from_old: Callable[[Any], Any]  # Restored state of the older layout -> today's.


class CheckpointSaveError(OSError):
  """A checkpoint could not be written (no space, no permission...): nothing of it is kept."""


def _os_cause(error: BaseException) -> BaseException:
  """The OSError (ENOSPC, EACCES...) behind an error from orbax's writers, else the error."""
  seen, stack = set(), [error]
  while stack:
    current = stack.pop()
    if id(current) in seen:
      continue
    seen.add(id(current))
    if isinstance(current, OSError):
      return current
    stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    stack.extend(a for a in getattr(current, "args", ()) if isinstance(a, BaseException))
    stack.extend(getattr(current, "exceptions", ()))  # ExceptionGroup.
  return error


@contextlib.contextmanager
def _reporting(directory: str, what: str,
               after: str = ("a restart resumes from the last complete checkpoint once the "
                             "cause is fixed (free space, permissions).")):
  """Turns a failed write into one `CheckpointSaveError` naming the directory and cause."""
  try:
    yield
  except (CheckpointSaveError, workdir_lock.LockLostError):
    raise
  except Exception as e:  # pylint: disable=broad-except
    cause = str(_os_cause(e))
    # tensorstore words an OSError in its own status text: name the OS cause where it can.
    found = re.search(r"No space left on device|Permission denied|Read-only file system|"
                      r"Disk quota exceeded", cause)
    logging.info("Writing %s in %s failed: %s", what, directory, cause)
    raise CheckpointSaveError(
        f"Could not write {what} in {directory}: "
        f"{found.group(0) if found else ' '.join(cause.split())}. Nothing of it was kept"
        f"{'; ' + after if after else '.'}") from e


def _manager_options(max_to_keep: int, async_save: bool) -> ocp.CheckpointManagerOptions:
  """orbax options of every manager here. The step directory is created in the caller's thread:
  created asynchronously, a directory that cannot be made (read-only, no inodes) left orbax's
  other threads waiting for its signal for 20 minutes, with no error."""
  if max_to_keep < 1:  # orbax would delete each checkpoint right after writing it.
    raise ValueError(f"config.checkpoint.max_to_keep={max_to_keep} must be at least 1")
  return ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True,
      cleanup_tmp_directories=True,  # Leftovers of an interrupted save go at start.
      async_options=ocp.AsyncOptions(create_directories_asynchronously=False))


def _close(wait_until_finished: Callable[[], None], manager: ocp.CheckpointManager) -> None:
  """Waits for the save in flight, then closes the manager; when the wait fails, the manager's
  own close (the same failure again) is quiet, so the first error is the one reported."""
  try:
    wait_until_finished()
  except BaseException:
    with contextlib.suppress(Exception):
      manager.close()
    raise
  manager.close()


def _wait(stop: StopSignals | None, blocking: Callable[[], Any], what: str) -> Any:
  """A checkpoint wait that honours SIGTERM (after its grace) and SIGINT."""
  return stop.wait(blocking, what) if stop is not None else interruptible(blocking, what)


class Checkpointer:
  """Keep-N, interval-based, asynchronous training checkpoints with automatic resume.

  Every committed checkpoint gets a verification record (`checkpoint_integrity`); at start the
  newest checkpoint that verifies is the one resumed from. Damaged newer ones are set aside
  (renamed `<step>.damaged`, never deleted) with a warning, or stop the run when
  `settings.on_damaged` is "fail"; so is one without a record whose files cannot be
  read. One that does not fit the run's state (other settings) is refused, never set aside.
  All processes agree on the step (process 0 checks). Every write and wait ends in seconds with
  a `CheckpointSaveError` when storage refuses it, and honours SIGTERM/SIGINT (`stop`).
  """

  def __init__(self, workdir: str, settings, stop: StopSignals | None = None):
    """`settings`: config.checkpoint's fields (`bert_jax.training.settings.CheckpointSettings`)."""
    self.workdir = storage.absolute(workdir)
    self.directory = storage.join(self.workdir, CHECKPOINTS_DIR)
    self.save_every_steps = settings.save_every_steps
    self.on_damaged = settings.on_damaged
    self.stop = stop
    options = _manager_options(settings.max_to_keep, settings.async_save)
    self._resume_step = _select_step(self.directory, self.on_damaged)
    self._recorder: threading.Thread | None = None  # Writes the pending verification record.
    self._committed = threading.Event()  # orbax finished the pending save: one last look.
    self._record_error: BaseException | None = None
    self._pending: int | None = None  # The last step saved.
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=_TRAIN_ITEMS)

  def latest_step(self) -> int | None:
    """The step to resume from: the newest checkpoint that verified at start."""
    return self._resume_step

  def should_save(self, step: int) -> bool:
    """Every `save_every_steps` steps (orbax's own policy would also save the first step)."""
    return self.save_every_steps > 0 and step % self.save_every_steps == 0

  def _record_when_committed(self, step: int) -> None:
    """Writes the verification record of `step` once orbax has committed it (renamed its
    temporary directory), in a thread so training goes on meanwhile; process 0 only. The thread
    ends once orbax has finished the save, committed or not (`wait_until_finished` then says)."""
    if jax.process_index() != 0:
      return
    step_dir = storage.join(self.directory, str(step))
    poll = 0.5 if storage.is_remote(step_dir) else 0.05  # Seconds between looks.
    self._committed.clear()
    self._record_error = None

    def record():
      try:
        while not is_committed(step_dir):
          if self._committed.is_set():  # orbax is done and the step is not there.
            if not is_committed(step_dir):
              raise OSError(f"checkpoint {step} is missing after orbax finished writing it "
                            "(removed by another process?)")
            break
          time.sleep(poll)
        checkpoint_integrity.write_manifest(step_dir)
      except Exception as e:  # pylint: disable=broad-except  (reported by wait_until_finished)
        self._record_error = e

    self._recorder = threading.Thread(target=record, daemon=True, name=f"record-{step}")
    self._recorder.start()

  def save(self, step: int, state, data_state: bytes, meta: dict[str, Any],
           vocab: Vocab | None) -> None:
    items = dict(state=ocp.args.StandardSave(state),
                 data=grain.checkpoint.CheckpointSave(_IteratorStateItem(data_state)),
                 meta=ocp.args.JsonSave(to_json(meta)))
    if vocab is not None:
      items["vocab"] = VocabSave(vocab)
    self.wait_until_finished()  # The previous save, with its record.
    workdir_lock.check_held(self.workdir)  # Never write over another run's checkpoints.
    with _reporting(self.directory, f"checkpoint {step}"):
      _wait(self.stop, lambda: self.manager.save(step, args=ocp.args.Composite(**items),
                                                 force=True), f"checkpoint {step}")
    self._pending = step
    self._record_when_committed(step)

  def wait_until_finished(self) -> None:
    """Until the pending save is committed and has its verification record (or raises)."""
    what = f"checkpoint {self._pending}" if self._pending is not None else "a checkpoint"
    try:
      with _reporting(self.directory, what):
        _wait(self.stop, self.manager.wait_until_finished, what)
        self._committed.set()
        if self._recorder is not None:
          _wait(self.stop, self._recorder.join, f"the verification record of {what}")
          if self._record_error is not None:
            raise self._record_error
    finally:
      self._committed.set()  # The recorder stops looking whatever happened.
      self._recorder = None
      self._pending = None

  def read_meta(self, step: int) -> dict[str, Any]:
    return read_meta(storage.join(self.directory, str(step)))

  def restore(self, abstract_state, legacy: "LegacyLayout | None" = None,
              settings: dict[str, Any] | None = None) -> tuple[int, Any, bytes] | None:
    """-> (step, state with the shardings of `abstract_state`, this process's iterator state) of
    the newest checkpoint that restores, or None when there is none. A checkpoint that does not
    fit this run's state (another optimizer, clipping...: its tree differs, or it verified
    intact) is refused, naming the fields of `settings` (this run's config) that differ from
    its run's, and left as it is; only one without a verification record whose files cannot be
    read is damaged: set aside, and the next one tried. A checkpoint whose state is in an older
    params layout (`legacy.is_old`) is read in that layout and converted."""
    while self._resume_step is not None:
      step, state = self._resume_step, None
      try:
        state = self._restore_state(step, abstract_state, legacy)
        error = ""
      except Exception as e:  # pylint: disable=broad-except  (tensorstore, orbax, OS errors)
        logging.info("Restoring checkpoint %d failed", step, exc_info=True)
        error = " ".join(str(e).split())[:300] or type(e).__name__
      if not _any_process(bool(error)):
        return step, state, self._read_data_state(step)
      step_dir = storage.join(self.directory, str(step))
      refusal = ""
      if jax.process_index() == 0:
        refusal = self._refusal(step, abstract_state, legacy, settings, error)
      refusal = _from_process_0(refusal)
      if refusal:
        raise ValueError(refusal)
      reason = f"it cannot be restored ({error or 'on another process'})"
      if self.on_damaged == "fail":
        raise ValueError(f"Checkpoint {step_dir} is damaged: {reason}. With "
                         "config.checkpoint.on_damaged='fallback' the run would resume from the "
                         "newest intact checkpoint instead")
      if jax.process_index() == 0:
        _set_aside(step_dir, reason)
      multihost_utils.sync_global_devices("bert_jax: damaged checkpoint set aside")
      self._resume_step = _select_step(self.directory, self.on_damaged)
      self.manager.reload()  # orbax's own list of steps, without the one set aside.
    return None

  def _refusal(self, step: int, abstract_state, legacy: "LegacyLayout | None",
               settings: dict[str, Any] | None, error: str) -> str:
    """Why checkpoint `step`, which failed to restore, is not damage but another run's state
    ("" when it is damage: no verification record, and its saved tree is unreadable or is the
    one this run expects, so its files are what failed)."""
    step_dir = storage.join(self.directory, str(step))
    recorded = storage.exists(storage.join(step_dir, checkpoint_integrity.MANIFEST_FILE))
    try:
      tree = saved_tree(storage.join(step_dir, "state"))
    except Exception:  # pylint: disable=broad-except  (unreadable metadata: damage)
      tree = None
    if legacy is not None and tree is not None and legacy.is_old(tree):
      abstract_state = legacy.to_old(abstract_state)
    same_tree = tree is not None and tree_signature(tree) == tree_signature(abstract_state)
    if not recorded and (tree is None or same_tree):
      return ""
    try:
      saved = read_meta(step_dir).get("config", {})
    except ValueError:  # (Its meta unreadable: the orbax error says what does not fit.)
      saved = {}
    diffs = settings_diffs(saved, settings or {})
    why = "it passed its integrity check" if recorded else "its saved tree is readable"
    return (f"Checkpoint {step_dir} is intact ({why}) but does not restore into this run's "
            "state: it was trained with other settings"
            + (f" ({'; '.join(diffs)})" if diffs else f" ({error})")
            + ". Resume with the settings it was trained with (its config is in "
            f"{step_dir}/meta), or start a new --workdir from its weights with "
            f"--config.init_from={self.workdir}; the checkpoints are left as they are")

  def _restore_state(self, step: int, abstract_state, legacy: "LegacyLayout | None"):
    """The state of checkpoint `step`, in the layout and shardings of `abstract_state`."""
    old = legacy is not None and legacy.is_old(saved_tree(storage.join(self.directory, str(step),
                                                                         "state")))
    target = legacy.to_old(abstract_state) if old else abstract_state
    state = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target)))["state"]
    if not old:
      return state
    logging.info("Checkpoint %d holds the params layout of an older bert_jax: converted", step)
    shardings = jax.tree.map(lambda leaf: leaf.sharding, abstract_state)
    return jax.device_put(legacy.from_old(state), shardings)

  def _read_data_state(self, step: int) -> bytes:
    """This process's iterator state. A checkpoint from another number of processes is
    accepted when all its processes were at the same position: the pipeline's position counts
    global batches, which mean the same examples for any process count."""
    directory = storage.join(self.directory, str(step), "data")
    count, index = jax.process_count(), jax.process_index()
    own = storage.join(directory, f"process_{index}-of-{count}.json")
    if storage.exists(own):
      return storage.read_bytes(own)
    files = [f for f in storage.listdir(directory) if f.startswith("process_")]
    states = {storage.read_bytes(storage.join(directory, f)) for f in files}
    if len(states) != 1:
      written_by = files[0].split("-of-")[1].split(".")[0] if files else "?"
      raise ValueError(
          f"{directory}: the data-iterator state was written by {written_by} processes at "
          f"different positions, and this run has {count}; resume with {written_by} processes "
          "(--num_processes), or start a new workdir from these weights with "
          "--config.init_from")
    logging.info("Data-iterator state of %s read from %s (another process count)", directory,
                 files[0])
    return states.pop()

  def close(self) -> None:
    _close(self.wait_until_finished, self.manager)


def _from_process_0(text: str) -> str:
  """Process 0's `text` on every process."""
  if jax.process_count() == 1:
    return text
  padded = np.frombuffer(text.encode().ljust(4096)[:4096], np.uint8)
  return np.asarray(multihost_utils.broadcast_one_to_all(padded)).tobytes().decode(
      errors="ignore").strip()


def tree_signature(tree) -> Any:
  """A state's tree as orbax saves it, for comparison: mappings (dicts, dataclasses, named
  tuples) as dicts, sequences as lists, arrays as their shapes, empty nodes (optax's
  EmptyState, None) as None. The saved tree (orbax metadata) and an abstract state compare."""
  if hasattr(tree, "shape") and not isinstance(tree, (dict, list, tuple)):
    return tuple(tree.shape)
  if dataclasses.is_dataclass(tree):
    tree = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
  elif isinstance(tree, tuple) and hasattr(tree, "_fields"):
    tree = tree._asdict()
  if hasattr(tree, "keys"):
    return {str(k): tree_signature(tree[k]) for k in tree.keys()} or None
  if isinstance(tree, (list, tuple)):
    return [tree_signature(x) for x in tree] or None
  return None


def _flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in config.items():
    if isinstance(value, dict):
      flat.update(_flat_config(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def settings_diffs(saved: dict[str, Any], config: dict[str, Any]) -> list[str]:
  """The config fields (sections of model and train first) whose value differs between a
  checkpoint's run (`saved`) and this one, as "train.optimizer: checkpoint 'lamb', this run
  'adamw'"; the run's length (num_train_steps) is left out, as resuming often changes it."""
  saved_flat, flat = _flat_config(to_json(saved)), _flat_config(to_json(config))
  names = sorted((n for n in saved_flat.keys() & flat.keys()
                  if saved_flat[n] != flat[n] and n != "train.num_train_steps"),
                 key=lambda n: (not n.startswith(("train.", "model.")), n))
  shown = [f"{n}: checkpoint {saved_flat[n]!r}, this run {flat[n]!r}" for n in names[:6]]
  return shown + ([f"and {len(names) - 6} more"] if len(names) > 6 else [])


def _any_process(flag: bool) -> bool:
  """True when `flag` is set on any process."""
  if jax.process_count() == 1:
    return flag
  return bool(np.max(multihost_utils.process_allgather(np.int32(flag))))


def _select_step(directory: str, on_damaged: str) -> int | None:
  """The newest checkpoint of `directory` that verifies (None: there is none, a fresh start),
  agreed by every process; damaged newer ones are set aside, or raise with on_damaged="fail"."""
  if on_damaged not in ("fallback", "fail"):
    raise ValueError(f"config.checkpoint.on_damaged={on_damaged!r}: use 'fallback' or 'fail'")
  chosen = -1  # -1: no checkpoint at all; -2: checkpoints, none usable.
  if jax.process_index() == 0:
    chosen = _verified_step(directory, on_damaged)
  chosen = int(multihost_utils.broadcast_one_to_all(np.int32(chosen)))
  if chosen == -2:
    raise ValueError(f"Every checkpoint in {directory} is damaged (set aside as <step>.damaged); "
                     "nothing safe to resume from. Start a new --workdir, or initialise from "
                     "weights you trust with --config.init_from")
  return None if chosen == -1 else chosen


def _verified_step(directory: str, on_damaged: str) -> int:
  """The newest committed checkpoint that verifies (-1: none committed, -2: none verifies).
  A save the run never finished (in a bucket: a step directory without orbax's commit marker;
  locally a temporary directory) is not a checkpoint: orbax removes it at start."""
  names = storage.listdir(directory)
  steps = [step for step in map(step_of, names) if step is not None]
  stray = sorted(n for n in names if step_of(n) is None and not _OWN_NAME.fullmatch(n))
  if stray:
    logging.warning("Ignoring %s in %s: not checkpoint steps (a step is a directory named by "
                    "its number); move them out of the way to silence this", ", ".join(
                        repr(n) for n in stray), directory)
  for step in steps:
    _check_inside(directory, storage.join(directory, str(step)))
  steps = sorted(s for s in steps if is_committed(storage.join(directory, str(s))))
  for step in reversed(steps):
    step_dir = storage.join(directory, str(step))
    reason = checkpoint_integrity.damage(step_dir)
    if reason is None:
      return step
    if on_damaged == "fail":
      raise ValueError(f"Checkpoint {step_dir} is damaged: {reason}. With "
                       "config.checkpoint.on_damaged='fallback' the run would resume from the "
                       "newest intact checkpoint instead")
    _set_aside(step_dir, reason)
  return -2 if steps else -1


# What else checkpoints/ holds by bert_jax's and orbax's doing: checkpoints set aside as
# damaged, and orbax's temporary directories of a save in flight (removed at start).
_OWN_NAME = re.compile(r"\d+\.damaged(\.\d+)?|.*\.orbax-checkpoint-tmp.*")


def step_of(name: str) -> int | None:
  """The step of a checkpoint directory's name, or None for any other name: orbax names a step
  by its number in ASCII digits ("12"; not "012", "１２" or "²", which `str.isdigit` accepts)."""
  if name.isascii() and name.isdigit() and str(int(name)) == name:
    return int(name)
  return None


def _check_inside(directory: str, step_dir: str) -> None:
  """A step directory must be a real directory of the workdir: a link to elsewhere would be
  resumed from, and orbax's later saves and rotation would write or delete outside the run."""
  if storage.is_remote(step_dir):
    return  # Buckets have no links.
  real_directory = os.path.realpath(directory)
  real = os.path.realpath(step_dir)
  if os.path.islink(step_dir) or os.path.dirname(real) != real_directory:
    raise ValueError(f"{step_dir} is a link to {real}: checkpoints must be directories inside "
                     f"{directory}. Move that checkpoint into the workdir (or remove the link) "
                     "and start again")


def _set_aside(step_dir: str, reason: str) -> None:
  """Renames a damaged checkpoint `<step>.damaged` (never deleted), with a warning."""
  aside = f"{step_dir}.damaged"
  copies = 1
  while storage.exists(aside):  # The same step damaged again after a rerun.
    copies += 1
    aside = f"{step_dir}.damaged.{copies}"
  logging.warning("Checkpoint %s is damaged: %s. Set aside as %s; resuming from an older "
                  "checkpoint", step_dir, reason, storage.basename(aside))
  storage.rename(step_dir, aside)


class BestExport:
  """The best params of a run so far (by the task's main metric) in `<workdir>/best/<step>/`."""

  def __init__(self, workdir: str, stop: StopSignals | None = None):
    self.workdir = storage.absolute(workdir)
    self.directory = storage.join(self.workdir, BEST_DIR)
    self.stop = stop
    self._pending: int | None = None
    self.manager = ocp.CheckpointManager(
        self.directory, options=_manager_options(max_to_keep=1, async_save=True),
        item_names=_EXPORT_ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, params, meta: dict[str, Any], vocab: Vocab) -> None:
    if jax.process_count() == 1:
      # Host copies: orbax would otherwise compile a slice per replicated shard (seconds on CPU).
      params = jax.device_get(params)
    self.wait_until_finished()
    workdir_lock.check_held(self.workdir)
    args = ocp.args.Composite(params=ocp.args.StandardSave(params),
                              meta=ocp.args.JsonSave(to_json(meta)), vocab=VocabSave(vocab))
    with _reporting(self.directory, f"the best params (step {step})"):
      _wait(self.stop, lambda: self.manager.save(step, args=args, force=True),
            f"the best params (step {step})")
    self._pending = step

  def wait_until_finished(self) -> None:
    what = f"the best params (step {self._pending})"
    try:
      with _reporting(self.directory, what):
        _wait(self.stop, self.manager.wait_until_finished, what)
    finally:
      self._pending = None

  def close(self) -> None:
    _close(self.wait_until_finished, self.manager)


# ----------------------------------------------------------------------------- readers


def is_committed(step_dir: str) -> bool:
  """orbax's commit marker: locally it also renames a finished temporary directory, but in a
  bucket it writes into the step directory itself, so the marker is what says "complete"."""
  return storage.exists(storage.join(step_dir, _COMMIT_MARKER))


def _complete_steps(directory: str) -> list[int]:
  steps = (step_of(n) for n in storage.listdir(directory))
  return sorted(s for s in steps if s is not None and is_committed(storage.join(directory, str(s))))


def find_step_dir(path: str) -> str | None:
  """The checkpoint a path means: a step directory itself, the newest step of a `checkpoints/`
  or `best/` directory, or of a workdir (its best export if it has one, else its newest
  training checkpoint). None when there is none (yet)."""
  path = storage.absolute(path)
  if storage.isdir(storage.join(path, "meta")):
    return path
  for directory in (storage.join(path, BEST_DIR), storage.join(path, CHECKPOINTS_DIR), path):
    steps = _complete_steps(directory)
    if steps:
      return storage.join(directory, str(steps[-1]))
  return None


def read_meta(step_dir: str) -> dict[str, Any]:
  """The `meta` item of a checkpoint (orbax's JSON item file, read without a manager)."""
  meta_file = storage.join(step_dir, "meta", "metadata")
  if not storage.isfile(meta_file):
    raise ValueError(f"{step_dir}: no meta item ({meta_file}); not a bert_jax checkpoint")
  try:
    return json.loads(storage.read_text(meta_file))
  except json.JSONDecodeError as e:
    raise ValueError(f"{meta_file} is not valid JSON ({e})") from e


def read_vocab(step_dir: str) -> Vocab | None:
  """The checkpoint's vocabulary, or None when it was saved without one."""
  directory = storage.join(step_dir, "vocab")
  return Vocab.load(directory) if storage.listdir(directory) else None


def restore_params(step_dir: str) -> dict:
  """The params of a checkpoint as float numpy, without knowing its optimizer state: the
  `params` item of a best export, or `params` of a training checkpoint's `state`."""
  if storage.isdir(storage.join(step_dir, "params")):
    return restore_tree(storage.join(step_dir, "params"))
  return restore_tree(storage.join(step_dir, "state"), subtree="params")


def save_tree(directory: str, tree, shown_as: str | None = None) -> None:
  """A pytree as an orbax checkpoint of its own (e.g. a pretrained directory's `params/`); a
  failed write is one `CheckpointSaveError` naming `shown_as` (default: `directory`)."""
  where, what = posixpath.split((shown_as or directory).rstrip("/"))
  with _reporting(where, what, after=""):
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(storage.absolute(directory), tree)
      checkpointer.wait_until_finished()


def saved_tree(directory: str):
  """The tree structure (orbax's value metadata) of an orbax PyTree checkpoint, read from its
  metadata file alone."""
  # The handler's metadata: the tree alone (the checkpointer's also looks for step metadata,
  # which lives one level up in a training checkpoint, and warns that it is missing).
  return ocp.PyTreeCheckpointHandler().metadata(epath.Path(directory))


def restore_tree(directory: str, subtree: str | None = None) -> dict:
  """An orbax PyTree checkpoint (or one subtree of it, e.g. a TrainState's `params`) as numpy,
  without knowing the rest of its structure."""
  try:
    tree = saved_tree(directory)
    if subtree is not None:
      if subtree not in tree:
        raise ValueError(f"no '{subtree}' in the checkpoint (it holds {sorted(tree)})")
      tree = {subtree: tree[subtree]}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = ocp.PyTreeCheckpointer().restore(directory, args=ocp.args.PyTreeRestore(
        item=tree, restore_args=restore_args, partial_restore=subtree is not None))
  except (OSError, ValueError, KeyError, RuntimeError) as e:
    raise ValueError(f"cannot restore the orbax checkpoint {directory} ({e})") from e
  return restored[subtree] if subtree is not None else restored


# ------------------------------------------------------------------------------ checks


def check_compatible(saved_model_config: dict[str, Any], model_config: dict[str, Any],
                     where: str) -> None:
  """Refuses to resume (or initialise) from a checkpoint of a different model: another shape or
  architecture (`BertConfig`'s fields of those roles; a field the checkpoint predates has its
  default there). Run fields (dtypes, dropout, kernels, padding) may differ."""
  defaults = {f.name: f.default for f in dataclasses.fields(BertConfig)}
  diffs = [f"{k}: checkpoint {saved_model_config.get(k, defaults[k])} vs config {model_config[k]}"
           for k in BertConfig.fields_of(SHAPE, ARCHITECTURE)
           if saved_model_config.get(k, defaults[k]) != model_config[k]]
  if diffs:
    flags = " ".join(f"--config.model.{k}={saved_model_config.get(k, defaults[k])}"
                     for k in BertConfig.fields_of(SHAPE, ARCHITECTURE)
                     if saved_model_config.get(k, defaults[k]) != model_config[k])
    raise ValueError(f"The checkpoint in {where} is of a different model ("
                     + "; ".join(diffs) + "). Use another --workdir, or set config.model "
                     f"to match the checkpoint: {flags}")


def vocab_fingerprint(vocab: Vocab | None) -> str | None:
  """SHA-256 of a vocabulary's pieces in id order (and its kind and casing): two vocabularies of
  one size but other ids differ here. None for no vocabulary (synthetic data)."""
  if vocab is None:
    return None
  digest = hashlib.sha256(f"{vocab.kind}\n{vocab.lowercase}\n".encode())
  for i in range(vocab.size):
    digest.update(vocab.id_to_piece(i).encode("utf-8") + b"\n")
  return digest.hexdigest()


def check_same_vocab(saved: str | None, current: str | None, where: str,
                     allowed: bool) -> None:
  """Refuses weights trained with another vocabulary (same size, other ids): every embedding row
  would mean another token. `allowed` (config.checkpoint.allow_vocab_change) lets it through
  with a warning, for deliberate vocabulary surgery."""
  if saved is None or current is None or saved == current:
    return
  what = (f"{where} was trained with another vocabulary (fingerprint {saved[:12]}, this run's "
          f"{current[:12]})")
  if allowed:
    logging.warning("%s; continuing, as config.checkpoint.allow_vocab_change is set", what)
    return
  raise ValueError(f"{what}: its embedding rows would mean other tokens. Use the same "
                   "vocabulary, or set --config.checkpoint.allow_vocab_change=true for "
                   "deliberate vocabulary surgery")


def to_json(value) -> Any:
  """ConfigDict/tuples/dtypes -> plain JSON values."""
  return json.loads(json.dumps(value, default=str))
