"""Masked diffusion (#41): the forward process and its ELBO weight against MDLM's code, the
stratified times, packed examples, the one masking-rate path (BERT's fixed rate, mmBERT's stages,
diffusion's t), and the held-out bound."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.generation import diffusion as sampler
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


def test_the_bound_is_on_for_diffusion_and_asked_for_by_mlm():
  """config.diffusion.eval_points=-1 (the default): the diffusion objective reports the bound on
  8 points; MLM evaluates with one forward pass per batch (the bound cost 40x on tiny.py) unless
  a number of points is given."""
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  from configs import tiny  # pylint: disable=import-outside-toplevel

  def task(objective: str, points: int | None = None):
    config = tiny.get_config()
    config.data.objective = objective
    if points is not None:
      config.diffusion.eval_points = points
    return train.pretraining_task(config, BertConfig.from_config(config.model), None)

  assert tiny.get_config().diffusion.eval_points == -1
  assert task("diffusion").diffusion.eval_points == diffusion.DEFAULT_EVAL_POINTS == 8
  assert task("diffusion", 0).diffusion.eval_points == 0
  assert task("mlm_nsp").diffusion.eval_points == task("mlm").diffusion.eval_points == 0
  assert task("mlm", 4).diffusion.eval_points == 4
  rows = _rows(2, 16)
  batch = {"input_ids": rows, "segment_ids": (rows != PAD).astype(np.int32),
           "position_ids": np.tile(np.arange(16), (2, 1)), "token_type_ids": np.zeros_like(rows),
           "cls_positions": np.zeros((2, 1), np.int32),
           "next_sentence_label": np.zeros((2, 1), np.int32),
           "nsp_weights": np.zeros((2, 1), np.float32), "example_weight": np.ones(2, np.float32)}
  plain = task("mlm").prepare_eval(batch, jax.random.key(0))
  assert "clean_input_ids" not in plain and "eval_key" not in plain
  assert "clean_input_ids" in task("mlm", 4).prepare_eval(batch, jax.random.key(0))


def test_settings_refuse_unknown_schedule():
  with pytest.raises(ValueError, match="config.diffusion.schedule='cosine': use one of"):
    diffusion.DiffusionSettings("cosine")
  with pytest.raises(ValueError, match="count_rule='binomial'"):
    dataclasses.replace(POLICY, count_rule="binomial")


# ----------------------------------------------------------------------------- the sampler


def _stub(probs: np.ndarray):
  """A model whose distribution at every position is `probs` over ids 5, 6, ... (the rest 0)."""
  logits = np.full(VOCAB, -1e4, np.float32)
  logits[5:5 + len(probs)] = np.log(probs)
  return lambda ids: jnp.broadcast_to(jnp.asarray(logits), (*ids.shape, VOCAB))


def _canvas(batch: int, prompt: list[int], length: int) -> jnp.ndarray:
  return jnp.asarray(np.tile([CLS, *prompt, *[MASK] * length, SEP], (batch, 1)), jnp.int32)


def test_ancestral_commits_follow_the_schedule():
  """Linear schedule, S steps: a token still masked at t is unmasked by s with chance
  (t - s) / t, so N (1 - k / S) stay masked after step k, in expectation over seeds, and the
  committed tokens follow the model's marginals."""
  steps, length, batch = 8, 16, 512
  probs = np.asarray([0.5, 0.3, 0.2])
  settings = sampler.SamplerSettings(steps=steps)
  ids = _canvas(batch, [7, 8], length)
  masked_left = []
  for stop in range(1, steps + 1):
    out = jax.jit(lambda i, k, stop=stop: sampler.sample(
        _stub(probs), i, 3, length, k, settings, MASK, (PAD, UNK, CLS, SEP, MASK), stop))(
            ids, jax.random.key(0))
    masked_left.append(float(jnp.mean(jnp.sum(out == MASK, axis=1))))
  expected = [length * (1 - k / steps) for k in range(1, steps + 1)]
  # sd of a mean over 512 rows of a Binomial(16, p): <= 0.09 tokens.
  np.testing.assert_allclose(masked_left, expected, atol=0.4)
  assert masked_left[-1] == 0
  filled = np.asarray(out[:, 3:3 + length]).ravel()
  np.testing.assert_allclose(np.bincount(filled - 5, minlength=3) / filled.size, probs,
                             atol=0.02)
  np.testing.assert_array_equal(out[:, :3], ids[:, :3])  # The prompt is never changed.
  np.testing.assert_array_equal(out[:, -1], SEP)


def test_confidence_rule_and_blocks_commit_as_planned():
  """LLaDA's rule keeps the planned number of tokens per step (the block's tokens spread over
  its steps); with blocks, a later block stays [MASK] until its turn."""
  length, steps = 10, 6
  settings = sampler.SamplerSettings(steps=steps, rule="confidence", block_size=4)
  plan = sampler.step_plan(length, settings)
  # Blocks of 4, 4, 2 with 2 steps each: 2 tokens a step, the last block 1.
  assert plan["commit"].tolist() == [2, 2, 2, 2, 1, 1]
  assert plan["start"].tolist() == [0, 0, 4, 4, 8, 8]
  model = lambda ids: jax.random.normal(jax.random.key(1), (*ids.shape, VOCAB))
  ids = _canvas(2, [], length)
  for stop in range(1, steps + 1):
    out = np.asarray(sampler.sample(model, ids, 1, length, jax.random.key(2), settings, MASK,
                                    (PAD, UNK, CLS, SEP, MASK), stop))
    masked = out[:, 1:1 + length] == MASK
    assert masked.sum(1).tolist() == [length - plan["commit"][:stop].sum()] * 2
    block_end = plan["end"][stop - 1]
    assert masked[:, block_end:].all()  # Later blocks untouched.
  with pytest.raises(ValueError, match="steps=2 is fewer than the 3 blocks"):
    sampler.step_plan(length, dataclasses.replace(settings, steps=2))
  for bad, message in ((dict(steps=0), "steps=0: it must be an integer >= 1"),
                       (dict(steps=4, rule="greedy"), "rule='greedy'"),
                       (dict(steps=4, top_p=0.0), "top_p=0.0")):
    with pytest.raises(ValueError, match=message):
      sampler.SamplerSettings(**bad)


def test_top_k_and_top_p_keep_the_likeliest():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
  kept = lambda **kw: np.asarray(sampler.filter_logits(
      logits, sampler.SamplerSettings(steps=1, **kw)) > sampler.NEG_INF / 2)[0].tolist()
  assert kept(top_k=2) == [True, True, False, False]
  assert kept(top_p=0.8) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8.
  assert kept(top_p=0.81) == [True, True, True, False]
  assert kept(top_p=0.4) == [True, False, False, False]


def test_any_temperature_keeps_the_never_drawn_tokens_out():
  """At d16959b --temperature=inf (or above ~1e8) divided the never-drawn tokens'
  NEG_INF to about 0, and [MASK] and the other special tokens were drawn. Now they stay out at
  any finite temperature (which draws uniformly over the rest), and inf, nan or a temperature
  too small to differ from argmax are refused in one line."""
  row = np.full(VOCAB, sampler.NEG_INF, np.float32)  # As `sample` removes the never-drawn.
  row[5:8] = np.log([0.6, 0.3, 0.1])
  logits = jnp.broadcast_to(jnp.asarray(row), (1, 4096, VOCAB))  # [1, T, V]
  for temperature in (1.0, 1e9, 1e30):
    settings = sampler.SamplerSettings(steps=1, temperature=temperature)
    tokens, _ = sampler._draw(jax.random.key(3), sampler.filter_logits(logits, settings),  # pylint: disable=protected-access
                              settings)
    drawn = np.bincount(np.asarray(tokens).ravel(), minlength=VOCAB)
    assert drawn.sum() == drawn[5:8].sum() == 4096, (temperature, np.nonzero(drawn))
    if temperature > 1e6:  # Uniform over the three tokens left.
      assert np.all(np.abs(drawn[5:8] / 4096 - 1 / 3) < 0.03), drawn[5:8]
  for bad in (math.inf, math.nan, -1.0, 1e-5):
    with pytest.raises(ValueError, match=r"^temperature=.*: it must be 0 \(argmax\) or a finite"):
      sampler.SamplerSettings(steps=1, temperature=bad)


def test_seeds_beyond_32_bits_are_refused_not_folded():
  """jax.random.key keeps 32 bits: at d16959b --seed=0 and --seed=4294967296 drew the same
  texts. Seeds are used whole, so one beyond 2**32 - 1 is refused before anything loads."""
  from bert_jax import predict  # pylint: disable=import-outside-toplevel
  settings = sampler.SamplerSettings(steps=1)
  for bad in (2**32, -1, 1.5, True):
    with pytest.raises(ValueError, match=r"^seed=.*: it must be an integer in \[0, 2\*\*32 - 1\]$"):
      predict.generate("/never/read", 4, settings, seed=bad)


def _train_on_repeated_sequences(sequences: np.ndarray, steps: int):
  """A tiny diffusion model trained on a few sequences, repeated (Adam, 2 layers, 32 rows a
  step)."""
  import optax  # pylint: disable=import-outside-toplevel
  length = sequences.shape[1]
  config = dataclasses.replace(TINY, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                               num_hidden_layers=2)
  task = DiffusionTask(config, POLICY, length, 1)
  params = task.model.init(jax.random.key(0), *task.example_inputs(), deterministic=True)["params"]
  batch_rows = np.tile(sequences, (32 // len(sequences), 1))
  batch = {"input_ids": batch_rows, "segment_ids": np.ones_like(batch_rows),
           "position_ids": np.tile(np.arange(length), (len(batch_rows), 1)),
           "token_type_ids": np.zeros_like(batch_rows),
           "cls_positions": np.zeros((len(batch_rows), 1), np.int32),
           "next_sentence_label": np.zeros((len(batch_rows), 1), np.int32),
           "nsp_weights": np.zeros((len(batch_rows), 1), np.float32)}
  optimizer = optax.adam(3e-3)

  @jax.jit
  def step(params, opt_state, key):
    prepared = task.prepare(batch, key, jnp.int32(0))
    counts = task.loss_counts(prepared)
    grads = jax.grad(lambda p: task.loss(task.loss_sums(p, prepared, None), counts))(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for i in range(steps):
    params, opt_state = step(params, opt_state, jax.random.key(i))
  return config, params


@pytest.fixture(scope="module")
def memorised():
  rng = np.random.default_rng(0)
  sequences = np.concatenate([np.full((4, 1), CLS), rng.integers(5, VOCAB, (4, 10)),
                              np.full((4, 1), SEP)], axis=1).astype(np.int32)
  config, params = _train_on_repeated_sequences(sequences, 800)
  model = BertForPreTraining(config)

  def apply(params, ids):
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    return model.apply({"params": params}, ids, jnp.zeros_like(ids), jnp.ones_like(ids),
                       positions, position_ids=positions,
                       cls_positions=jnp.zeros((ids.shape[0], 1), jnp.int32))["mlm_logits"]
  return sequences, params, apply


def test_a_memorised_corpus_is_generated_from_all_masks(memorised):
  """Trained on four sequences, the model generates them from all-[MASK]: each sample is one of
  them, whichever rule; the same seed gives the same texts, another seed others."""
  sequences, params, apply = memorised
  canvas = _canvas(16, [], 10)
  never = (PAD, UNK, CLS, SEP, MASK)
  run = lambda key, **kw: np.asarray(sampler.generate(
      params, canvas, jax.random.key(key), apply=apply, start=1, length=10,
      settings=sampler.SamplerSettings(**{"steps": 10, **kw}), mask_id=MASK, never=never))
  known = {tuple(s) for s in sequences.tolist()}
  # The confidence rule commits one token a step, each given all before it. Ancestral steps
  # commit a binomial number each, drawn independently of one another given the rest: with the
  # linear schedule N^2 / (2 S) pairs of a sample land in one step in expectation (0.5 at S =
  # 100, N = 10), and a pair drawn early, from little context, may mix two sequences (the
  # module's docstring): 13-15 of 16 measured over 4 seeds, 16 of 16 for the confidence rule.
  for kw, least in ((dict(rule="confidence"), 15), (dict(rule="confidence", block_size=5), 15),
                    (dict(steps=100), 12)):
    out = run(0, **kw)
    hits = sum(tuple(row) in known for row in out.tolist())
    assert hits >= least, (kw, hits)
  np.testing.assert_array_equal(run(0), run(0))
  assert not np.array_equal(run(0), run(1))
  assert len({tuple(r) for r in run(0).tolist()}) >= 2  # Not one sequence for every row.


@pytest.mark.usefixtures("one_device")
def test_a_preempted_diffusion_run_resumes_bit_identically(tmp_path, monkeypatch):
  """The times (fold_in of the step's key, stratified over the batch) and masks come back: a
  run stopped by SIGTERM and started again logs the uninterrupted run's losses and ends on its
  params, bit for bit."""
  import os  # pylint: disable=import-outside-toplevel

  from bert_jax.checkpoints import checkpointing  # pylint: disable=import-outside-toplevel
  from configs import diffusion_tiny  # pylint: disable=import-outside-toplevel
  from tests import sigterm_at  # pylint: disable=import-outside-toplevel

  config = diffusion_tiny.get_config()
  config.data.update(source="synthetic", max_seq_length=32)
  config.model.update(vocab_size=64, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                      num_hidden_layers=2, max_position_embeddings=32, vocab_pad_multiple=1,
                      local_attention=16)
  config.train.update(num_train_steps=6, batch_size=8, eval_every_steps=0, log_every_steps=1,
                      warmup_steps=2)
  config.checkpoint.save_every_steps = 100
  config.logging.tensorboard = False

  whole, stopped = sigterm_at.preempted_and_resumed(config, tmp_path, monkeypatch)
  losses = sigterm_at.train_losses
  assert losses(stopped) == losses(whole) and len(losses(whole)) == 6
  jax.tree.map(np.testing.assert_array_equal,
               checkpointing.restore_params(os.path.join(stopped, "checkpoints", "6")),
               checkpointing.restore_params(os.path.join(whole, "checkpoints", "6")))
