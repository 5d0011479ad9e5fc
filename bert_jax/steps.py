"""The pure train and eval steps. Both mask inside jit, so masking is dynamic (a new draw for
every step, from `fold_in(rng, step)`) and costs no host time."""

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax import losses
from bert_jax.masking import MaskingConfig, mask_tokens


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer steps taken.
  params: Any
  opt_state: Any


def init_state(rng, *, model: nn.Module, optimizer: optax.GradientTransformation,
               seq_len: int, num_predictions: int) -> TrainState:
  """Random init. Params and optimizer state keep their logical-axis boxes, so
  `nn.get_partition_spec(jax.eval_shape(init_state, ...))` gives the state's shardings; unbox
  (`nn.meta.unbox`) before training."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  positions = jnp.zeros((1, num_predictions), jnp.int32)
  params = model.init(rng, ids, ids, ids, positions, deterministic=True)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def _mask_batch(rng, batch: dict, masking_config: MaskingConfig) -> dict:
  word_starts = batch["word_starts"] if masking_config.whole_word_masking else None
  return {**batch, **mask_tokens(rng, batch["input_ids"], masking_config, word_starts)}


def _forward(model, params, batch, deterministic, dropout_rng=None):
  rngs = None if deterministic else {"dropout": dropout_rng}
  return model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                     batch["attention_mask"], batch["masked_lm_positions"],
                     deterministic=deterministic, rngs=rngs)


def _microbatches(batch: dict, num: int) -> dict:
  """[B, ...] -> [num, B/num, ...]; microbatch j takes rows j, j+num, ... so every microbatch
  stays spread over all data-parallel devices."""
  def split(x):
    x = x.reshape(x.shape[0] // num, num, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: dict, rng, *, model: nn.Module,
               optimizer: optax.GradientTransformation, masking_config: MaskingConfig,
               schedule: optax.Schedule, grad_accum_steps: int = 1) -> tuple[TrainState, dict]:
  """One optimizer step on a global batch [B, L]: mask, forward, backward, clip, update.

  The loss is normalised by the counts of the whole batch, so accumulating microbatch gradients
  gives exactly the full-batch gradient. Returns metrics as sums and counts plus grad_norm and
  the learning rate used.
  """
  rng = jax.random.fold_in(rng, state.step)
  mask_rng, dropout_rng = jax.random.split(rng)
  batch = _mask_batch(mask_rng, batch, masking_config)
  mlm_total = jnp.maximum(jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)), 1.0)
  nsp_total = jnp.float32(batch["input_ids"].shape[0])

  def loss_fn(params, micro, micro_rng):
    outputs = _forward(model, params, micro, deterministic=False, dropout_rng=micro_rng)
    sums = {**losses.mlm_sums(outputs["mlm_logits"], micro["masked_lm_ids"],
                              micro["masked_lm_weights"]),
            **losses.nsp_sums(outputs["nsp_logits"], micro["next_sentence_label"])}
    return sums["mlm_loss_sum"] / mlm_total + sums["nsp_loss_sum"] / nsp_total, sums

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    (loss, sums), grads = grad_fn(state.params, batch, dropout_rng)
  else:
    def accumulate(carry, xs):
      index, micro = xs
      (loss, sums), grads = grad_fn(state.params, micro, jax.random.fold_in(dropout_rng, index))
      return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, (jnp.float32(0), _zero_sums(), state.params))
    (loss, sums, grads), _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(grad_accum_steps), _microbatches(batch, grad_accum_steps)))

  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {**sums, "loss": loss, "grad_norm": optax.tree.norm(grads),
             "learning_rate": schedule(state.step)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _zero_sums() -> dict:
  names = ("mlm_loss_sum", "mlm_correct_sum", "mlm_count",
           "nsp_loss_sum", "nsp_correct_sum", "nsp_count")
  return {name: jnp.float32(0) for name in names}


def eval_step(params, batch: dict, rng, *, model: nn.Module,
              masking_config: MaskingConfig) -> dict:
  """Sums and counts on one eval batch (padding examples weigh 0 through example_weight)."""
  batch = _mask_batch(rng, batch, masking_config)
  outputs = _forward(model, params, batch, deterministic=True)
  _, sums = losses.pretraining_loss(outputs, batch)
  return sums
