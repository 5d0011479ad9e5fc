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
import orbax.checkpoint as ocp


class _IteratorStateItem:
  """Adapter for grain's orbax handler: carries a recorded iterator state (JSON bytes)."""

  def __init__(self, state: bytes = b""):
    self.state = state

  def get_state(self) -> bytes:
    return self.state

  def set_state(self, state: bytes) -> None:
    self.state = state

  def start_prefetch(self) -> None:  # Called by grain's handler after restore.
    pass


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
    item = _IteratorStateItem()
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=grain.checkpoint.CheckpointRestore(item),
        meta=ocp.args.JsonRestore()))
    return restored["state"], item.state, restored["meta"]

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
