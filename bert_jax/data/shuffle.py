"""The corpus-wide shuffle of the documents before blocking: a seeded order by key, flat memory.

google-research/bert's `create_pretraining_data.py` reads every document into memory, shuffles
them, and draws each random-next B from the whole corpus. bert_jax cuts the document stream into
blocks (`blocks`), the pool each random B is drawn from; without a shuffle a block is a run of
consecutive input (2-4 books, or documents of one topic on topic-ordered input). So the
documents are first put in a seeded random order:

* Each document's key is a seeded 128-bit hash of its text (`document_key`); the shuffled order
  is the order of the keys. Hash keys are independent uniform draws, so the order is a uniformly
  random permutation of the distinct documents, and each block a uniform random sample of the
  corpus. Documents of one text share one key, so they arrive together: the first is kept and
  the others are dropped (`distinct`), counted as duplicates.
* A key depends on the document and the seed alone, so any engine computes the same order, and
  the same records: this module in one process, or an Apache Beam pipeline
  (`bert_jax.data.beam`) that groups the documents by shard and sorts each shard.
* The key space is cut into `2 ** shard_bits` equal ranges, the *shards* (`shard_bits`: about
  `SHARD_CHARS` characters of text a shard, from the corpus's size). Blocks are cut within a
  shard, never across one: the unit of work a Beam worker sorts. A corpus under `SHARD_CHARS`
  is one shard.

`shuffled_documents` sorts externally, in two passes over temporary files:

1. Scatter: each document goes to one of 256 files by its key's first byte, written through
   per-file buffers (at most `WRITE_BUFFER_BYTES` in memory); the corpus's size is counted.
2. Gather: file by file, in key order, a file is read whole (at most `max_file_bytes`), sorted
   by key and its documents yielded with their shard. A larger file (a corpus over about 256 x
   `max_file_bytes`) is first scattered again by the key's next byte, recursively.

Memory is one file plus the write buffers whatever the corpus size; the temporary files hold
the corpus's text once (UTF-8 in `marshal` records: a length, the key, the sentences), and each
file is deleted as soon as it has been read.

Imported by the preparation worker processes and Beam workers: it stays free of TFDS / JAX.
"""

import hashlib
import logging
import marshal
import math
import os
import shutil
import struct
import time
from collections.abc import Iterable, Iterator, Sequence

KEY_BYTES = 16  # 128-bit keys: distinct documents of a 1e12-document corpus never collide.
# About this much text a shard: what a Beam worker holds and sorts (~16 MB of text is ~250 MB
# of Python strings and lists).
SHARD_CHARS = 16 * 2**20
MAX_SHARD_BITS = 24  # At most 2**24 shards (256 T characters of text at SHARD_CHARS).
MAX_FILE_BYTES = 32 * 2**20  # The most a temporary file may hold when it is read whole.
WRITE_BUFFER_BYTES = 16 * 2**20  # Buffered scatter output, written out when it exceeds this.
_FANOUT = 256  # Files of a scatter: one per value of a key byte.
_HEADER = struct.Struct("<I")  # Each record: the length of the marshal data, key, data.


def clean(document: Iterable[str]) -> list[str]:
  """The document's sentences stripped, blank ones dropped (a document without any is
  dropped wherever this returns [])."""
  sentences = [s.strip() for s in document]
  return [s for s in sentences if s]


def document_key(seed: int, sentences: Sequence[str]) -> bytes:
  """The document's place in the shuffled order of `seed`: 16 bytes, compared as bytes."""
  text = "\n".join(sentences).encode("utf-8", "surrogatepass")
  return hashlib.blake2b(text, digest_size=KEY_BYTES,
                         key=f"bert_jax/shuffle/{seed}".encode()).digest()


def shard_bits(chars: int, shard_chars: int = SHARD_CHARS) -> int:
  """log2 of the number of shards of a corpus of `chars` characters (stripped sentences):
  shards of about `shard_chars`, a power of two of them (0: one shard)."""
  if chars <= shard_chars:
    return 0
  return min(MAX_SHARD_BITS, math.ceil(math.log2(chars / shard_chars)))


def shard_of(key: bytes, bits: int) -> int:
  """The shard of a key: its first `bits` bits."""
  return int.from_bytes(key[:4], "big") >> (32 - bits) if bits else 0


def _records(documents: Iterable[Sequence[str]], seed: int, counts: dict) -> Iterator[bytes]:
  """Each document with a sentence left after `clean`, as one framed record; counts the
  documents and characters into `counts`."""
  for document in documents:
    sentences = clean(document)
    if sentences:
      counts["documents"] += 1
      counts["chars"] += sum(map(len, sentences))
      data = marshal.dumps(sentences)
      yield _HEADER.pack(len(data)) + document_key(seed, sentences) + data


def _read_records(path: str) -> Iterator[bytes]:
  """The framed records of a file, streamed (for a file too large to read whole)."""
  with open(path, "rb") as f:
    while header := f.read(_HEADER.size):
      (length,) = _HEADER.unpack(header)
      yield header + f.read(KEY_BYTES + length)


def _scatter(records: Iterable[bytes], paths: Sequence[str], depth: int) -> None:
  """Appends each record to `paths[key byte number depth]` (256 paths)."""
  buffers: list[list[bytes]] = [[] for _ in paths]
  buffered = 0

  def flush() -> None:
    for path, buffer in zip(paths, buffers):
      if buffer:
        with open(path, "ab") as f:
          f.write(b"".join(buffer))
        buffer.clear()

  for record in records:
    buffers[record[_HEADER.size + depth]].append(record)
    buffered += len(record)
    if buffered > WRITE_BUFFER_BYTES:
      flush()
      buffered = 0
  flush()


def distinct(keyed: Iterable[tuple[bytes, list[str]]], counts: dict
             ) -> Iterator[tuple[bytes, list[str]]]:
  """`keyed` documents in key order, each text once: a document with the key (the text) of
  the one before it is dropped and counted into `counts["duplicate_documents"]`."""
  previous = None
  for key, sentences in keyed:
    if key == previous:
      counts["duplicate_documents"] = counts.get("duplicate_documents", 0) + 1
      continue
    previous = key
    yield key, sentences


def _gather(path: str, depth: int, bits: int, max_file_bytes: int
            ) -> Iterator[tuple[bytes, list[str]]]:
  """(key, sentences) of the documents of the file `path` (their keys share `depth` + 1 first
  bytes), in key order; deletes the file."""
  size = os.path.getsize(path)
  if size > max_file_bytes and depth + 1 < KEY_BYTES:
    parts = [f"{path}.{i:03d}" for i in range(_FANOUT)]
    _scatter(_read_records(path), parts, depth + 1)
    os.remove(path)
    for part in parts:
      if os.path.exists(part):
        yield from _gather(part, depth + 1, bits, max_file_bytes)
    return
  with open(path, "rb") as f:
    data = f.read()
  os.remove(path)
  spans, position = [], 0
  while position < len(data):
    (length,) = _HEADER.unpack_from(data, position)
    position += _HEADER.size
    spans.append((data[position:position + KEY_BYTES], position + KEY_BYTES,
                  position + KEY_BYTES + length))
    position += KEY_BYTES + length
  spans.sort(key=lambda span: span[0])
  view = memoryview(data)
  for key, start, end in spans:
    yield key, marshal.loads(view[start:end])


def shuffled_documents(
    documents: Iterable[Sequence[str]], *, seed: int, work_dir: str,
    max_file_bytes: int = MAX_FILE_BYTES, shard_chars: int = SHARD_CHARS,
    tally: dict | None = None,
) -> Iterator[tuple[int, list[str]]]:
  """(shard, sentences) of `documents` in the seeded key order (sentences `clean`ed; documents
  without any dropped, and repeats of a text: `distinct`, counted into `tally`), through
  temporary files in `work_dir`; shards ascend.

  `work_dir` must not exist: it is created when iteration starts (all documents are read
  then) and removed with everything in it when the iterator is exhausted, closed or fails.
  """
  os.makedirs(work_dir)  # Never an existing directory: the cleanup below removes it.
  try:
    start = time.time()
    paths = [os.path.join(work_dir, f"keys-{i:03d}") for i in range(_FANOUT)]
    counts = {"documents": 0, "chars": 0}
    _scatter(_records(documents, seed, counts), paths, 0)
    bits = shard_bits(counts["chars"], shard_chars)
    logging.info("shuffle: %d documents (%d characters, %d shards) scattered over %d files in "
                 "%.1f s", counts["documents"], counts["chars"], 2**bits,
                 sum(map(os.path.exists, paths)), time.time() - start)
    tally = {} if tally is None else tally
    for path in paths:
      if os.path.exists(path):
        for key, sentences in distinct(_gather(path, 0, bits, max_file_bytes), tally):
          yield shard_of(key, bits), sentences
  finally:
    shutil.rmtree(work_dir, ignore_errors=True)
