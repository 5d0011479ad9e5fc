"""Blocks: the document stream cut into per-split blocks, and each block's rows.

A block is a run of consecutive documents of one split, about `block_chars` characters
(thousands of documents): the unit of work of the preparation workers (`workers`, or the Beam
pipeline's, `beam`) and the pool random-next segments are drawn from (`nsp`), so memory stays
flat with corpus size. Preparation shuffles the documents corpus-wide first (`shuffle`: a seeded
key order, cut into shards of about 16 M characters) and cuts each shard into blocks on its own
(`iter_prepared_blocks`, `iter_document_blocks`): a block is a uniform random sample of its
split, never a run of the input (a few books, one topic).

* Documents go to the `validation` split by a hash of their text (`is_validation_document`), so a
  duplicated document never lands in both splits. The split depends on the text alone, not on
  the seed or the shuffle: every seed holds out the same documents, so runs prepared with other
  seeds evaluate on the same text, and none of it is in their train split.
* A block of one document (a split's last block in a shard, or a document of `block_chars` or
  more) carries the documents of its split's previous block in the shard as `neighbours`
  (block 0: of the next block), where its random-next B come from.
* Each (split, shard, dupe pass, block) has its own RNG seeded from (seed, split, shard, pass,
  block index) (`block_seed`), so the output depends on the seed and the corpus only, never on
  the number of workers or on the engine (this process's workers or Beam's).
* The original shuffles all instances at the end. Here each block's instances (all dupe passes)
  are shuffled with a seed of the block (`rows_seed`), then packed into rows of up to K
  examples (`packing.pack`, best fit decreasing; K = `packing.examples_per_row`, 1 = one example
  a row); grain shuffles the rows globally at read time.
* Objective "mlm" (RoBERTa's FULL-SENTENCES, no NSP) cuts the block's contiguous text into full
  rows instead (`packing.full_sentence_rows`); each dupe pass takes the block's documents in its
  own seeded order, so the passes' rows differ (other neighbours, other row boundaries).

Imported by the preparation worker processes and Beam workers: it stays free of TFDS / JAX.
"""

import dataclasses
import hashlib
import itertools
import os
import random
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from bert_jax.data import nsp
from bert_jax.data import packing
from bert_jax.data import shuffle
from bert_jax.data.packing import Document, Instance
from bert_jax.data.records import EncodedPair, EncodedSentences, RecordSerializer

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)


class Tokenizer(Protocol):
  """What example construction needs from a `bert_jax.data.vocab.Vocab`."""

  size: int
  pad_id: int
  cls_id: int
  sep_id: int

  def encode_with_word_starts(self, text: str) -> tuple[list[int], list[int]]:
    ...


@dataclasses.dataclass
class BlockStats:
  """Counts over what one or more blocks produced (the random-next fallbacks counted as
  `nsp.RandomNextCounts`)."""

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
    # Text that spells a special token ("[MASK]") stays text, as google-research/bert's
    # tokenizer keeps it: pretraining never sees a control token the text did not get from us.
    all_ids = tokenizer.encode_batch(sentences, split_special_tokens=True)
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


class DocumentBlock(NamedTuple):
  """A run of consecutive documents of one split of one shard (in the shuffled order, when
  prepared): the unit of work and of random-next draws."""

  split: str
  index: int  # Block number within its split of its shard.
  documents: list[list[str]]
  # Only on a block of one document: the documents of a neighbouring block of the same split
  # and shard (the previous one; the next one for block 0), where its random-next B come from.
  # Empty there only when the shard's split holds that one document.
  neighbours: Sequence[list[str]] = ()
  shard: int = 0  # The shard of the shuffled order it was cut from (`shuffle`).

  @property
  def name(self) -> str:
    """Unique among a dataset's blocks: `<split>-<shard>-<index>`."""
    return f"{self.split}-{self.shard:06d}-{self.index:06d}"


def is_validation_document(sentences: Sequence[str], validation_fraction: float) -> bool:
  """Deterministic split assignment from a hash of the document's text."""
  if validation_fraction <= 0.0:
    return False
  digest = hashlib.blake2b("\n".join(sentences).encode("utf-8", "replace"), digest_size=8)
  return int.from_bytes(digest.digest(), "little") < validation_fraction * 2.0**64


def iter_document_blocks(
    documents: Iterable[Sequence[str]], *, validation_fraction: float, block_chars: int,
    shard: int = 0,
) -> Iterator[DocumentBlock]:
  """Cuts the document stream (of one shard) into per-split blocks of about `block_chars`
  characters.

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
    block = DocumentBlock(split, index, block_documents, shard=shard)
    if len(block_documents) >= 2:
      yield block
    elif index == 0:
      held[split] = block
    else:
      yield block._replace(neighbours=previous[split])
    previous[split] = block_documents

  for document in documents:
    sentences = shuffle.clean(document)
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


def iter_prepared_blocks(
    documents: Iterable[Sequence[str]], settings: "ExampleSettings", work_dir: str,
    tally: dict | None = None,
) -> Iterator[DocumentBlock]:
  """The blocks preparation builds: `documents` shuffled corpus-wide (`shuffle`, seeded by
  `settings.seed`; its temporary files in `work_dir`, which must not exist and is removed once
  the documents have been read back; each text once, the repeats counted into `tally`), each
  shard cut into blocks (`iter_document_blocks`)."""
  shuffled = shuffle.shuffled_documents(documents, seed=settings.seed, work_dir=work_dir,
                                        shard_chars=settings.shard_chars, tally=tally)
  for shard, group in itertools.groupby(shuffled, key=lambda item: item[0]):
    yield from iter_document_blocks(
        (sentences for _, sentences in group), validation_fraction=settings.validation_fraction,
        block_chars=settings.block_chars, shard=shard)


def block_seed(seed: int, split: str, pass_index: int, block_index: int, shard: int = 0) -> int:
  """The RNG seed of one (split, shard, dupe pass, block): independent of how work is
  distributed."""
  key = f"bert_jax/examples/{seed}/{split}/{shard}/{pass_index}/{block_index}".encode()
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
    shard: int = 0,
) -> Iterator[Instance]:
  """All instances of one tokenized block: `dupe_factor` passes, each with its own RNG.

  `neighbours` (tokenized `DocumentBlock.neighbours`) are drawn from only where the block holds a
  single document; `stats` gets the random-next fallback counts.
  """
  for pass_index in range(dupe_factor):
    rng = random.Random(block_seed(seed, split, pass_index, block_index, shard))
    for document_index in range(len(documents)):
      yield from nsp.create_instances_from_document(
          documents, document_index, max_seq_length, short_seq_prob, rng,
          other_documents=neighbours, stats=stats)


def rows_seed(seed: int, split: str, block_index: int, shard: int = 0) -> int:
  """The seed of the shuffle of one block's examples (all passes) before they go into rows."""
  key = f"bert_jax/rows/{seed}/{split}/{shard}/{block_index}".encode()
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
  # Text a shard of the shuffled order holds, about (`shuffle.shard_bits`): blocks are cut
  # within a shard; a Beam worker sorts one.
  shard_chars: int = shuffle.SHARD_CHARS
  objective: str = "mlm_nsp"
  max_examples_per_row: int = 4

  @property
  def examples_per_row(self) -> int:
    """K of the records: the slots of a row (1 for objective "mlm")."""
    return packing.examples_per_row(self.objective, self.max_examples_per_row)

  def validate(self) -> None:
    """Raises ValueError naming the first setting out of range (and its flag)."""
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
    if self.shard_chars < 1:
      raise ValueError(f"shard_chars={self.shard_chars} must be >= 1")
    if self.objective not in packing.OBJECTIVES:
      raise ValueError(f"objective={self.objective!r} is not one of {packing.OBJECTIVES}; change "
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
        stats=stats, shard=block.shard):
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
  rng = random.Random(rows_seed(settings.seed, block.split, block.index, block.shard))
  if settings.objective == "mlm":
    stats = BlockStats()
    documents, _ = _tokenize_block(block, tokenizer, stats, with_neighbours=False)  # No NSP.
    rows: list = []
    for pass_index in range(settings.dupe_factor):
      order = list(range(len(documents)))
      random.Random(block_seed(settings.seed, block.split, pass_index, block.index,
                               block.shard)).shuffle(order)
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
  """Single-process stream of one split's rows as feature lists (block by block, in order): the
  rows `prepare` writes. The shuffle's temporary files (the corpus's text) go to $TMPDIR."""
  settings.validate()
  with tempfile.TemporaryDirectory(prefix="bert_jax_rows_") as work_dir:
    blocks = iter_prepared_blocks(documents, settings, os.path.join(work_dir, "shuffle"))
    for block in blocks:
      if block.split != split:
        continue
      rows, _ = build_block(block, tokenizer, settings)
      for row in rows:
        yield row_features(row, settings, tokenizer)
