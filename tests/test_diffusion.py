"""Masked diffusion (#41): the forward process and its ELBO weight against MDLM's code, the
stratified times, packed examples, the one masking-rate path (BERT's fixed rate, mmBERT's stages,
diffusion's t), and the held-out bound."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.model import BertConfig, BertForPreTraining
from bert_jax.objectives import diffusion
from bert_jax.objectives import masking as masking_lib
from bert_jax.objectives.masking import MaskingConfig, mask_tokens
from bert_jax.tasks.diffusion import DiffusionTask

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 40
POLICY = MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=(PAD, CLS, SEP, MASK),
                       max_predictions_per_seq=20)


def _rows(batch: int, length: int, seed: int = 0, real: int | None = None) -> np.ndarray:
  """[B, L] rows [CLS] text [SEP] padding, text ids in [5, VOCAB)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (batch, length)).astype(np.int32)
  ids[:, 0] = CLS
  real = length if real is None else real
  ids[:, real - 1] = SEP
  ids[:, real:] = PAD
  return ids


# ----------------------------------------------------------------------------- MDLM's loss


def _mdlm_loss(log_p_x0: np.ndarray, t: np.ndarray, eps: float) -> np.ndarray:
  """A numpy transcription of MDLM's `_forward_pass_diffusion` (parameterization "subs") with
  `LogLinearNoise(eps)`: sigma = -log1p(-(1 - eps) t), dsigma = (1 - eps) / (1 - (1 - eps) t),
  loss = -log p(x0) x dsigma / expm1(sigma), per token (log p = 0 where the token is unmasked:
  SUBS copies it). log_p_x0 [B, L] (0 where unmasked), t [B]."""
  sigma = -np.log1p(-(1 - eps) * t)
  dsigma = (1 - eps) / (1 - (1 - eps) * t)
  return -log_p_x0 * (dsigma / np.expm1(sigma))[:, None]


@pytest.mark.parametrize("schedule, eps", [("loglinear", diffusion.EPS), ("linear", 0.0)])
def test_weighting_equals_mdlm_loss(schedule, eps):
  """"linear" (alpha_t = 1 - t) is MDLM's log-linear noise with eps = 0; "loglinear" is its
  default eps = 1e-3. Same masks, same logits: the same per-token loss, and the masked
  fraction 1 - exp(-sigma) of MDLM's `move_chance`."""
  batch, length = 6, 24
  t = np.asarray([0.001, 0.05, 0.3, 0.5, 0.8, 0.99], np.float32)
  sigma = -np.log1p(-(1 - eps) * t.astype(np.float64))
  np.testing.assert_allclose(diffusion.masked_fraction(t, schedule), 1 - np.exp(-sigma),
                             rtol=1e-5)
  ids = _rows(batch, length)
  key = jax.random.key(3)
  corrupted = diffusion.corrupt(key, {"input_ids": jnp.asarray(ids)},
                                diffusion.corruption(POLICY, length),
                                jnp.asarray(t)[:, None] * jnp.ones((1, length)), schedule)
  logits = jax.random.normal(jax.random.key(4), (batch, length, VOCAB)) * 2.0  # [B, L, V]
  at_slots = jnp.take_along_axis(logits, corrupted["masked_lm_positions"][..., None], 1)
  sums = diffusion.diffusion_sums(at_slots, corrupted, schedule, POLICY.special_token_ids)

  restricted = np.asarray(diffusion.restrict(logits, POLICY.special_token_ids), np.float64)
  log_p = restricted - np.log(np.exp(restricted).sum(-1, keepdims=True))
  masked = np.asarray(corrupted["input_ids"]) == MASK  # [B, L]
  log_p_x0 = np.where(masked, np.take_along_axis(log_p, ids[..., None], -1)[..., 0], 0.0)
  expected = _mdlm_loss(log_p_x0, t.astype(np.float64), eps).sum()
  np.testing.assert_allclose(float(sums["diffusion_loss_sum"]), expected, rtol=2e-5)
  assert float(sums["mlm_count"]) == masked.sum() > 0


def test_uniform_model_loss_has_its_closed_form():
  """A model with equal logits puts 1 / V' on each of the V' non-control tokens: every masked
  token costs log V', so the NELBO sum is log V' x sum over examples of masked_e / t_e (linear),
  and its expectation per text token is log V' (the weight 1/t undoes the rate t)."""
  batch, length = 2048, 32
  ids = _rows(batch, length, seed=1)
  task_times = diffusion.example_times(jax.random.key(0), jnp.ones((batch, length), jnp.int32), 1)
  corrupted = diffusion.corrupt(jax.random.key(1), {"input_ids": jnp.asarray(ids)},
                                diffusion.corruption(POLICY, length), task_times, "linear")
  sums = diffusion.diffusion_sums(jnp.zeros((batch, length, VOCAB)), corrupted, "linear",
                                  POLICY.special_token_ids)
  allowed = VOCAB - len(POLICY.special_token_ids)
  masked = (np.asarray(corrupted["input_ids"]) == MASK).sum(1)
  t = np.asarray(task_times)[:, 0]
  np.testing.assert_allclose(float(sums["diffusion_loss_sum"]),
                             np.log(allowed) * np.sum(masked / t), rtol=1e-5)
  text = (length - 2) * batch
  # The estimate's expectation is log V' per token; its sd over 2,048 stratified rows of 30
  # tokens is about 1%.
  assert abs(float(sums["diffusion_loss_sum"]) / text / np.log(allowed) - 1) < 0.05


# ----------------------------------------------------------------------------- forward process


def test_stratified_times_cover_every_stratum():
  n = 64
  for seed in range(5):
    t = np.asarray(diffusion.stratified_times(jax.random.key(seed), n))
    u = (t - diffusion.EPS) / (1 - diffusion.EPS)
    np.testing.assert_array_equal(np.floor(u * n), np.arange(n))  # One per [j/n, (j+1)/n).
    assert t.min() >= diffusion.EPS and t.max() <= 1.0
  # Packed rows: the rows' first examples spread over [EPS, 1] too (stratum b x K).
  segments = jnp.asarray(np.repeat([[1, 1, 2, 2, 3, 0]], 16, 0))
  times = np.asarray(diffusion.example_times(jax.random.key(0), segments, 3))
  first = (times[:, 0] - diffusion.EPS) / (1 - diffusion.EPS)
  np.testing.assert_array_equal(np.floor(first * 16), np.arange(16))
  assert np.all(times[:, 0] == times[:, 1]) and np.all(times[:, 2] == times[:, 3])
  assert np.all(times[:, 0] != times[:, 2])


@pytest.mark.parametrize("schedule", diffusion.SCHEDULES)
def test_masked_fraction_per_example_averages_its_rate(schedule):
  """Every text token is masked with probability 1 - alpha_t, on its own: over many draws the
  fraction of each example's text that is [MASK] averages it, at every t; never a control
  token; every masked token is [MASK] (no 80/10/10)."""
  batch, length, draws = 8, 64, 200
  t = jnp.asarray(np.linspace(0.05, 1.0, batch), jnp.float32)[:, None]
  ids = jnp.asarray(_rows(batch, length, seed=2))
  policy = diffusion.corruption(POLICY, length)

  def fraction(key):
    out = diffusion.corrupt(key, {"input_ids": ids}, policy, t * jnp.ones((1, length)), schedule)
    masked = out["input_ids"] == MASK
    assert_ids = jnp.where(masked, ids, out["input_ids"])
    return jnp.mean(masked[:, 1:-1], axis=1), jnp.all(assert_ids == ids), masked[:, [0, -1]].any()

  fractions, unchanged, specials = jax.vmap(fraction)(jax.random.split(jax.random.key(5), draws))
  expected = np.asarray(diffusion.masked_fraction(t[:, 0], schedule))
  sd = np.sqrt(expected * (1 - expected) / (length - 2) / draws)
  assert np.all(np.abs(np.asarray(fractions).mean(0) - expected) <= 4 * sd + 1e-6)
  assert bool(jnp.all(unchanged)) and not bool(jnp.any(specials))


def test_one_rate_path_for_fixed_scheduled_and_per_example_rates():
  """BERT's fixed rate through a traced rate gives the table's counts (the same targets); a
  rate per example gives each its own count; mmBERT's stages pick the rate by step."""
  batch, length = 16, 48
  ids = jnp.asarray(_rows(batch, length, seed=4, real=40))
  key = jax.random.key(7)
  table = mask_tokens(key, ids, POLICY)
  traced = jax.jit(lambda r: mask_tokens(key, ids, POLICY, rate=r))(jnp.float32(0.15))
  for name in table:
    np.testing.assert_array_equal(table[name], traced[name])
  rates = jnp.asarray(np.linspace(0.1, 0.4, batch), jnp.float32)[:, None]
  per_example = mask_tokens(key, ids, POLICY, rate=rates * jnp.ones((1, length)))
  counts = np.asarray(per_example["masked_lm_weights"]).sum(1)
  np.testing.assert_array_equal(counts, np.maximum(1, np.round(38 * np.asarray(rates[:, 0]))))
  starts, stage = (0, 700, 900), (0.3, 0.15, 0.05)
  got = [float(masking_lib.stage_rate(jnp.int32(s), starts, stage)) for s in (0, 699, 700, 950)]
  assert got == pytest.approx([0.3, 0.3, 0.15, 0.05])


# ----------------------------------------------------------------------------- the task


TINY = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, max_position_embeddings=64, vocab_pad_multiple=8)


def _task(length: int, examples_per_row: int = 1) -> DiffusionTask:
  return DiffusionTask(TINY, POLICY, length, examples_per_row)


def test_packed_examples_score_as_alone():
  """Two examples packed in a row (own segment, positions from 0): each one's loss term equals
  the term of the same example alone in its row, at the same t and masks."""
  task = _task(32, 2)
  params = task.model.init(jax.random.key(0), *task.example_inputs(), deterministic=True)["params"]
  a, b = _rows(1, 12, seed=8)[0], _rows(1, 20, seed=9)[0]
  packed = {"input_ids": np.concatenate([a, b])[None],
            "segment_ids": np.asarray([[1] * 12 + [2] * 20]),
            "position_ids": np.asarray([list(range(12)) + list(range(20))]),
            "token_type_ids": np.zeros((1, 32), np.int32),
            "cls_positions": np.asarray([[0, 12]]), "nsp_weights": np.zeros((1, 2), np.float32),
            "next_sentence_label": np.zeros((1, 2), np.int32)}
  t = np.where(packed["segment_ids"] == 1, 0.4, 0.7).astype(np.float32)
  policy = task.corruption
  corrupted = diffusion.corrupt(jax.random.key(2), packed, policy, jnp.asarray(t), "linear")
  corrupted["text_tokens"] = jnp.asarray([28.0])

  def term(batch):
    return float(task.loss_sums(params, batch, None)["diffusion_loss_sum"])

  alone = []
  for start, size, rate in ((0, 12, 0.4), (12, 20, 0.7)):
    keep = slice(start, start + size)
    row = {k: np.zeros_like(v) for k, v in packed.items()}
    for name in ("input_ids", "segment_ids", "position_ids"):
      row[name][0, :size] = packed[name][0, keep]
    row["segment_ids"][0, :size] = 1
    row["input_ids"][0, :size] = np.asarray(corrupted["input_ids"])[0, keep]
    masked = np.flatnonzero(row["input_ids"][0] == MASK)
    slots = np.zeros((1, 32), np.int32)
    slots[0, :len(masked)] = masked
    alone.append(term({**row, "masked_lm_positions": slots,
                       "masked_lm_ids": np.where(np.arange(32) < len(masked),
                                                 packed["input_ids"][0, start + slots[0]], 0)[None],
                       "masked_lm_weights": (np.arange(32) < len(masked))[None].astype(np.float32),
                       "masked_lm_times": np.full((1, 32), rate, np.float32),
                       "text_tokens": np.asarray([size - 2.0])}))
  assert term(corrupted) == pytest.approx(sum(alone), rel=1e-5)
  assert min(alone) > 0


def test_elbo_grid_is_fixed_and_bounds_a_uniform_model():
  """The held-out bound: the same key gives the same number twice; a model with zero weights
  (equal logits) scores log V' nats per token up to the grid's quadrature of E[masked / t]."""
  task = _task(32)
  params = task.model.init(jax.random.key(0), *task.example_inputs(), deterministic=True)["params"]
  zero = jax.tree.map(jnp.zeros_like, params)
  rows = _rows(64, 32, seed=11)
  batch = {"input_ids": rows, "segment_ids": (rows != PAD).astype(np.int32),
           "position_ids": np.tile(np.arange(32), (64, 1)),
           "token_type_ids": np.zeros_like(rows), "cls_positions": np.zeros((64, 1), np.int32),
           "next_sentence_label": np.zeros((64, 1), np.int32),
           "nsp_weights": np.zeros((64, 1), np.float32),
           "example_weight": np.ones(64, np.float32)}
  key = jax.random.key(1)
  one = task.elbo(zero, batch, key)
  two = task.elbo(zero, batch, key)
  assert float(one["elbo_nats_sum"]) == float(two["elbo_nats_sum"])
  nats = diffusion.means(jax.device_get(one))["elbo_nats_per_token"]
  assert nats == pytest.approx(np.log(VOCAB - 4), rel=0.05)
  trained_like = task.elbo(params, batch, key)
  assert float(trained_like["elbo_tokens"]) == 64 * 30


def test_settings_refuse_unknown_schedule():
  with pytest.raises(ValueError, match="config.diffusion.schedule='cosine': use one of"):
    diffusion.DiffusionSettings("cosine")
  with pytest.raises(ValueError, match="count_rule='binomial'"):
    dataclasses.replace(POLICY, count_rule="binomial")
