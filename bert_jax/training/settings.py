"""The typed settings of the training layer. A driver (`bert_jax/train.py`, `bert_jax/finetune.py`)
builds them once from its ConfigDict (`TrainSettings.from_config`), after `config_checks` has
checked every value; the trainer, the compiled programs, the reporter, the checkpointer and the
mesh read these frozen dataclasses, never the ConfigDict. Each field is named as in
configs/base.py, where its default and meaning are.

`StepSettings` is what the compiled step depends on: it is hashable, so a program is cached on it
(runs in one process that differ only in data or weights share a compilation). The registered
optimizers' own fields (`optimizer.OPTIMIZERS`) travel in `StepSettings.own` and read as
attributes, so an optimizer's `build` sees `settings.momentum` as it would the config's field.
"""

import dataclasses
from typing import Any

from bert_jax.training import optimizer as optimizer_lib


def _fields(cls, section, **overrides) -> dict[str, Any]:
  """The values of `cls`'s fields from a ConfigDict section (a missing one is a KeyError naming
  it: configs/base.py holds every default, none is guessed here)."""
  names = [f.name for f in dataclasses.fields(cls) if f.name not in overrides]
  return {**{name: section[name] for name in names}, **overrides}


def _frozen(value: Any) -> Any:
  """Lists (and nested lists) as tuples: settings are hashable."""
  return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """config.mesh: the device mesh's axis sizes (-1: the devices left over) and axis rules."""
  data: int
  fsdp: int
  tensor: int
  dcn_data: int
  logical_axis_rules: tuple[tuple[str, Any], ...]

  @classmethod
  def from_config(cls, mesh_config) -> "MeshSettings":
    return cls(**_fields(cls, mesh_config,
                         logical_axis_rules=_frozen(mesh_config.logical_axis_rules)))


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """config.checkpoint: when and how checkpoints are written, kept and trusted."""
  save_every_steps: int
  max_to_keep: int
  async_save: bool
  on_damaged: str
  stop_grace_seconds: float
  allow_vocab_change: bool

  @classmethod
  def from_config(cls, checkpoint_config) -> "CheckpointSettings":
    return cls(**_fields(cls, checkpoint_config))


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """The config.train fields the compiled train step depends on: optimizer, schedule, clipping
  and gradient accumulation; `own`: the registered optimizers' own fields, (name, value) pairs."""
  optimizer: str
  schedule: str
  learning_rate: float
  warmup_steps: int
  num_train_steps: int
  decay_fraction: float
  decay_shape: str
  weight_decay: float
  b1: float
  b2: float
  eps: float
  max_grad_norm: float
  grad_accum_steps: int
  own: tuple[tuple[str, Any], ...] = ()

  def __getattr__(self, name: str) -> Any:  # Only for names that are not fields: `own`'s.
    for key, value in object.__getattribute__(self, "own"):
      if key == name:
        return value
    raise AttributeError(f"StepSettings has no field {name!r} (the registered optimizers' own "
                         f"fields: {[key for key, _ in self.own]})")

  @classmethod
  def from_config(cls, train_config) -> "StepSettings":
    own = tuple((name, _frozen(train_config[name])) for name in optimizer_lib.own_fields())
    return cls(**_fields(cls, train_config, own=own))


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """What the one trainer reads of a run's config (pretraining and fine-tuning alike)."""
  seed: int  # config.seed: init, data order and masking derive from it.
  batch_size: int  # config.train.batch_size: rows per global batch.
  eval_batch_size: int  # config.train.eval_batch_size.
  num_train_steps: int  # The run's last step (fine-tuning: from its epochs, once resolved).
  log_every_steps: int
  eval_every_steps: int  # 0: evaluate at the last step only.
  prefetch: int  # config.data.prefetch: batches put on the devices ahead of the step.
  tensorboard: bool  # config.logging.tensorboard.
  profile_steps: tuple[int, int]  # config.logging.profile_steps: (first step, count).
  step: StepSettings
  mesh: MeshSettings
  checkpoint: CheckpointSettings

  @classmethod
  def from_config(cls, config) -> "TrainSettings":
    """From a checked pretraining or fine-tuning ConfigDict (the drivers' one call)."""
    train = config.train
    return cls(seed=config.seed, batch_size=train.batch_size,
               eval_batch_size=train.eval_batch_size, num_train_steps=train.num_train_steps,
               log_every_steps=train.log_every_steps, eval_every_steps=train.eval_every_steps,
               prefetch=config.data.prefetch, tensorboard=config.logging.tensorboard,
               profile_steps=_frozen(config.logging.profile_steps),
               step=StepSettings.from_config(train), mesh=MeshSettings.from_config(config.mesh),
               checkpoint=CheckpointSettings.from_config(config.checkpoint))
