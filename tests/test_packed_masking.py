"""Masking of packed rows as google-research/bert masks each instance: every example of a row gets
its own min(P, max(1, round(0.15 x its eligible tokens))) targets, drawn within it; the worst
case of a row bounds P (config check); unpacked rows (K = 1) mask exactly as before; the train
metrics count examples per step and targets per example."""

import dataclasses
import functools
import random

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_checks, train
from bert_jax.data import corpus, packing, pipeline, prepare, tfds_builder
from bert_jax.data import vocab as vocab_lib
from bert_jax.objectives.masking import (MaskingConfig, example_targets, mask_tokens,
                                         max_targets_per_row)
from bert_jax.models.model import BertConfig
from configs import base, base_phase2, tiny

VOCAB, PAD, UNK, CLS, SEP, MASK = 300, 0, 1, 2, 3, 4
SPECIALS = (PAD, CLS, SEP, MASK)
CONFIG = MaskingConfig(vocab_size=VOCAB, mask_token_id=MASK, special_token_ids=SPECIALS)
WORDS = ("the model reads text and learns which sentence comes next while masked words are "
         "predicted from their context in every layer of the network on each step").split()


def _packed_rows(seed: int, rows: int, length: int, slots: int) -> dict[str, np.ndarray]:
  """Synthetic packed rows (the real layout): 1..K examples of >= 5 tokens each."""
  make = pipeline.SyntheticBatch(
      batch_size=rows, seq_len=length, vocab_size=VOCAB, pad_id=PAD, cls_id=CLS, sep_id=SEP,
      special_ids=(PAD, UNK, CLS, SEP, MASK), seed=seed, process_index=0, process_count=1,
      max_examples_per_row=slots)
  return make.map(0)


def _targets_per_example(batch: dict, out: dict) -> tuple[list[int], list[int]]:
  """(targets, eligible tokens) of every example of every row, in order."""
  segments, eligible = batch["segment_ids"], ~np.isin(batch["input_ids"], SPECIALS)
  targets, sizes = [], []
  for row in range(len(segments)):
    chosen = out["masked_lm_positions"][row][out["masked_lm_weights"][row] > 0]
    for k in range(1, int(segments[row].max()) + 1):
      targets.append(int((segments[row][chosen] == k).sum()))
      sizes.append(int((eligible[row] & (segments[row] == k)).sum()))
  return targets, sizes


def _masked(key, batch, config, segments=True):
  words = batch["word_starts"] if config.whole_word_masking else None
  return jax.tree.map(np.asarray, mask_tokens(
      key, batch["input_ids"], config, words, batch["segment_ids"] if segments else None))


# ---------------------------------------------------------------- the count, per example


def test_each_example_gets_its_own_count_and_the_sum_fits_p():
  batch = _packed_rows(0, 512, 128, 4)
  config = dataclasses.replace(CONFIG, max_predictions_per_seq=max_targets_per_row(
      0.15, 128, 4, *packing.example_specials("mlm_nsp")))
  assert config.max_predictions_per_seq == 19
  targets, sizes = _targets_per_example(batch, _masked(jax.random.key(0), batch, config))
  assert len(targets) > 1000 and min(sizes) >= 2
  assert targets == [example_targets(n, 0.15) for n in sizes]
  # Before: 15% of the whole row, rounded once, so short examples often got none.
  before, _ = _targets_per_example(batch, _masked(jax.random.key(0), batch, config, False))
  assert before.count(0) > 0.03 * len(before) and targets.count(0) == 0


def test_selection_is_uniform_within_each_example():
  batch = _packed_rows(1, 1024, 64, 3)
  out = _masked(jax.random.key(1), batch, dataclasses.replace(CONFIG, max_predictions_per_seq=10))
  segments, eligible = batch["segment_ids"], ~np.isin(batch["input_ids"], SPECIALS)
  selected = np.zeros_like(eligible)
  rows = np.nonzero(out["masked_lm_weights"] > 0)[0]
  selected[rows, out["masked_lm_positions"][out["masked_lm_weights"] > 0]] = True
  # Rank of each eligible token among its example's: the first and the second half of every
  # example are selected at the same rate (no position bias inside an example).
  first_half, second_half = [], []
  for row in range(len(segments)):
    for k in range(1, int(segments[row].max()) + 1):
      where = np.flatnonzero(eligible[row] & (segments[row] == k))
      half = len(where) // 2
      first_half += selected[row, where[:half]].tolist()
      second_half += selected[row, where[len(where) - half:]].tolist()
  assert abs(np.mean(first_half) - np.mean(second_half)) < 0.01, (np.mean(first_half),
                                                                    np.mean(second_half))


def test_whole_word_masking_per_example_never_overshoots_or_splits():
  batch = _packed_rows(2, 256, 128, 4)
  config = dataclasses.replace(CONFIG, whole_word_masking=True, max_predictions_per_seq=19)
  out = _masked(jax.random.key(2), batch, config)
  targets, sizes = _targets_per_example(batch, out)
  wanted = [example_targets(n, 0.15) for n in sizes]
  assert all(t <= w for t, w in zip(targets, wanted))
  assert sum(targets) > 0.9 * sum(wanted)  # Not vacuous: most examples fill their count.
  # A word: an eligible start piece and the eligible pieces after it (masking.py's rule).
  eligible = ~np.isin(batch["input_ids"], SPECIALS)
  after_ineligible = ~np.pad(eligible, ((0, 0), (1, 0)))[:, :-1]
  word_id = np.cumsum(eligible & ((batch["word_starts"] == 1) | after_ineligible), axis=1)
  selected = np.zeros_like(eligible)
  used = out["masked_lm_weights"] > 0
  selected[np.nonzero(used)[0], out["masked_lm_positions"][used]] = True
  for row in range(len(eligible)):
    for word in np.unique(word_id[row][eligible[row]]):
      pieces = selected[row][eligible[row] & (word_id[row] == word)]
      assert pieces.all() or not pieces.any(), (row, word)  # Never split.


@pytest.mark.parametrize("whole_word_masking, mask_prob, slots",
                         [(False, 0.15, 20), (True, 0.3, 40)])
def test_unpacked_rows_mask_as_before_bit_for_bit(whole_word_masking, mask_prob, slots):
  """K = 1: segment ids (1 on the example, 0 on padding) change nothing, draw for draw, so the
  pinned whole-row results of tests/test_masking.py hold for unpacked rows."""
  batch = _packed_rows(3, 256, 96, 1)
  config = dataclasses.replace(CONFIG, whole_word_masking=whole_word_masking,
                               mask_prob=mask_prob, max_predictions_per_seq=slots)
  key = jax.random.fold_in(jax.random.key(3), 11)
  with_segments = _masked(key, batch, config)
  whole_rows = _masked(key, batch, config, segments=False)
  for name, value in whole_rows.items():
    assert value.tobytes() == with_segments[name].tobytes(), name


# ---------------------------------------------------------------- P: the worst case of a row


def _brute_force(mask_prob: float, length: int, slots: int) -> int:
  @functools.lru_cache(None)
  def best(room: int, left: int) -> int:
    return max([0] + [example_targets(size - 3, mask_prob) + best(room - size, left - 1)
                      for size in range(5, room + 1)] if left else [0])
  return best(length, slots)


def test_max_targets_per_row_is_exact_and_bounds_p():
  for mask_prob in (0.15, 0.3, 0.5):
    for length in (5, 12, 33, 64):
      for slots in (1, 2, 4):
        assert max_targets_per_row(mask_prob, length, slots, 3, 5) == _brute_force(
            mask_prob, length, slots), (mask_prob, length, slots)
  # Phase 2 (L=512, K=16): 80, the original's P, where one example would need 76.
  assert max_targets_per_row(0.15, 512, 16, 3, 5) == 80
  assert max_targets_per_row(0.15, 512, 1, 3, 5) == 76
  assert max_targets_per_row(0.3, 1024, 1, 2, 3) == 307  # modern_base's FULL-SENTENCES rows.
  config_checks.check_pretraining(base_phase2.get_config())
  config = base_phase2.get_config()
  config.masking.max_predictions_per_seq = 77  # round(0.15 x 512): the old bound.
  with pytest.raises(ValueError, match=r"^config.masking.max_predictions_per_seq=77 cannot hold "
                     r"the 80 targets of a full row \(up to 16 examples in max_seq_length 512"):
    config_checks.check_pretraining(config)


# ---------------------------------------------------------------- a prepared shard


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
  """Every train row of a tiny corpus prepared as configs/base.py's (L=128, K=4): short
  documents, so that most rows pack 2-4 examples of 25-100 tokens."""
  root = tmp_path_factory.mktemp("packed_shard")
  rng = random.Random(0)
  lines = []
  for _ in range(150):
    lines += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 3))).capitalize() + "."
              for _ in range(rng.randint(2, 6))] + [""]
  (root / "corpus.txt").write_text("\n".join(lines) + "\n")
  text = str(root / "corpus.txt")
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(text)), str(root / "sp"), VOCAB, "bpe")
  dataset_dir = str(root / "dataset")
  meta = prepare.prepare_dataset(
      dataset_dir, lambda: corpus.iter_bert_format(text), vocab, max_seq_length=128,
      dupe_factor=2, validation_fraction=0.1, seed=0, max_examples_per_row=4, num_workers=0)
  source = tfds_builder.data_source(dataset_dir, "train")
  return pipeline.stack_examples([source[i] for i in range(len(source))]), meta


def test_prepared_shard_every_example_gets_its_own_count_and_80_10_10(shard):
  rows, meta = shard
  config = base.get_config()  # L=128, K=4, P=20 >= the 19 a row of 4 examples can need.
  config.model.vocab_size = meta["vocab_size"]
  config_checks.check_pretraining(config)
  task = train.pretraining_task(config, BertConfig.from_config(config.model), meta)
  specials = task.masking.special_token_ids
  prepare_batch = jax.jit(task.prepare)
  eligible = ~np.isin(rows["input_ids"], specials)
  segments = rows["segment_ids"]
  assert (segments.max(axis=1) > 1).mean() > 0.8  # Mostly packed rows.
  counts = {"targets": 0, "eligible": 0, "masked": 0, "random": 0, "kept": 0}
  for draw in range(4):  # A few draws for the 80/10/10 statistics.
    out = jax.tree.map(np.asarray, prepare_batch(rows, jax.random.key(draw), jnp.int32(draw)))
    used = out["masked_lm_weights"] > 0
    for row in range(len(segments)):
      chosen = out["masked_lm_positions"][row][used[row]]
      for k in range(1, int(segments[row].max()) + 1):
        n = int((eligible[row] & (segments[row] == k)).sum())
        assert int((segments[row][chosen] == k).sum()) == min(
            config.masking.max_predictions_per_seq, max(1, round(0.15 * n))), (row, k, n)
    original = out["masked_lm_ids"][used]
    corrupted = np.take_along_axis(out["input_ids"], out["masked_lm_positions"], axis=1)[used]
    assert (original == np.take_along_axis(rows["input_ids"], out["masked_lm_positions"],
                                           axis=1)[used]).all()
    counts["targets"] += int(used.sum())
    counts["eligible"] += int(eligible.sum())
    counts["masked"] += int((corrupted == task.masking.mask_token_id).sum())
    counts["kept"] += int((corrupted == original).sum())
  counts["random"] = counts["targets"] - counts["masked"] - counts["kept"]
  # 15% of the eligible tokens (per-example rounding moves it a little), 80/10/10 of those.
  assert abs(counts["targets"] / counts["eligible"] - 0.15) < 0.01, counts
  assert abs(counts["masked"] / counts["targets"] - 0.8) < 0.02, counts
  assert abs(counts["random"] / counts["targets"] - 0.1) < 0.015, counts
  assert abs(counts["kept"] / counts["targets"] - 0.1) < 0.015, counts


# ---------------------------------------------------------------- what the metrics count


def test_examples_and_targets_per_example_in_the_train_metrics():
  config = tiny.get_config()
  config.model.vocab_size = VOCAB
  config.data.update(max_seq_length=64, max_examples_per_row=3)
  config.masking.max_predictions_per_seq = 10
  task = train.pretraining_task(config, BertConfig.from_config(config.model), None)
  batch = _packed_rows(4, 32, 64, 3)
  prepared = task.prepare(batch, jax.random.key(0), jnp.int32(0))
  assert float(task.examples(prepared)) == float(batch["nsp_weights"].sum())
  sums = {"mlm_loss_sum": 1.0, "mlm_correct_sum": 0.0, "nsp_loss_sum": 1.0,
          "nsp_correct_sum": 0.0, "mlm_count": float(prepared["masked_lm_weights"].sum()),
          "nsp_count": float(batch["nsp_weights"].sum()), "examples": float(task.examples(
              prepared))}
  report = task.report(sums)
  assert report["targets_per_example"] == sums["mlm_count"] / sums["examples"]
  # MLM-only rows (no NSP weight) count one example each, also once cut into spans.
  config.data.update(objective="mlm", span_warmup_steps=10, span_warmup_start=8)
  mlm_task = train.pretraining_task(config, BertConfig.from_config(config.model), None)
  one = _packed_rows(5, 32, 64, 1)
  cut = mlm_task.prepare({**one, "nsp_weights": one["nsp_weights"] * 0}, jax.random.key(0),
                         jnp.int32(0))
  assert int(np.asarray(cut["segment_ids"]).max()) > 1  # Spans of 8 tokens...
  assert float(mlm_task.examples(cut)) == 32.0  # ...still one example a row
  # ...masked as one example (15% of the row), not per span.
  eligible = (~np.isin(one["input_ids"], SPECIALS)).sum(axis=1)
  assert np.asarray(cut["masked_lm_weights"]).sum(axis=1).tolist() == [
      min(10, example_targets(int(n), 0.15)) for n in eligible]
  # The evaluation counts the examples it covered too (MLM-only rows: one each; padding rows
  # none), not NSP's count (0 for MLM-only rows).
  mlm_rows = {**one, "nsp_weights": one["nsp_weights"] * 0}
  mlm_rows["segment_ids"] = mlm_rows["segment_ids"].copy()
  mlm_rows["segment_ids"][-2:] = 0  # 2 padding rows.
  params = jax.jit(lambda key: nn.meta.unbox(mlm_task.model.init(
      key, *mlm_task.example_inputs(), deterministic=True)["params"]))(jax.random.key(0))
  _, eval_sums = jax.jit(lambda p, rows: mlm_task.eval_outputs(
      p, mlm_task.prepare_eval(rows, jax.random.key(1))))(params, mlm_rows)
  scores = mlm_task.scores({}, jax.device_get(eval_sums), None)
  assert scores.counts["examples"] == 30.0 and eval_sums["nsp_count"] == 0
