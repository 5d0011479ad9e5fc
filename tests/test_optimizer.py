"""BERT's optimizer and schedule against a numpy transcription of google-research/bert's
optimization.py (`create_optimizer`: polynomial_decay + warmup, clip_by_global_norm,
`AdamWeightDecayOptimizer`); the "modern encoder" options (ModernBERT) against theirs: schedule
"wsd" against its definition, "stable_adamw" against a numpy transcription of optimi's
StableAdamW (github.com/warner-benjamin/optimi, optimi/stableadamw.py)."""

import dataclasses
import math
import os
import re
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from absl import flags
from ml_collections import config_flags

from bert_jax import config_checks
from bert_jax.objectives import losses
from bert_jax.training import optimizer as optimizer_lib
from bert_jax.training.settings import StepSettings
from bert_jax.objectives.masking import MaskingConfig
from bert_jax.models.model import BertConfig, BertForPreTraining
from bert_jax.tasks import PretrainingTask
from bert_jax.weights import layout
from configs import base


def _train_config(**overrides) -> ml_collections.ConfigDict:
  values = dict(optimizer="bert_adamw", schedule="bert", learning_rate=1e-2, warmup_steps=10,
                num_train_steps=100, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                max_grad_norm=1.0, decay_fraction=0.1, decay_shape="1-sqrt")
  values.update(overrides)
  return ml_collections.ConfigDict(values)


# ------------------------------------------------ numpy transcription of optimization.py


def reference_learning_rate(global_step: int, init_lr: float, num_train_steps: int,
                            num_warmup_steps: int) -> np.float32:
  """create_optimizer's learning rate at `global_step` (float32, as TF computes it)."""
  f32 = np.float32
  step = f32(min(global_step, num_train_steps))  # polynomial_decay, cycle=False.
  learning_rate = (f32(init_lr) - f32(0.0)) * (f32(1.0) - step / f32(num_train_steps)) ** f32(1.0)
  if num_warmup_steps:
    warmup_percent_done = f32(global_step) / f32(num_warmup_steps)
    warmup_learning_rate = f32(init_lr) * warmup_percent_done
    is_warmup = f32(global_step < num_warmup_steps)
    learning_rate = (f32(1.0) - is_warmup) * learning_rate + is_warmup * warmup_learning_rate
  return f32(learning_rate)


def _use_weight_decay(param_name: str) -> bool:
  """AdamWeightDecayOptimizer._do_use_weight_decay with BERT's exclude list."""
  return not any(re.search(r, param_name) for r in ["LayerNorm", "layer_norm", "bias"])


class ReferenceAdamWeightDecay:
  """AdamWeightDecayOptimizer.apply_gradients over a dict of named float32 numpy params, with
  its decay rule applied to `decay_names[name]` (the original's name of a param)."""

  def __init__(self, params: dict[str, np.ndarray], weight_decay_rate: float, beta_1: float,
               beta_2: float, epsilon: float, decay_names: dict[str, str] | None = None):
    self.decay_names = decay_names or {name: name for name in params}
    self.m = {k: np.zeros_like(v) for k, v in params.items()}
    self.v = {k: np.zeros_like(v) for k, v in params.items()}
    # `1.0 - self.beta_1` is Python float arithmetic in the original, then a float32 constant.
    self.wd, self.b1, self.b2, self.eps = (np.float32(x) for x in (weight_decay_rate, beta_1,
                                                                    beta_2, epsilon))
    self.one_minus_b1, self.one_minus_b2 = np.float32(1.0 - beta_1), np.float32(1.0 - beta_2)

  def apply_gradients(self, grads: dict, params: dict, learning_rate: np.float32) -> dict:
    new_params = {}
    for name, param in params.items():
      grad = grads[name]
      next_m = self.b1 * self.m[name] + self.one_minus_b1 * grad
      next_v = self.b2 * self.v[name] + self.one_minus_b2 * np.square(grad)
      update = next_m / (np.sqrt(next_v) + self.eps)
      if _use_weight_decay(self.decay_names[name]):
        update += self.wd * param
      new_params[name] = param - learning_rate * update
      self.m[name], self.v[name] = next_m, next_v
    return new_params


def reference_clip_by_global_norm(grads: dict, clip_norm: float) -> dict:
  """tf.clip_by_global_norm."""
  global_norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float32)) for g in grads.values()))
  scale = np.float32(clip_norm) / np.maximum(global_norm, np.float32(clip_norm))
  return {k: g * scale for k, g in grads.items()}


# ------------------------------------------------------------------------- tests


@pytest.mark.parametrize("total,warmup", [(100, 10), (100, 0), (50, 50), (7, 3)])
def test_bert_schedule_matches_polynomial_decay_with_warmup(total, warmup):
  config = _train_config(num_train_steps=total, warmup_steps=warmup, learning_rate=1e-4)
  schedule = jax.jit(optimizer_lib.learning_rate_schedule(config))
  for step in range(total + 3):
    expected = reference_learning_rate(step, 1e-4, total, warmup)
    # XLA turns x / T into x * (1 / T): equal to float32 rounding relative to the peak.
    np.testing.assert_allclose(float(schedule(step)), float(expected), rtol=0, atol=1e-4 * 1e-6)
  if warmup == 10:  # 0.9 x peak right after a 10% warmup, not the peak.
    np.testing.assert_allclose(float(schedule(10)), 0.9e-4, rtol=1e-6)


def test_warmup_linear_schedule_is_kept():
  config = _train_config(schedule="warmup_linear", learning_rate=1.0)
  schedule = optimizer_lib.learning_rate_schedule(config)
  np.testing.assert_allclose([float(schedule(s)) for s in (0, 5, 10, 55, 100)],
                             [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
  with pytest.raises(ValueError, match="config.train.schedule='cosine'"):
    optimizer_lib.learning_rate_schedule(_train_config(schedule="cosine"))


def _flat_names(tree) -> dict[str, np.ndarray]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(k.key for k in path): np.asarray(leaf) for path, leaf in flat}


def _original_names(params) -> dict[str, str]:
  """Each param's name -> its name in the original's layout (one subtree per layer, BERT's
  `LayerNorm`: what its weight-decay rule reads; the layers of a stacked param share a rule)."""
  def name(path, leaf):  # A stacked param: its name once per layer.
    text = "/".join(k.key for k in path)
    return np.asarray([text] * leaf.shape[0]) if optimizer_lib.is_stacked(path) else text

  names = jax.tree_util.tree_map_with_path(name, params)
  flat = jax.tree_util.tree_flatten_with_path(layout.downgrade(names), is_leaf=lambda x:
                                              isinstance(x, (str, np.str_)))[0]
  return {str(new): "/".join(k.key for k in path) for path, new in reversed(flat)}  # Layer 0.


def test_100_steps_equal_the_original_optimizer_on_a_small_model():
  model_config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=16)
  model = BertForPreTraining(model_config)
  task = PretrainingTask(model_config, MaskingConfig(64, 4, (0, 2, 3, 4)), 16, examples_per_row=1)
  rng = np.random.default_rng(0)
  batch = {
      "input_ids": jnp.asarray(rng.integers(5, 64, (4, 16)), jnp.int32),
      "token_type_ids": jnp.asarray(np.repeat([[0] * 8 + [1] * 8], 4, 0), jnp.int32),
      "attention_mask": jnp.ones((4, 16), jnp.int32),
      "masked_lm_positions": jnp.asarray(rng.integers(0, 16, (4, 3)), jnp.int32),
      "masked_lm_ids": jnp.asarray(rng.integers(5, 64, (4, 3)), jnp.int32),
      "masked_lm_weights": jnp.ones((4, 3), jnp.float32),
      "next_sentence_label": jnp.asarray([0, 1, 0, 1], jnp.int32),
      "nsp_weights": jnp.ones((4,), jnp.float32),
  }
  params = model.init(jax.random.key(0), batch["input_ids"], batch["token_type_ids"],
                      batch["attention_mask"], batch["masked_lm_positions"])["params"]
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, params,
                        is_leaf=lambda x: hasattr(x, "unbox"))

  @jax.jit
  def grad_fn(p):
    def loss(p):
      outputs = model.apply({"params": p}, batch["input_ids"], batch["token_type_ids"],
                            batch["attention_mask"], batch["masked_lm_positions"])
      return task.loss(losses.pretraining_sums(outputs, batch), task.loss_counts(batch))
    return jax.grad(loss)(p)

  config = _train_config()
  optimizer = optimizer_lib.make_optimizer(config)
  update = jax.jit(optimizer.update)
  opt_state = optimizer.init(params)
  reference_params = initial = _flat_names(params)
  original_names = _original_names(params)
  assert original_names["bert/encoder/layers/attention_norm/scale"] == (
      "bert/layer_0/attention_LayerNorm/scale")
  reference = ReferenceAdamWeightDecay(reference_params, 0.01, 0.9, 0.999, 1e-6, original_names)
  # LayerNorm scales/shifts and every bias are excluded from decay, matrices are not.
  assert not _use_weight_decay("bert/embeddings/LayerNorm/scale")
  assert not _use_weight_decay("mlm/bias") and _use_weight_decay("mlm/transform/kernel")
  worst = 0.0
  for step in range(config.num_train_steps):
    grads = grad_fn(params)
    updates, opt_state = update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    # Both optimizers get the same raw gradients (the model's, at our params): taking each its
    # own would let float rounding in the forward pass grow chaotically over 100 steps (Adam
    # without bias correction turns near-zero gradients into +-1 steps).
    reference_grads = reference_clip_by_global_norm(_flat_names(grads), 1.0)
    reference_params = reference.apply_gradients(
        reference_grads, reference_params,
        reference_learning_rate(step, 1e-2, config.num_train_steps, config.warmup_steps))
    ours = _flat_names(params)
    worst = max(worst, max(float(np.max(np.abs(ours[k] - reference_params[k])))
                           for k in ours))
  assert worst <= 1e-6, worst
  moved = max(float(np.max(np.abs(reference_params[k] - v))) for k, v in initial.items())
  assert moved > 0.05  # The run is not trivially still.


def test_first_steps_larger_than_bias_corrected_adamw():
  """(1 - b1^t) / sqrt(1 - b2^t): ~3.16x at step 1 for a parameter without decay."""
  params = {"bias": jnp.zeros((3,), jnp.float32)}
  grads = {"bias": jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}
  first_updates = []
  for name in ("bert_adamw", "adamw"):
    optimizer = optimizer_lib.make_optimizer(_train_config(
        optimizer=name, warmup_steps=0, max_grad_norm=0.0))
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    first_updates.append(np.asarray(updates["bias"]))
  np.testing.assert_allclose(first_updates[0] / first_updates[1], 0.1 / np.sqrt(0.001), rtol=1e-4)


def test_unknown_optimizer_is_a_clear_error():
  with pytest.raises(ValueError, match="config.train.optimizer='sgd'.*bert_adamw"):
    optimizer_lib.make_optimizer(_train_config(optimizer="sgd"))


def test_lamb_trust_ratio_is_per_layer_of_the_stacked_encoder():
  """The encoder's layers are one stacked [S, ...] tensor per parameter: LAMB must still scale
  each layer by its own trust ratio, as optax.lamb does over one tensor per layer."""
  config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=8)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                        BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids,
                                                        ids[:, :2])["params"],
                        is_leaf=lambda x: hasattr(x, "unbox"))
  rng = np.random.default_rng(0)
  # Layers of very different scales: a shared (whole-tensor) ratio would differ per layer.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * (np.arange(1, 4, dtype=np.float32) ** 2).reshape(3, *[1] * (x.ndim - 1))
      if optimizer_lib.is_stacked(path) else x, params)
  config_train = _train_config(optimizer="lamb", max_grad_norm=0.0, warmup_steps=0)
  ours, reference = optimizer_lib.make_optimizer(config_train), optax.lamb(
      optimizer_lib.learning_rate_schedule(config_train), b1=0.9, b2=0.999, eps=1e-6,
      weight_decay=0.01, mask=optimizer_lib.decay_mask)
  ours_state, reference_state = ours.init(params), reference.init(layout.downgrade(params))
  ours_params, reference_params = params, layout.downgrade(params)
  step = jax.jit(lambda optimizer, grads, state, params: (
      lambda updates, state: (optax.apply_updates(params, updates), state))(
          *optimizer.update(grads, state, params)), static_argnums=0)
  for _ in range(3):
    grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    ours_params, ours_state = step(ours, grads, ours_state, ours_params)
    reference_params, reference_state = step(reference, layout.downgrade(grads), reference_state,
                                             reference_params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7),
               layout.downgrade(ours_params), reference_params)


# ------------------------------------------------------- schedule "wsd" (warmup-stable-decay)


def reference_wsd(step: int, peak: float, warmup: int, total: int, decay_steps: int,
                  shape: str) -> float:
  """The definition, in float64: linear warmup from 0 (overriding), the peak, then 1 - sqrt(u)
  or 1 - u with u going 0 -> 1 over the last `decay_steps` steps, 0 from `total` on."""
  if step < warmup:
    return peak * step / warmup
  start = total - decay_steps
  if decay_steps == 0 or step < start:
    return peak
  progress = min((step - start) / decay_steps, 1.0)
  return peak * (1.0 - (math.sqrt(progress) if shape == "1-sqrt" else progress))


def _wsd(total: int, warmup: int, fraction: float, shape: str = "1-sqrt", peak: float = 1e-3):
  config = _train_config(schedule="wsd", learning_rate=peak, num_train_steps=total,
                         warmup_steps=warmup, decay_fraction=fraction, decay_shape=shape)
  schedule = jax.jit(optimizer_lib.learning_rate_schedule(config))
  return lambda steps: np.asarray(schedule(jnp.asarray(steps, jnp.int32)))


@pytest.mark.parametrize("shape", optimizer_lib.DECAY_SHAPES)
@pytest.mark.parametrize("total,warmup,fraction,decay_steps", [
    (100, 10, 0.2, 20), (100, 0, 0.1, 10), (1000, 30, 0.1, 100), (7, 3, 1.0, 7),
    (100, 10, 0.0, 0), (101, 5, 0.33, 33)])
def test_wsd_schedule_matches_its_definition_every_step(shape, total, warmup, fraction,
                                                        decay_steps):
  schedule = _wsd(total, warmup, fraction, shape)
  steps = np.arange(total + 5)
  expected = [reference_wsd(s, 1e-3, warmup, total, decay_steps, shape) for s in steps]
  np.testing.assert_allclose(schedule(steps), expected, rtol=0, atol=1e-3 * 1e-6)
  start = total - decay_steps
  if warmup < start:  # The stable phase is exactly the peak: the decay starts at its step.
    assert (schedule(np.arange(warmup, start + 1)) == np.float32(1e-3)).all()
  assert schedule([total + 10])[0] == (np.float32(1e-3) if decay_steps == 0 else 0.0)
  if decay_steps >= 4 and shape == "1-sqrt" and start >= warmup:  # Half down at a quarter.
    np.testing.assert_allclose(schedule([start + decay_steps // 4]),
                               [1e-3 * (1 - math.sqrt((decay_steps // 4) / decay_steps))],
                               rtol=1e-6)


def test_wsd_decay_steps_round_half_up_and_give_back_d_of_d_over_total():
  # decay_fraction = d / (s + d): exactly d decay steps, over small and large runs; truncating
  # the product would lose a step on some of these (so they do exercise float error).
  pairs = [(s, d) for s in range(1, 400, 7) for d in range(1, 400, 3)]
  pairs += [(s, d) for s in (10**6 - 1, 3 * 10**7 + 17, 10**9) for d in (1, 999, 123_457)]
  assert all(optimizer_lib.wsd_decay_steps(d / (s + d), s + d) == d for s, d in pairs)
  assert any(int(d / (s + d) * (s + d)) != d for s, d in pairs)
  # Decimal fractions as a command line gives them; x.5 rounds up (Python's round: to even).
  assert optimizer_lib.wsd_decay_steps(0.1, 1000) == 100
  assert optimizer_lib.wsd_decay_steps(0.29, 100) == 29
  assert [optimizer_lib.wsd_decay_steps(f, t) for f, t in ((0.25, 10), (0.5, 5), (0.125, 4))] == [
      3, 3, 1]
  assert optimizer_lib.wsd_decay_steps(0.0, 100) == 0
  assert optimizer_lib.wsd_decay_steps(1.0, 100) == 100


@pytest.mark.parametrize("shape", optimizer_lib.DECAY_SHAPES)
def test_wsd_decay_from_a_stable_checkpoint_follows_the_long_run(shape):
  """A checkpoint at step s of the stable phase, resumed with num_train_steps = s + d and
  decay_fraction = d / (s + d): the long run's rates, bit for bit, up to s; then d decay steps."""
  long_total, warmup = 5000, 100
  long_run = _wsd(long_total, warmup, 0.2, shape)(np.arange(long_total))
  pairs = ((100, 1), (100, 57), (137, 29), (1000, 700), (2345, 321), (3999, 1001), (4000, 1000))
  assert any(int(d / (s + d) * (s + d)) != d for s, d in pairs)  # Float error in some of them.
  for s, d in pairs:
    short_run = _wsd(s + d, warmup, d / (s + d), shape)
    np.testing.assert_array_equal(short_run(np.arange(s)), long_run[:s])
    assert (short_run(np.arange(warmup, s + 1)) == np.float32(1e-3)).all()  # Decay from s on.
    expected = [reference_wsd(s + k, 1e-3, warmup, s + d, d, shape) for k in range(d + 1)]
    np.testing.assert_allclose(short_run(np.arange(s, s + d + 1)), expected, rtol=0,
                               atol=1e-3 * 1e-6)
    assert short_run([s + d])[0] == 0.0 and short_run([s + d - 1])[0] > 0.0
  # The long run itself decays over its last 20% (1000 steps from step 4000).
  np.testing.assert_array_equal(long_run[:4001][warmup:], np.float32(1e-3))
  assert long_run[4001] < np.float32(1e-3)


def test_wsd_warmup_edge_cases():
  # Warmup from 0, as the other schedules: step 0 updates nothing.
  assert _wsd(100, 10, 0.2)([0])[0] == 0.0
  np.testing.assert_allclose(_wsd(100, 10, 0.2)([1, 5, 9, 10]), [1e-4, 5e-4, 9e-4, 1e-3],
                             rtol=1e-6)
  # No warmup: the peak from step 0.
  assert _wsd(100, 0, 0.2)([0])[0] == np.float32(1e-3)
  # Warmup past the decay start (S = 80): warmup overrides, then the decay curve at W = 90.
  schedule = _wsd(100, 90, 0.2, "linear")
  np.testing.assert_allclose(schedule([80, 89, 90, 95]),
                             [1e-3 * 80 / 90, 1e-3 * 89 / 90, 1e-3 * 0.5, 1e-3 * 0.25], rtol=1e-6)
  # Warmup past the run (W > T): still rising at the last step, 0 once it ends (decay over).
  schedule = _wsd(20, 30, 0.5)
  np.testing.assert_allclose(schedule([0, 10, 19, 29]), [0.0, 1e-3 / 3, 1e-3 * 19 / 30,
                                                         1e-3 * 29 / 30], rtol=1e-6)
  assert schedule([30])[0] == 0.0
  # All steps decay (fraction 1): the decay starts at step 0, warmup overrides it.
  np.testing.assert_allclose(_wsd(10, 2, 1.0, "linear")([0, 1, 2, 5]),
                             [0.0, 5e-4, 1e-3 * 0.8, 1e-3 * 0.5], rtol=1e-6)
  with pytest.raises(ValueError, match="config.train.decay_shape='cosine'"):
    _wsd(10, 2, 0.5, "cosine")


# ------------------------------------------ numpy transcription of optimi's StableAdamW


def reference_debias_beta(beta: float, step: int) -> float:
  """optimi.utils.debias_beta."""
  return (beta**step - beta) / (beta**step - 1)


class ReferenceStableAdamW:
  """optimi.StableAdamW(params, lr, betas, weight_decay, eps, decouple_lr=True) as ModernBERT's
  "decoupled_stableadamw" builds it (max_lr None -> the lr it is built with), its for-loop path
  (`stableadamw` -> `_single_param_stableadamw`, float32 params, no Kahan summation), over a dict
  of named float32 numpy tensors, one per layer as in ModernBERT's torch model. Param groups as
  ModernBERT's `param_groups_weight_decay`: no decay where ndim <= 1 or the name ends in bias."""

  def __init__(self, params: dict[str, np.ndarray], lr: float, betas: tuple[float, float],
               weight_decay: float, eps: float):
    self.beta1, self.beta2, self.weight_decay, self.eps = *betas, weight_decay, eps
    self.max_lr = lr
    self.exp_avg = {k: np.zeros_like(v) for k, v in params.items()}
    self.exp_avg_sq = {k: np.zeros_like(v) for k, v in params.items()}
    self.eps_sq = {k: np.float32(eps**2) for k in params}  # torch.tensor(eps**2, param.dtype).
    self.step = 0
    self.rms = {}  # Each tensor's stabilisation term at the last step.

  def decays(self, name: str, param: np.ndarray) -> bool:
    return not (param.ndim <= 1 or name.endswith("bias"))

  def apply(self, grads: dict, params: dict, lr: float) -> dict:
    """One `optimizer.step()` with the group's lr set to `lr` by the scheduler."""
    self.step += 1
    beta1_comp = 1 - reference_debias_beta(self.beta1, self.step)
    beta2_hat = reference_debias_beta(self.beta2, self.step)
    beta2_comp = 1 - beta2_hat
    new_params = {}
    for name, param in params.items():
      grad, exp_avg, exp_avg_sq = grads[name], self.exp_avg[name], self.exp_avg_sq[name]
      weight_decay = self.weight_decay if self.decays(name, param) else 0.0
      exp_avg = exp_avg + beta1_comp * (grad - exp_avg)  # exp_avg.lerp_(grad, beta1_comp)
      exp_avg_sq = exp_avg_sq * beta2_hat + beta2_comp * grad * grad  # .mul_().addcmul_()
      rms = np.sqrt(np.mean(grad**2 / np.maximum(exp_avg_sq, self.eps_sq[name])))
      param_lr = lr / max(1, rms.item())
      if weight_decay != 0:  # decouple_lr=True.
        param = param * (1 - (param_lr / self.max_lr) * weight_decay)
      param = param - param_lr * (exp_avg / (np.sqrt(exp_avg_sq) + self.eps))  # addcdiv_.
      new_params[name], self.exp_avg[name], self.exp_avg_sq[name] = param, exp_avg, exp_avg_sq
      self.rms[name] = float(rms)
    return new_params


def _tiny_params(layers: int = 3):
  config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=layers,
                      num_attention_heads=2, intermediate_size=32, max_position_embeddings=8)
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                      BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids,
                                                      ids[:, :2])["params"],
                      is_leaf=lambda x: hasattr(x, "unbox"))


SPIKES = (8, 20, 33, 47)  # Steps whose gradients jump 10x on layer 1 and the MLM head.


def _gradients(params, step: int, rng):
  """Random gradients shrinking 3% a step (g^2 below v once v has a history: no clipping but
  from noise on small tensors), 10x spikes on layer 1 of the stacked params and on the MLM head
  at SPIKES (clipping there, per layer), and none on the NSP head for 5 steps (v = 0: the eps^2
  floor; then its first gradient is a spike), then ~1e-6 there (eps as large as sqrt(v))."""
  def grad(path, x):
    g = rng.normal(size=x.shape).astype(np.float32) * np.float32(0.97**step)
    names = [k.key for k in path]
    if step in SPIKES and optimizer_lib.is_stacked(path):
      g[1] *= 10.0
    elif step in SPIKES and names[0] == "mlm":
      g *= 10.0
    if names[0] == "nsp":  # Tiny: v near eps^2 and sqrt(v) near eps, where eps matters.
      g *= 0.0 if step < 5 else 1e-6
    return jnp.asarray(g)
  return jax.tree_util.tree_map_with_path(grad, params)


@pytest.mark.parametrize("lr,weight_decay", [(8e-4, 1e-5), (1e-2, 0.1)],
                         ids=["modernbert", "strong_decay"])
def test_stable_adamw_equals_optimi_over_60_steps(lr, weight_decay):
  """60 steps of ModernBERT's betas and eps under a "wsd" schedule, on stacked params (3 layers)
  vs the reference over one tensor per layer; update clipping triggers on some steps and some
  tensors only, and on layer 1 of a stacked parameter without its layers 0 and 2."""
  params = _tiny_params()
  config = _train_config(optimizer="stable_adamw", schedule="wsd", learning_rate=lr,
                         num_train_steps=60, warmup_steps=6, decay_fraction=0.3, b1=0.9,
                         b2=0.98, eps=1e-6, weight_decay=weight_decay, max_grad_norm=0.0)
  optimizer = optimizer_lib.make_optimizer(config)
  schedule = optimizer_lib.learning_rate_schedule(config)

  @jax.jit
  def step(grads, state, params):
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = optimizer.init(params)
  reference_params = initial = _flat_names(layout.downgrade(params))
  reference = ReferenceStableAdamW(reference_params, lr, (0.9, 0.98), weight_decay, 1e-6)
  decay_names = _flat_names(optimizer_lib.decay_mask(layout.downgrade(params)))
  assert {k: reference.decays(k, v) for k, v in initial.items()} == {
      k: bool(v) for k, v in decay_names.items()}  # ModernBERT's rule is our decay mask.
  rng, worst, clipped = np.random.default_rng(0), 0.0, []
  for t in range(config.num_train_steps):
    grads = _gradients(params, t, rng)
    params, state = step(grads, state, params)
    reference_params = reference.apply(_flat_names(layout.downgrade(grads)), reference_params,
                                       reference_wsd(t, lr, 6, 60, 18, "1-sqrt"))
    np.testing.assert_allclose(float(schedule(t)), reference_wsd(t, lr, 6, 60, 18, "1-sqrt"),
                               rtol=1e-6, atol=1e-12)
    clipped.append({k for k, rms in reference.rms.items() if rms > 1.0})
    ours = _flat_names(layout.downgrade(params))
    worst = max(worst, max(float(np.max(np.abs(ours[k] - reference_params[k]))) for k in ours))
  print(f"StableAdamW vs optimi, 60 steps: max abs diff {worst:.2e}")
  assert worst <= 1e-6, worst
  # Clipped on the spikes, per layer: layer 1 of a stacked kernel, neither layer 0 nor 2.
  kernel = "bert/layer_{}/intermediate/kernel"
  assert all(kernel.format(1) in clipped[s] and kernel.format(0) not in clipped[s]
             and kernel.format(2) not in clipped[s] and kernel.format(1) not in clipped[s - 1]
             for s in SPIKES)
  assert all("mlm/bias" in clipped[s] for s in SPIKES)
  # The NSP head's first gradient (step 5) is ~6x its v, but v < eps^2: the floor leaves it be.
  assert "nsp/kernel" not in clipped[5]
  print(f"steps with a clipped tensor: {[t for t, c in enumerate(clipped) if c]}")
  assert sum(not c for c in clipped) >= 30  # Most steps clip nothing.
  moved = max(float(np.max(np.abs(reference_params[k] - v))) for k, v in initial.items())
  assert moved > 10 * lr  # The run is not trivially still (lr x 45 in all).


# ------------------------------------------------- the modern encoder recipe, end to end

WSD_FIELDS = ("decay_fraction", "decay_shape")


def test_stable_adamw_with_wsd_pass_the_config_checks(monkeypatch):
  """From the command line; their training (and bit-identical resume) is in
  tests/test_modern_encoder.py."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config", flag_values=flag_values,
                                  lock_config=True)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  argv = ["train", f"--config={root}/configs/tiny.py", "--config.train.optimizer=stable_adamw",
          "--config.train.schedule=wsd"]
  monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv.
  flag_values(argv)
  assert (flag_values.config.train.optimizer, flag_values.config.train.schedule) == (
      "stable_adamw", "wsd")
  config_checks.check_pretraining(flag_values.config)


def test_compiled_step_fields_carry_the_wsd_fields():
  """The compiled step is built from the typed StepSettings only: the schedule's fields must be
  among them, and a change of one is another program (the settings are its cache key)."""
  config = base.get_config()
  step = StepSettings.from_config(config.train)
  assert set(WSD_FIELDS) <= {f.name for f in dataclasses.fields(StepSettings)}
  for name in WSD_FIELDS:
    changed = config.train.copy_and_resolve_references()
    changed[name] = changed[name] + 1 if not isinstance(changed[name], str) else "linear"
    assert StepSettings.from_config(changed) != step, name
