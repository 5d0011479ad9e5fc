"""Masked diffusion (absorbing state, continuous time): MDLM (Sahoo et al. 2024) and LLaDA (Nie et
al. 2025) as an objective of the encoder, and its likelihood bound.

Forward process: at time t in [0, 1] each real token is [MASK] with probability 1 - alpha_t,
independently (`masking.mask_tokens` with count_rule "bernoulli": the one masking-rate path of
BERT's fixed rate and mmBERT's schedule). Schedules (`SCHEDULES`):
- "linear": alpha_t = 1 - t, so a token is masked with probability t and the ELBO weight
  -alpha'_t / (1 - alpha_t) is 1/t (LLaDA; MDLM's linear schedule);
- "loglinear": MDLM's `LogLinearNoise`, sigma(t) = -log(1 - (1 - eps) t), alpha_t = exp(-sigma),
  so a token is masked with probability (1 - eps) t and the weight is sigma'(t) / expm1(sigma(t)).

Loss: the continuous-time negative ELBO of an example x of n text tokens,
  NELBO(x) = E_t [ w(t) sum over masked i of -log p(x_i | z_t) ],
estimated with one t per example drawn stratified over the global batch (MDLM's antithetic
sampling: example j of N takes u_j / N + j / N, then (1 - eps) t + eps), normalised per real
token as MDLM does (sum over the batch / its real tokens). The model is the encoder's MLM head
with the control tokens ([PAD], [CLS], [SEP], [MASK]: never a target) given no probability:
MDLM's SUBS parameterisation (zero probability of the mask) for every token that cannot occur.
Unmasked tokens are copied (they carry no loss).

Bound: `elbo_nats_per_token` is the NELBO per text token on held-out rows, the integral over t
taken by the midpoint rule on a fixed grid of `points` times in [eps, 1] with fixed keys, so two
runs (and any MLM-trained encoder: its MLM head is the same p) are compared on the same draws;
exp of it bounds the perplexity from above (up to the grid's quadrature error).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.objectives.masking import MaskingConfig, mask_tokens

SCHEDULES = ("linear", "loglinear")
EPS = 1e-3  # MDLM's sampling_eps (t >= EPS) and LogLinearNoise's eps.
NEG_INF = -1e9  # Logit of a token the model never proposes.
TIME_STREAM = 0x54494D45  # fold_in of the masking key: the examples' times ("TIME").


DEFAULT_EVAL_POINTS = 8  # config.diffusion.eval_points=-1 for objective diffusion.


def eval_points(configured: int, objective: str) -> int:
  """config.diffusion.eval_points as the run uses it: -1 is DEFAULT_EVAL_POINTS for objective
  "diffusion" and 0 (no held-out bound: one forward pass per evaluation batch) for the others."""
  if configured >= 0:
    return configured
  return DEFAULT_EVAL_POINTS if objective == "diffusion" else 0


@dataclasses.dataclass(frozen=True)
class DiffusionSettings:
  """config.diffusion, checked (`config_checks`); hashable (a static part of the step)."""
  schedule: str = "linear"  # One of SCHEDULES.
  eval_points: int = DEFAULT_EVAL_POINTS  # Grid of t for the held-out bound; 0: no bound.

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"config.diffusion.schedule={self.schedule!r}: use one of {SCHEDULES}")


def masked_fraction(t: jax.Array, schedule: str) -> jax.Array:
  """1 - alpha_t: the probability that a token is [MASK] at time t (same shape as t, f32)."""
  t = jnp.asarray(t, jnp.float32)
  if schedule == "linear":
    return t
  if schedule == "loglinear":
    return -jnp.expm1(-_loglinear_sigma(t))  # (1 - eps) t.
  raise ValueError(f"schedule={schedule!r}: use one of {SCHEDULES}")


def elbo_weight(t: jax.Array, schedule: str) -> jax.Array:
  """-alpha'_t / (1 - alpha_t), the continuous-time ELBO's weight of a masked token's NLL."""
  t = jnp.asarray(t, jnp.float32)
  if schedule == "linear":
    return 1.0 / t
  if schedule == "loglinear":
    sigma = _loglinear_sigma(t)
    dsigma = (1.0 - EPS) / (1.0 - (1.0 - EPS) * t)
    return dsigma / jnp.expm1(sigma)
  raise ValueError(f"schedule={schedule!r}: use one of {SCHEDULES}")


def _loglinear_sigma(t: jax.Array) -> jax.Array:
  return -jnp.log1p(-(1.0 - EPS) * t)


def stratified_times(key: jax.Array, n: int) -> jax.Array:
  """[n] f32: one t per stratum [j/n, (j+1)/n) of [0, 1), mapped to [EPS, 1] (MDLM's
  antithetic `_sample_t`): the batch's times cover [EPS, 1] evenly."""
  u = jax.random.uniform(key, (n,), jnp.float32)
  t = (u / n + jnp.arange(n, dtype=jnp.float32) / n) % 1.0
  return (1.0 - EPS) * t + EPS


def example_times(key: jax.Array, segment_ids: jax.Array, slots: int) -> jax.Array:
  """[B, L] f32: each position gets its example's t. Example k (from 1, by `segment_ids`) of row
  b takes stratum b x slots + k - 1 of B x slots, so the rows' first examples spread over
  [EPS, 1] (K = 1: exactly one per stratum of 1/B); padding takes its row's last slot (it is
  never masked)."""
  batch = segment_ids.shape[0]
  times = stratified_times(key, batch * slots).reshape(batch, slots)  # [B, K]
  slot = jnp.clip(segment_ids.astype(jnp.int32) - 1, 0, slots - 1)  # [B, L]
  slot = jnp.where(segment_ids > 0, slot, slots - 1)
  return jnp.take_along_axis(times, slot, axis=1)  # [B, L]


def corruption(masking: MaskingConfig, seq_len: int) -> MaskingConfig:
  """The masking policy of the forward process: each eligible token on its own ("bernoulli"),
  every one of them [MASK] (no 80/10/10), up to every position of a row (P = L)."""
  return dataclasses.replace(masking, count_rule="bernoulli", mask_token_prob=1.0,
                             random_token_prob=0.0, max_predictions_per_seq=seq_len,
                             whole_word_masking=False)


def corrupt(key: jax.Array, batch: dict, masking: MaskingConfig, times: jax.Array,
            schedule: str, maskable: jax.Array | None = None) -> dict:
  """Masks `batch` at each position's time ([B, L], or a scalar): adds the MLM fields (P = L
  slots) and `masked_lm_times` [B, P] f32 (each target's t; 1 in unused slots). `maskable`
  [B, L] (0/1): where masking may happen (a conditional row's response); None: every text
  token."""
  rate = masked_fraction(times, schedule)
  if maskable is not None:
    rate = rate * maskable.astype(jnp.float32)
  segment_ids = batch.get("segment_ids")
  masked = mask_tokens(key, batch["input_ids"], masking, None, segment_ids,
                       jnp.broadcast_to(rate, batch["input_ids"].shape))
  slot_times = jnp.take_along_axis(jnp.broadcast_to(times, batch["input_ids"].shape),
                                   masked["masked_lm_positions"], axis=1)  # [B, P]
  slot_times = jnp.where(masked["masked_lm_weights"] > 0, slot_times, 1.0)
  return {**batch, **masked, "masked_lm_times": slot_times}


def restrict(logits: jax.Array, never: tuple[int, ...]) -> jax.Array:
  """[..., V] logits with the ids in `never` (control tokens) at NEG_INF: p is the model's
  distribution over the tokens a text can hold."""
  vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  banned = jnp.isin(vocab, jnp.asarray(never, jnp.int32))
  return jnp.where(banned, jnp.float32(NEG_INF), logits.astype(jnp.float32))


def nll(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """[..., V] logits (restricted), labels [...] -> -log p(label) [...] f32."""
  vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  label_logit = jnp.sum(jnp.where(vocab == labels[..., None], logits, 0.0), axis=-1)
  return jax.nn.logsumexp(logits, axis=-1) - label_logit


def text_tokens(input_ids: jax.Array, masking: MaskingConfig) -> jax.Array:
  """[B, L] f32: 1 on every token the forward process may mask (not a control token) of the
  uncorrupted ids: the NELBO's normaliser, per position."""
  special = jnp.asarray(masking.special_token_ids, jnp.int32)
  return (~jnp.isin(input_ids, special)).astype(jnp.float32)


def diffusion_sums(logits: jax.Array, batch: dict, schedule: str,
                   never: tuple[int, ...]) -> dict[str, jax.Array]:
  """MLM logits at the P = L slots [B, P, V] of a corrupted batch -> f32 sums:
  `diffusion_loss_sum` (sum over targets of w(t) x NLL: the NELBO's sum), `masked_nll_sum`
  (unweighted), `mlm_correct_sum` and `mlm_count` (the targets; eval padding rows weigh 0)."""
  weights = batch["masked_lm_weights"].astype(jnp.float32)  # [B, P]
  if "example_weight" in batch:
    weights = weights * batch["example_weight"][:, None]
  restricted = restrict(logits, never)  # [B, P, V]
  token_nll = nll(restricted, batch["masked_lm_ids"])  # [B, P]
  correct = (jnp.argmax(restricted, axis=-1) == batch["masked_lm_ids"]).astype(jnp.float32)
  weight_t = elbo_weight(batch["masked_lm_times"], schedule)  # [B, P]
  return {"diffusion_loss_sum": jnp.sum(token_nll * weight_t * weights),
          "masked_nll_sum": jnp.sum(token_nll * weights),
          "mlm_correct_sum": jnp.sum(correct * weights),
          "mlm_count": jnp.sum(weights)}


def grid_times(points: int) -> np.ndarray:
  """[points] f32: the midpoints of `points` equal cells of [EPS, 1]."""
  return (EPS + (1.0 - EPS) * (np.arange(points) + 0.5) / points).astype(np.float32)


def elbo_sums(forward, batch: dict, key: jax.Array, masking: MaskingConfig, schedule: str,
              points: int, maskable: jax.Array | None = None) -> dict[str, jax.Array]:
  """The held-out bound's sums: `elbo_nats_sum` (the midpoint-rule NELBO over `grid_times`,
  each point's masks from fold_in(key, j): the same for every model), `elbo_tokens` (the text
  tokens it covers: `maskable` ones, a conditional row's response, when given), and
  `elbo_correct_sum` / `elbo_targets` (argmax hits over the grid's masked tokens).
  `forward(corrupted batch) -> [B, L, V]` MLM logits at the P = L slots."""
  policy = corruption(masking, batch["input_ids"].shape[1])

  def point(totals, j):
    t = jnp.asarray(grid_times(points))[j]
    corrupted = corrupt(jax.random.fold_in(key, j), batch, policy, t, schedule, maskable)
    sums = diffusion_sums(forward(corrupted), corrupted, schedule, masking.special_token_ids)
    return (totals[0] + sums["diffusion_loss_sum"] / points,
            totals[1] + sums["mlm_correct_sum"], totals[2] + sums["mlm_count"]), None

  zero = jnp.float32(0.0)
  (total, correct, targets), _ = jax.lax.scan(point, (zero, zero, zero), jnp.arange(points))
  tokens = text_tokens(batch["input_ids"], masking)  # [B, L]
  if maskable is not None:
    tokens = tokens * maskable.astype(jnp.float32)
  if "example_weight" in batch:
    tokens = tokens * batch["example_weight"][:, None]
  return {"elbo_nats_sum": total, "elbo_tokens": jnp.sum(tokens), "elbo_correct_sum": correct,
          "elbo_targets": targets}


def means(sums: dict) -> dict[str, float]:
  """The bound from summed sums (absent sums: nothing)."""
  if "elbo_tokens" not in sums:
    return {}
  nats = float(sums["elbo_nats_sum"]) / max(float(sums["elbo_tokens"]), 1.0)
  return {"elbo_nats_per_token": nats, "elbo_perplexity_bound": float(np.exp(min(nats, 700.0)))}
