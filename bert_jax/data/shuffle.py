"""The corpus-wide shuffle of the documents before blocking, with flat memory.

google-research/bert's `create_pretraining_data.py` reads every document into memory, shuffles
them, and draws each random-next B from the whole corpus. bert_jax cuts the document stream into
blocks (`blocks`), the pool each random B is drawn from; without a shuffle a block is a run of
consecutive input (2-4 books, or documents of one topic on topic-ordered input). So
`shuffled_documents` first puts the documents in a seeded random order, in two passes over
temporary files:

1. Scatter: each document goes to one of `NUM_SHARDS` shard files by a seeded draw, written
   through per-shard buffers (at most `WRITE_BUFFER_BYTES` in memory).
2. Gather: shard by shard, a shard file is read whole (at most `max_shard_bytes`) and its
   documents are yielded in a seeded random order. A larger shard (a corpus over about
   `NUM_SHARDS` x `max_shard_bytes` / 2, or bad luck) is first scattered again into shards of
   about half the bound, recursively.

A random shard for each document, then a random order within each shard, is a uniformly random
permutation of the documents, so each block is a uniform random sample of the corpus. The order
depends on the seed and the documents only (not on the worker count or buffer flushes); memory
is one shard plus the write buffers whatever the corpus size; the temporary files hold the
corpus's text once (UTF-8, a length and a `marshal` record a document), and each shard file is
deleted as soon as it has been read.

Imported by the preparation worker processes' modules: it stays free of TFDS / JAX.
"""

import hashlib
import logging
import marshal
import os
import random
import shutil
import struct
import time
from collections.abc import Iterable, Iterator, Sequence

NUM_SHARDS = 256  # Shard files of the first scatter.
MAX_SHARD_BYTES = 32 * 2**20  # The most a shard file may hold when it is read whole.
WRITE_BUFFER_BYTES = 16 * 2**20  # Buffered scatter output, written out when it exceeds this.
_LENGTH = struct.Struct("<I")  # Each record: its length, then marshal.dumps(list of sentences).


def _rng(seed: int, *names: str) -> random.Random:
  """The RNG of one step of the shuffle (a scatter or a shard's order) of `seed`."""
  key = "/".join(("bert_jax/shuffle", str(seed), *names)).encode()
  return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little"))


def _records(documents: Iterable[Sequence[str]]) -> Iterator[bytes]:
  """Each document with a sentence left after stripping, as one framed record."""
  for document in documents:
    sentences = [s.strip() for s in document]
    sentences = [s for s in sentences if s]
    if sentences:
      data = marshal.dumps(sentences)
      yield _LENGTH.pack(len(data)) + data


def _read_records(path: str) -> Iterator[bytes]:
  """The framed records of a shard file, streamed (for a shard too large to read whole)."""
  with open(path, "rb") as f:
    while header := f.read(_LENGTH.size):
      (length,) = _LENGTH.unpack(header)
      yield header + f.read(length)


def _scatter(records: Iterable[bytes], paths: Sequence[str], rng: random.Random) -> int:
  """Appends each record to one of `paths`, drawn by `rng`; returns the records written."""
  buffers: list[list[bytes]] = [[] for _ in paths]
  buffered = count = 0

  def flush() -> None:
    for path, buffer in zip(paths, buffers):
      if buffer:
        with open(path, "ab") as f:
          f.write(b"".join(buffer))
        buffer.clear()

  for record in records:
    buffers[rng.randrange(len(paths))].append(record)
    buffered += len(record)
    count += 1
    if buffered > WRITE_BUFFER_BYTES:
      flush()
      buffered = 0
  flush()
  return count


def _gather(path: str, name: str, seed: int, max_shard_bytes: int,
            may_split: bool = True) -> Iterator[list[str]]:
  """The documents of the shard file `path`, in a seeded random order; deletes the file."""
  size = os.path.getsize(path)
  if size > max_shard_bytes and may_split:
    parts = [f"{path}.{i:03d}" for i in range(-(-2 * size // max_shard_bytes))]
    _scatter(_read_records(path), parts, _rng(seed, "scatter", name))
    os.remove(path)
    for i, part in enumerate(parts):
      if os.path.exists(part):
        # A part holding the whole shard (one document over the bound) is read as it is.
        yield from _gather(part, f"{name}.{i}", seed, max_shard_bytes,
                           os.path.getsize(part) < size)
    return
  with open(path, "rb") as f:
    data = f.read()
  os.remove(path)
  spans, position = [], 0
  while position < len(data):
    (length,) = _LENGTH.unpack_from(data, position)
    position += _LENGTH.size
    spans.append((position, position + length))
    position += length
  _rng(seed, "order", name).shuffle(spans)
  view = memoryview(data)
  for start, end in spans:
    yield marshal.loads(view[start:end])


def shuffled_documents(
    documents: Iterable[Sequence[str]], *, seed: int, work_dir: str,
    num_shards: int = NUM_SHARDS, max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Iterator[list[str]]:
  """`documents` in a seeded, uniformly random order (sentences stripped, blank ones and
  documents without any dropped), through shard files in `work_dir`.

  `work_dir` must not exist: it is created when iteration starts (all documents are read
  then) and removed with everything in it when the iterator is exhausted, closed or fails.
  """
  os.makedirs(work_dir)  # Never an existing directory: the cleanup below removes it.
  try:
    start = time.time()
    paths = [os.path.join(work_dir, f"shard-{i:05d}") for i in range(num_shards)]
    count = _scatter(_records(documents), paths, _rng(seed, "scatter"))
    logging.info("shuffle: %d documents scattered over %d shard files in %.1f s", count,
                 sum(map(os.path.exists, paths)), time.time() - start)
    for i, path in enumerate(paths):
      if os.path.exists(path):
        yield from _gather(path, str(i), seed, max_shard_bytes)
  finally:
    shutil.rmtree(work_dir, ignore_errors=True)
