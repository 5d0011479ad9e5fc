"""NSP instances of a document, as google-research/bert `create_pretraining_data.py`.

`create_instances_from_document` and the truncation follow the original step for step (same
random draws in the same order, minus the MLM masking, which bert_jax does on the fly inside the
jitted step). What differs is where a random-next segment B comes from, so that memory stays
flat with corpus size:

* The original reads the whole corpus into memory, shuffles the documents, and draws each
  random-next B from a document of the corpus other than A's (ten tries, so a corpus of very few
  documents can still hand it A's own text, labelled random). Here `all_documents` is a block of
  thousands of documents (`blocks`), and B comes from another document of it: the original's
  ten draws, then, where all ten hit A's document, one draw among the block's other documents.
  A block of one document draws B from `other_documents` (a neighbouring block's). Preparation
  shuffles the documents corpus-wide before cutting blocks (`shuffle`), so a block is a uniform
  random sample of its split and B's document, drawn uniformly from it, is a uniform draw from
  the whole corpus (A's split of it), as in the original, on topic- or book-ordered input too
  (tested). What remains different: the examples of one block, all its dupe passes included,
  draw their B from the same sample of ~`block_chars` characters, where the original's passes
  each draw anew.
* So B never comes from A's document. With no other document in reach (a split of a single
  document), a chunk that would get a random B gets its real continuation (label 0) instead, or
  no example when it is one sentence (`RandomNextCounts`).

As in the original, a chunk of a single sentence always gets a random B, so the random-next share
is 50% only for long documents: short documents, or a short target drawn for a document (which
makes every chunk one sentence), push it up (~55% for documents of 60-90 sentences with
short_seq_prob=0.1, ~61% on the docstring corpus). `blocks.BlockStats.random_next` reports it.

Imported by the preparation worker processes: it stays free of TFDS / JAX.
"""

import random
from collections.abc import Iterable, Sequence
from typing import Protocol

from bert_jax.data.packing import Document, Instance, Segment


class RandomNextCounts(Protocol):
  """Where the random-next fallbacks are counted (`blocks.BlockStats`)."""

  # Random-next B drawn from `other_documents` (A's was the only document of `all_documents`).
  random_next_neighbour: int
  # Chunks that drew random-next with no other document in reach: given their real
  # continuation (label 0) instead, or dropped when they had one sentence.
  random_next_to_continuation: int
  random_next_skipped: int


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
    stats: RandomNextCounts | None,
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


def _random_b(
    random_document: Document, target_b_length: int, rng: random.Random
) -> tuple[list[int], list[int]]:
  """The original's random-next B: sentences of `random_document` from a random start until
  `target_b_length` tokens are reached (or the document ends)."""
  random_start = rng.randint(0, len(random_document) - 1)
  ids_b: list[int] = []
  word_starts_b: list[int] = []
  for j in range(random_start, len(random_document)):
    ids_b.extend(random_document[j][0])
    word_starts_b.extend(random_document[j][1])
    if len(ids_b) >= target_b_length:
      break
  return ids_b, word_starts_b


def create_instances_from_document(
    all_documents: Sequence[Document],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    other_documents: Sequence[Document] = (),
    stats: RandomNextCounts | None = None,
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
          ids_b, word_starts_b = _random_b(random_document, target_seq_length - len(ids_a), rng)
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
