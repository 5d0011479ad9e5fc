"""Rows of `max_seq_length` tokens: the record layout, NSP examples packed into rows, and
RoBERTa's FULL-SENTENCES rows.

Every prepared record is one ROW (the WORKSPACE batch contract, one row of it):

* token features, [L] each: `input_ids`, `token_type_ids` (0 for [CLS] A [SEP], 1 for B [SEP] of
  each example, 0 on padding), `segment_ids` (k for the k-th example of the row, from 1; 0 on
  padding), `position_ids` (restarting at 0 at each example's [CLS]; 0 on padding),
  `word_starts` (1 at the first piece of a word; 0 on continuation pieces, specials, padding);
* slot features, [K] each (K = the dataset's examples per row): `cls_positions` (row position of
  each example's [CLS]), `next_sentence_label` (0 real continuation, 1 random), `nsp_weights` (1
  for a real example; stored as 0/1 integers, read as float32); 0 in every unused slot.

Objective "mlm_nsp": a row holds up to K NSP examples ([CLS] A [SEP] B [SEP] each), chosen by
`pack` (best fit decreasing) from a block's shuffled examples; K = 1 is the unpacked layout.
Objective "mlm": a row is one FULL-SENTENCES sequence ([CLS] text [SEP], `full_sentence_rows`:
the documents' contiguous text cut into full rows, [SEP] between documents), K = 1, with
`nsp_weights` 0 so that the NSP loss and its count are 0. `examples_per_row` is that rule, the
one place it is written.

The types rows are made of (`Segment`, `Document`, `Instance`, `SentencesRow`) live here, so
that the modules building rows (`nsp`, `blocks`, `records`) import this one and never the
reverse. Imported by the preparation worker processes: it stays free of TFDS / JAX / numpy.
"""

import bisect
from collections.abc import Sequence
from typing import NamedTuple

# "mlm_nsp": BERT's NSP pairs, packed K to a row; "mlm": RoBERTa's FULL-SENTENCES rows.
OBJECTIVES = ("mlm_nsp", "mlm")
# config.data.objective -> the rows it trains on (the format a prepared dataset records):
# replaced-token detection (`tasks/rtd.py`) reads MLM's rows, with NSP ("rtd_nsp") or without;
# masked diffusion (`tasks/diffusion.py`) reads MLM's rows.
ROW_FORMATS = {"mlm_nsp": "mlm_nsp", "mlm": "mlm", "rtd": "mlm", "rtd_nsp": "mlm_nsp",
               "diffusion": "mlm"}


def row_format(objective: str) -> str:
  """The rows (one of OBJECTIVES) of a training objective (a key of ROW_FORMATS)."""
  if objective not in ROW_FORMATS:
    raise ValueError(f"objective={objective!r} is not one of {tuple(ROW_FORMATS)}")
  return ROW_FORMATS[objective]
TOKEN_FEATURES = ("input_ids", "token_type_ids", "segment_ids", "position_ids", "word_starts")
SLOT_FEATURES = ("cls_positions", "next_sentence_label", "nsp_weights")
NSP_WEIGHTS = "nsp_weights"  # The one float32 feature of a batch (0/1 integers in the records).

# A tokenized sentence: (piece ids, word-start flags), equal lengths.
Segment = tuple[list[int], list[int]]
Document = list[Segment]


class Instance(NamedTuple):
  """One NSP pair before padding (the original's `TrainingInstance`, without masking)."""

  ids_a: list[int]
  word_starts_a: list[int]
  ids_b: list[int]
  word_starts_b: list[int]
  is_random_next: bool
  target_seq_length: int  # The target drawn for the document (< max_num_tokens: short).


def examples_per_row(objective: str, max_examples_per_row: int) -> int:
  """K, the [K] slots of every row: `max_examples_per_row` NSP examples for "mlm_nsp"; one
  sequence for "mlm", whatever `max_examples_per_row` says (a FULL-SENTENCES row is one
  segment)."""
  return 1 if objective == "mlm" else max_examples_per_row


def example_specials(objective: str) -> tuple[int, int]:
  """(tokens of an example that are never masked, fewest tokens of an example) in an objective's
  rows: [CLS] A [SEP] B [SEP] with A and B non-empty for "mlm_nsp" (3, 5); [CLS] text [SEP] for
  "mlm" (2, 3). Masking gives each example its own count of targets, so the most a row can need
  (`masking.max_targets_per_row`, the check on max_predictions_per_seq) depends on them."""
  return (2, 3) if objective == "mlm" else (3, 5)


def pack(lengths: Sequence[int], capacity: int, max_per_row: int) -> list[list[int]]:
  """Best-fit-decreasing bin packing: item indices grouped into rows.

  Items go longest first (ties in index order) into the open row with the least room that still
  holds them, or a new row; a row with `max_per_row` items is closed. Every item is in exactly
  one row; a row's lengths sum to at most `capacity`. The output is deterministic: each row's
  indices ascending, rows ordered by their first index, so a shuffled input gives rows in a
  shuffled order (a row's place does not depend on its items' lengths).

  Raises ValueError for an item of length < 1 or > capacity (naming it), or capacity /
  max_per_row < 1.
  """
  if capacity < 1 or max_per_row < 1:
    raise ValueError(f"pack: capacity={capacity} and max_per_row={max_per_row} must be >= 1")
  for i, length in enumerate(lengths):
    if not 1 <= length <= capacity:
      raise ValueError(f"pack: item {i} has length {length}, outside [1, {capacity}] (a row's "
                       "capacity)")
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # Stable: ties by index.
  rows: list[list[int]] = []
  # Rows still open for items, by room left: room -> row numbers (a stack), and the sorted
  # distinct rooms, so the best fit for a length n is the first room >= n (bisect).
  open_rows: dict[int, list[int]] = {}
  rooms: list[int] = []
  for i in order:
    length = lengths[i]
    j = bisect.bisect_left(rooms, length)
    if j < len(rooms):
      room = rooms[j]
      stack = open_rows[room]
      row = stack.pop()
      if not stack:
        del open_rows[room]
        del rooms[j]
      rows[row].append(i)
    else:
      room, row = capacity, len(rows)
      rows.append([i])
    room -= length
    if room and len(rows[row]) < max_per_row:
      stack = open_rows.get(room)
      if stack is None:
        stack = open_rows[room] = []
        bisect.insort(rooms, room)
      stack.append(row)
  for row in rows:
    row.sort()
  rows.sort(key=lambda row: row[0])
  return rows


def instance_length(instance: Instance) -> int:
  """Tokens of one NSP example in a row: [CLS] A [SEP] B [SEP]."""
  return len(instance.ids_a) + len(instance.ids_b) + 3


def nsp_row_features(
    instances: Sequence[Instance], max_seq_length: int, max_examples_per_row: int,
    cls_id: int, sep_id: int, pad_id: int,
) -> dict[str, list[int]]:
  """The record layout (lists) of a row holding `instances` in order, padded to L and K.

  The reference layout: `records.RecordSerializer` writes the same values as bytes.
  """
  if not 1 <= len(instances) <= max_examples_per_row:
    raise ValueError(f"a row holds 1 to {max_examples_per_row} examples, got {len(instances)}")
  features: dict[str, list[int]] = {name: [] for name in (*TOKEN_FEATURES, *SLOT_FEATURES)}
  for k, instance in enumerate(instances, start=1):
    len_a, len_b = len(instance.ids_a), len(instance.ids_b)
    length = len_a + len_b + 3
    features["cls_positions"].append(len(features["input_ids"]))
    features["next_sentence_label"].append(1 if instance.is_random_next else 0)
    features[NSP_WEIGHTS].append(1)
    features["input_ids"] += [cls_id, *instance.ids_a, sep_id, *instance.ids_b, sep_id]
    features["token_type_ids"] += [0] * (len_a + 2) + [1] * (len_b + 1)
    features["segment_ids"] += [k] * length
    features["position_ids"] += range(length)
    features["word_starts"] += [0, *instance.word_starts_a, 0, *instance.word_starts_b, 0]
  _pad(features, max_seq_length, max_examples_per_row, pad_id)
  return features


def _pad(features: dict[str, list[int]], max_seq_length: int, num_slots: int,
         pad_id: int) -> None:
  num_pad = max_seq_length - len(features["input_ids"])
  if num_pad < 0:
    raise ValueError(f"a row of {len(features['input_ids'])} tokens exceeds "
                     f"max_seq_length={max_seq_length}")
  for name in TOKEN_FEATURES:
    features[name] += [pad_id if name == "input_ids" else 0] * num_pad
  for name in SLOT_FEATURES:
    features[name] += [0] * (num_slots - len(features[name]))


# ---------------------------------------------------------------- FULL-SENTENCES (objective mlm)


class SentencesRow(NamedTuple):
  """One FULL-SENTENCES row without its [CLS] and final [SEP]: the pieces in between, a [SEP]
  between documents included (word start 0 there)."""

  ids: list[int]
  word_starts: list[int]


def full_sentence_rows(
    documents: Sequence[Document], max_seq_length: int, sep_id: int
) -> tuple[list[SentencesRow], int]:
  """RoBERTa's FULL-SENTENCES rows of `documents` (in the order given): (rows, sentences cut).

  The documents' text as one contiguous stream, sentence after sentence and document after
  document, with a [SEP] between two documents that meet inside a row; the stream is cut into
  rows of exactly L - 2 tokens ([CLS] ... [SEP] around them), so every row but the last is
  full. A sentence that reaches a row's end continues at the start of the next one (counted in
  the second return value); a document boundary that falls on a row boundary needs no [SEP].
  """
  capacity = max_seq_length - 2  # [CLS] and the final [SEP].
  if capacity < 1:
    raise ValueError(f"max_seq_length={max_seq_length}: a row needs at least 3 tokens")
  rows: list[SentencesRow] = []
  ids: list[int] = []
  word_starts: list[int] = []
  num_cut = 0
  for document in documents:
    for s, (sentence_ids, sentence_starts) in enumerate(document):
      if s == 0 and ids:  # A new document inside an open row.
        ids.append(sep_id)
        word_starts.append(0)
      start = 0
      while start < len(sentence_ids):
        if len(ids) == capacity:
          rows.append(SentencesRow(ids, word_starts))
          ids, word_starts = [], []
          num_cut += start > 0
        take = min(capacity - len(ids), len(sentence_ids) - start)
        ids.extend(sentence_ids[start:start + take])
        word_starts.extend(sentence_starts[start:start + take])
        start += take
      if len(ids) == capacity:
        rows.append(SentencesRow(ids, word_starts))
        ids, word_starts = [], []
  if ids:
    rows.append(SentencesRow(ids, word_starts))
  return rows, num_cut


def sentences_row_length(row: SentencesRow) -> int:
  """Tokens of a FULL-SENTENCES row: [CLS] ... [SEP]."""
  return len(row.ids) + 2


def sentences_row_features(
    row: SentencesRow, max_seq_length: int, cls_id: int, sep_id: int, pad_id: int
) -> dict[str, list[int]]:
  """The record layout (lists) of a FULL-SENTENCES row: one segment, positions 0..n-1, token
  types 0, one slot ([CLS] at 0, label 0, weight 0: no NSP)."""
  length = len(row.ids) + 2
  features = {
      "input_ids": [cls_id, *row.ids, sep_id],
      "token_type_ids": [0] * length,
      "segment_ids": [1] * length,
      "position_ids": list(range(length)),
      "word_starts": [0, *row.word_starts, 0],
      "cls_positions": [0],
      "next_sentence_label": [0],
      NSP_WEIGHTS: [0],
  }
  _pad(features, max_seq_length, 1, pad_id)
  return features
