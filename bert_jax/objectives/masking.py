"""BERT's masked-LM corruption (select 15%, then 80% [MASK] / 10% random / 10% unchanged) in JAX.

`mask_tokens` follows google-research/bert `create_masked_lm_predictions` per EXAMPLE: each example
of a row (a packed row holds several, told apart by `segment_ids`) gets `num_to_predict =
min(max_predictions_per_seq, max(1, round(n_eligible * mask_prob)))` targets of its own, drawn
uniformly without replacement among its eligible positions (any token but the control tokens
[PAD], [CLS], [SEP], [MASK]; [UNK] is eligible, as the original selects every token but [CLS]
and [SEP]), or, with whole-word masking, its whole words taken in random order, skipping any
word that would overshoot its `num_to_predict`. So a short example packed next to long ones
gets its target as it would alone, and a row of K examples holds the sum of their counts: the
P = `max_predictions_per_seq` slots of a row must hold that sum in the worst case
(`max_targets_per_row`, checked by the config). Without `segment_ids` a row is one example (an
unpacked row, K = 1: the same draws and results). Each selected token then gets its own 80/10/10
draw. Two deliberate differences from the original: `n_eligible` counts only maskable tokens
(the original also counts [CLS] and [SEP]), and a random replacement is drawn among non-control
ids only ([UNK] included; the original draws any vocabulary entry).

Everything is a pure function of (rng, inputs) with static shapes, so it runs inside the jitted
train step (and under vmap) with no host round trip. Masking is dynamic: the train step derives a
fresh key per step with `jax.random.fold_in(seed_key, step)`, so every epoch sees new masks while a
resumed run reproduces the same masks bit for bit.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

COUNT_RULES = ("round", "bernoulli")
COUNT_STREAM = 0x434E5400  # fold_in of the masking key: "bernoulli" counts' draws ("CNT").

@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """The masking policy; frozen and hashable so it can be a static argument of `jax.jit`.

  `special_token_ids` (the control tokens: pad, [CLS], [SEP], [MASK], any others) are never
  selected and never drawn as random replacements; they are stored sorted and de-duplicated.
  [UNK] is not one of them: it is selected (and drawn) like any word piece, as in
  google-research/bert, so the model learns to predict it; `from_config` takes it out.
  """
  vocab_size: int
  mask_token_id: int
  special_token_ids: tuple[int, ...]
  mask_prob: float = 0.15
  max_predictions_per_seq: int = 20
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  whole_word_masking: bool = False
  # How an example's rate r becomes its targets: "round", BERT's min(P, max(1, round(r x n)))
  # of its n eligible tokens; "bernoulli", each eligible token on its own with probability r
  # (masked diffusion; a row's first P kept).
  count_rule: str = "round"

  def __post_init__(self):
    def as_int(name: str, value) -> int:
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"MaskingConfig.{name} must be an int, got {value!r}")
      return int(value)

    def as_prob(name: str, value, low_open: bool = False) -> float:
      if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"MaskingConfig.{name} must be a float, got {value!r}")
      value = float(value)
      if not (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0):
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"MaskingConfig.{name} must be in {interval}, got {value}")
      return value

    vocab_size = as_int("vocab_size", self.vocab_size)
    if vocab_size < 2:
      raise ValueError(f"MaskingConfig.vocab_size must be >= 2, got {vocab_size}")
    mask_token_id = as_int("mask_token_id", self.mask_token_id)
    if isinstance(self.special_token_ids, (str, bytes)) or not hasattr(self.special_token_ids,
                                                                        "__iter__"):
      raise TypeError("MaskingConfig.special_token_ids must be a sequence of ints, got "
                      f"{self.special_token_ids!r}")
    special = tuple(sorted({as_int("special_token_ids[]", t) for t in self.special_token_ids}))
    out_of_range = [t for t in special if not 0 <= t < vocab_size]
    if out_of_range:
      raise ValueError(f"MaskingConfig.special_token_ids {out_of_range} are outside "
                       f"[0, vocab_size={vocab_size})")
    if mask_token_id not in special:
      raise ValueError(f"MaskingConfig.mask_token_id={mask_token_id} must be one of "
                       f"special_token_ids {special} (it must never be selected or drawn)")
    if len(special) >= vocab_size:
      raise ValueError("MaskingConfig: every id is special, nothing is left to mask or draw")
    max_predictions = as_int("max_predictions_per_seq", self.max_predictions_per_seq)
    if max_predictions < 1:
      raise ValueError(f"MaskingConfig.max_predictions_per_seq must be >= 1, got {max_predictions}")
    mask_prob = as_prob("mask_prob", self.mask_prob, low_open=True)
    mask_token_prob = as_prob("mask_token_prob", self.mask_token_prob)
    random_token_prob = as_prob("random_token_prob", self.random_token_prob)
    if mask_token_prob + random_token_prob > 1.0 + 1e-9:
      raise ValueError(f"MaskingConfig: mask_token_prob + random_token_prob = "
                       f"{mask_token_prob} + {random_token_prob} > 1")
    if not isinstance(self.whole_word_masking, (bool, np.bool_)):
      raise TypeError(f"MaskingConfig.whole_word_masking must be a bool, got "
                      f"{self.whole_word_masking!r}")
    if self.count_rule not in COUNT_RULES:
      raise ValueError(f"MaskingConfig.count_rule={self.count_rule!r}: use one of {COUNT_RULES}")
    if self.count_rule == "bernoulli" and self.whole_word_masking:
      raise ValueError("MaskingConfig: count_rule 'bernoulli' masks tokens one by one; "
                       "whole_word_masking needs 'round'")
    # Normalised values (plain Python types) keep equal configs equal and hashable.
    for name, value in (("vocab_size", vocab_size), ("mask_token_id", mask_token_id),
                        ("special_token_ids", special), ("mask_prob", mask_prob),
                        ("max_predictions_per_seq", max_predictions),
                        ("mask_token_prob", mask_token_prob),
                        ("random_token_prob", random_token_prob),
                        ("whole_word_masking", bool(self.whole_word_masking))):
      object.__setattr__(self, name, value)

  @classmethod
  def from_config(cls, masking_cfg: ml_collections.ConfigDict, vocab_size: int,
                  mask_token_id: int, special_token_ids, unk_token_id: int) -> "MaskingConfig":
    """Builds the policy from the `config.masking` section plus the vocabulary's ids: all of its
    special ids (`Vocab.special_ids`) but [UNK] become the never-masked control tokens."""
    return cls(
        vocab_size=vocab_size,
        mask_token_id=mask_token_id,
        special_token_ids=tuple(t for t in special_token_ids if t != unk_token_id),
        mask_prob=masking_cfg.mask_prob,
        max_predictions_per_seq=masking_cfg.max_predictions_per_seq,
        mask_token_prob=masking_cfg.mask_token_prob,
        random_token_prob=masking_cfg.random_token_prob,
        whole_word_masking=masking_cfg.whole_word_masking,
    )


def example_targets(n_eligible: int, mask_prob: float) -> int:
  """Targets of one example with `n_eligible` maskable tokens before the cap P: the original's
  max(1, round(n * mask_prob)) with Python's float64 `round` (half to even, as the original under
  Python 3); 0 eligible tokens give 0 targets."""
  return max(1, int(round(n_eligible * mask_prob))) if n_eligible else 0


def _num_to_predict_table(length: int, config: MaskingConfig) -> np.ndarray:
  """[length + 1] int32: targets of an example for each count of eligible tokens (capped at P)."""
  return np.asarray([min(config.max_predictions_per_seq, example_targets(n, config.mask_prob))
                     for n in range(length + 1)], np.int32)


def _selected(select_key: jax.Array, hit_key: jax.Array, eligible: jax.Array,
              examples: "_Examples", config: MaskingConfig, rate: jax.Array | None,
              word_starts: jax.Array | None, segment_ids: jax.Array | None) -> jax.Array:
  """The one path from a masking rate to the selected positions [B, L] bool, whatever the
  rate's source: BERT's fixed `mask_prob`, a rate scheduled by step (mmBERT's 30% -> 15% ->
  5%) or a rate per position's example (masked diffusion's t; 0 on what must stay, a prompt).

  "round": each example's min(P, max(1, round(r n))) of its n eligible tokens (0 for none),
  chosen uniformly (or as whole words); the fixed rate reads the float64 table of the
  original, a traced rate rounds in float32 (half to even). "bernoulli": each eligible token
  on its own, when its uniform draw falls below its rate (MDLM / LLaDA), the first P of a row
  kept."""
  if config.count_rule == "bernoulli":
    rate = jnp.float32(config.mask_prob) if rate is None else jnp.asarray(rate, jnp.float32)
    hits = eligible & (jax.random.uniform(hit_key, eligible.shape, jnp.float32) < rate)
    return hits & (jnp.cumsum(hits, axis=1) <= config.max_predictions_per_seq)
  # Each position holds its example's eligible count and targets ([B, 1]: whole rows).
  n_eligible = examples.total(eligible.astype(jnp.int32))
  if rate is None:
    num_to_predict = jnp.asarray(_num_to_predict_table(eligible.shape[1], config))[n_eligible]
  else:
    count = jnp.maximum(1.0, jnp.round(n_eligible.astype(jnp.float32)
                                       * jnp.asarray(rate, jnp.float32))).astype(jnp.int32)
    num_to_predict = jnp.minimum(jnp.where(n_eligible > 0, count, 0),
                                 config.max_predictions_per_seq)
  if not config.whole_word_masking:
    return _select_tokens(select_key, eligible, num_to_predict, examples)
  if word_starts is None:
    raise ValueError("MaskingConfig.whole_word_masking=True needs word_starts [B, L] "
                     "(1 at the first piece of each word); got None")
  if word_starts.shape != eligible.shape:
    raise ValueError(f"word_starts shape {word_starts.shape} != input_ids shape "
                     f"{eligible.shape}")
  return _select_whole_words(select_key, eligible, word_starts, num_to_predict, segment_ids,
                             config.max_predictions_per_seq)


def stage_rate(step: jax.Array, stage_starts: tuple[int, ...],
               stage_rates: tuple[float, ...]) -> jax.Array:
  """f32 scalar: the rate of the last stage started by optimizer step `step` (`stage_starts`
  ascending, the first 0): mmBERT's inverse masking schedule, 30% in pretraining, 15% in
  mid-training, 5% in the decay phase, as stages of one run."""
  started = jnp.sum((jnp.asarray(step, jnp.int32) >= jnp.asarray(stage_starts, jnp.int32))
                    .astype(jnp.int32)) - 1
  return jnp.asarray(stage_rates, jnp.float32)[jnp.maximum(started, 0)]


@functools.lru_cache(maxsize=256)
def max_targets_per_row(mask_prob: float, seq_len: int, examples_per_row: int,
                        specials_per_example: int, min_example_length: int) -> int:
  """The most targets a row of `seq_len` tokens can need: the sum of `example_targets` over up
  to `examples_per_row` examples, each of >= `min_example_length` tokens of which
  `specials_per_example` are never eligible ([CLS] A [SEP] B [SEP]: 3 and 5), together <=
  `seq_len`. One example needs round(mask_prob x (seq_len - specials)); several can need more,
  as each has at least 1 and rounds on its own: at 0.15, L = 512, K = 16, fifteen 5-token
  examples and one of 437 tokens need 15 + 65 = 80 > round(0.15 x 509) = 76.

  Exact: with cost[t] the fewest tokens of an example worth >= t targets (targets never fall as
  an example grows), fewest[k][T] = the fewest tokens of at most k examples worth >= T in all;
  fewest[a + b] is the (min, +) convolution of fewest[a] and fewest[b], so k = K takes
  O(log K) convolutions.
  """
  def value(length: int) -> int:
    return example_targets(length - specials_per_example, mask_prob)

  if seq_len < min_example_length:
    return 0
  most = value(seq_len)  # The targets of one example filling the row.
  if examples_per_row == 1:
    return most
  top = int(mask_prob * seq_len) + examples_per_row + 1  # Each example: <= rate x tokens + 1.
  never = np.iinfo(np.int64).max // 4
  one = np.full(top + 1, never, np.int64)  # fewest[1]
  one[0], length = 0, min_example_length
  for t in range(1, most + 1):
    while value(length) < t:
      length += 1
    one[t] = length

  def convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.full(top + 1, never, np.int64)
    for u in np.flatnonzero(a <= seq_len):  # Totals beyond the row never come back under it.
      out[u:] = np.minimum(out[u:], a[u] + b[:top + 1 - u])
    return out

  fewest = np.full(top + 1, never, np.int64)
  fewest[0] = 0  # No example: 0 targets in 0 tokens.
  power, k = one, examples_per_row
  while k:
    if k & 1:
      fewest = convolve(fewest, power)
    k >>= 1
    if k:
      power = convolve(power, power)
  return int(np.flatnonzero(fewest <= seq_len).max())


class _Examples(NamedTuple):
  """The examples of each row: runs of equal `segment_ids` (contiguous, by the batch contract;
  padding is a run too, with nothing eligible), or the whole row when `index` is None. `total` /
  `minimum` give every position the sum / min of its example's values: [B, L] -> [B, L]
  ([B, 1] for whole rows). A scatter into per-example slots and a gather back: on CPU (B=256,
  L=512, K=16) the selection is 2.6x faster this way than with cumulative sums gathered at the runs'
  ends, and 1.4x faster than with a sort by example."""
  index: jax.Array | None  # [B, L] int32: the example of each position, 0, 1, ... along the row.

  @classmethod
  def of(cls, segment_ids: jax.Array | None) -> "_Examples":
    if segment_ids is None:
      return cls(None)
    starts = jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)),
                     constant_values=True)  # [B, L]
    return cls(jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1)

  def total(self, values: jax.Array) -> jax.Array:
    if self.index is None:
      return jnp.sum(values, axis=1, keepdims=True, dtype=values.dtype)  # [B, 1]
    sums = jnp.zeros(values.shape, values.dtype).at[self._rows(), self.index].add(values)
    return jnp.take_along_axis(sums, self.index, axis=1)  # [B, L]

  def minimum(self, values: jax.Array) -> jax.Array:
    if self.index is None:
      return jnp.min(values, axis=1, keepdims=True)  # [B, 1]
    lowest = jnp.full(values.shape, jnp.iinfo(values.dtype).max, values.dtype).at[
        self._rows(), self.index].min(values)
    return jnp.take_along_axis(lowest, self.index, axis=1)  # [B, L]

  def _rows(self) -> jax.Array:
    return jnp.arange(self.index.shape[0], dtype=jnp.int32)[:, None]  # [B, 1]


def _random_ranks(key: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """[B, N] uint32 random scores, distinct within a row and all >= 2**31 (0 can mark "none").

  The low bits hold the column index, so ties are impossible and a row's order is a uniformly
  random permutation up to the 2**-(31 - index bits) resolution of the random high bits.
  """
  index_bits = max(1, (shape[1] - 1).bit_length())
  if index_bits > 15:  # Keep >= 16 random bits.
    raise ValueError(f"rows of {shape[1]} tokens are too long for 32-bit random ranks")
  bits = jax.random.bits(key, shape, jnp.uint32)  # [B, N]
  column = jnp.arange(shape[1], dtype=jnp.uint32)[None, :]
  return jnp.uint32(1 << 31) | ((bits >> (index_bits + 1)) << index_bits) | column


def _kth_largest(scores: jax.Array, k: jax.Array, examples: _Examples) -> jax.Array:
  """scores [B, L] uint32, k [B, L] (or [B, 1] for whole rows) >= 1 -> the k-th largest score of
  each position's example, same shape as k.

  A bitwise binary search, highest bit first (32 counting passes over the row): on CPU it is
  several times faster than `lax.top_k` or a sort, and it is exact for distinct scores.
  """
  def try_bit(i, kth):  # kth: its bits above bit (31 - i) are final
    candidate = kth | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    count = examples.total((scores >= candidate).astype(jnp.int32))
    return jnp.where(count >= k, candidate, kth)

  return jax.lax.fori_loop(0, 32, try_bit, jnp.zeros(k.shape, jnp.uint32))


def _select_tokens(key: jax.Array, eligible: jax.Array, num_to_predict: jax.Array,
                   examples: _Examples) -> jax.Array:
  """Uniform choice of `num_to_predict` eligible positions per example -> selected [B, L] bool.

  The eligible positions with the `num_to_predict` largest distinct random scores of their
  example, i.e. the first ones of a random shuffle, as the original's `rng.shuffle(cand_indexes)`.
  """
  scores = jnp.where(eligible, _random_ranks(key, eligible.shape), jnp.uint32(0))  # [B, L]
  threshold = _kth_largest(scores, jnp.maximum(num_to_predict, 1), examples)
  # num_to_predict <= n_eligible, so the threshold is an eligible score (never 0).
  return eligible & (scores >= threshold) & (num_to_predict > 0)


def _select_whole_words(key: jax.Array, eligible: jax.Array, word_starts: jax.Array,
                        num_to_predict: jax.Array, segment_ids: jax.Array | None,
                        max_predictions: int) -> jax.Array:
  """Whole words of each example in random order, skipping any that would overshoot ->
  selected [B, L] bool.

  A word is an eligible start piece plus the eligible continuation pieces after it; an eligible
  piece right after an ineligible one starts a word even if `word_starts` is 0 there. Words never
  span examples ([CLS] and [SEP] are not eligible), so the row's word slots split into runs, one
  per example, and each example's room is its own `num_to_predict` ([B, L] per position, or
  [B, 1] for whole rows).
  """
  batch, length = eligible.shape
  rows = jnp.arange(batch, dtype=jnp.int32)[:, None]
  prev_eligible = jnp.pad(eligible, ((0, 0), (1, 0)))[:, :-1]  # [B, L]
  is_start = eligible & ((word_starts != 0) | ~prev_eligible)  # [B, L]
  word_index = jnp.cumsum(is_start, axis=1, dtype=jnp.int32) - 1  # [B, L]; -1 before 1st word
  # Pieces per word slot (0: no such word); ineligible tokens scatter out of range, dropped.
  word_length = jnp.zeros((batch, length), jnp.int32).at[
      rows, jnp.where(eligible, word_index, length)].add(1, mode="drop")  # [B, W=L]
  scores = _random_ranks(key, (batch, length))  # [B, W]; ascending = the shuffled word order
  if segment_ids is None:
    word_examples, room = _Examples.of(None), num_to_predict  # [B, 1]
  else:  # Each word slot takes its example's segment id and room; unused slots stay 0.
    slot = jnp.where(is_start, word_index, length)  # [B, L]; non-starts dropped
    word_examples = _Examples.of(jnp.zeros((batch, length), jnp.int32).at[rows, slot].set(
        segment_ids, mode="drop"))  # [B, W]
    room = jnp.zeros((batch, length), jnp.int32).at[rows, slot].set(
        jnp.broadcast_to(num_to_predict, (batch, length)), mode="drop")  # [B, W]

  # The original walks the shuffled words and takes each one that still fits
  # (`if len(masked_lms) + len(index_set) > num_to_predict: continue`). A word skipped once never
  # fits later (the room only shrinks), so taking, P times, the first untaken word of each
  # example in shuffled order that fits gives the same words; at most num_to_predict <= min(P, L)
  # words of an example are taken.
  def take_next(_, carry):
    taken, room = carry  # [B, W] bool, room per example
    fits = (word_length > 0) & ~taken & (word_length <= room)  # [B, W]
    first = word_examples.minimum(jnp.where(fits, scores, jnp.uint32(0xFFFFFFFF)))
    pick = fits & (scores == first)  # [B, W]; <= one word an example, scores are distinct
    return taken | pick, room - word_examples.total(jnp.where(pick, word_length, 0))

  word_taken, _ = jax.lax.fori_loop(0, min(max_predictions, length), take_next,
                                    (jnp.zeros((batch, length), jnp.bool_), room))
  token_taken = jnp.take_along_axis(word_taken, jnp.maximum(word_index, 0), axis=1)  # [B, L]
  return eligible & token_taken


def _nth_non_special(index: jax.Array, special_ids: tuple[int, ...]) -> jax.Array:
  """Maps index in [0, V - n_special) to the index-th non-special id, without a table or rejection.

  Walking the sorted specials, each one at or below the running id pushes it up by one.
  """
  token = index
  for special in special_ids:
    token = token + (token >= special).astype(token.dtype)
  return token


@functools.partial(jax.jit, static_argnames=("config",))
def mask_tokens(rng: jax.Array, input_ids: jax.Array, config: MaskingConfig,
                word_starts: jax.Array | None = None,
                segment_ids: jax.Array | None = None,
                rate: jax.Array | None = None) -> dict[str, jax.Array]:
  """Corrupts a batch for MLM; `config` is static, everything else traced.

  Args:
    rng: a PRNG key (one per call; derive per-step keys with `jax.random.fold_in`).
    input_ids: [B, L] int token ids ([L] also works, e.g. under vmap over rows).
    config: the `MaskingConfig` (hashable, so equal configs share one compilation).
    word_starts: [B, L], 1 at the first piece of each word; needed when whole_word_masking.
    segment_ids: [B, L], k on the tokens of a row's k-th example (each example a contiguous
      run), 0 on padding; each example gets its own count of targets. None: a row is one example.
    rate: the masking rate, traced: a scalar (a step's rate, `stage_rate`), or each position's
      example's rate ([B, L]; masked diffusion's t per example). None: `config.mask_prob`,
      whose "round" counts come from an exact float64 table (google-research/bert's).

  Returns:
    dict with `input_ids` [B, L] int32 (corrupted), `masked_lm_positions` [B, P] int32 (ascending,
    0 in unused slots), `masked_lm_ids` [B, P] int32 (original tokens, 0 in unused slots) and
    `masked_lm_weights` [B, P] float32 (1.0 for a target, 0.0 for an unused slot), P =
    `config.max_predictions_per_seq`. A row whose examples need more than P targets in all
    (which the config check on P rules out) keeps its first P selected positions.
  """
  if input_ids.ndim == 1:  # One row (e.g. vmapped over rows): add and drop a batch axis.
    row_starts = None if word_starts is None else word_starts[None]
    row_segments = None if segment_ids is None else segment_ids[None]
    row_rate = None if rate is None or jnp.ndim(rate) == 0 else jnp.asarray(rate)[None]
    out = mask_tokens(rng, input_ids[None], config, row_starts, row_segments, row_rate)
    return {name: value[0] for name, value in out.items()}
  if input_ids.ndim != 2:
    raise ValueError(f"input_ids must be [B, L] (or [L]), got shape {input_ids.shape}")
  if segment_ids is not None and segment_ids.shape != input_ids.shape:
    raise ValueError(f"segment_ids shape {segment_ids.shape} != input_ids shape "
                     f"{input_ids.shape}")
  input_ids = input_ids.astype(jnp.int32)  # [B, L]
  batch, length = input_ids.shape
  num_slots = config.max_predictions_per_seq  # P
  select_key, category_key, token_key = jax.random.split(rng, 3)

  special = jnp.asarray(config.special_token_ids, jnp.int32)
  eligible = ~jnp.isin(input_ids, special)  # [B, L]; padding is one of the specials, [UNK] not
  segment_ids = None if segment_ids is None else segment_ids.astype(jnp.int32)
  examples = _Examples.of(segment_ids)
  selected = _selected(select_key, jax.random.fold_in(rng, COUNT_STREAM), eligible, examples,
                       config, rate, word_starts, segment_ids)  # [B, L]

  # Slot j of a row holds its j-th selected position (ascending, as the original sorts its
  # masked_lms by index; a packed row's examples one after another); unused slots keep the
  # sentinel L.
  slot = jnp.cumsum(selected, axis=1, dtype=jnp.int32) - 1  # [B, L]
  rows = jnp.arange(batch, dtype=jnp.int32)[:, None]
  positions = jnp.full((batch, num_slots), length, jnp.int32).at[
      rows, jnp.where(selected, slot, num_slots)].set(
          jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)),
          mode="drop")  # [B, P]
  used = positions < length  # [B, P]
  masked_lm_positions = jnp.where(used, positions, 0)  # [B, P]
  masked_lm_ids = jnp.where(
      used, jnp.take_along_axis(input_ids, masked_lm_positions, axis=1), 0)  # [B, P]

  # The 80/10/10 draw, per selected token, from keys independent of the selection.
  draw = jax.random.uniform(category_key, (batch, num_slots), jnp.float32)  # [B, P]
  to_mask = draw < config.mask_token_prob
  to_random = ~to_mask & (draw < config.mask_token_prob + config.random_token_prob)
  num_allowed = config.vocab_size - len(config.special_token_ids)
  random_ids = _nth_non_special(
      jax.random.randint(token_key, (batch, num_slots), 0, num_allowed, jnp.int32),
      config.special_token_ids)  # [B, P]
  new_ids = jnp.where(to_mask, jnp.int32(config.mask_token_id),
                      jnp.where(to_random, random_ids, masked_lm_ids))  # [B, P]
  # Unused slots point past the end and are dropped, so they never touch position 0.
  corrupted = input_ids.at[rows, positions].set(new_ids, mode="drop")  # [B, L]

  return {
      "input_ids": corrupted,
      "masked_lm_positions": masked_lm_positions,
      "masked_lm_ids": masked_lm_ids,
      "masked_lm_weights": used.astype(jnp.float32),
  }
