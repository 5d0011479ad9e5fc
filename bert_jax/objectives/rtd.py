"""Replaced-token detection (ELECTRA, Clark et al. 2020): what happens between the generator and
the discriminator, and the discriminator's loss, as pure functions of arrays.

- `sample_replacements`: one token per target slot, drawn from the generator's distribution by
  Gumbel-max (argmax of logits + Gumbel noise) with the noise of each row from its own key, so a
  row's draws do not depend on how the batch is split into microbatches or over devices. The
  sample carries no gradient (ELECTRA's generator learns from its MLM loss only).
- `corrupt`: the discriminator's input. Every selected position takes its sample, whatever the
  80/10/10 draw gave the generator's input ([MASK], a random token or the original), as ELECTRA
  does; the other positions keep the original token.
- `discriminator_sums`: a binary cross-entropy per real (non-padding) token, label `replaced =
  corrupted != original`: a sample that equals the original counts as original. Returned as sums
  and counts like every loss here, with the accuracy, the replaced fraction and the pairs of
  (replaced, original) tokens of the batch the discriminator ranks correctly (`disc_auc` =
  their share: the ROC AUC over the pairs within each batch, exact under summing).
"""

import jax
import jax.numpy as jnp


def sample_replacements(logits, row_seeds, temperature: float = 1.0):
  """logits [B, P, V] f32 (the generator's, at the target slots), row_seeds [B] uint32 ->
  sampled ids [B, P] int32 from softmax(logits / temperature): Gumbel-max with the noise of row
  b from fold_in(key(0), seed b)."""
  logits = jax.lax.stop_gradient(logits.astype(jnp.float32)) / temperature

  def row(seed, row_logits):  # [P, V] -> [P]
    key = jax.random.fold_in(jax.random.key(0), seed)
    noise = jax.random.gumbel(key, row_logits.shape, jnp.float32)
    return jnp.argmax(row_logits + noise, axis=-1).astype(jnp.int32)

  return jax.vmap(row)(row_seeds, logits)


def scatter_targets(input_ids, positions, values, weights):
  """input_ids [B, L] with values [B, P] written at positions [B, P] where weights [B, P] > 0
  (unused slots, weight 0, point anywhere and write nothing) -> [B, L]."""
  length = input_ids.shape[1]
  hit = (positions[..., None] == jnp.arange(length)) & (weights[..., None] > 0)  # [B, P, L]
  written = jnp.sum(jnp.where(hit, values[..., None], 0), axis=1)  # [B, L]
  return jnp.where(jnp.any(hit, axis=1), written, input_ids).astype(input_ids.dtype)


def corrupt(batch, sampled):
  """A masked batch (`masking.mask_tokens`' fields) and the samples [B, P] -> (original ids
  [B, L], the discriminator's input [B, L])."""
  positions, weights = batch["masked_lm_positions"], batch["masked_lm_weights"]
  original = scatter_targets(batch["input_ids"], positions, batch["masked_lm_ids"], weights)
  return original, scatter_targets(original, positions, sampled, weights)


def discriminator_sums(logits, original, corrupted, real) -> dict[str, jax.Array]:
  """logits [B, L] f32 (replaced vs original), original / corrupted ids [B, L], real [B, L]
  (1 on non-padding tokens; 0 rows of an eval batch's padding) -> f32 sums: `disc_loss_sum`
  (binary cross-entropy), `disc_correct_sum` (logit > 0 iff replaced), `disc_count` (real
  tokens), `replaced_sum` (label 1), `disc_pairs_sum` (replaced x original pairs of the batch)
  and `disc_ordered_sum` (those pairs whose replaced token scores higher; ties count 1/2)."""
  logits = logits.astype(jnp.float32)
  weight = real.astype(jnp.float32)
  labels = (corrupted != original).astype(jnp.float32) * weight  # [B, L]
  # log(1 + e^-x) for label 1, log(1 + e^x) for label 0.
  loss = jax.nn.softplus(jnp.where(labels > 0, -logits, logits))
  correct = ((logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)
  positives = jnp.sum(labels)
  negatives = jnp.sum(weight) - positives
  return {"disc_loss_sum": jnp.sum(loss * weight),
          "disc_correct_sum": jnp.sum(correct * weight),
          "disc_count": jnp.sum(weight),
          "replaced_sum": positives,
          "disc_pairs_sum": positives * negatives,
          "disc_ordered_sum": _ordered_pairs(logits, labels, weight)}


def _ordered_pairs(scores, labels, weight):
  """Mann-Whitney U: over the weighted tokens, the (label 1, label 0) pairs whose label-1
  score is higher, ties counting 1/2 (flattened over the batch; f32 scalar)."""
  scores, labels, weight = scores.reshape(-1), labels.reshape(-1), weight.reshape(-1)
  order = jnp.argsort(scores)
  scores, labels, weight = scores[order], labels[order], weight[order]
  negative = weight * (1.0 - labels)
  total = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(negative)])  # Before i.
  start = jnp.searchsorted(scores, scores, side="left")  # Each score's run of equal scores.
  end = jnp.searchsorted(scores, scores, side="right")
  below, tied = total[start], total[end] - total[start]
  return jnp.sum(labels * weight * (below + 0.5 * tied))


def means(sums) -> dict[str, float]:
  """Summed discriminator sums -> `disc_loss`, `disc_accuracy`, `replaced_fraction`,
  `disc_auc` (0.5 when a batch held one class only)."""
  count = max(float(sums["disc_count"]), 1.0)
  pairs = float(sums["disc_pairs_sum"])
  return {"disc_loss": float(sums["disc_loss_sum"]) / count,
          "disc_accuracy": float(sums["disc_correct_sum"]) / count,
          "replaced_fraction": float(sums["replaced_sum"]) / count,
          "disc_auc": float(sums["disc_ordered_sum"]) / pairs if pairs > 0 else 0.5}
