"""BERT's optimizer and schedule against a numpy transcription of google-research/bert's
optimization.py (`create_optimizer`: polynomial_decay + warmup, clip_by_global_norm,
`AdamWeightDecayOptimizer`)."""

import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax import losses, optimizer as optimizer_lib
from bert_jax.masking import MaskingConfig
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks import PretrainingTask
from bert_jax.weights import layout


def _train_config(**overrides) -> ml_collections.ConfigDict:
  values = dict(optimizer="bert_adamw", schedule="bert", learning_rate=1e-2, warmup_steps=10,
                num_train_steps=100, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                max_grad_norm=1.0)
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
