"""Tests of bert_jax.objectives.masking: reproducibility, jit/vmap, the 15% / 80-10-10 statistics, exact
per-row target counts, whole-word masking as google-research/bert, and the effect on the MLM loss."""

import dataclasses
import random

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.objectives import losses
from bert_jax.objectives.masking import MaskingConfig, mask_tokens
from configs import base

# BERT's WordPiece ids: [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
VOCAB = 30522
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
SPECIALS = (PAD, CLS, SEP, MASK)  # Never masked; [UNK] is selected like any token.
CONFIG = MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=SPECIALS)


def _expected_num_to_predict(n_eligible: int, mask_prob: float, max_predictions: int) -> int:
  """google-research/bert's count (Python 3 round: half to even); 0 when nothing is eligible."""
  if n_eligible == 0:
    return 0
  return min(max_predictions, max(1, int(round(n_eligible * mask_prob))))


def _make_batch(seed: int, batch: int, length: int, min_real: int, max_real: int,
                unk_rate: float = 0.0) -> np.ndarray:
  """[CLS] A [SEP] B [SEP] [PAD]...: rows of min_real..max_real word pieces, ids avoid specials."""
  rng = np.random.default_rng(seed)
  ids = np.full((batch, length), PAD, np.int32)  # [B, L]
  for row in range(batch):
    n_real = int(rng.integers(min_real, max_real + 1))
    tokens = rng.integers(MASK + 1, VOCAB, n_real).astype(np.int32)
    tokens[rng.random(n_real) < unk_rate] = UNK
    split = int(rng.integers(1, n_real))
    ids[row, :n_real + 3] = np.concatenate(
        [[CLS], tokens[:split], [SEP], tokens[split:], [SEP]]).astype(np.int32)
  return ids


def _to_np(out: dict) -> dict:
  return {name: np.asarray(value) for name, value in out.items()}


# ---------------------------------------------------------------- config


def test_config_validation_and_from_config():
  with pytest.raises(ValueError, match="mask_prob"):
    dataclasses.replace(CONFIG, mask_prob=0.0)
  with pytest.raises(ValueError, match="mask_prob"):
    dataclasses.replace(CONFIG, mask_prob=1.5)
  with pytest.raises(ValueError, match="random_token_prob"):
    dataclasses.replace(CONFIG, random_token_prob=-0.1)
  with pytest.raises(ValueError, match="> 1"):
    dataclasses.replace(CONFIG, mask_token_prob=0.9, random_token_prob=0.2)
  with pytest.raises(ValueError, match="max_predictions_per_seq"):
    dataclasses.replace(CONFIG, max_predictions_per_seq=0)
  with pytest.raises(TypeError, match="max_predictions_per_seq"):
    dataclasses.replace(CONFIG, max_predictions_per_seq=2.5)
  with pytest.raises(ValueError, match="mask_token_id"):
    dataclasses.replace(CONFIG, special_token_ids=(PAD, CLS, SEP))
  with pytest.raises(ValueError, match="outside"):
    dataclasses.replace(CONFIG, special_token_ids=SPECIALS + (VOCAB,))
  with pytest.raises(TypeError, match="whole_word_masking"):
    dataclasses.replace(CONFIG, whole_word_masking="yes")
  with pytest.raises(ValueError, match="every id is special"):
    MaskingConfig(vocab_size=2, mask_token_id=1, special_token_ids=(0, 1))

  # Specials are normalised (sorted, de-duplicated), so equal policies compare and hash equal.
  shuffled = MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK,
                           special_token_ids=[MASK, PAD, SEP, CLS, PAD])
  assert shuffled == CONFIG and hash(shuffled) == hash(CONFIG)
  assert shuffled.special_token_ids == tuple(sorted(SPECIALS))

  config = base.get_config()
  config.masking.max_predictions_per_seq = 7
  config.masking.whole_word_masking = True
  built = MaskingConfig.from_config(config.masking, VOCAB, MASK, SPECIALS + (UNK,),
                                    unk_token_id=UNK)  # [UNK] is taken out of the specials.
  assert built == MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=SPECIALS,
                                mask_prob=0.15, max_predictions_per_seq=7, mask_token_prob=0.8,
                                random_token_prob=0.1, whole_word_masking=True)
  incomplete = ml_collections.ConfigDict({"mask_prob": 0.15})
  with pytest.raises(AttributeError):  # No silent defaults: the config section is the truth.
    MaskingConfig.from_config(incomplete, VOCAB, MASK, SPECIALS, unk_token_id=UNK)


# ---------------------------------------------------------------- determinism, jit, vmap


def test_same_key_same_output_and_different_key_different_selection():
  ids = _make_batch(0, 8, 64, 30, 60)
  first = _to_np(mask_tokens(jax.random.key(1), ids, CONFIG))
  again = _to_np(mask_tokens(jax.random.key(1), ids, CONFIG))
  other = _to_np(mask_tokens(jax.random.key(2), ids, CONFIG))
  expected = {"input_ids": (np.int32, (8, 64)), "masked_lm_positions": (np.int32, (8, 20)),
              "masked_lm_ids": (np.int32, (8, 20)), "masked_lm_weights": (np.float32, (8, 20))}
  assert {name: (value.dtype, value.shape) for name, value in first.items()} == expected
  for name in first:
    assert first[name].tobytes() == again[name].tobytes(), name
  assert not np.array_equal(first["masked_lm_positions"], other["masked_lm_positions"])
  # Dynamic masking: per-step keys from fold_in give different selections too.
  step_keys = [jax.random.fold_in(jax.random.key(1), step) for step in (0, 1)]
  step_positions = [np.asarray(mask_tokens(k, ids, CONFIG)["masked_lm_positions"])
                    for k in step_keys]
  assert not np.array_equal(*step_positions)


def test_jit_vmap_and_one_compilation_per_shape():
  traces = []

  def step(rng, ids, config):
    traces.append(ids.shape)  # Runs only while tracing.
    return mask_tokens(rng, ids, config)

  jitted = jax.jit(step, static_argnames="config")
  ids = _make_batch(1, 4, 32, 10, 25)
  for seed in range(3):
    # A separately built but equal config must not trigger a new trace.
    config = MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=list(SPECIALS))
    jitted(jax.random.key(seed), _make_batch(seed, 4, 32, 10, 25), config)
  assert traces == [(4, 32)]
  jitted(jax.random.key(0), _make_batch(0, 4, 48, 10, 25), CONFIG)
  assert traces == [(4, 32), (4, 48)]
  # The public jitted function itself: new keys, data and equal configs reuse one executable.
  cache_before = mask_tokens._cache_size()
  mask_tokens(jax.random.key(0), ids, CONFIG)
  cache_after_first = mask_tokens._cache_size()
  assert cache_after_first - cache_before <= 1
  for seed in range(1, 3):
    config = MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=list(SPECIALS))
    mask_tokens(jax.random.key(seed), _make_batch(seed, 4, 32, 10, 25), config)
  assert mask_tokens._cache_size() == cache_after_first

  # vmap over keys (a stack of batches) equals calling once per key.
  keys = jax.random.split(jax.random.key(7), 3)
  stacked = np.stack([ids, ids[::-1], ids])  # [N, B, L]
  batched = _to_np(jax.jit(jax.vmap(lambda k, x: mask_tokens(k, x, CONFIG)))(keys, stacked))
  for n in range(3):
    single = _to_np(mask_tokens(keys[n], stacked[n], CONFIG))
    for name in single:
      np.testing.assert_array_equal(batched[name][n], single[name], err_msg=name)
  # Identical inputs under different keys get different selections.
  assert not np.array_equal(batched["masked_lm_positions"][0], batched["masked_lm_positions"][2])

  # vmap over rows (one key per row, [L] inside) equals one-row batches.
  row_keys = jax.random.split(jax.random.key(8), 4)
  per_row = _to_np(jax.vmap(lambda k, x: mask_tokens(k, x, CONFIG))(row_keys, ids))
  for row in range(4):
    single = _to_np(mask_tokens(row_keys[row], ids[row:row + 1], CONFIG))
    for name in single:
      np.testing.assert_array_equal(per_row[name][row], single[name][0], err_msg=name)


# ---------------------------------------------------------------- selection and replacement


def test_selection_and_80_10_10_statistics():
  batch, length = 2048, 128
  ids = _make_batch(3, batch, length, 85, 115)  # ~100 eligible per row: P=20 never binds.
  out = _to_np(mask_tokens(jax.random.key(3), ids, CONFIG))
  eligible = ~np.isin(ids, SPECIALS)
  n_eligible = int(eligible.sum())
  assert n_eligible >= 100_000
  weights = out["masked_lm_weights"]
  n_selected = int(weights.sum())
  assert abs(n_selected / n_eligible - 0.15) < 0.003

  # No position bias: early and late eligible tokens are selected at the same rate.
  selected = np.zeros_like(eligible)
  rows = np.repeat(np.arange(batch)[:, None], weights.shape[1], axis=1)
  selected[rows[weights > 0], out["masked_lm_positions"][weights > 0]] = True
  rank = np.cumsum(eligible, axis=1) - 1  # Index among the row's eligible tokens.
  for part in (eligible & (rank < 42), eligible & (rank >= 42)):
    assert abs(selected[part].mean() - 0.15) < 0.006

  # Categories from what the corrupted input holds at each target (the original ids are never
  # [MASK]; a random draw equal to the original has chance 1/30517 and counts as "kept").
  used = weights > 0
  original = out["masked_lm_ids"][used]
  corrupted = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], axis=1)[used]
  masked = corrupted == MASK
  kept = corrupted == original
  randomised = ~masked & ~kept
  assert abs(masked.mean() - 0.8) < 0.015
  assert abs(randomised.mean() - 0.1) < 0.01
  assert abs(kept.mean() - 0.1) < 0.01
  assert not np.isin(corrupted[randomised], SPECIALS).any()
  assert ((corrupted >= 0) & (corrupted < VOCAB)).all()


def test_specials_never_selected_ids_match_and_layout():
  batch, length = 64, 48
  ids = _make_batch(4, batch, length, 5, 45, unk_rate=0.2)  # [UNK] inside the text, padding.
  ids[5] = PAD
  ids[6, :3] = [CLS, SEP, SEP]
  ids[6, 3:] = PAD  # No eligible token: selects nothing.
  out = _to_np(mask_tokens(jax.random.key(4), ids, CONFIG))
  positions, weights = out["masked_lm_positions"], out["masked_lm_weights"]
  used = weights > 0
  assert set(np.unique(weights)) <= {0.0, 1.0}
  rows = np.arange(batch)[:, None]
  original_at = ids[rows, positions]  # [B, P]
  assert not np.isin(original_at[used], SPECIALS).any()
  np.testing.assert_array_equal(out["masked_lm_ids"][used], original_at[used])
  assert (positions[~used] == 0).all() and (out["masked_lm_ids"][~used] == 0).all()
  assert not used[5].any() and not used[6].any()
  np.testing.assert_array_equal(out["input_ids"][5:7], ids[5:7])
  for row in range(batch):
    count = int(used[row].sum())
    assert used[row, :count].all() and not used[row, count:].any()  # Targets first.
    assert (np.diff(positions[row, :count]) > 0).all()  # Ascending, no duplicates.
    # Only targets change; every other token (specials included) is left as it was.
    changed = np.flatnonzero(out["input_ids"][row] != ids[row])
    assert set(changed) <= set(positions[row, :count])
  corrupted_at = out["input_ids"][rows, positions]
  replaced = used & (corrupted_at != original_at) & (corrupted_at != MASK)
  assert not np.isin(corrupted_at[replaced], SPECIALS).any()
  # [UNK] is a target as often as it is in the text (~20% of the eligible tokens here).
  eligible = ~np.isin(ids, SPECIALS)
  unk_share_of_text = (ids[eligible] == UNK).mean()
  unk_share_of_targets = (original_at[used] == UNK).mean()
  assert abs(unk_share_of_targets - unk_share_of_text) < 0.06, (unk_share_of_targets,
                                                                 unk_share_of_text)


@pytest.mark.parametrize("max_predictions", [20, 64])
def test_num_to_predict_formula_per_row(max_predictions):
  length = 256
  # Includes half-way cases (10 -> 1.5 -> 2, 30 -> 4.5 -> 4, 50 -> 7.5 -> 8, 70 -> 10.5 -> 10),
  # the max(1, .) floor (1, 2, 3), the cap (n >= 134 with P = 20) and 190 (28.5 in
  # float64 -> 28 half to even, but 28.500002 -> 29 if computed in float32).
  counts = [0, 1, 2, 3, 4, 5, 9, 10, 11, 13, 30, 50, 70, 100, 133, 134, 190, 200, 253]
  rng = np.random.default_rng(5)
  ids = np.full((len(counts), length), PAD, np.int32)
  for row, n in enumerate(counts):
    ids[row, 0] = CLS
    ids[row, 1:n + 1] = rng.integers(MASK + 1, VOCAB, n)
    ids[row, n + 1] = SEP
  config = dataclasses.replace(CONFIG, max_predictions_per_seq=max_predictions)
  out = _to_np(mask_tokens(jax.random.key(5), ids, config))
  got = out["masked_lm_weights"].sum(axis=1).astype(int).tolist()
  assert got == [_expected_num_to_predict(n, 0.15, max_predictions) for n in counts]


def test_more_slots_than_tokens():
  ids = np.array([[CLS, 1000, 1001, SEP, 1002, SEP, PAD, PAD]], np.int32)
  config = dataclasses.replace(CONFIG, mask_prob=1.0, max_predictions_per_seq=20)
  out = _to_np(mask_tokens(jax.random.key(6), ids, config))
  assert out["masked_lm_positions"].shape == (1, 20)
  np.testing.assert_array_equal(out["masked_lm_positions"][0, :3], [1, 2, 4])
  assert out["masked_lm_weights"].sum() == 3


def test_random_replacements_uniform_over_non_special_ids():
  # Tiny vocab with specials at both ends: allowed ids are 1, 2, 5, 6, 7, 8.
  config = MaskingConfig(vocab_size=10, mask_token_id=4, special_token_ids=(0, 3, 4, 9),
                         mask_prob=1.0, max_predictions_per_seq=32, mask_token_prob=0.0,
                         random_token_prob=1.0)
  ids = np.ones((1024, 32), np.int32)  # Every token is 1 and is selected.
  out = _to_np(mask_tokens(jax.random.key(9), ids, config))
  assert out["masked_lm_weights"].sum() == ids.size
  values, counts = np.unique(out["input_ids"], return_counts=True)
  assert set(values.tolist()) == {1, 2, 5, 6, 7, 8}
  np.testing.assert_allclose(counts / ids.size, 1 / 6, atol=0.006)


def test_selected_unchanged_tokens_count_in_loss_and_unselected_never():
  batch, length, vocab = 6, 24, 200
  config = MaskingConfig(vocab_size=vocab, mask_token_id=MASK, special_token_ids=SPECIALS,
                         mask_prob=0.3, max_predictions_per_seq=8)
  rng = np.random.default_rng(10)
  ids = rng.integers(MASK + 1, vocab, (batch, length)).astype(np.int32)
  ids[:, 0], ids[:, -1] = CLS, SEP
  ids[:, -5:-1] = PAD
  out = mask_tokens(jax.random.key(10), ids, config)
  positions, weights = np.asarray(out["masked_lm_positions"]), np.asarray(out["masked_lm_weights"])
  corrupted = np.asarray(out["input_ids"])
  rows = np.arange(batch)[:, None]
  kept = (weights > 0) & (corrupted[rows, positions] == ids[rows, positions])
  assert kept.any() and (weights == 0).any()

  @jax.jit
  def loss_sums(sequence_logits):  # [B, L, V] -> the real MLM sums at the masked positions
    mlm_logits = jnp.take_along_axis(sequence_logits, out["masked_lm_positions"][..., None],
                                     axis=1)  # [B, P, V]
    return losses.mlm_sums(mlm_logits, out["masked_lm_ids"], out["masked_lm_weights"])

  logits = jax.random.normal(jax.random.key(11), (batch, length, vocab), jnp.float32)
  reference = loss_sums(logits)
  assert float(reference["mlm_count"]) == weights.sum()

  # A selected token that kept its input still carries weight 1 and moves the loss.
  row, slot = np.argwhere(kept)[0]
  assert weights[row, slot] == 1.0
  bumped = logits.at[row, positions[row, slot], ids[row, positions[row, slot]]].add(5.0)
  assert float(loss_sums(bumped)["mlm_loss_sum"]) < float(reference["mlm_loss_sum"]) - 1e-3

  # An unselected position never enters the loss, even where weight-0 slots gather from it
  # (unused slots point at position 0).
  selected = np.zeros((batch, length), bool)
  selected[np.nonzero(weights > 0)[0], positions[weights > 0]] = True
  for row, position in [tuple(i) for i in np.argwhere(~selected)[:: 7]] + [(0, 0)]:
    assert not selected[row, position]
    changed = logits.at[row, position].set(
        jax.random.normal(jax.random.key(int(position)), (vocab,)) * 10.0)
    np.testing.assert_array_equal(loss_sums(changed)["mlm_loss_sum"], reference["mlm_loss_sum"])


# ---------------------------------------------------------------- whole-word masking


def _original_whole_word_masking(word_lengths: list[int], num_to_predict: int,
                                 rng: random.Random) -> list[int]:
  """google-research/bert's loop over shuffled words -> lengths of the words it takes."""
  words = list(word_lengths)
  rng.shuffle(words)
  taken, count = [], 0
  for length in words:
    if count >= num_to_predict:
      break
    if count + length > num_to_predict:
      continue
    taken.append(length)
    count += length
  return taken


def _make_word_batch(seed: int, batch: int, length: int, max_word: int):
  """Rows of words of 1..max_word pieces between [CLS]/[SEP], with [UNK] and padding.

  Returns ids [B, L], word_starts [B, L] and, per row, the words as lists of positions.
  """
  rng = np.random.default_rng(seed)
  ids = np.full((batch, length), PAD, np.int32)
  starts = np.zeros((batch, length), np.int32)
  words = []
  for row in range(batch):
    budget = int(rng.integers(4, length - 3))
    ids[row, 0] = CLS
    position, row_words = 1, []
    while position < budget:
      if rng.random() < 0.05:
        if rng.random() < 0.5:  # [UNK] is a one-piece word, eligible like any other.
          ids[row, position], starts[row, position] = UNK, 1
          row_words.append([position])
        else:
          ids[row, position] = SEP  # A control token between words.
        position += 1
        continue
      pieces = min(int(rng.integers(1, max_word + 1)), budget - position)
      ids[row, position:position + pieces] = rng.integers(MASK + 1, VOCAB, pieces)
      starts[row, position] = 1
      row_words.append(list(range(position, position + pieces)))
      position += pieces
    ids[row, position] = SEP
    words.append(row_words)
  return ids, starts, words


def test_whole_word_masking_never_splits_and_counts_like_the_original():
  config = dataclasses.replace(CONFIG, whole_word_masking=True)
  ids, starts, words = _make_word_batch(12, 128, 64, max_word=4)
  out = _to_np(mask_tokens(jax.random.key(12), ids, config, starts))
  weights, positions = out["masked_lm_weights"], out["masked_lm_positions"]
  num_taken_any = 0
  for row in range(ids.shape[0]):
    selected = set(positions[row][weights[row] > 0].tolist())
    n_eligible = sum(len(word) for word in words[row])
    num_to_predict = _expected_num_to_predict(n_eligible, 0.15, 20)
    assert len(selected) <= num_to_predict
    covered = set()
    for word in words[row]:
      hits = selected.intersection(word)
      assert not hits or hits == set(word), (row, word, hits)  # Never split.
      covered |= hits
      # The original only skips a word that would overshoot; it skips it at a count no larger
      # than the final count, so every word left out must overshoot from the final count too.
      if not hits:
        assert len(selected) + len(word) > num_to_predict, (row, word)
    assert covered == selected  # Nothing outside the words ([CLS], [SEP], padding).
    num_taken_any += bool(selected)
  assert num_taken_any >= 0.9 * ids.shape[0]  # Not vacuous (empty rows: no word fits).


def test_whole_word_masking_exact_counts_and_distribution():
  config = dataclasses.replace(CONFIG, whole_word_masking=True, max_predictions_per_seq=8)

  def row_of_words(word_lengths: list[int], length: int = 64):
    ids = np.full((length,), PAD, np.int32)
    starts = np.zeros((length,), np.int32)
    ids[0], position = CLS, 1
    for pieces in word_lengths:
      ids[position:position + pieces] = np.arange(pieces) + 1000 + position
      starts[position] = 1
      position += pieces
    ids[position] = SEP
    return ids, starts

  # Order-independent outcomes of the original: 4 words of 3 -> 12 eligible -> 2 targets, no
  # word fits, nothing is selected; 10 words of 2 -> 3 targets -> exactly one word (2 pieces);
  # 12 single pieces and a 5-piece word -> 17 eligible -> 3 targets, all single pieces.
  for word_lengths, expected in (([3] * 4, 0), ([2] * 10, 2), ([1] * 12 + [5], 3)):
    ids, starts = row_of_words(word_lengths)
    out = mask_tokens(jax.random.key(13), ids[None], config, starts[None])
    assert float(out["masked_lm_weights"].sum()) == expected, word_lengths

  # Distribution: our selection vs the original's loop on the same row (many draws). 34 pieces
  # -> 5 targets, often not reachable (mean ~4.90): a loop that stops at the first overshoot
  # (~4.02) or favours long words (4-piece rate ~0.125 instead of ~0.084) fails here.
  word_lengths = [2, 3, 2, 4, 3, 2, 3, 2, 4, 3, 2, 3, 1]
  ids, starts = row_of_words(word_lengths)
  trials = 8192
  out = _to_np(mask_tokens(jax.random.key(14), np.tile(ids, (trials, 1)), config,
                           np.tile(starts, (trials, 1))))
  targets = np.where(out["masked_lm_weights"] > 0, out["masked_lm_positions"], -1)  # [T, P]
  word_first = np.flatnonzero(starts)  # First piece of each word, in word order.
  word_rate = np.array([(targets == first).sum() / trials for first in word_first])  # [W]
  reference_rng = random.Random(0)
  reference = [_original_whole_word_masking(word_lengths, 5, reference_rng) for _ in range(20000)]
  ours_count = out["masked_lm_weights"].sum(axis=1).mean()
  reference_count = np.mean([sum(taken) for taken in reference])
  assert abs(ours_count - reference_count) < 0.03, (ours_count, reference_count)
  for length in (1, 2, 3, 4):
    ours_rate = word_rate[np.array(word_lengths) == length].mean()
    reference_rate = (sum(taken.count(length) for taken in reference)
                      / (len(reference) * word_lengths.count(length)))
    assert abs(ours_rate - reference_rate) < 0.03, (length, ours_rate, reference_rate)

  # The 80/10/10 draw is per token: some selected words mix [MASK] with kept/random pieces.
  corrupted = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], axis=1)
  long_start = int(word_first[word_lengths.index(4)])
  long_word = list(range(long_start, long_start + 4))
  rows_with_long = np.isin(out["masked_lm_positions"], long_word).sum(axis=1) == 4
  long_slots = np.isin(out["masked_lm_positions"], long_word) & rows_with_long[:, None]
  is_mask = (corrupted == MASK)[long_slots].reshape(-1, 4)
  assert (is_mask.any(axis=1) & ~is_mask.all(axis=1)).any()


def test_whole_word_masking_needs_word_starts():
  config = dataclasses.replace(CONFIG, whole_word_masking=True)
  with pytest.raises(ValueError, match="word_starts"):
    mask_tokens(jax.random.key(0), _make_batch(0, 2, 16, 5, 10), config)
