"""BERT's pretraining losses, returned as sums and counts so means over batches and hosts are exact.

MLM is normalised by the number of real targets, NSP by the number of real examples (a packed
row holds up to K; empty slots weigh 0). The MLM loss covers exactly the selected targets
(`masked_lm_weights` = 1), whether their input token was replaced by [MASK], by a random token,
or left unchanged; unused slots weigh 0.
"""

import jax
import jax.numpy as jnp


def _cross_entropy(logits, labels):
  """logits [..., C] f32, labels [...] int -> per-item negative log-likelihood [...] f32."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def mlm_sums(mlm_logits, masked_lm_ids, masked_lm_weights) -> dict[str, jax.Array]:
  """mlm_logits [B, P, V], masked_lm_ids [B, P], masked_lm_weights [B, P] -> f32 sums:
  `mlm_loss_sum` (weighted NLL), `mlm_correct_sum` (weighted argmax hits), `mlm_count` (weights).

  Written in a form XLA:CPU runs fast on [B, P, V] logits: the target logit by a one-hot select,
  whose gradient fuses into the softmax gradient (a
  `take_along_axis` transposes to a scatter into a [B, P, V] zeros buffer), and the argmax as the
  first index reaching the row max (two vectorised reductions instead of a (value, index) one)."""
  logits = mlm_logits.astype(jnp.float32)  # [B, P, V]
  labels = masked_lm_ids.astype(jnp.int32)  # [B, P]
  vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)  # [B, P, V]
  label_logit = jnp.sum(jnp.where(vocab == labels[..., None], logits, 0.0), axis=-1)  # [B, P]
  nll = jax.nn.logsumexp(logits, axis=-1) - label_logit  # [B, P]
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))  # [B, P, 1]
  argmax = jnp.min(jnp.where(logits == row_max, vocab, logits.shape[-1]), axis=-1)  # [B, P]
  weights = masked_lm_weights.astype(jnp.float32)
  return {
      "mlm_loss_sum": jnp.sum(nll * weights),
      "mlm_correct_sum": jnp.sum((argmax == labels).astype(jnp.float32) * weights),
      "mlm_count": jnp.sum(weights),
  }


def nsp_sums(nsp_logits, next_sentence_label, nsp_weights) -> dict[str, jax.Array]:
  """nsp_logits [..., 2], next_sentence_label [...] (0 = real continuation, 1 = random),
  nsp_weights [...] (1 for a real example, 0 for an empty slot of a packed row) ->
  `nsp_loss_sum`, `nsp_correct_sum`, `nsp_count`."""
  weights = nsp_weights.astype(jnp.float32)
  nll = _cross_entropy(nsp_logits, next_sentence_label)  # [...]
  correct = (jnp.argmax(nsp_logits, axis=-1) == next_sentence_label).astype(jnp.float32)
  return {
      "nsp_loss_sum": jnp.sum(nll * weights),
      "nsp_correct_sum": jnp.sum(correct * weights),
      "nsp_count": jnp.sum(weights),
  }


def pretraining_sums(outputs, batch) -> dict[str, jax.Array]:
  """Outputs of BertForPreTraining (with cls_positions: nsp_logits [B, K, 2]) and a masked batch
  -> the MLM and NSP sums. `batch["example_weight"]` [B] (eval padding rows) zeroes whole rows."""
  mlm_weights, nsp_weights = batch["masked_lm_weights"], batch["nsp_weights"]  # [B, P], [B, K]
  if "example_weight" in batch:  # Present only in eval batches.
    mlm_weights = mlm_weights * batch["example_weight"][:, None]
    nsp_weights = nsp_weights * batch["example_weight"][:, None]
  return {**mlm_sums(outputs["mlm_logits"], batch["masked_lm_ids"], mlm_weights),
          **nsp_sums(outputs["nsp_logits"], batch["next_sentence_label"], nsp_weights)}


def means(sums: dict) -> dict[str, float]:
  """Sums (already added over batches / hosts) -> the mean metrics reported to users."""
  mlm_count = max(float(sums["mlm_count"]), 1.0)
  nsp_count = max(float(sums["nsp_count"]), 1.0)
  return {
      "mlm_loss": float(sums["mlm_loss_sum"]) / mlm_count,
      "mlm_accuracy": float(sums["mlm_correct_sum"]) / mlm_count,
      "nsp_loss": float(sums["nsp_loss_sum"]) / nsp_count,
      "nsp_accuracy": float(sums["nsp_correct_sum"]) / nsp_count,
  }
