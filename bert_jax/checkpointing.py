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
import json
import os
import re
import threading
import time
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import checkpoint_integrity, storage
from bert_jax.data.vocab import Vocab

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


class Checkpointer:
  """Keep-N, interval-based, asynchronous training checkpoints with automatic resume.

  Every committed checkpoint gets a verification record (`checkpoint_integrity`); at start the
  newest checkpoint that verifies is the one resumed from. Damaged newer ones are set aside
  (renamed `<step>.damaged`, never deleted) with a warning, or stop the run when
  `checkpoint_config.on_damaged` is "fail". All processes agree on the step (process 0 checks).
  """

  def __init__(self, workdir: str, checkpoint_config):
    self.directory = storage.join(storage.absolute(workdir), CHECKPOINTS_DIR)
    self.save_every_steps = checkpoint_config.save_every_steps
    self._resume_step = _select_step(self.directory, checkpoint_config.on_damaged)
    self._recorder: threading.Thread | None = None  # Writes the pending verification record.
    self._save_failed = threading.Event()  # Tells the recorder to give up.
    self._pending: int | None = None  # The last step saved.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=checkpoint_config.max_to_keep,
        enable_async_checkpointing=checkpoint_config.async_save, create=True,
        cleanup_tmp_directories=True)  # Leftovers of an interrupted save go at start.
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
    temporary directory), in a thread so training goes on meanwhile; process 0 only."""
    if jax.process_index() != 0:
      return
    step_dir = storage.join(self.directory, str(step))
    poll = 0.5 if storage.is_remote(step_dir) else 0.05  # Seconds between looks.

    def record():
      while not is_committed(step_dir):
        if self._save_failed.is_set():
          return  # Nothing was committed: no record to write.
        time.sleep(poll)
      checkpoint_integrity.write_manifest(step_dir)

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
    with self._reporting(step):
      self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    self._pending = step
    self._record_when_committed(step)

  @contextlib.contextmanager
  def _reporting(self, step: int | None):
    """Turns a failed write into one `CheckpointSaveError` naming the directory and cause."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      cause = str(_os_cause(e))
      # tensorstore words an OSError in its own status text: name the OS cause where it can.
      found = re.search(r"No space left on device|Permission denied|Read-only file system|"
                        r"Disk quota exceeded", cause)
      what = f"checkpoint {step}" if step is not None else "a checkpoint"
      logging.info("Writing %s in %s failed: %s", what, self.directory, cause)
      raise CheckpointSaveError(
          f"Could not write {what} in {self.directory}: "
          f"{found.group(0) if found else ' '.join(cause.split())}. Nothing of it was kept; a "
          "restart resumes from the last complete checkpoint once the cause is fixed "
          "(free space, permissions).") from e

  def wait_until_finished(self) -> None:
    try:
      with self._reporting(self._pending):
        self.manager.wait_until_finished()
    except CheckpointSaveError:
      self._save_failed.set()
      raise
    finally:
      if self._recorder is not None:
        self._recorder.join()
        self._recorder = None
      self._save_failed.clear()

  def read_meta(self, step: int) -> dict[str, Any]:
    return read_meta(storage.join(self.directory, str(step)))

  def restore(self, step: int, abstract_state) -> tuple[Any, bytes]:
    """-> (state with the shardings of `abstract_state`, this process's iterator state)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state)))
    return restored["state"], self._read_data_state(step)

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
          "--config.checkpoint.init_from")
    logging.info("Data-iterator state of %s read from %s (another process count)", directory,
                 files[0])
    return states.pop()

  def close(self) -> None:
    try:
      self.wait_until_finished()
    finally:
      self.manager.close()


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
                     "weights you trust with --config.checkpoint.init_from")
  return None if chosen == -1 else chosen


def _verified_step(directory: str, on_damaged: str) -> int:
  """The newest committed checkpoint that verifies (-1: none committed, -2: none verifies).
  A save the run never finished (in a bucket: a step directory without orbax's commit marker;
  locally a temporary directory) is not a checkpoint: orbax removes it at start."""
  steps = [int(n) for n in storage.listdir(directory) if n.isdigit()]
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
    aside = f"{step_dir}.damaged"
    copies = 1
    while storage.exists(aside):  # The same step damaged again after a rerun.
      copies += 1
      aside = f"{step_dir}.damaged.{copies}"
    logging.warning("Checkpoint %s is damaged: %s. Set aside as %s; resuming from an older "
                    "checkpoint", step_dir, reason, storage.basename(aside))
    storage.rename(step_dir, aside)
  return -2 if steps else -1


class BestExport:
  """The best params of a run so far (by the task's main metric) in `<workdir>/best/<step>/`."""

  def __init__(self, workdir: str):
    self.directory = storage.join(storage.absolute(workdir), BEST_DIR)
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True),
        item_names=_EXPORT_ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, params, meta: dict[str, Any], vocab: Vocab) -> None:
    if jax.process_count() == 1:
      # Host copies: orbax would otherwise compile a slice per replicated shard (seconds on CPU).
      params = jax.device_get(params)
    self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(to_json(meta)),
        vocab=VocabSave(vocab)), force=True)

  def wait_until_finished(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


# ----------------------------------------------------------------------------- readers


def is_committed(step_dir: str) -> bool:
  """orbax's commit marker: locally it also renames a finished temporary directory, but in a
  bucket it writes into the step directory itself, so the marker is what says "complete"."""
  return storage.exists(storage.join(step_dir, _COMMIT_MARKER))


def _complete_steps(directory: str) -> list[int]:
  return sorted(int(n) for n in storage.listdir(directory)
                if n.isdigit() and is_committed(storage.join(directory, n)))


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


def save_tree(directory: str, tree) -> None:
  """A pytree as an orbax checkpoint of its own (e.g. a pretrained directory's `params/`)."""
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(storage.absolute(directory), tree)
    checkpointer.wait_until_finished()


def restore_tree(directory: str, subtree: str | None = None) -> dict:
  """An orbax PyTree checkpoint (or one subtree of it, e.g. a TrainState's `params`) as numpy,
  without knowing the rest of its structure."""
  try:
    # The handler's metadata: the tree alone (the checkpointer's also looks for step metadata,
    # which lives one level up in a training checkpoint, and warns that it is missing).
    tree = ocp.PyTreeCheckpointHandler().metadata(epath.Path(directory))
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


SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size")


def check_compatible(saved_model_config: dict[str, Any], model_config: dict[str, Any],
                     where: str) -> None:
  """Refuses to resume (or initialise) from a checkpoint of a different model shape."""
  diffs = [f"{k}: checkpoint {saved_model_config.get(k)} vs config {model_config[k]}"
           for k in SHAPE_FIELDS if saved_model_config.get(k) != model_config[k]]
  if diffs:
    raise ValueError(f"The checkpoint in {where} is of a different model ("
                     + "; ".join(diffs) + "). Use another --workdir, or set config.model "
                     "to match the checkpoint.")


def to_json(value) -> Any:
  """ConfigDict/tuples/dtypes -> plain JSON values."""
  return json.loads(json.dumps(value, default=str))
