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
* The original shuffles all instances at the end; bert_jax shuffles globally at read time.
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
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from bert_jax.varint import encode_varint

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
FEATURE_NAMES = ("input_ids", "token_type_ids", "attention_mask", "word_starts")
LABEL_NAME = "next_sentence_label"

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
  examples: int = 0
  random_next: int = 0
  short_target: int = 0  # Examples from a document whose target length was drawn short.
  real_tokens: int = 0  # Non-padding tokens over all examples, specials included.
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


def instance_to_features(
    instance: Instance, max_seq_length: int, cls_id: int, sep_id: int, pad_id: int
) -> dict[str, list[int] | int]:
  """[CLS] A [SEP] B [SEP] + padding, as the WORKSPACE batch contract (lists, one example)."""
  len_a, len_b = len(instance.ids_a), len(instance.ids_b)
  num_real = len_a + len_b + 3
  num_pad = max_seq_length - num_real
  if num_pad < 0:
    raise ValueError(f"instance of {num_real} tokens exceeds max_seq_length={max_seq_length}")
  return {
      "input_ids": [cls_id, *instance.ids_a, sep_id, *instance.ids_b, sep_id] + [pad_id] * num_pad,
      "token_type_ids": [0] * (len_a + 2) + [1] * (len_b + 1) + [0] * num_pad,
      "attention_mask": [1] * num_real + [0] * num_pad,
      "word_starts": [0, *instance.word_starts_a, 0, *instance.word_starts_b, 0] + [0] * num_pad,
      LABEL_NAME: 1 if instance.is_random_next else 0,
  }


# ---------------------------------------------------------------- record serialization


_SMALL_VARINTS = [encode_varint(i) for i in range(1 << 14)]


def _varint(value: int) -> bytes:
  return _SMALL_VARINTS[value] if value < 16384 else encode_varint(value)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
  return tag + _varint(len(payload)) + payload


class RecordSerializer:
  """Writes one example as a serialized `tf.train.Example` (the TFDS record format).

  The protobuf wire format is assembled by hand from a per-id varint table: 3-4x faster than
  building proto objects, and no TensorFlow. Every feature is an int64 list (TFDS stores int32
  tensors that way); tests decode the bytes with the TFDS features of `tfds_builder`.
  """

  def __init__(self, max_seq_length: int, vocab_size: int, pad_id: int):
    self.max_seq_length = max_seq_length
    self._varints = [_varint(i) for i in range(max(vocab_size, 2))]
    self._pad = self._varints[pad_id]
    self._keys = {name: _length_delimited(b"\x0a", name.encode()) for name in
                  (*FEATURE_NAMES, LABEL_NAME)}
    # Features of 0/1 values have a fixed byte length: their framing is computed once.
    fixed_payload = b"\x00" * max_seq_length
    self._prefixes = {name: self._feature(name, fixed_payload)[:-max_seq_length]
                      for name in FEATURE_NAMES if name != "input_ids"}
    self._labels = (self._feature(LABEL_NAME, b"\x00"), self._feature(LABEL_NAME, b"\x01"))

  def _feature(self, name: str, packed_values: bytes) -> bytes:
    int64_list = _length_delimited(b"\x0a", packed_values)  # Int64List.value (packed).
    feature = _length_delimited(b"\x1a", int64_list)  # Feature.int64_list.
    entry = self._keys[name] + _length_delimited(b"\x12", feature)  # map<string, Feature>.
    return _length_delimited(b"\x0a", entry)  # Features.feature.

  def serialize(self, instance: Instance, cls_id: int, sep_id: int) -> bytes:
    """Pads `instance` to max_seq_length and returns its record bytes."""
    len_a, len_b = len(instance.ids_a), len(instance.ids_b)
    num_real = len_a + len_b + 3
    num_pad = self.max_seq_length - num_real
    if num_pad < 0:
      raise ValueError(f"instance of {num_real} tokens exceeds max_seq_length")
    varints = self._varints
    try:
      ids = b"".join([varints[cls_id], *[varints[t] for t in instance.ids_a], varints[sep_id],
                      *[varints[t] for t in instance.ids_b], varints[sep_id]])
    except IndexError as e:
      raise ValueError(f"token id outside [0, {len(varints)}) (vocab size)") from e
    # 0/1 values are their own one-byte varints.
    prefixes = self._prefixes
    features = b"".join([
        self._feature("input_ids", ids + self._pad * num_pad),
        prefixes["token_type_ids"],
        b"\x00" * (len_a + 2) + b"\x01" * (len_b + 1) + b"\x00" * num_pad,
        prefixes["attention_mask"],
        b"\x01" * num_real + b"\x00" * num_pad,
        prefixes["word_starts"],
        b"\x00", bytes(instance.word_starts_a), b"\x00", bytes(instance.word_starts_b),
        b"\x00" * (num_pad + 1),
        self._labels[1 if instance.is_random_next else 0],
    ])
    return _length_delimited(b"\x0a", features)  # Example.features.


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


@dataclasses.dataclass(frozen=True)
class ExampleSettings:
  """How examples are built; everything that changes the output except corpus and vocab."""

  max_seq_length: int = 128
  short_seq_prob: float = 0.1
  dupe_factor: int = 5
  validation_fraction: float = 0.01
  seed: int = 0
  block_chars: int = 2_000_000

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


def build_block(
    block: DocumentBlock, tokenizer: Tokenizer, settings: ExampleSettings
) -> tuple[Iterator[Instance], BlockStats]:
  """Tokenizes a block and returns its instances (lazily) and its counts so far.

  The stats' example counts fill in while the iterator is consumed.
  """
  stats = BlockStats()
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
  if block.neighbours:
    neighbours = [document for document in tokenize_documents(block.neighbours, tokenizer)
                  if document]
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
      stats.real_tokens += len(instance.ids_a) + len(instance.ids_b) + 3
      yield instance

  return instances(), stats


def iter_examples(
    documents: Iterable[Sequence[str]], tokenizer: Tokenizer, settings: ExampleSettings,
    split: str,
) -> Iterator[dict[str, list[int] | int]]:
  """Single-process stream of one split's padded examples (block by block, in order)."""
  settings.validate()
  blocks = iter_document_blocks(documents, validation_fraction=settings.validation_fraction,
                                block_chars=settings.block_chars)
  for block in blocks:
    if block.split != split:
      continue
    instances, _ = build_block(block, tokenizer, settings)
    for instance in instances:
      yield instance_to_features(instance, settings.max_seq_length, tokenizer.cls_id,
                                 tokenizer.sep_id, tokenizer.pad_id)


# ---------------------------------------------------------------- worker side

_WORKER_TOKENIZER: Tokenizer | None = None
# group_size:1 for random access, as TFDS; snappy writes 2.5x faster than the default zstd for
# ~5% larger files, and reads as fast.
_RECORD_OPTIONS = "group_size:1,snappy"


def init_worker(tokenizer: Tokenizer) -> None:
  """Pool initializer: keeps the tokenizer for every block this process builds."""
  global _WORKER_TOKENIZER
  _WORKER_TOKENIZER = tokenizer


def write_block(
    block: DocumentBlock, settings: ExampleSettings, path: str,
    tokenizer: Tokenizer | None = None,
) -> tuple[str, int, int, BlockStats]:
  """Builds one block's examples into an ArrayRecord file at `path`.

  Returns (split, block index, bytes written, stats). Writes nothing when the block yields no
  examples. Runs in a worker process (tokenizer from `init_worker`) or inline.
  """
  from array_record.python import array_record_module  # Light import; TFDS not needed here.

  tokenizer = tokenizer if tokenizer is not None else _WORKER_TOKENIZER
  if tokenizer is None:
    raise RuntimeError("write_block: no tokenizer (init_worker was not called)")
  serializer = RecordSerializer(settings.max_seq_length, tokenizer.size, tokenizer.pad_id)
  instances, stats = build_block(block, tokenizer, settings)
  num_bytes = 0
  writer = None
  try:
    for instance in instances:
      record = serializer.serialize(instance, tokenizer.cls_id, tokenizer.sep_id)
      if writer is None:
        writer = array_record_module.ArrayRecordWriter(os.fspath(path), _RECORD_OPTIONS)
      writer.write(record)
      num_bytes += len(record)
  finally:
    if writer is not None:
      writer.close()
  return block.split, block.index, num_bytes, stats
