"""BERT's optimizers from optax: AdamW (or LAMB) with linear warmup then linear decay to 0,
global-norm clipping and weight decay on weight matrices only (not LayerNorm, not biases)."""

import jax
import optax


def learning_rate_schedule(train_config) -> optax.Schedule:
  """0 -> peak over warmup_steps, then linearly to 0 at num_train_steps."""
  peak, warmup = train_config.learning_rate, train_config.warmup_steps
  decay_steps = max(train_config.num_train_steps - warmup, 1)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(warmup, 1)),
       optax.linear_schedule(peak, 0.0, decay_steps)],
      boundaries=[warmup])


def decay_mask(params):
  """True for kernels and embedding tables; False for biases and LayerNorm scales/shifts, which
  google-research/bert excludes from weight decay."""
  def is_matrix(path, _):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]  # Skips box fields.
    return names[-1] in ("kernel", "embedding")
  return jax.tree_util.tree_map_with_path(is_matrix, params)


def make_optimizer(train_config) -> optax.GradientTransformation:
  schedule = learning_rate_schedule(train_config)
  kwargs = dict(learning_rate=schedule, b1=train_config.b1, b2=train_config.b2,
                eps=train_config.eps, weight_decay=train_config.weight_decay, mask=decay_mask)
  if train_config.optimizer == "adamw":
    optimizer = optax.adamw(**kwargs)
  elif train_config.optimizer == "lamb":
    optimizer = optax.lamb(**kwargs)
  else:
    raise ValueError(f"config.train.optimizer={train_config.optimizer!r}: use 'adamw' or 'lamb'")
  if train_config.max_grad_norm > 0:
    optimizer = optax.chain(optax.clip_by_global_norm(train_config.max_grad_norm), optimizer)
  return optimizer
