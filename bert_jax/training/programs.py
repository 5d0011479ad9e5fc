"""The compiled programs of a run: the jitted init, train step and eval step of one task,
optimizer and mesh (cached, so runs in one process that differ only in data or starting weights
share their compilations), the checks of the mesh and batch sizes before anything compiles, and
the report of a compiled step's memory and FLOPs (`launch/train.py --compile_only`)."""

import dataclasses
import functools
import math
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import model
from bert_jax.training import optimizer as optimizer_lib, sharding, steps
from bert_jax.training.settings import StepSettings, TrainSettings
from bert_jax.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class Program:
  """What one task + optimizer fields + mesh compile to."""
  state_shardings: Any  # NamedShardings of the TrainState.
  abstract_state: Any  # Its unboxed ShapeDtypeStructs.
  init: Any  # key -> TrainState, born sharded.
  train_step: Any  # (state, batch, key) -> (state, metrics); state donated.
  eval_step: Any  # (params, batch, key) -> (outputs, sums).

  def sharded_abstract_state(self):
    """The abstract state with its shardings (a restore target; what compiling lowers)."""
    return jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                        self.abstract_state, self.state_shardings)


def abstract_key(mesh=None) -> jax.ShapeDtypeStruct:
  """A PRNG key's shape and dtype: what the programs are traced and lowered with. A concrete key
  made inside `jax.set_mesh` of a compile-only mesh (a TPU topology from a CPU host) fails.
  With `mesh`: replicated over it, as the run's keys are (made inside `jax.set_mesh`), so that
  what is compiled ahead of time is the program the run calls."""
  key = jax.eval_shape(lambda: jax.random.key(0))
  if mesh is None:
    return key
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)


@functools.lru_cache(maxsize=8)
def program(task: Task, step: StepSettings, mesh, rules) -> Program:
  """The jitted functions of `task` with the optimizer and schedule of `step` on
  `mesh` (cached on all four: they are hashable)."""
  optimizer = optimizer_lib.make_optimizer(step, task.frozen)
  init_fn = functools.partial(steps.init_state, task=task, optimizer=optimizer)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init_fn, abstract_key())
    shardings = sharding.logical_to_shardings(abstract, mesh, rules)
  unboxed = jax.tree.map(lambda x: x.unbox(apply_constraint=False)
                         if isinstance(x, nn.Partitioned) else x, abstract,
                         is_leaf=lambda x: isinstance(x, nn.Partitioned))
  step_fn = functools.partial(
      steps.train_step, task=task, optimizer=optimizer,
      schedule=optimizer_lib.learning_rate_schedule(step),
      grad_accum_steps=step.grad_accum_steps)
  return Program(
      state_shardings=shardings, abstract_state=unboxed,
      init=jax.jit(lambda key: nn.meta.unbox(init_fn(key)), out_shardings=shardings),
      train_step=jax.jit(step_fn, in_shardings=(shardings, None, None),
                         out_shardings=(shardings, None), donate_argnums=0),
      eval_step=jax.jit(functools.partial(steps.eval_step, task=task)))


def make_program(settings: TrainSettings, task: Task, mesh) -> Program:
  return program(task, settings.step, mesh, sharding.logical_rules(settings.mesh))


def check_mesh(settings: TrainSettings, model_config, mesh) -> None:
  """The model's sharded dimensions and the batch sizes against the mesh, and its attention
  kernel against the mesh's devices (those compiled for), before compiling."""
  model.check_attention_impl(model_config.attention_impl, jnp.dtype(model_config.dtype).name,
                             model_config.head_dim, device=mesh.devices.flat[0])
  sharding.check_divisibility(model_config, dict(mesh.shape),
                              sharding.logical_rules(settings.mesh))
  check_batch_sizes(settings, mesh)


def check_batch_sizes(settings: TrainSettings, mesh) -> None:
  """Batch sizes against the mesh, before any device work (the values themselves, and the
  batch against grad accumulation, are `config_checks`')."""
  accum = settings.step.grad_accum_steps
  microbatch = ("config.train.batch_size" if accum == 1 else
                "config.train.batch_size / config.train.grad_accum_steps")
  sharding.batch_size_per_shard(settings.batch_size // accum, mesh, microbatch)
  sharding.batch_size_per_shard(settings.eval_batch_size, mesh, "config.train.eval_batch_size")


def row_multiple(mesh, grad_accum_steps: int) -> int:
  """What a packed batch's row count must divide by: every data x fsdp shard gets the same rows
  in each of the `grad_accum_steps` chunks, and every process its equal share."""
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  return math.lcm(shards * grad_accum_steps, jax.process_count())


def batch_spec(task: Task, batch_size: int, mesh, grad_accum_steps: int = 1
               ) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract global train batch of `task` (`Task.batch_shapes`), split over data x fsdp."""
  shapes = task.batch_shapes(batch_size, row_multiple(mesh, grad_accum_steps))
  return {name: jax.ShapeDtypeStruct(shape, dtype,
                                     sharding=sharding.batch_sharding(mesh, len(shape)))
          for name, (shape, dtype) in shapes.items()}


def memory_report(compiled) -> dict[str, float]:
  """Per-device memory of a compiled step in GiB (XLA's memory analysis) and XLA's FLOPs."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  gib = 1 / 2**30
  report = {"xla_flops_per_device": float(cost.get("flops", 0.0)) if cost else 0.0}
  if memory is not None:
    report.update(
        arguments_gib=memory.argument_size_in_bytes * gib,
        outputs_gib=memory.output_size_in_bytes * gib,
        temporaries_gib=memory.temp_size_in_bytes * gib,
        code_gib=memory.generated_code_size_in_bytes * gib,
        # Donated state: outputs reuse the argument buffers.
        total_gib=(memory.argument_size_in_bytes + memory.temp_size_in_bytes
                   + memory.generated_code_size_in_bytes) * gib)
  return report


def compile_step(batch_size: int, task: Task, mesh, prog: Program,
                 log: Callable[[str], None], grad_accum_steps: int = 1):
  """The train step at `batch_size` examples compiled against abstract shapes; logs time,
  memory and FLOPs. The run's own arguments lower to the same program (the key replicated as
  the run's is), so the first step's call finds this executable in jax's in-memory compile
  cache instead of compiling the step a second time."""
  start = time.time()
  spec = batch_spec(task, batch_size, mesh, grad_accum_steps)
  compiled = prog.train_step.lower(prog.sharded_abstract_state(), spec,
                                   abstract_key(mesh)).compile()
  log(f"Compiled the train step in {time.time() - start:.1f} s on {jax.device_count()} "
      f"devices, mesh {dict(mesh.shape)}")
  report = memory_report(compiled)
  if "total_gib" in report:
    log(f"Compiled train step, per device: arguments {report['arguments_gib']:.3f} GiB, "
        f"temporaries {report['temporaries_gib']:.3f} GiB, code {report['code_gib']:.3f} GiB; "
        f"about {report['total_gib']:.3f} GiB in all")
  flops_per_example = task.flops_per_example()
  if flops_per_example:
    log(f"FLOPs per step: {batch_size * flops_per_example:.4g} (model count, all "
        f"devices); XLA's count {report['xla_flops_per_device']:.4g} per device")
  return compiled
