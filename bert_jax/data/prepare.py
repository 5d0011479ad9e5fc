"""Streaming preparation of a corpus into a prepared dataset directory.

A prepared dataset directory (WORKSPACE contract) holds:
  dataset_info.json, features.json, bert_pretraining-{train,validation}.array_record-*  (TFDS)
  vocab/            the vocabulary (`Vocab.load(dir/vocab)`)
  bert_meta.json    vocab size, special ids, max_seq_length, objective, max_examples_per_row,
                    settings, per-split rows / examples / real tokens / fill rate, corpus stats

Every record is a row of max_seq_length tokens (`packing`): up to K NSP examples (objective
"mlm_nsp") or one FULL-SENTENCES sequence ("mlm"). The documents are shuffled corpus-wide
(`shuffle`: a first pass spreads them over temporary shard files, so that a block, the pool of
random-next B, is a random sample of the whole corpus), then cut into blocks
(`blocks.iter_prepared_blocks`); worker processes (`workers.write_blocks`) turn each block into
an ArrayRecord file of rows (its examples shuffled and packed within the block), a bounded
number of blocks in flight, so memory stays flat whatever the corpus size. Everything, the
shuffle's shard files (the corpus's text once) included, is written into a temporary sibling
directory that is renamed into place at the end: an interrupted preparation never leaves a
directory that looks complete, nor any temporary file. An output directory in a bucket
(gs://) is prepared locally, then uploaded with its bert_meta.json last, so it too is complete
or not a dataset at all (training reads it through a gcsfuse mount: ArrayRecord opens local
files only).
"""

import contextlib
import dataclasses
import gc
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bert_jax.runtime import storage
from bert_jax.data import blocks
from bert_jax.data import workers

META_FILE = "bert_meta.json"
VOCAB_DIR = "vocab"
# 3: records are packed rows (segment_ids, position_ids, [K] slot features).
FORMAT_VERSION = 3
# What rows a corpus and settings give, in the same format: bumped when they change, so that a
# cached dataset (the built-in corpus's key, `builtin.cache_key`) is prepared again rather than
# reused. 2: documents shuffled corpus-wide before blocking (`shuffle`); 3: the shuffle orders
# documents by a seeded hash key and blocks are cut within shards of it (the same rows from Beam);
# 4: a document that repeats another's text is dropped (`shuffle.distinct`).
PREPARATION_VERSION = 4
_BLOCKS_DIR = ".blocks"
_SHUFFLE_DIR = ".shuffle"

DocumentsFactory = Callable[[], Iterable[Sequence[str]]]


def check_output_dir(output_dir: str) -> None:
  """Raises unless `output_dir` (local or in a bucket) is absent or an empty directory."""
  if storage.exists(output_dir) and (not storage.isdir(output_dir)
                                     or storage.listdir(output_dir)):
    raise ValueError(f"--output_dir={output_dir} already exists and is not empty; choose a new "
                     "directory or delete it.")


def _as_dict(stats: Any) -> dict[str, Any] | None:
  if callable(stats):
    stats = stats()
  if stats is None:
    return None
  if dataclasses.is_dataclass(stats):
    return dataclasses.asdict(stats)
  return dict(stats)


def _split_summary(stats: blocks.BlockStats, max_seq_length: int) -> dict[str, Any]:
  """rows, examples, real_tokens and fill_rate (real tokens / (rows x L)) of one split."""
  return {"rows": stats.rows, "examples": stats.examples, "real_tokens": stats.real_tokens,
          "fill_rate": round(stats.real_tokens / max(stats.rows * max_seq_length, 1), 6)}


def prepare_dataset(
    output_dir: str,
    documents_factory: DocumentsFactory,
    vocab,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 5,
    validation_fraction: float = 0.01,
    seed: int = 0,
    objective: str = blocks.ExampleSettings.objective,
    max_examples_per_row: int = blocks.ExampleSettings.max_examples_per_row,
    num_workers: int | None = None,
    block_chars: int = blocks.ExampleSettings.block_chars,
    shard_chars: int = blocks.ExampleSettings.shard_chars,
    corpus_stats: Any = None,
    corpus_fingerprint: str = "",
) -> dict[str, Any]:
  """Builds the rows of a corpus into `output_dir`; returns the metadata written.

  Objective "mlm_nsp" packs up to `max_examples_per_row` NSP examples a row; "mlm" writes
  FULL-SENTENCES rows and ignores `max_examples_per_row` (its rows hold one sequence: the
  metadata records 1). `documents_factory()` returns a fresh iterator of documents (lists of
  sentences); `vocab` is a `bert_jax.data.vocab.Vocab` (picklable: the worker processes get a
  copy). `num_workers=None` uses every core, 0 builds in this process; the output is the same
  for any value. `corpus_stats` (e.g. the `CorpusStats` the factory's reader fills, or a
  callable returning it) is read after the corpus has been consumed and stored in the metadata
  with `corpus_fingerprint`. The output depends on the corpus and settings only: the documents
  are shuffled corpus-wide with `seed` (`shuffle`) in this process, before any worker starts.
  Besides the dataset, the disk needs room for the corpus's text once (the shuffle's files,
  next to `output_dir`).

  An `output_dir` in a bucket (gs://...) is built in a local temporary directory (under
  $TMPDIR, which needs room for the whole dataset) and uploaded once complete, bert_meta.json
  last: the bucket holds a complete dataset or none (a failed upload is removed again).
  """
  settings = blocks.ExampleSettings(
      max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
      validation_fraction=validation_fraction, seed=seed, block_chars=block_chars,
      shard_chars=shard_chars,
      objective=objective, max_examples_per_row=max_examples_per_row)
  settings.validate()
  # Recorded as what the rows hold ("mlm": 1), so the metadata is not misleading.
  settings = dataclasses.replace(settings, max_examples_per_row=settings.examples_per_row)
  output_dir = storage.absolute(output_dir)
  check_output_dir(output_dir)
  if num_workers is None:
    num_workers = os.cpu_count() or 1
  inputs = (documents_factory, vocab, settings, num_workers, corpus_stats, corpus_fingerprint)
  if not storage.is_remote(output_dir):
    return _build(output_dir, *inputs)
  with tempfile.TemporaryDirectory(prefix="bert_jax_prepare_") as staging:
    local_dir = os.path.join(staging, "dataset")
    meta = _build(local_dir, *inputs)
    _upload(local_dir, output_dir)
  return meta


def _upload(local_dir: str, output_dir: str) -> None:
  """Copies the finished dataset `local_dir` to `output_dir` in a bucket, bert_meta.json last:
  until it is there `load_meta` refuses the directory, so an interrupted upload never looks like
  a dataset. A failed upload removes what it wrote (the directory was empty before)."""
  start = time.time()
  meta_file = os.path.join(local_dir, META_FILE)
  with open(meta_file, "rb") as f:
    meta_bytes = f.read()
  os.remove(meta_file)
  try:
    storage.copy_tree(local_dir, output_dir)
    storage.write_bytes(storage.join(output_dir, META_FILE), meta_bytes)
  except BaseException:
    try:
      storage.remove_tree(output_dir)
    except Exception as e:  # pylint: disable=broad-except  (the upload's error matters more)
      logging.warning("prepare: could not remove the incomplete upload %s (%s); delete it "
                      "before preparing into it again.", output_dir, e)
    raise
  logging.info("prepare: uploaded the dataset to %s in %.1f s", output_dir, time.time() - start)


def _build(output_dir: str, documents_factory: DocumentsFactory, vocab,
           settings: blocks.ExampleSettings, num_workers: int, corpus_stats: Any,
           corpus_fingerprint: str) -> dict[str, Any]:
  """`prepare_dataset` into the local `output_dir` (absent or empty): built in a temporary
  sibling directory, renamed into place when complete."""
  parent = os.path.dirname(output_dir)
  os.makedirs(parent, exist_ok=True)
  tmp_dir = os.path.join(
      parent, f".{os.path.basename(output_dir)}.incomplete-{os.getpid()}-{uuid.uuid4().hex[:8]}")
  start = time.time()
  try:  # Whatever ends it (an error, Ctrl-C's KeyboardInterrupt), no temporary directory stays.
    os.makedirs(os.path.join(tmp_dir, _BLOCKS_DIR))
    vocab.save(os.path.join(tmp_dir, VOCAB_DIR))
    tally: dict[str, int] = {}
    split_shards, split_stats = _write_shards(
        os.path.join(tmp_dir, _BLOCKS_DIR), os.path.join(tmp_dir, _SHUFFLE_DIR),
        documents_factory(), vocab, settings, num_workers, tally)
    _check_splits(split_stats, settings)

    from bert_jax.data import tfds_builder  # Deferred: TFDS is a slow import.

    tfds_builder.write_tfds_layout(tmp_dir, settings.max_seq_length, settings.examples_per_row,
                                   split_shards)
    shutil.rmtree(os.path.join(tmp_dir, _BLOCKS_DIR))
    read = _as_dict(corpus_stats)
    meta = _meta(vocab, settings, split_stats, read and {**read, **tally}, corpus_fingerprint,
                 time.time() - start)
    with open(os.path.join(tmp_dir, META_FILE), "w") as f:
      json.dump(meta, f, indent=2)
    if os.path.isdir(output_dir):
      os.rmdir(output_dir)  # Empty (checked above); fails if someone filled it meanwhile.
    os.rename(tmp_dir, output_dir)
  except BaseException as error:
    shutil.rmtree(tmp_dir, ignore_errors=True)  # The worker pool is stopped (_write_shards).
    if isinstance(error, KeyboardInterrupt) and num_workers > 0:
      # The frames of its traceback hold the worker pool (itself in reference cycles): without
      # them, and collected, the pool's semaphores are released now, even when the process then
      # ends with os._exit (bert_jax.runtime.cli after a Ctrl-C, skipping multiprocessing's exit
      # handlers: the resource tracker would print "leaked semaphore objects"). Where Ctrl-C
      # struck is of no interest.
      error = error.with_traceback(None)
      gc.collect()
      raise error  # pylint: disable=raise-missing-from
    raise
  chars = split_stats[blocks.TRAIN].chars + split_stats[blocks.VALIDATION].chars
  train = meta["splits"][blocks.TRAIN]
  logging.info("prepare: wrote %s (%d train rows holding %d examples, %.1f%% real tokens; %d "
               "validation rows) in %.1f s, %.2f MB/s", output_dir, train["rows"],
               train["examples"], 100 * train["fill_rate"],
               meta["splits"][blocks.VALIDATION]["rows"], meta["prepare_seconds"],
               chars / 1e6 / max(meta["prepare_seconds"], 1e-9))
  return meta


SplitShards = dict[str, list[tuple[str, int, int]]]  # split -> [(path, rows, bytes)].


def _write_shards(
    blocks_dir: str, shuffle_dir: str, documents: Iterable[Sequence[str]], vocab,
    settings: blocks.ExampleSettings, num_workers: int, tally: dict | None = None,
) -> tuple[SplitShards, dict[str, blocks.BlockStats]]:
  """Every block's ArrayRecord file in `blocks_dir` (the shuffle's files in `shuffle_dir`, gone
  once read back): (the shards of each split, in block order; each split's counts). The
  documents dropped as repeats are counted into `tally` (`shuffle.distinct`)."""
  start = time.time()
  document_blocks = blocks.iter_prepared_blocks(documents, settings, shuffle_dir, tally)
  split_shards: SplitShards = {s: [] for s in blocks.SPLITS}
  split_stats = {s: blocks.BlockStats() for s in blocks.SPLITS}
  # Closed on any error: the worker processes are stopped (the pool is terminated and joined)
  # before their directory goes, or a worker still writing a block would recreate files in it.
  with contextlib.closing(workers.write_blocks(
      document_blocks, vocab, settings, blocks_dir, num_workers)) as results:
    for path, (split, block_index, num_bytes, stats) in results:
      split_stats[split].add(stats)
      if stats.rows:
        split_shards[split].append((path, stats.rows, num_bytes))
      chars = sum(s.chars for s in split_stats.values())
      logging.info("prepare: %s block %d done, %.1f MB of text so far (%.2f MB/s)", split,
                   block_index, chars / 1e6, chars / 1e6 / max(time.time() - start, 1e-9))
  return split_shards, split_stats


def _check_splits(split_stats: dict[str, blocks.BlockStats],
                  settings: blocks.ExampleSettings, warn: bool = True) -> None:
  """Raises when the train split has no row; warns (unless not `warn`) of an empty validation
  split and of NSP chunks that had no other document to draw a random next segment from."""
  for split, stats in split_stats.items() if warn else ():
    if stats.random_next_to_continuation or stats.random_next_skipped:
      # A split of one document (its NSP labels all 0): say so rather than skew eval silently.
      logging.warning(
          "prepare: %s split (%d documents): %d chunks had no document but their own to draw "
          "a random next segment from; %d got their real continuation instead, %d (one "
          "sentence) made no example.", split, stats.documents,
          stats.random_next_to_continuation + stats.random_next_skipped,
          stats.random_next_to_continuation, stats.random_next_skipped)
  if not split_stats[blocks.TRAIN].rows:
    raise ValueError(_no_training_rows(split_stats, settings))
  if warn and not split_stats[blocks.VALIDATION].rows:
    logging.warning("prepare: %s", _empty_validation(split_stats, settings))


def _meta(vocab, settings: blocks.ExampleSettings, split_stats: dict[str, blocks.BlockStats],
          corpus_stats: Any, corpus_fingerprint: str, seconds: float) -> dict[str, Any]:
  """The dataset's bert_meta.json."""
  max_seq_length = settings.max_seq_length
  return {
      "format_version": FORMAT_VERSION,
      "preparation_version": PREPARATION_VERSION,
      "vocab_size": int(vocab.size),
      "vocab_kind": vocab.kind,
      "vocab_dir": VOCAB_DIR,
      "pad_id": int(vocab.pad_id),
      "unk_id": int(vocab.unk_id),
      "cls_id": int(vocab.cls_id),
      "sep_id": int(vocab.sep_id),
      "mask_id": int(vocab.mask_id),
      "special_ids": [int(i) for i in vocab.special_ids],
      "max_seq_length": max_seq_length,
      "objective": settings.objective,
      "max_examples_per_row": settings.examples_per_row,  # K: the [K] slots of every row.
      "settings": dataclasses.asdict(settings),
      "splits": {s: _split_summary(split_stats[s], max_seq_length) for s in blocks.SPLITS},
      "stats": {s: dataclasses.asdict(split_stats[s]) for s in blocks.SPLITS},
      "corpus_stats": _as_dict(corpus_stats),
      "corpus_fingerprint": corpus_fingerprint,
      "prepare_seconds": round(seconds, 3),
  }


def _no_training_rows(split_stats: dict[str, blocks.BlockStats],
                      settings: blocks.ExampleSettings) -> str:
  """Why the corpus gave the train split no row, and what to change."""
  train, validation = split_stats[blocks.TRAIN], split_stats[blocks.VALIDATION]
  if not train.documents and not validation.documents:
    return ("The corpus produced no training examples (no document with a tokenized sentence); "
            "check the input flags (--input / --tfds_name / --builtin).")
  if not train.documents:
    return (f"The corpus produced no training examples: its {validation.documents} document(s) "
            f"all went to the validation split (--validation_fraction="
            f"{settings.validation_fraction}); give more documents (separated by blank lines).")
  return (f"The corpus produced no training examples: its {train.documents} training "
          f"document(s) hold {train.sentences} sentence(s), and a next-sentence example needs "
          "two sentences of one document, or another document to draw a random next sentence "
          "from; give more documents (separated by blank lines) or sentences (one a line, or "
          "--input_format=paragraphs), or prepare for --objective=mlm.")


def _empty_validation(split_stats: dict[str, blocks.BlockStats],
                      settings: blocks.ExampleSettings) -> str:
  """The warning of a dataset without validation rows: training refuses it."""
  documents = split_stats[blocks.VALIDATION].documents
  if settings.validation_fraction <= 0:
    why = "--validation_fraction=0"
  elif not documents:
    why = (f"none of the corpus's {split_stats[blocks.TRAIN].documents} documents fell "
           f"into --validation_fraction={settings.validation_fraction}")
  else:
    why = f"its {documents} document(s) made no example"
  return (f"the validation split is empty ({why}); pretraining evaluates on it and refuses "
          "this dataset: prepare it again with a --validation_fraction > 0 and enough text "
          "for it (more documents).")


def load_meta(dataset_dir: str) -> dict[str, Any]:
  """The `bert_meta.json` of a prepared dataset (local or in a bucket), with a clear error if it
  is not one."""
  if not storage.isdir(dataset_dir):
    raise ValueError(f"Dataset directory {dataset_dir!r} does not exist; prepare it with "
                     f"`python launch/prepare_data.py --output_dir={dataset_dir} ...` "
                     "(or set --config.data.dataset_dir).")
  path = storage.join(dataset_dir, META_FILE)
  if not storage.isfile(path):
    raise ValueError(f"{dataset_dir!r} is not a prepared bert_jax dataset (no {META_FILE}); "
                     "prepare it with launch/prepare_data.py.")
  try:
    meta = json.loads(storage.read_text(path))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); prepare the dataset again with "
                     "launch/prepare_data.py.") from e
  if not isinstance(meta, dict):
    raise ValueError(f"{path} is not a bert_jax dataset's metadata (a JSON object); prepare the "
                     "dataset again with launch/prepare_data.py.")
  if meta.get("format_version") != FORMAT_VERSION:
    raise ValueError(f"{dataset_dir!r} was prepared in format_version "
                     f"{meta.get('format_version')} of bert_jax datasets; this version reads "
                     f"{FORMAT_VERSION} (packed rows): prepare the dataset again with "
                     "launch/prepare_data.py.")
  missing = [key for key in _REQUIRED_META if key not in meta]
  if missing:
    raise ValueError(f"{path} lacks {', '.join(missing)}: not a complete bert_jax dataset's "
                     "metadata; prepare the dataset again with launch/prepare_data.py.")
  return meta


# What training reads of bert_meta.json (`_meta` writes them all).
_REQUIRED_META = ("vocab_size", "vocab_dir", "pad_id", "unk_id", "cls_id", "sep_id", "mask_id",
                  "special_ids", "max_seq_length", "objective", "max_examples_per_row", "splits")


def vocab_dir(dataset_dir: str, meta: dict[str, Any]) -> str:
  """The vocabulary of a prepared dataset: its `vocab_dir`, which must lie inside it. The rows'
  ids are that vocabulary's; a bert_meta.json naming one elsewhere (another dataset's, edited
  by hand) would train silently on other pieces."""
  name = meta["vocab_dir"]
  parts = os.path.normpath(name).split(os.sep) if isinstance(name, str) else [".."]
  if not isinstance(name, str) or not name or os.path.isabs(name) or "://" in name or (
      ".." in parts):
    raise ValueError(
        f"{storage.join(dataset_dir, META_FILE)}: vocab_dir {name!r} lies outside the dataset: "
        "a dataset's rows are ids of the vocabulary it was prepared with, kept in the dataset "
        f"({VOCAB_DIR}/). If {name!r} is that vocabulary, copy it to "
        f"{storage.join(dataset_dir, VOCAB_DIR)} and set \"vocab_dir\": \"{VOCAB_DIR}\"; "
        "otherwise prepare the dataset again with it (launch/prepare_data.py --vocab)")
  return storage.join(dataset_dir, name)


def load_vocab(dataset_dir: str):
  """The vocabulary saved with a prepared dataset."""
  from bert_jax.data import vocab as vocab_lib

  return vocab_lib.Vocab.load(vocab_dir(dataset_dir, load_meta(dataset_dir)))
