"""Where a run starts: its workdir's latest checkpoint (refused, before any device work, when it
is of another task, model, vocabulary or label list), or a fresh state born sharded, with the
pretrained weights the task takes put in place (shapes checked; the parts the source lacks keep
their fresh initialisation and are named)."""

from typing import Any, Callable

import jax
import numpy as np

from bert_jax.checkpoints import checkpointing
from bert_jax.training import steps
from bert_jax.models.model import padded_size
from bert_jax.training.programs import Program
from bert_jax.tasks.base import Task
from bert_jax.weights import layout

# Training checkpoints of the params layout before the encoder was scanned restore converted.
LEGACY_LAYOUT = checkpointing.LegacyLayout(layout.holds_layout_1, layout.downgrade, layout.upgrade)


def check_resumable(checkpointer: checkpointing.Checkpointer, task: Task, meta: dict[str, Any],
                    allow_vocab_change: bool) -> None:
  """Refuses a workdir whose latest checkpoint is of another task, model shape, vocabulary or
  label list, was trained with optimizer settings whose state does not fit this run's, or is
  past this run's last step (`meta`: what this run records in its checkpoints)."""
  latest = checkpointer.latest_step()
  if latest is None:
    return
  where = f"{checkpointer.directory}/{latest}"
  saved = checkpointer.read_meta(latest)
  saved_task = saved.get("task", {}).get("name")
  if saved_task != task.name:
    raise ValueError(f"{where} is a checkpoint of task {saved_task!r}, this run is "
                     f"{task.name!r}; use another --workdir")
  checkpointing.check_compatible(saved["model_config"], meta["model_config"],
                                 checkpointer.directory)
  checkpointing.check_same_vocab(saved.get("vocab_fingerprint"), meta.get("vocab_fingerprint"),
                                 where, allow_vocab_change)
  task.check_saved(saved["task"], saved.get("config", {}), where)
  saved_head = saved["task"].get("head", "bert")  # Checkpoints before ModernBERT's heads: BERT's.
  head = task.meta().get("head", saved_head)
  if head != saved_head:
    raise ValueError(f"{where} was trained with {saved_head}'s task head, this run builds "
                     f"{head}'s: set --config.head.kind={saved_head} to resume it")
  saved_labels = saved["task"].get("labels")
  labels = task.meta().get("labels")
  if saved_labels is not None and list(saved_labels) != list(labels or ()):
    raise ValueError(f"{where} was trained with the labels {list(saved_labels)}, this run has "
                     f"{list(labels or ())}: the classifier's rows would mean other labels. Give "
                     "--config.data.labels in the saved order, or use another --workdir")
  # What the trained model computes (an embedding's pooling and normalisation): a resume under
  # other values would go on training another function of the same params.
  for name in getattr(task, "resume_identity", ()):
    section = getattr(task, "config_section", "task")
    if name in saved["task"] and saved["task"][name] != task.meta().get(name):
      raise ValueError(f"{where} was trained with config.{section}.{name}="
                       f"{saved['task'][name]!r}, this run has {task.meta().get(name)!r}: set "
                       f"--config.{section}.{name}={_flag_value(saved['task'][name])} to resume "
                       "it, or use another --workdir")
  # Checkpoints from before vocabulary padding record no vocab_pad_multiple: they are unpadded.
  saved_multiple = saved["model_config"].get("vocab_pad_multiple", 1)
  model_config = task.model_config
  if padded_size(model_config.vocab_size, saved_multiple) != model_config.padded_vocab_size:
    raise ValueError(f"{where} was trained with vocab_pad_multiple={saved_multiple}, this run's "
                     f"config.model.vocab_pad_multiple is {model_config.vocab_pad_multiple}; set "
                     f"it to {saved_multiple} to resume")
  # Then what this run would do with it: its optimizer state must fit, and it must train on.
  check_state_settings(saved.get("config", {}), meta.get("config", {}), where,
                       checkpointer.workdir)
  check_steps(latest, meta.get("config", {}), where)


def _flag_value(value: Any) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def check_steps(latest: int, config: dict[str, Any], where: str) -> None:
  """A workdir trained past this run's last step: resuming would train nothing and report
  the checkpoint's scores as this run's (the same step: its final evaluation again)."""
  total = config.get("train", {}).get("num_train_steps")
  if total is not None and latest > total:
    raise ValueError(f"{where} is at step {latest}, past config.train.num_train_steps={total}: "
                     "this workdir has trained further already. Give --config.train."
                     f"num_train_steps={latest} or more to resume it, or use another --workdir")


def state_settings(config: dict[str, Any]) -> dict[str, Any]:
  """The settings that decide the tree of the optimizer state (a checkpoint restores only into
  the same one): the optimizer, clipping on or off (its chain has one more state) and a frozen
  encoder (no state for it). The other optimizer fields (learning rate, schedule, decay...) may
  change on a resume."""
  train = config.get("train", {})
  settings = {"train.optimizer": train.get("optimizer"),
              "train.max_grad_norm": ("on" if (train.get("max_grad_norm") or 0) > 0 else "off")
              if "max_grad_norm" in train else None}
  if "freeze_encoder" in train:
    settings["train.freeze_encoder"] = bool(train["freeze_encoder"])
  return settings


def check_state_settings(saved: dict[str, Any], config: dict[str, Any], where: str,
                         workdir: str) -> None:
  """Refuses a resume whose optimizer state would not fit the checkpoint's, naming the field
  (before any device work, and never taken for damage: the checkpoints stay as they are)."""
  saved_settings, settings = state_settings(saved), state_settings(config)
  diffs = [name for name, value in settings.items()
           if saved_settings.get(name) is not None and value is not None
           and saved_settings[name] != value]
  if not diffs:
    return
  train, saved_train = config["train"], saved["train"]
  shown = [f"{name}: checkpoint {saved_train[name.split('.')[1]]!r}, this run "
           f"{train[name.split('.')[1]]!r}" for name in diffs]
  if "train.max_grad_norm" in diffs:
    shown[diffs.index("train.max_grad_norm")] += " (clipping on vs off)"
  overrides = " ".join(f"--config.{name}={saved_train[name.split('.')[1]]}" for name in diffs)
  raise ValueError(f"{where} was trained with other optimizer settings ({'; '.join(shown)}): "
                   "its optimizer state does not fit this run. Resume with the checkpoint's "
                   f"({overrides}), or start a new --workdir from its weights with "
                   f"--config.init_from={workdir} (the optimizer starts afresh); the checkpoints "
                   "are left as they are")


def merge_initial(fresh: dict, initial: dict, source: str) -> tuple[dict, list[str]]:
  """Fresh params with every leaf `initial` has put in place (shapes checked) -> (params,
  sorted names of the top-level parts left fresh, e.g. a head the source lacks)."""
  flat_initial = {path: value for path, value in
                  jax.tree_util.tree_flatten_with_path(initial)[0]}
  fresh_parts, leaves = set(), []
  for path, leaf in jax.tree_util.tree_flatten_with_path(fresh)[0]:
    if path not in flat_initial:  # Named by part: "mlm", "classifier", "pooler" (of bert).
      fresh_parts.add(path[1].key if path[0].key == "bert" else path[0].key)
      leaves.append(leaf)
      continue
    value = np.asarray(flat_initial[path])
    if value.shape != leaf.shape:
      name = "/".join(k.key for k in path)
      raise ValueError(f"{source}: {name} has shape {value.shape}, the model {leaf.shape}; "
                       "the checkpoint is of another model shape")
    leaves.append(value.astype(leaf.dtype))
  return jax.tree.unflatten(jax.tree.structure(fresh), leaves), sorted(fresh_parts)


def initial_state(seed: int, task: Task, prog: Program, checkpointer: checkpointing.Checkpointer,
                  initial: dict | None, source: str, log: Callable[[str], None],
                  settings: dict[str, Any] | None = None
                  ) -> tuple[steps.TrainState, bytes | None, dict]:
  """(state, data-iterator state or None, best eval so far): restored from the latest
  checkpoint, else born sharded from `seed`, with the `initial` (pretrained) params from
  `source` put in place if given. `settings`: this run's config (as a dict), named field by
  field where a checkpoint does not restore into its state."""
  if checkpointer.latest_step() is not None:
    restored = checkpointer.restore(prog.sharded_abstract_state(), LEGACY_LAYOUT, settings)
    if restored is None:
      raise ValueError(f"No checkpoint in {checkpointer.directory} could be restored (each was "
                       "set aside as <step>.damaged); start a new --workdir, or initialise from "
                       "weights you trust with --config.init_from")
    latest, state, data_state = restored
    log(f"Resumed from {checkpointer.directory}/{latest}")
    return state, data_state, checkpointer.read_meta(latest).get("best", {})
  state = prog.init(jax.random.key(seed))
  if initial is None:
    return state, None, {}
  params, fresh = merge_initial(jax.device_get(state.params), task.initial_params(initial),
                                source)
  log(f"Initialised from {source}" + (f" (fresh: {', '.join(fresh)})" if fresh else ""))
  return state.replace(params=jax.device_put(params, prog.state_shardings.params)), None, {}
