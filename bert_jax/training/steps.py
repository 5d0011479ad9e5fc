"""The pure train and eval steps of every task. The task prepares a batch inside jit (pretraining
masks it there: a new draw every step from `fold_in(rng, step)`, at no host cost), counts its
loss denominators over the whole batch, then the step accumulates microbatch gradients."""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from bert_jax.tasks.base import Task


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer steps taken.
  params: Any
  opt_state: Any


def init_state(rng, *, task: Task, optimizer: optax.GradientTransformation) -> TrainState:
  """Random init. Params and optimizer state keep their logical-axis boxes, so
  `nn.get_partition_spec(jax.eval_shape(init_state, ...))` gives the state's shardings; unbox
  (`nn.meta.unbox`) before training."""
  params = task.model.init(rng, *task.example_inputs(), deterministic=True)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def train_step(state: TrainState, batch: dict, rng, *, task: Task,
               optimizer: optax.GradientTransformation, schedule: optax.Schedule,
               grad_accum_steps: int = 1) -> tuple[TrainState, dict]:
  """One optimizer step on a global batch: prepare, forward, backward, clip, update.

  The loss is normalised by the counts of the whole batch, and the task's `gradients` (by
  default microbatch gradients accumulated over `grad_accum_steps`) give exactly the full-batch
  gradient. Params under `task.frozen` are carried over as they
  are (bit-identical whatever the float rules). Returns metrics as sums and counts (the task's,
  real_tokens, slots (the size of input_ids), examples) plus loss, grad_norm (of the trained params) and the learning rate used.
  """
  rng = jax.random.fold_in(rng, state.step)
  prepare_rng, dropout_rng = jax.random.split(rng)
  batch = task.prepare(batch, prepare_rng, state.step)
  counts = task.loss_counts(batch)
  loss, sums, grads = task.gradients(state.params, batch, dropout_rng, counts, grad_accum_steps)

  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  params = {**params, **{name: state.params[name] for name in task.frozen}}
  trained_grads = {k: v for k, v in grads.items() if k not in task.frozen}
  metrics = {**sums, "loss": loss, "grad_norm": optax.tree.norm(trained_grads),
             "learning_rate": schedule(state.step), "real_tokens": task.real_tokens(batch),
             "slots": jnp.float32(batch["input_ids"].size), "examples": task.examples(batch)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: dict, rng, *, task: Task) -> tuple[dict, dict]:
  """(per-row outputs, sums) of one eval batch, deterministic; padding rows weigh 0 through
  `example_weight`, which is passed through with the outputs."""
  batch = task.prepare_eval(batch, rng)
  outputs, sums = task.eval_outputs(params, batch)
  return {**outputs, "example_weight": batch["example_weight"]}, sums
