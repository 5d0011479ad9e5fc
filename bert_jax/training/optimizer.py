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
- "stable_adamw" is StableAdamW (Wortsman et al. 2023, arXiv:2304.13013) exactly as ModernBERT
  trains with it: `decoupled_stableadamw` = optimi's `StableAdamW(decouple_lr=True)`
  (github.com/warner-benjamin/optimi, optimi/stableadamw.py). AdamW whose learning rate is
  divided, per tensor, by max(1, RMS(g^2 / max(v_hat, eps^2))) (AdaFactor's update clipping),
  with weight decay scaled by lr / peak lr instead of lr. Per tensor means per layer of the
  stacked encoder params. See `stable_adamw`.
- Schedule "bert" is the original's: lr = peak x (1 - t/T) (polynomial decay, power 1, over all T
  steps from step 0), overridden by peak x t/W while t < W; so it is 0.9 x peak right after a
  10% warmup. "warmup_linear" decays from the peak over the T - W steps after warmup.
- Schedule "wsd" (warmup-stable-decay, ModernBERT's): peak x t/W while t < W, then the peak,
  then a decay to 0 over the last D = round(decay_fraction x T) steps, shaped "1-sqrt" or
  "linear". A stable-phase checkpoint at step s decays over d more steps when resumed with
  T = s + d and decay_fraction = d / (s + d): D is exactly d (`wsd_decay_steps`) and the learning
  rate up to s is bit-identical to the long run's. See `wsd_schedule`.
Gradients are clipped by global norm before the optimizer, as the original (`max_grad_norm`);
ModernBERT turns that off with StableAdamW (its update clipping replaces it): max_grad_norm=0.

`OPTIMIZERS` is the registry: name -> `OptimizerSpec` (how to build it from config.train and the
schedule, and the config.train fields it alone reads, each with its check). A new optimizer is
an entry here (or one a user's module adds to the dict) plus its fields in configs/base.py: the
config checks and the compiled step read its fields from the registry (WORKSPACE.md).
"""

import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("bert", "warmup_linear", "wsd")
DECAY_SHAPES = ("1-sqrt", "linear")  # Schedule "wsd": the decay phase's shape.


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
  if train_config.schedule == "wsd":
    return wsd_schedule(peak, warmup, total, train_config.decay_fraction,
                        train_config.decay_shape)
  raise ValueError(f"config.train.schedule={train_config.schedule!r}: use one of {SCHEDULES}")


def wsd_decay_steps(decay_fraction: float, total: int) -> int:
  """The decay steps D of schedule "wsd": decay_fraction x total rounded half up (0.25 x 10 ->
  3), in [0, total]. The 1e-6 tolerance absorbs the float error of the product (a few
  1e-16 x total), so decay_fraction = d / total (a decay of d steps from a stable-phase
  checkpoint) gives back exactly d, and a product that is x.5 in decimals always rounds up."""
  return min(max(math.floor(decay_fraction * total + 0.5 + 1e-6), 0), total)


def wsd_schedule(peak: float, warmup: int, total: int, decay_fraction: float,
                 shape: str) -> optax.Schedule:
  """Warmup-stable-decay: step t -> peak x t/W while t < W; else peak x (1 - f(u)) with
  u = clip((t - S) / D, 0, 1), S = T - D (D = `wsd_decay_steps`), f = sqrt ("1-sqrt") or
  identity ("linear"): the peak until S, 0 from T on; D = 0: the peak for ever after warmup.
  Warmup overrides the rest, as in schedule "bert": with W > S the rate still rises to
  peak x (W-1)/W, then drops to the decay curve at W (W >= T: it rises to the last step).
  A run resumed at step s >= W with T = s + d, decay_fraction = d / (s + d) computes exactly
  the long run's rates up to s (S = s there: u = 0, lr = peak), then decays over d steps."""
  if shape not in DECAY_SHAPES:
    raise ValueError(f"config.train.decay_shape={shape!r}: use one of {DECAY_SHAPES}")
  decay = wsd_decay_steps(decay_fraction, total)
  start = total - decay

  def schedule(step):
    step = jnp.asarray(step, jnp.int32)
    if decay > 0:
      # Integer steps first (exact in float32 up to 2^24 steps).
      elapsed = jnp.clip(step - start, 0, decay)
      progress = elapsed.astype(jnp.float32) / decay
      fall = jnp.sqrt(progress) if shape == "1-sqrt" else progress
      # Both ends selected, not computed: XLA's x * (1 / D) and fused peak x (1 - fall) miss
      # them by an ulp (a rate of -1.5e-11 after the end); the peak and 0 are exact.
      rate = jnp.where(elapsed == 0, peak,
                       jnp.where(elapsed == decay, 0.0, peak * jnp.maximum(1.0 - fall, 0.0)))
    else:
      rate = jnp.full((), peak, jnp.float32)
    if warmup <= 0:
      return rate
    return jnp.where(step < warmup, peak * (step.astype(jnp.float32) / warmup), rate)
  return schedule


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


def per_layer_mean(x: jax.Array, stacked: bool) -> jax.Array:
  """The float32 mean of a tensor, or of each layer [S] of a stacked one (broadcastable to x)."""
  axes = tuple(range(1, x.ndim)) if stacked else None
  return jnp.mean(x, axis=axes, dtype=jnp.float32, keepdims=stacked)


class ScaleByStableAdamState(NamedTuple):
  count: jax.Array  # int32 scalar: updates so far.
  mu: optax.Updates  # First moment, bias-corrected (optimi keeps m_hat itself), param dtype.
  nu: optax.Updates  # Second moment, bias-corrected (v_hat), param dtype.


def debias_beta(beta: float, step: jax.Array) -> jax.Array:
  """optimi.utils.debias_beta: (beta^t - beta) / (beta^t - 1) = beta (1 - beta^(t-1)) /
  (1 - beta^t). A moving average with it at step t (from 1) is the bias-corrected average."""
  power = jnp.power(jnp.float32(beta), step)
  return (power - beta) / (power - 1.0)


def stable_adamw(learning_rate: optax.ScalarOrSchedule, b1: float, b2: float, eps: float,
                 weight_decay: float, mask, max_learning_rate: float
                 ) -> optax.GradientTransformation:
  """StableAdamW as ModernBERT trains with it ("decoupled_stableadamw"): optimi's
  `StableAdamW(decouple_lr=True, max_lr=None -> the peak lr)` (warner-benjamin/optimi,
  optimi/stableadamw.py, `_single_param_stableadamw`), after Wortsman et al. 2023, "Stable and
  low-precision training for large-scale vision-language models" (arXiv:2304.13013). At step
  t = 1, 2, ... with lr = learning_rate(t - 1), for each tensor (each layer of a stacked one):
    m <- lerp(m, g, 1 - debias_beta(b1, t)); v <- debias_beta(b2, t) v + (1 - ...) g^2
      (m, v are the bias-corrected moments m_hat, v_hat themselves: optimi's debiased betas)
    rms = sqrt(mean(g^2 / max(v, eps^2)))  (the updated v; AdaFactor's update clipping)
    lr_t = lr / max(1, rms)
    param <- param x (1 - (lr_t / max_learning_rate) x weight_decay)  [where mask]
    param <- param - lr_t x m / (sqrt(v) + eps)  (eps outside the root)
  The decay is "fully decoupled": scaled by the schedule's lr / peak, not by lr (ModernBERT:
  weight_decay 1e-5 with lr 8e-4, betas (0.9, 0.98), eps 1e-6, no gradient clipping).
  Returns the update (new param - param); state in the param dtype, the RMS in float32."""
  schedule = learning_rate if callable(learning_rate) else (lambda _: learning_rate)
  eps_sq = max(eps * eps, float(jnp.finfo(jnp.float32).tiny))  # eps^2 underflowing: no 0 / 0.

  def init_fn(params):
    return ScaleByStableAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=optax.tree.zeros_like(params),
                                  nu=optax.tree.zeros_like(params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("stable_adamw needs the params (weight decay)")
    step = (state.count + 1).astype(jnp.float32)
    b1_comp, b2_hat = 1.0 - debias_beta(b1, step), debias_beta(b2, step)
    mu = jax.tree.map(lambda m, g: (m + b1_comp * (g - m)).astype(m.dtype), state.mu, updates)
    nu = jax.tree.map(lambda v, g: (b2_hat * v + (1.0 - b2_hat) * jnp.square(g)).astype(v.dtype),
                      state.nu, updates)
    lr = jnp.asarray(schedule(state.count), jnp.float32)
    decays = mask(params) if callable(mask) else mask

    def leaf_update(path, g, m, v, param, decay):
      g, m, v = (x.astype(jnp.float32) for x in (g, m, v))
      rms = jnp.sqrt(per_layer_mean(jnp.square(g) / jnp.maximum(v, eps_sq), is_stacked(path)))
      tensor_lr = lr / jnp.maximum(1.0, rms)  # [] or [S, 1, ...].
      decayed = jnp.where(decay, (tensor_lr / max_learning_rate) * weight_decay, 0.0)
      update = -decayed * param.astype(jnp.float32) - tensor_lr * m / (jnp.sqrt(v) + eps)
      return update.astype(param.dtype)

    new_updates = jax.tree_util.tree_map_with_path(leaf_update, updates, mu, nu, params, decays)
    return new_updates, ScaleByStableAdamState(count=state.count + 1, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


# ---------------------------------------------------------------------------- the registry

FieldCheck = Callable[[Any], str | None]  # A value -> None, or what is wrong with it.


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """An optimizer by name. `build(train_config, schedule)` -> its transformation (clipping and
  frozen subtrees are added around it); `own_fields`: the config.train fields only it reads,
  each with its check (they join the config checks and the compiled step's fields)."""
  build: Callable[[Any, optax.Schedule], optax.GradientTransformation]
  own_fields: Mapping[str, FieldCheck] = dataclasses.field(default_factory=dict)


def adam_arguments(train_config, schedule: optax.Schedule) -> dict[str, Any]:
  """The fields every Adam-like optimizer here takes: lr schedule, betas, eps, decay (matrices)."""
  return dict(learning_rate=schedule, b1=train_config.b1, b2=train_config.b2,
              eps=train_config.eps, weight_decay=train_config.weight_decay, mask=decay_mask)


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "bert_adamw": OptimizerSpec(lambda t, s: bert_adamw(**adam_arguments(t, s))),
    "adamw": OptimizerSpec(lambda t, s: optax.adamw(**adam_arguments(t, s))),
    "lamb": OptimizerSpec(lambda t, s: lamb(**adam_arguments(t, s))),
    "stable_adamw": OptimizerSpec(lambda t, s: stable_adamw(
        **adam_arguments(t, s), max_learning_rate=t.learning_rate)),
}


def own_fields() -> dict[str, FieldCheck]:
  """The config.train fields of every registered optimizer -> their checks."""
  return {name: check for spec in OPTIMIZERS.values() for name, check in spec.own_fields.items()}


def _clipped_optimizer(train_config) -> optax.GradientTransformation:
  if train_config.optimizer not in OPTIMIZERS:
    raise ValueError(f"config.train.optimizer={train_config.optimizer!r}: use one of "
                     f"{tuple(OPTIMIZERS)}")
  optimizer = OPTIMIZERS[train_config.optimizer].build(train_config,
                                                       learning_rate_schedule(train_config))
  if train_config.max_grad_norm > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(train_config.max_grad_norm), optimizer)
  return optimizer
