"""Preparation workers: the pool of spawned processes that turn blocks into ArrayRecord files.

`write_blocks` hands each block (`blocks.DocumentBlock`) to a worker, which builds its rows
(`blocks.build_block`) and writes them as records (`records.RecordSerializer`) into a file of its
own; a bounded number of blocks is in flight, so neither the corpus nor the results pile up in
memory. `spawn_pool` is also the pool of `corpus.iter_builtin_docstrings`.

Worker processes import this module: it stays free of TFDS / JAX.
"""

import collections
import multiprocessing
import multiprocessing.pool
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterable, Iterator

from bert_jax.data import blocks as blocks_lib
from bert_jax.data.records import RecordSerializer

_WORKER_TOKENIZER: blocks_lib.Tokenizer | None = None
# group_size:1 for random access, as TFDS; snappy writes 2.5x faster than the default zstd for
# ~5% larger files, and reads as fast.
_RECORD_OPTIONS = "group_size:1,snappy"

# What `write_block` returns: (split, block index, bytes written, stats).
BlockResult = tuple[str, int, int, blocks_lib.BlockStats]


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
    block: blocks_lib.DocumentBlock, settings: blocks_lib.ExampleSettings, path: str,
    tokenizer: blocks_lib.Tokenizer | None = None,
) -> BlockResult:
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
  rows, stats = blocks_lib.build_block(block, tokenizer, settings, serializer)
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


def write_blocks(
    blocks: Iterable[blocks_lib.DocumentBlock],
    tokenizer: blocks_lib.Tokenizer,
    settings: blocks_lib.ExampleSettings,
    blocks_dir: str,
    num_workers: int,
) -> Iterator[tuple[str, BlockResult]]:
  """Writes each block into `<blocks_dir>/<block.name>.array_record`; yields (path,
  `write_block` result) per block, in block order.

  `num_workers` 0 builds in this process. With workers, at most 2 * num_workers blocks are in
  flight; they are spawned and ignore Ctrl-C (`spawn_pool`): the caller reacts, and closing this
  generator terminates and joins the pool.
  """
  def path_of(block: blocks_lib.DocumentBlock) -> str:
    return os.path.join(blocks_dir, f"{block.name}.array_record")

  if num_workers <= 0:
    for block in blocks:
      yield path_of(block), write_block(block, settings, path_of(block), tokenizer)
    return
  tokenizer_file = os.path.join(blocks_dir, "tokenizer.pickle")  # Read by each worker.
  with open(tokenizer_file, "wb") as f:
    pickle.dump(tokenizer, f)
  with spawn_pool(num_workers, init_worker, (tokenizer_file,)) as pool:
    pending: collections.deque = collections.deque()
    for block in blocks:
      pending.append((path_of(block), pool.apply_async(
          write_block, (block, settings, path_of(block)))))
      if len(pending) >= 2 * num_workers:
        path, result = pending.popleft()
        yield path, result.get()
    while pending:
      path, result = pending.popleft()
      yield path, result.get()
