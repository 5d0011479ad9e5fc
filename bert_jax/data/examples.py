"""NSP example construction, as google-research/bert `create_pretraining_data.py`.

`create_instances_from_document` and the truncation follow the original step for step (same
random draws in the same order, minus the MLM masking, which bert_jax does on the fly inside the
jitted step). What differs is where the documents come from, so that memory stays flat with
corpus size:

* The original reads the whole corpus into memory, shuffles the documents and draws each
  random-next segment B from a document of the corpus other than A's (ten tries, so a corpus of
  very few documents can still hand it A's own text, labelled random). Here the document stream
  is cut into blocks of about `block_chars` characters (thousands of documents) and B comes from
  another document of the same block: the original's ten draws, then, where all ten hit A's
  document, one draw among the block's other documents. A block of one document (a split's last
  block, or a document of `block_chars` or more) draws B from the documents of its split's
  previous block (block 0: of the next block). Documents are drawn uniformly in every case; with
  thousands of documents per block the examples are statistically the same.
* So B never comes from A's document. A split of a single document has no other document to
  draw from: a chunk that would get a random B gets its real continuation (label 0) instead, or
  no example when it is one sentence (`BlockStats.random_next_to_continuation`,
  `random_next_skipped`).
* Each (split, dupe pass, block) has its own RNG seeded from (seed, split, pass, block index),
  so the output depends on the seed and the corpus only, never on the number of workers.
* The original shuffles all instances at the end. Here each block's instances (all dupe passes)
  are shuffled with a seed of the block (`rows_seed`), then packed into rows of up to K
  examples (`packing.pack`, best fit decreasing; K = `max_examples_per_row`, 1 = one example a
  row); grain shuffles the rows globally at read time.
* Objective "mlm" (RoBERTa's FULL-SENTENCES, no NSP) cuts the block's contiguous text into full
  rows instead (`packing.full_sentence_rows`); each dupe pass takes the block's documents in its own
  seeded order, so the passes' rows differ (other neighbours, other row boundaries).
* Documents go to the `validation` split by a hash of their text (`is_validation_document`), so a
  duplicated document never lands in both splits.

As in the original, a chunk of a single sentence always gets a random B, so the random-next share
is 50% only for long documents: short documents, or a short target drawn for a document (which
makes every chunk one sentence), push it up (~55% for documents of 60-90 sentences with
short_seq_prob=0.1, ~61% on the docstring corpus). `BlockStats.random_next` reports it.

This module is imported by the preparation worker processes: it stays free of TFDS / JAX.
"""

import dataclasses
import hashlib
import itertools
import multiprocessing
import multiprocessing.pool
import os
import pickle
import random
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from bert_jax.data import packing
from bert_jax.varint import encode_varint

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
# "mlm_nsp": BERT's NSP pairs, packed K to a row; "mlm": RoBERTa's FULL-SENTENCES rows.
OBJECTIVES = ("mlm_nsp", "mlm")

# A tokenized sentence: (piece ids, word-start flags), equal lengths.
Segment = tuple[list[int], list[int]]
Document = list[Segment]


class Tokenizer(Protocol):
  """What example construction needs from a `bert_jax.data.vocab.Vocab`."""

  size: int
  pad_id: int
  cls_id: int
  sep_id: int

  def encode_with_word_starts(self, text: str) -> tuple[list[int], list[int]]:
    ...


class Instance(NamedTuple):
  """One NSP pair before padding (the original's `TrainingInstance`, without masking)."""

  ids_a: list[int]
  word_starts_a: list[int]
  ids_b: list[int]
  word_starts_b: list[int]
  is_random_next: bool
  target_seq_length: int  # The target drawn for the document (< max_num_tokens: short).


@dataclasses.dataclass
class BlockStats:
  """Counts over what one or more blocks produced."""

  documents: int = 0
  sentences: int = 0
  chars: int = 0
  tokens: int = 0
  rows: int = 0  # Records written, max_seq_length tokens each.
  examples: int = 0  # NSP examples in those rows; objective "mlm": rows (one sequence each).
  random_next: int = 0
  short_target: int = 0  # Examples from a document whose target length was drawn short.
  real_tokens: int = 0  # Non-padding tokens over all rows, specials included.
  sentences_cut: int = 0  # Objective "mlm": sentences longer than a row, cut across rows.
  # Random-next B drawn from a neighbouring block's documents (the block held one document).
  random_next_neighbour: int = 0
  # Chunks that drew random-next with no other document in reach (a split of one document):
  # given their real continuation (label 0) instead, or dropped when they had one sentence.
  random_next_to_continuation: int = 0
  random_next_skipped: int = 0

  def add(self, other: "BlockStats") -> None:
    for field in dataclasses.fields(self):
      setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def tokenize_documents(
    documents: Sequence[Sequence[str]], tokenizer: Tokenizer
) -> list[Document]:
  """Tokenizes documents (lists of sentences); sentences without tokens are dropped.

  With a tokenizer that has `encode_batch` + `word_starts` (a `Vocab`), all sentences go through
  one backend call and one word-start lookup: per-call overhead dominates on short sentences.
  Word starts must be 0/1 (ints or bools).
  """
  sentences = [sentence for document in documents for sentence in document]
  if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "word_starts"):
    all_ids = tokenizer.encode_batch(sentences)
    lengths = np.fromiter(map(len, all_ids), dtype=np.int64, count=len(all_ids))  # [S]
    flat_ids = np.fromiter(itertools.chain.from_iterable(all_ids), dtype=np.int64,
                           count=int(lengths.sum()))  # [T]
    flat_starts = np.asarray(tokenizer.word_starts(flat_ids), dtype=np.int64)  # [T]
    # The lookup over the concatenation only knows the first piece of the first sentence; as
    # `Vocab.word_starts`, each sentence's first piece starts a word unless it is a special.
    offsets = np.cumsum(lengths) - lengths  # [S]
    firsts = offsets[lengths > 0]
    no_start = sorted(set(tokenizer.special_ids) - {tokenizer.unk_id})
    firsts = firsts[~np.isin(flat_ids[firsts], no_start)]
    flat_starts[firsts] = 1
    starts_list = flat_starts.tolist()
    pairs = [(ids, starts_list[o:o + len(ids)]) for ids, o in zip(all_ids, offsets.tolist())]
  else:
    pairs = [tokenizer.encode_with_word_starts(sentence) for sentence in sentences]
  tokenized, start = [], 0
  for document in documents:
    segments = pairs[start:start + len(document)]
    start += len(document)
    tokenized.append([segment for segment in segments if len(segment[0])])
  return tokenized


def truncation_bounds(
    len_a: int, len_b: int, max_num_tokens: int, rng: random.Random
) -> tuple[int, int, int, int]:
  """The original `truncate_seq_pair` as index bounds: (a_start, a_end, b_start, b_end).

  While the pair is too long, one token goes from the longer side (B on a tie), from the front or
  the back with probability 1/2 each: the same draws as the original, without O(n) list pops.
  """
  a_start, a_end, b_start, b_end = 0, len_a, 0, len_b
  while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
    if a_end - a_start > b_end - b_start:
      if rng.random() < 0.5:
        a_start += 1
      else:
        a_end -= 1
    else:
      if rng.random() < 0.5:
        b_start += 1
      else:
        b_end -= 1
  return a_start, a_end, b_start, b_end


def truncate_seq_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
) -> tuple[list[int], list[int]]:
  """Returns the truncated copies of `tokens_a`, `tokens_b` (the original's semantics)."""
  a0, a1, b0, b1 = truncation_bounds(len(tokens_a), len(tokens_b), max_num_tokens, rng)
  return tokens_a[a0:a1], tokens_b[b0:b1]


def _concat(segments: Iterable[Segment]) -> tuple[list[int], list[int]]:
  ids: list[int] = []
  word_starts: list[int] = []
  for segment_ids, segment_word_starts in segments:
    ids.extend(segment_ids)
    word_starts.extend(segment_word_starts)
  return ids, word_starts


def _draw_random_document(
    all_documents: Sequence[Document],
    document_index: int,
    other_documents: Sequence[Document],
    stats: BlockStats | None,
    rng: random.Random,
) -> Document | None:
  """The document a random-next B comes from: never A's own; None when there is no other.

  First the original's ten tries over `all_documents` (the same draws). Where all ten hit A's
  document, the original takes it anyway and labels A's own text random; here one more draw picks
  uniformly among the other documents of `all_documents` or, when A's is the only one, among
  `other_documents` (a neighbouring block's).
  """
  # Ten tries to avoid the same document, as the original (blocks hold thousands).
  for _ in range(10):
    random_document_index = rng.randint(0, len(all_documents) - 1)
    if random_document_index != document_index:
      return all_documents[random_document_index]
  if len(all_documents) > 1:  # (1/n)^10 odds: only blocks of very few documents get here.
    random_document_index = rng.randint(0, len(all_documents) - 2)
    return all_documents[random_document_index + (random_document_index >= document_index)]
  if other_documents:
    if stats is not None:
      stats.random_next_neighbour += 1
    return other_documents[rng.randint(0, len(other_documents) - 1)]
  return None


def create_instances_from_document(
    all_documents: Sequence[Document],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    other_documents: Sequence[Document] = (),
    stats: BlockStats | None = None,
) -> list[Instance]:
  """NSP instances of one document; B's random documents come from `all_documents`.

  A random-next B never comes from A's own document: when A's is the only document of
  `all_documents`, B comes from `other_documents` (a neighbouring block's documents). With neither,
  a chunk the original would give a random B gets its real continuation (label 0) when it has two
  sentences or more, and makes no example when it has one; `stats` counts both
  (`random_next_to_continuation`, `random_next_skipped`) and the draws from `other_documents`
  (`random_next_neighbour`).
  """
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP].
  # Drawn once per document, as the original: short documents give more (short) examples.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)

  instances = []
  current_chunk: list[Segment] = []
  current_length = 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment[0])
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        ids_a, word_starts_a = _concat(current_chunk[:a_end])

        random_document: Document | None = None
        is_random_next = len(current_chunk) == 1 or rng.random() < 0.5
        if is_random_next:
          random_document = _draw_random_document(
              all_documents, document_index, other_documents, stats, rng)
          # With no document but A's in reach (a split of one document), labelling A's own text
          # random would teach NSP a wrong answer: the chunk gets its real continuation, or no
          # example when it has none (one sentence).
          is_random_next = random_document is not None
          if not is_random_next and stats is not None:
            if len(current_chunk) == 1:
              stats.random_next_skipped += 1
            else:
              stats.random_next_to_continuation += 1

        if is_random_next:
          target_b_length = target_seq_length - len(ids_a)
          random_start = rng.randint(0, len(random_document) - 1)
          ids_b: list[int] = []
          word_starts_b: list[int] = []
          for j in range(random_start, len(random_document)):
            ids_b.extend(random_document[j][0])
            word_starts_b.extend(random_document[j][1])
            if len(ids_b) >= target_b_length:
              break
          # The chunk's unused sentences are "put back" for the next instance.
          i -= len(current_chunk) - a_end
        else:
          ids_b, word_starts_b = _concat(current_chunk[a_end:])

        if ids_b:  # Empty only for a one-sentence chunk that could not get a random B.
          a0, a1, b0, b1 = truncation_bounds(len(ids_a), len(ids_b), max_num_tokens, rng)
          assert a1 > a0 and b1 > b0
          instances.append(Instance(
              ids_a[a0:a1], word_starts_a[a0:a1], ids_b[b0:b1], word_starts_b[b0:b1],
              is_random_next, target_seq_length))
      current_chunk = []
      current_length = 0
    i += 1
  return instances


# ---------------------------------------------------------------- record serialization


_SMALL_VARINTS = [encode_varint(i) for i in range(1 << 14)]


def _varint(value: int) -> bytes:
  return _SMALL_VARINTS[value] if value < 16384 else encode_varint(value)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
  return tag + _varint(len(payload)) + payload


class EncodedPair(NamedTuple):
  """An NSP instance as record bytes: what a row needs of it, ~3 bytes a token (an `Instance`
  holds ~18 in lists), so a whole block's examples fit in memory until they are packed."""

  ids: bytes  # Varints of [CLS] A [SEP] B [SEP].
  word_starts: bytes  # 0/1 bytes, specials included (0).
  len_a: int
  len_b: int
  is_random_next: bool


class EncodedSentences(NamedTuple):
  """A FULL-SENTENCES row as record bytes ([CLS] and the final [SEP] included)."""

  ids: bytes  # Varints.
  word_starts: bytes  # 0/1 bytes.
  length: int  # Tokens.


class RecordSerializer:
  """Writes one row as a serialized `tf.train.Example` (the TFDS record format).

  Two steps: `encode_pair` / `encode_sentences` turn an example into its bytes once, as it is
  built (compact, see `EncodedPair`); `serialize_pairs` / `serialize_sentences` join a row's.
  The protobuf wire format is assembled by hand: 3-4x faster than building proto objects, and
  no TensorFlow. Every feature is an int64 list (TFDS stores int32 tensors that way,
  `nsp_weights` included: 0/1). Values below 128 are their own one-byte varints, so the 0/1 and
  small-int features are byte strings (slices of precomputed ones); token ids go through a
  per-id varint table. Tests decode the bytes with the TFDS features of `tfds_builder` and
  compare with `packing.nsp_row_features` / `packing.sentences_row_features`.
  """

  def __init__(self, max_seq_length: int, max_examples_per_row: int, vocab_size: int, *,
               pad_id: int, cls_id: int, sep_id: int):
    self.max_seq_length, self.num_slots = max_seq_length, max_examples_per_row
    self._varints = [_varint(i) for i in range(max(vocab_size, 2))]
    self._pad, self._cls, self._sep = (self._varints[pad_id], self._varints[cls_id],
                                       self._varints[sep_id])
    self._names = (*packing.TOKEN_FEATURES, *packing.SLOT_FEATURES)
    self._keys = {name: _length_delimited(b"\x0a", name.encode()) for name in self._names}
    # Per feature: payload length -> the framing bytes before the payload.
    self._prefixes: list[dict[int, bytes]] = [{} for _ in self._names]
    length = max_seq_length
    self._zeros, self._ones = bytes(length), b"\x01" * length
    # Segment ids 0..K as varints; the positions 0..L-1 as varint bytes cut by length.
    self._segment_ids = [_varint(k) for k in range(max_examples_per_row + 1)]
    self._positions = b"".join(_varint(i) for i in range(length))
    self._position_ends = [0]
    for i in range(length):
      self._position_ends.append(self._position_ends[-1] + len(_varint(i)))

  def encode_pair(self, instance: Instance) -> EncodedPair:
    """An NSP instance's bytes ([CLS] A [SEP] B [SEP]), ready for `serialize_pairs`."""
    varints, sep = self._varints, self._sep
    try:  # A list comprehension per side: the fastest per-token lookup here.
      ids = b"".join([self._cls, *[varints[t] for t in instance.ids_a], sep,
                      *[varints[t] for t in instance.ids_b], sep])
    except IndexError as e:
      raise ValueError(f"token id outside [0, {len(varints)}) (vocab size)") from e
    word_starts = b"".join([b"\x00", bytes(instance.word_starts_a), b"\x00",
                            bytes(instance.word_starts_b), b"\x00"])
    return EncodedPair(ids, word_starts, len(instance.ids_a), len(instance.ids_b),
                       bool(instance.is_random_next))

  def encode_sentences(self, row: packing.SentencesRow) -> EncodedSentences:
    """A FULL-SENTENCES row's bytes ([CLS] ... [SEP]), ready for `serialize_sentences`."""
    varints = self._varints
    try:
      ids = b"".join([self._cls, *[varints[t] for t in row.ids], self._sep])
    except IndexError as e:
      raise ValueError(f"token id outside [0, {len(varints)}) (vocab size)") from e
    return EncodedSentences(ids, b"".join([b"\x00", bytes(row.word_starts), b"\x00"]),
                            len(row.ids) + 2)

  def _example(self, payloads: Sequence[bytes]) -> bytes:
    """Example bytes of the packed payloads, in TOKEN_FEATURES then SLOT_FEATURES order."""
    parts = [b"\x0a", b""]  # Example.features, its length filled in below.
    size = 0
    for name, payload, prefixes in zip(self._names, payloads, self._prefixes):
      prefix = prefixes.get(len(payload))
      if prefix is None:  # The framing depends on the name and the payload's length only.
        int64_list = _length_delimited(b"\x0a", payload)  # Int64List.value (packed).
        feature = _length_delimited(b"\x1a", int64_list)  # Feature.int64_list.
        entry = self._keys[name] + _length_delimited(b"\x12", feature)  # map<string, Feature>
        prefix = prefixes[len(payload)] = _length_delimited(b"\x0a", entry)[:-len(payload)]
      parts += (prefix, payload)
      size += len(prefix) + len(payload)
    parts[1] = _varint(size)
    return b"".join(parts)

  def serialize_pairs(self, examples: Sequence[EncodedPair]) -> bytes:
    """Record bytes of a row holding `examples` in order (`packing.nsp_row_features`)."""
    num_examples = len(examples)
    if not 1 <= num_examples <= self.num_slots:
      raise ValueError(f"a row holds 1 to {self.num_slots} examples, got {num_examples}")
    zeros, ones, positions, ends = self._zeros, self._ones, self._positions, self._position_ends
    ids, types, segments, position_ids, word_starts, cls_positions, labels = (
        [], [], [], [], [], [], [])
    row_length = 0
    for k, (example_ids, example_starts, len_a, len_b, is_random_next) in enumerate(
        examples, start=1):
      length = len_a + len_b + 3
      if row_length + length > self.max_seq_length:
        raise ValueError(f"a row of {row_length + length}+ tokens exceeds max_seq_length="
                         f"{self.max_seq_length}")
      ids.append(example_ids)
      word_starts.append(example_starts)
      types += (zeros[:len_a + 2], ones[:len_b + 1])
      segments.append(self._segment_ids[k] * length)
      position_ids.append(positions[:ends[length]])
      cls_positions.append(_varint(row_length))
      labels.append(is_random_next)
      row_length += length
    num_pad = self.max_seq_length - row_length
    pad = zeros[:num_pad]
    empty = bytes(self.num_slots - num_examples)
    return self._example((
        b"".join(ids) + self._pad * num_pad, b"".join(types) + pad, b"".join(segments) + pad,
        b"".join(position_ids) + pad, b"".join(word_starts) + pad,
        b"".join(cls_positions) + empty, bytes(labels) + empty, ones[:num_examples] + empty))

  def serialize_sentences(self, row: EncodedSentences) -> bytes:
    """Record bytes of a FULL-SENTENCES row (`packing.sentences_row_features`)."""
    num_pad = self.max_seq_length - row.length
    if num_pad < 0:
      raise ValueError(f"a row of {row.length} tokens exceeds max_seq_length="
                       f"{self.max_seq_length}")
    pad = self._zeros[:num_pad]
    slots = bytes(self.num_slots)  # [CLS] at 0, label 0, weight 0 (no NSP).
    return self._example((
        row.ids + self._pad * num_pad, self._zeros, self._ones[:row.length] + pad,
        self._positions[:self._position_ends[row.length]] + pad, row.word_starts + pad,
        slots, slots, slots))


# ---------------------------------------------------------------- blocks


class DocumentBlock(NamedTuple):
  """A run of consecutive documents of one split: the unit of work and of random-next draws."""

  split: str
  index: int  # Block number within its split.
  documents: list[list[str]]
  # Only on a block of one document: the documents of a neighbouring block of the same split
  # (the previous one; the next one for block 0), where its random-next B come from. Empty
  # there only when the split holds that one document.
  neighbours: Sequence[list[str]] = ()


def is_validation_document(sentences: Sequence[str], validation_fraction: float) -> bool:
  """Deterministic split assignment from a hash of the document's text."""
  if validation_fraction <= 0.0:
    return False
  digest = hashlib.blake2b("\n".join(sentences).encode("utf-8", "replace"), digest_size=8)
  return int.from_bytes(digest.digest(), "little") < validation_fraction * 2.0**64


def iter_document_blocks(
    documents: Iterable[Sequence[str]], *, validation_fraction: float, block_chars: int
) -> Iterator[DocumentBlock]:
  """Cuts the document stream into per-split blocks of about `block_chars` characters.

  Blank sentences and documents without sentences are dropped. A block of a single document (a
  split's last block, or one document of `block_chars` or more) carries the documents of the
  split's previous block as `neighbours`; block 0 carries block 1's, so it is held back until
  block 1 is full. Per split, only the block being filled, the previous block and such a held
  block 0 are in memory. Blocks come in index order within a split (not across splits).
  """
  pending: dict[str, list[list[str]]] = {split: [] for split in SPLITS}
  pending_chars = {split: 0 for split in SPLITS}
  next_index = {split: 0 for split in SPLITS}
  previous: dict[str, list[list[str]]] = {split: [] for split in SPLITS}
  held: dict[str, DocumentBlock | None] = {split: None for split in SPLITS}

  def finish(split: str) -> Iterator[DocumentBlock]:
    """Yields what the split's full `pending` block releases; resets `pending`."""
    index, block_documents = next_index[split], pending[split]
    next_index[split] += 1
    pending[split], pending_chars[split] = [], 0
    if held[split] is not None:  # Block 0 of one document: block 1 (this one) is its pool.
      yield held[split]._replace(neighbours=block_documents)
      held[split] = None
    block = DocumentBlock(split, index, block_documents)
    if len(block_documents) >= 2:
      yield block
    elif index == 0:
      held[split] = block
    else:
      yield block._replace(neighbours=previous[split])
    previous[split] = block_documents

  for document in documents:
    sentences = [s.strip() for s in document]
    sentences = [s for s in sentences if s]
    if not sentences:
      continue
    split = VALIDATION if is_validation_document(sentences, validation_fraction) else TRAIN
    pending[split].append(sentences)
    pending_chars[split] += sum(len(s) for s in sentences)
    if pending_chars[split] >= block_chars:
      yield from finish(split)
  for split in SPLITS:
    if pending[split]:
      yield from finish(split)
    if held[split] is not None:  # The split's only document: no other to draw B from.
      yield held[split]
      held[split] = None


def block_seed(seed: int, split: str, pass_index: int, block_index: int) -> int:
  """The RNG seed of one (split, dupe pass, block): independent of how work is distributed."""
  key = f"bert_jax/examples/{seed}/{split}/{pass_index}/{block_index}".encode()
  return int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little")


def iter_block_instances(
    documents: Sequence[Document],
    *,
    split: str,
    block_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    neighbours: Sequence[Document] = (),
    stats: BlockStats | None = None,
) -> Iterator[Instance]:
  """All instances of one tokenized block: `dupe_factor` passes, each with its own RNG.

  `neighbours` (tokenized `DocumentBlock.neighbours`) are drawn from only where the block holds a
  single document; `stats` gets the random-next fallback counts.
  """
  for pass_index in range(dupe_factor):
    rng = random.Random(block_seed(seed, split, pass_index, block_index))
    for document_index in range(len(documents)):
      yield from create_instances_from_document(
          documents, document_index, max_seq_length, short_seq_prob, rng,
          other_documents=neighbours, stats=stats)


def rows_seed(seed: int, split: str, block_index: int) -> int:
  """The seed of the shuffle of one block's examples (all passes) before they go into rows."""
  key = f"bert_jax/rows/{seed}/{split}/{block_index}".encode()
  return int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little")


@dataclasses.dataclass(frozen=True)
class ExampleSettings:
  """How rows are built; everything that changes the output except corpus and vocab.

  Objective "mlm" builds FULL-SENTENCES rows: it ignores `short_seq_prob` and
  `max_examples_per_row` (its rows hold one sequence: `examples_per_row` is 1).
  """

  max_seq_length: int = 128
  short_seq_prob: float = 0.1
  dupe_factor: int = 5
  validation_fraction: float = 0.01
  seed: int = 0
  block_chars: int = 2_000_000
  objective: str = "mlm_nsp"
  max_examples_per_row: int = 4

  @property
  def examples_per_row(self) -> int:
    """K of the records: the slots of a row (1 for objective "mlm")."""
    return 1 if self.objective == "mlm" else self.max_examples_per_row

  def validate(self) -> None:
    if self.max_seq_length < 5:
      raise ValueError(f"max_seq_length={self.max_seq_length}: need at least 5 "
                       "([CLS] A [SEP] B [SEP]); change --max_seq_length")
    if not 0.0 <= self.short_seq_prob <= 1.0:
      raise ValueError(f"short_seq_prob={self.short_seq_prob} must be in [0, 1]")
    if self.dupe_factor < 1:
      raise ValueError(f"dupe_factor={self.dupe_factor} must be >= 1")
    if not 0.0 <= self.validation_fraction < 1.0:
      raise ValueError(f"validation_fraction={self.validation_fraction} must be in [0, 1)")
    if self.block_chars < 1:
      raise ValueError(f"block_chars={self.block_chars} must be >= 1")
    if self.objective not in OBJECTIVES:
      raise ValueError(f"objective={self.objective!r} is not one of {OBJECTIVES}; change "
                       "--objective")
    if self.max_examples_per_row < 1:
      raise ValueError(f"max_examples_per_row={self.max_examples_per_row} must be >= 1 (1: one "
                       "example per row, unpacked); change --max_examples_per_row")


# A row's content: up to K NSP instances (objective "mlm_nsp"), or one FULL-SENTENCES sequence;
# or their `RecordSerializer` encodings when `build_block` is given the serializer.
Row = list[Instance] | packing.SentencesRow | list[EncodedPair] | EncodedSentences


def _tokenize_block(
    block: DocumentBlock, tokenizer: Tokenizer, stats: BlockStats, with_neighbours: bool = True
) -> tuple[list[Document], list[Document]]:
  """(the block's tokenized documents, its neighbours' (when asked)); counts the block's text in
  `stats`."""
  documents = []
  stats.chars = sum(len(s) for sentences in block.documents for s in sentences)
  for document in tokenize_documents(block.documents, tokenizer):
    if document:
      documents.append(document)
      stats.documents += 1
      stats.sentences += len(document)
      stats.tokens += sum(len(ids) for ids, _ in document)
  # Only a block of one document carries neighbours; they count in their own block's stats.
  neighbours = []
  if block.neighbours and with_neighbours:
    neighbours = [document for document in tokenize_documents(block.neighbours, tokenizer)
                  if document]
  return documents, neighbours


def build_instances(
    block: DocumentBlock, tokenizer: Tokenizer, settings: ExampleSettings
) -> tuple[Iterator[Instance], BlockStats]:
  """A block's NSP instances, every dupe pass, in generation order (before any shuffle), lazily,
  and its counts: the example counts fill in while the iterator is consumed (no rows)."""
  stats = BlockStats()
  documents, neighbours = _tokenize_block(block, tokenizer, stats)
  max_num_tokens = settings.max_seq_length - 3

  def instances() -> Iterator[Instance]:
    for instance in iter_block_instances(
        documents, split=block.split, block_index=block.index,
        max_seq_length=settings.max_seq_length, short_seq_prob=settings.short_seq_prob,
        dupe_factor=settings.dupe_factor, seed=settings.seed, neighbours=neighbours,
        stats=stats):
      stats.examples += 1
      stats.random_next += instance.is_random_next
      stats.short_target += instance.target_seq_length < max_num_tokens
      stats.real_tokens += packing.instance_length(instance)
      yield instance

  return instances(), stats


def build_block(
    block: DocumentBlock, tokenizer: Tokenizer, settings: ExampleSettings,
    serializer: RecordSerializer | None = None,
) -> tuple[list[Row], BlockStats]:
  """A block's rows, in their record order, and its counts.

  "mlm_nsp": the instances of every dupe pass, shuffled (`rows_seed`), packed K to a row
  (`packing.pack`). "mlm": each pass lays the block's documents, in an order of its own
  (`block_seed`), into FULL-SENTENCES rows; the rows of all passes are shuffled (`rows_seed`).
  The whole block is in memory (memory grows with `block_chars` x dupe_factor, not with the
  corpus); with a `serializer`, each example is kept only as its encoding (`EncodedPair`,
  `EncodedSentences`: ~3 bytes a token) and the rows hold those, in the same order.
  """
  rng = random.Random(rows_seed(settings.seed, block.split, block.index))
  if settings.objective == "mlm":
    stats = BlockStats()
    documents, _ = _tokenize_block(block, tokenizer, stats, with_neighbours=False)  # No NSP.
    rows: list = []
    for pass_index in range(settings.dupe_factor):
      order = list(range(len(documents)))
      random.Random(block_seed(settings.seed, block.split, pass_index, block.index)).shuffle(order)
      pass_rows, num_cut = packing.full_sentence_rows(
          [documents[i] for i in order], settings.max_seq_length, tokenizer.sep_id)
      stats.sentences_cut += num_cut
      stats.real_tokens += sum(map(packing.sentences_row_length, pass_rows))
      rows += pass_rows if serializer is None else map(serializer.encode_sentences, pass_rows)
    rng.shuffle(rows)
    stats.rows = stats.examples = len(rows)
    return rows, stats
  instances, stats = build_instances(block, tokenizer, settings)
  lengths, examples = [], []
  for instance in instances:
    lengths.append(packing.instance_length(instance))
    examples.append(instance if serializer is None else serializer.encode_pair(instance))
  # One permutation for both lists: rows mix the block's documents and passes.
  order = list(range(len(examples)))
  rng.shuffle(order)
  packed = packing.pack([lengths[i] for i in order], settings.max_seq_length,
                        settings.examples_per_row)
  rows = [[examples[order[i]] for i in row] for row in packed]
  stats.rows = len(rows)
  return rows, stats


def row_features(row: Row, settings: ExampleSettings, tokenizer: Tokenizer) -> dict[str, list[int]]:
  """The record layout of a row as lists (what `RecordSerializer` writes as bytes)."""
  if isinstance(row, packing.SentencesRow):
    return packing.sentences_row_features(row, settings.max_seq_length, tokenizer.cls_id,
                                          tokenizer.sep_id, tokenizer.pad_id)
  return packing.nsp_row_features(row, settings.max_seq_length, settings.examples_per_row,
                                  tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)


def iter_rows(
    documents: Iterable[Sequence[str]], tokenizer: Tokenizer, settings: ExampleSettings,
    split: str,
) -> Iterator[dict[str, list[int]]]:
  """Single-process stream of one split's rows as feature lists (block by block, in order)."""
  settings.validate()
  blocks = iter_document_blocks(documents, validation_fraction=settings.validation_fraction,
                                block_chars=settings.block_chars)
  for block in blocks:
    if block.split != split:
      continue
    rows, _ = build_block(block, tokenizer, settings)
    for row in rows:
      yield row_features(row, settings, tokenizer)


# ---------------------------------------------------------------- worker side

_WORKER_TOKENIZER: Tokenizer | None = None
# group_size:1 for random access, as TFDS; snappy writes 2.5x faster than the default zstd for
# ~5% larger files, and reads as fast.
_RECORD_OPTIONS = "group_size:1,snappy"


def init_worker(tokenizer_file: str) -> None:
  """Pool initializer: loads the tokenizer for every block this process builds from the file
  the parent pickled it into. Not the tokenizer itself in the pool's initargs: those go down a
  pipe while the worker starts, and a vocabulary of hundreds of KB would hold the parent there,
  for a second per worker, with SIGINT ignored (`spawn_pool`)."""
  global _WORKER_TOKENIZER
  with open(tokenizer_file, "rb") as f:
    _WORKER_TOKENIZER = pickle.load(f)


def spawn_pool(num_workers: int, initializer: Callable[..., None] | None = None,
               initargs: tuple = ()) -> multiprocessing.pool.Pool:
  """A pool of `num_workers` spawned processes (not forked: the caller may be a multithreaded
  JAX process) that ignore SIGINT.

  A Ctrl-C reaches the whole process group: the parent alone should react (it terminates the
  pool and removes the partial output), while a worker would print a traceback of its own, even
  one still importing modules. So the parent ignores SIGINT while it starts the workers (an
  ignored signal stays ignored across exec, and Python then installs no handler of its own): a
  Ctrl-C in those milliseconds (a fork and exec per worker, with small `initargs`) is lost,
  never half-handled.
  """
  context = multiprocessing.get_context("spawn")
  initargs = (initializer, *initargs)  # Replacement workers ignore it from their initializer.
  if threading.current_thread() is not threading.main_thread():  # signal.signal needs it.
    return context.Pool(num_workers, _ignoring_sigint, initargs)
  handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    return context.Pool(num_workers, _ignoring_sigint, initargs)
  finally:
    signal.signal(signal.SIGINT, signal.SIG_DFL if handler is None else handler)


def _ignoring_sigint(initializer: Callable[..., None] | None, *initargs) -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if initializer is not None:
    initializer(*initargs)


def write_block(
    block: DocumentBlock, settings: ExampleSettings, path: str,
    tokenizer: Tokenizer | None = None,
) -> tuple[str, int, int, BlockStats]:
  """Builds one block's rows into an ArrayRecord file at `path`.

  Returns (split, block index, bytes written, stats). Writes nothing when the block yields no
  rows. Runs in a worker process (tokenizer from `init_worker`) or inline.
  """
  from array_record.python import array_record_module  # Light import; TFDS not needed here.

  tokenizer = tokenizer if tokenizer is not None else _WORKER_TOKENIZER
  if tokenizer is None:
    raise RuntimeError("write_block: no tokenizer (init_worker was not called)")
  serializer = RecordSerializer(
      settings.max_seq_length, settings.examples_per_row, tokenizer.size,
      pad_id=tokenizer.pad_id, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id)
  rows, stats = build_block(block, tokenizer, settings, serializer)
  serialize = (serializer.serialize_sentences if settings.objective == "mlm"
               else serializer.serialize_pairs)
  num_bytes = 0
  if rows:
    writer = array_record_module.ArrayRecordWriter(os.fspath(path), _RECORD_OPTIONS)
    try:
      for row in rows:
        record = serialize(row)
        writer.write(record)
        num_bytes += len(record)
    finally:
      writer.close()
  return block.split, block.index, num_bytes, stats
