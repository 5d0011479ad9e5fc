"""BERT's optimizer and learning-rate schedule, plus optax's AdamW and LAMB as alternatives.

- "bert_adamw" is google-research/bert's `AdamWeightDecayOptimizer` (optimization.py): Adam
  moments *without* bias correction, update m / (sqrt(v) + eps) with eps outside the square
  root, plus decoupled weight decay (weight_decay x param) on weight matrices only, the sum
  scaled by the learning rate. Without bias correction its first steps are larger than a
  bias-corrected Adam's by (1 - b1^t) / sqrt(1 - b2^t): 3.2x at step 1, 6.5x at step 10,
  1.26x at step 1000 (b1 = 0.9, b2 = 0.999).
- "adamw" (`optax.adamw`, bias-corrected) and "lamb" (`optax.lamb`'s chain) stay available.
  LAMB's trust ratio is per weight matrix: the encoder's layer params are stacked [S, ...]
  (`bert/encoder/layers`), so their norms are taken per layer (`per_layer_norm`), as with
  one tensor per layer.
- Schedule "bert" is the original's: lr = peak x (1 - t/T) (polynomial decay, power 1, over all T
  steps from step 0), overridden by peak x t/W while t < W; so it is 0.9 x peak right after a
  10% warmup. "warmup_linear" decays from the peak over the T - W steps after warmup.
Gradients are clipped by global norm before the optimizer, as the original (`max_grad_norm`).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("bert_adamw", "adamw", "lamb")
SCHEDULES = ("bert", "warmup_linear")


def learning_rate_schedule(train_config) -> optax.Schedule:
  """step t (0-based: the update that makes step t + 1) -> learning rate, per config.train."""
  peak, warmup = train_config.learning_rate, train_config.warmup_steps
  total = train_config.num_train_steps
  if train_config.schedule == "warmup_linear":
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, max(warmup, 1)),
         optax.linear_schedule(peak, 0.0, max(total - warmup, 1))],
        boundaries=[warmup])
  if train_config.schedule == "bert":
    def schedule(step):
      step = jnp.asarray(step, jnp.float32)
      # tf.train.polynomial_decay(peak, step, total, end=0, power=1, cycle=False).
      decayed = peak * (1.0 - jnp.minimum(step, total) / max(total, 1))
      if warmup <= 0:
        return decayed
      return jnp.where(step < warmup, peak * (step / warmup), decayed)
    return schedule
  raise ValueError(f"config.train.schedule={train_config.schedule!r}: use one of {SCHEDULES}")


def decay_mask(params):
  """True for kernels and embedding tables; False for biases and LayerNorm scales/shifts, which
  google-research/bert excludes from weight decay ("LayerNorm", "layer_norm", "bias")."""
  def is_matrix(path, _):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]  # Skips box fields.
    return names[-1] in ("kernel", "embedding")
  return jax.tree_util.tree_map_with_path(is_matrix, params)


class ScaleByBertAdamState(NamedTuple):
  mu: optax.Updates  # First moment, param dtype.
  nu: optax.Updates  # Second moment, param dtype.


def scale_by_bert_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """AdamWeightDecayOptimizer's direction: m / (sqrt(v) + eps), no bias correction."""

  def init_fn(params):
    return ScaleByBertAdamState(mu=optax.tree.zeros_like(params),
                                nu=optax.tree.zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state.nu, updates)
    direction = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return direction, ScaleByBertAdamState(mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def bert_adamw(learning_rate: optax.ScalarOrSchedule, b1: float, b2: float, eps: float,
               weight_decay: float, mask) -> optax.GradientTransformation:
  """google-research/bert's AdamWeightDecayOptimizer:
  param -= lr x (m / (sqrt(v) + eps) + weight_decay x param [matrices only])."""
  return optax.chain(
      scale_by_bert_adam(b1, b2, eps),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate))


def make_optimizer(train_config, frozen: tuple[str, ...] = ()) -> optax.GradientTransformation:
  """config.train -> clip by global norm (if max_grad_norm > 0), then the optimizer. Top-level
  params subtrees named in `frozen` get `optax.set_to_zero` (no updates, no optimizer state)."""
  optimizer = _clipped_optimizer(train_config)
  if not frozen:
    return optimizer
  labels = lambda params: {k: "frozen" if k in frozen else "trained" for k in params}
  return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)


def is_stacked(path) -> bool:
  """Whether a params path is the encoder's stacked [S, ...] layer params."""
  keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return any(keys[i:i + 2] == ["encoder", "layers"] for i in range(len(keys) - 1))


def per_layer_norm(x, stacked: bool):
  """The L2 norm of a tensor, or of each layer [S] of a stacked one (broadcastable to x)."""
  if not stacked:
    return jnp.sqrt(jnp.sum(jnp.square(x)))
  return jnp.sqrt(jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)), keepdims=True))


def scale_by_trust_ratio_per_layer() -> optax.GradientTransformation:
  """optax's LAMB trust ratio ||param|| / ||update|| (1 where either is 0), per layer of the
  stacked encoder params and per tensor elsewhere."""
  def update_fn(updates, state, params):
    def scale(path, update, param):
      param_norm = per_layer_norm(param, is_stacked(path))
      update_norm = per_layer_norm(update, is_stacked(path))
      ratio = jnp.where((param_norm == 0.0) | (update_norm == 0.0), 1.0,
                        param_norm / jnp.where(update_norm == 0.0, 1.0, update_norm))
      return update * ratio.astype(update.dtype)
    return jax.tree_util.tree_map_with_path(scale, updates, params), state
  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lamb(learning_rate: optax.ScalarOrSchedule, b1: float, b2: float, eps: float,
         weight_decay: float, mask) -> optax.GradientTransformation:
  """optax.lamb's chain (Adam, decoupled decay, trust ratio, learning rate) with the trust
  ratio per layer of stacked params."""
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask),
      scale_by_trust_ratio_per_layer(),
      optax.scale_by_learning_rate(learning_rate))


def _clipped_optimizer(train_config) -> optax.GradientTransformation:
  schedule = learning_rate_schedule(train_config)
  kwargs = dict(learning_rate=schedule, b1=train_config.b1, b2=train_config.b2,
                eps=train_config.eps, weight_decay=train_config.weight_decay, mask=decay_mask)
  if train_config.optimizer == "bert_adamw":
    optimizer = bert_adamw(**kwargs)
  elif train_config.optimizer == "adamw":
    optimizer = optax.adamw(**kwargs)
  elif train_config.optimizer == "lamb":
    optimizer = lamb(**kwargs)
  else:
    raise ValueError(f"config.train.optimizer={train_config.optimizer!r}: use one of "
                     f"{OPTIMIZERS}")
  if train_config.max_grad_norm > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(train_config.max_grad_norm), optimizer)
  return optimizer
