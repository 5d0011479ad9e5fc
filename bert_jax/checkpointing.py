"""orbax checkpoints of the train state, the data-iterator state and the run's metadata.

A checkpoint `<workdir>/checkpoints/<step>/` holds three items:
- `state`: params, optimizer state and step (each process writes its own shards);
- `data`: the input iterator's position, one JSON file per process (grain's handler), taken
  when the batch of the checkpointed step was consumed, not when it was prefetched;
- `meta`: the config, the model config and the vocabulary files, so a checkpoint is
  self-contained for fine-tuning, prediction and export.
Checkpoints are written asynchronously and appear only once complete, so a crash mid-save never
leaves one that restore would pick.
"""

import base64
import json
import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging


class _IteratorStateItem:
  """Adapter for grain's orbax handler (one JSON file per process): carries the iterator state
  recorded when the checkpointed step's batch was consumed."""

  def __init__(self, state: bytes):
    self.state = state

  def get_state(self) -> bytes:
    return self.state


def encode_files(directory: str) -> dict[str, str]:
  """The files of a (vocabulary) directory as base64 text, to store in `meta`."""
  return {name: base64.b64encode(open(os.path.join(directory, name), "rb").read()).decode()
          for name in sorted(os.listdir(directory))
          if os.path.isfile(os.path.join(directory, name))}


def decode_files(files: dict[str, str], directory: str) -> str:
  os.makedirs(directory, exist_ok=True)
  for name, data in files.items():
    with open(os.path.join(directory, name), "wb") as f:
      f.write(base64.b64decode(data))
  return directory


class Checkpointer:
  """Keep-N, interval-based, asynchronous checkpoints with automatic resume."""

  def __init__(self, directory: str, checkpoint_config):
    self.directory = os.path.abspath(directory)
    self.save_every_steps = checkpoint_config.save_every_steps
    options = ocp.CheckpointManagerOptions(
        max_to_keep=checkpoint_config.max_to_keep,
        enable_async_checkpointing=checkpoint_config.async_save,
        create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "data", "meta"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def should_save(self, step: int) -> bool:
    """Every `save_every_steps` steps (orbax's own policy would also save the first step)."""
    return self.save_every_steps > 0 and step % self.save_every_steps == 0

  def save(self, step: int, state, data_state: bytes, meta: dict[str, Any]) -> bool:
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(_IteratorStateItem(data_state)),
        meta=ocp.args.JsonSave(meta))
    return self.manager.save(step, args=args, force=True)

  def read_meta(self, step: int) -> dict[str, Any]:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, step: int, abstract_state) -> tuple[Any, bytes, dict[str, Any]]:
    """-> (state with the shardings of `abstract_state`, data-iterator state, meta)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored["state"], self._read_data_state(step), restored["meta"]

  def _read_data_state(self, step: int) -> bytes:
    """This process's iterator state. A checkpoint from another number of processes is
    accepted when all its processes were at the same position: the pipeline's position counts
    global batches, which mean the same examples for any process count."""
    directory = os.path.join(self.directory, str(step), "data")
    count, index = jax.process_count(), jax.process_index()
    own = os.path.join(directory, f"process_{index}-of-{count}.json")
    if os.path.exists(own):
      return open(own, "rb").read()
    files = sorted(f for f in os.listdir(directory) if f.startswith("process_"))
    states = {open(os.path.join(directory, f), "rb").read() for f in files}
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

  def wait_until_finished(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def check_compatible(saved_meta: dict[str, Any], model_config: dict[str, Any],
                     directory: str) -> None:
  """Refuses to resume from a checkpoint of a different model shape, naming the fields."""
  saved = saved_meta.get("model_config", {})
  shape_fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings", "type_vocab_size")
  diffs = [f"{k}: checkpoint {saved.get(k)} vs config {model_config[k]}"
           for k in shape_fields if saved.get(k) != model_config[k]]
  if diffs:
    raise ValueError(f"The checkpoint in {directory} is of a different model ("
                     + "; ".join(diffs) + "). Use another --workdir, or set config.model "
                     "to match the checkpoint.")


def to_json(value) -> Any:
  """ConfigDict/tuples/dtypes -> plain JSON values."""
  return json.loads(json.dumps(value, default=str))
