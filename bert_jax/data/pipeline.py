"""Input pipelines: grain over a prepared dataset (train, eval) and a synthetic source.

Every batch is a dict of numpy arrays, the per-host slice of the global batch (WORKSPACE), one
prepared row per batch row (`packing`'s layout; K = the dataset's `max_examples_per_row`):
`input_ids`, `token_type_ids`, `segment_ids`, `position_ids`, `word_starts` int32 [B, L];
`cls_positions`, `next_sentence_label` int32 [B, K] and `nsp_weights` float32 [B, K]; eval batches
add `example_weight` float32 [B] (0 on rows that pad the last batch).

Train order: the whole split is shuffled with the seed, epoch after epoch (each epoch reshuffled),
and cut into global batches; host p of P reads rows [p * B/P, (p + 1) * B/P) of each global batch.
So the hosts' shards are disjoint and together cover the data, and once the hosts' rows are
stitched in process order (`jax.make_array_from_process_local_data`), global batch k is the same
array, row for row, whatever the number of hosts: the masks drawn for each row, and so the
losses, do not depend on the host count.
"""

import concurrent.futures
import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any

from absl import flags
import grain
import ml_collections
import numpy as np
from tensorflow_datasets.proto import tf_example_pb2

from bert_jax.runtime import storage
from bert_jax.data import batching
from bert_jax.data import blocks
from bert_jax.data import builtin
from bert_jax.data import packing
from bert_jax.data import prepare
from bert_jax.data import tfds_builder

Batch = dict[str, np.ndarray]
_FEATURES = (*packing.TOKEN_FEATURES, *packing.SLOT_FEATURES)
# Batches computed ahead in background threads (GIL-bound decode overlaps the jitted step).
_READ_THREADS = 2
_READ_BUFFER = 4


def check_dataset_matches(meta: dict[str, Any], vocab_size: int, max_seq_length: int,
                          objective: str, max_examples_per_row: int) -> None:
  """Refuses a prepared dataset whose vocabulary, sequence length, objective or examples per row
  differ from the config. K is the config's `packing.examples_per_row`: 1 for "mlm" rows (one
  sequence) whatever `max_examples_per_row` says."""
  problems = []
  if int(meta["vocab_size"]) != int(vocab_size):
    problems.append(
        f"the dataset's vocabulary has {meta['vocab_size']} tokens but "
        f"config.model.vocab_size={vocab_size}: set --config.model.vocab_size="
        f"{meta['vocab_size']} (or prepare the data again with --vocab_size={vocab_size})")
  if int(meta["max_seq_length"]) != int(max_seq_length):
    problems.append(
        f"the dataset's max_seq_length is {meta['max_seq_length']} but "
        f"config.data.max_seq_length={max_seq_length}: set --config.data.max_seq_length="
        f"{meta['max_seq_length']} (or prepare the data again with "
        f"--max_seq_length={max_seq_length})")
  if meta["objective"] != objective:
    # `objective` is the run's row format: rtd and diffusion read "mlm" rows, rtd_nsp
    # "mlm_nsp". Advise what keeps the run's objective first (the red team: an RTD run was told
    # to switch to mlm_nsp, which would silently drop RTD).
    readers = [o for o, rows in packing.ROW_FORMATS.items() if rows == meta["objective"]]
    problems.append(
        f"the dataset was prepared as {meta['objective']!r} rows but config.data.objective "
        f"reads {objective!r} rows: prepare the data again with --objective={objective} (or "
        f"train an objective that reads these rows: {', '.join(readers)})")
  elif int(meta["max_examples_per_row"]) != packing.examples_per_row(objective,
                                                                     int(max_examples_per_row)):
    problems.append(
        f"the dataset packs up to {meta['max_examples_per_row']} examples per row but "
        f"config.data.max_examples_per_row={max_examples_per_row}: set "
        f"--config.data.max_examples_per_row={meta['max_examples_per_row']} (or prepare the "
        f"data again with --max_examples_per_row={max_examples_per_row})")
  if problems:
    raise ValueError("Prepared dataset does not match the model config: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What a pretraining run reads (config.data's source) and what that data must match (the
  model's vocabulary, the length, the objective and its packing): the driver builds it once."""
  source: str  # "builtin", "prepared" or "synthetic".
  dataset_dir: str  # "prepared": the prepared dataset's directory.
  vocab_size: int  # config.model.vocab_size.
  max_seq_length: int
  objective: str  # "mlm" or "mlm_nsp".
  max_examples_per_row: int
  builtin: builtin.BuiltinSettings  # "builtin": the corpus's settings (its cache key).

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "DataSpec":
    data = config.data
    return cls(source=data.source, dataset_dir=data.dataset_dir,
               vocab_size=config.model.vocab_size, max_seq_length=data.max_seq_length,
               objective=packing.row_format(data.objective),
               max_examples_per_row=data.max_examples_per_row,
               builtin=builtin.BuiltinSettings.from_config(config))


def resolve_dataset(spec: DataSpec, workdir: str,
                    builtin_dir: str | None = None) -> tuple[str, dict]:
  """(dataset_dir, meta) for `spec.source` "builtin" or "prepared", checked against the spec
  and by `check_dataset` (readable shards, a validation split to evaluate on). Only reads.

  "builtin" is the built-in corpus prepared under `workdir` for the spec's settings
  (`builtin.dataset_dir`; `builtin.ensure_builtin` prepares it, as `bert_jax/train.py` does
  first; `builtin_dir`: the directory `ensure_builtin` returned, so that the corpus is not
  looked at twice). For a "prepared" dataset `workdir` plays no part (a launcher checks it before it
  touches its workdir). A prepared dataset in a bucket is refused here, before any device work,
  with how to mount it: ArrayRecord reads local files only.
  """
  fraction_flag = "--validation_fraction"
  if spec.source == "builtin":
    dataset_dir = builtin_dir or builtin.dataset_dir(workdir, spec.builtin)
    if not storage.isfile(storage.join(dataset_dir, prepare.META_FILE)):
      raise ValueError(f"The built-in corpus is not prepared for this config in {dataset_dir}: "
                       "training prepares it (bert_jax.data.builtin.ensure_builtin) before "
                       "reading it.")
    fraction_flag = "--config.data.validation_fraction"
  elif spec.source == "prepared":
    if not spec.dataset_dir:
      raise ValueError("config.data.source='prepared' needs --config.data.dataset_dir.")
    dataset_dir = storage.require_local(spec.dataset_dir,
                                        "The prepared dataset (--config.data.dataset_dir)")
  else:
    raise ValueError(f"config.data.source={spec.source!r} has no dataset directory "
                     "(expected 'builtin' or 'prepared').")
  meta = prepare.load_meta(dataset_dir)
  prepare.vocab_dir(dataset_dir, meta)  # Inside the dataset.
  check_dataset_matches(meta, spec.vocab_size, spec.max_seq_length, spec.objective,
                        spec.max_examples_per_row)
  check_dataset(dataset_dir, fraction_flag=fraction_flag)
  return dataset_dir, meta


# Shards opened at once by `check_dataset`: I/O bound (a gcsfuse mount answers in tens of ms).
_CHECK_THREADS = 16


def check_dataset(dataset_dir: str, *, fraction_flag: str = "--validation_fraction") -> None:
  """Raises ValueError (one line, naming the dataset or the file) on the first problem of a
  prepared dataset that would otherwise only show once training runs, after compiling: not a
  dataset, an empty train or validation split (pretraining evaluates at least at its last
  step), or a shard that is missing, truncated or corrupt (each ArrayRecord shard of both splits
  is opened, its record count compared with dataset_info.json, its first and last records read
  and decoded). Cheap: a few reads per shard, in threads. `fraction_flag` is how the fix is
  spelled (the built-in corpus: --config.data.validation_fraction)."""
  dataset_dir = storage.require_local(dataset_dir, "The prepared dataset")
  meta = prepare.load_meta(dataset_dir)
  try:
    splits = tfds_builder.split_infos(dataset_dir)
  except Exception as e:  # TFDS raises many types for a damaged dataset_info.json.
    raise ValueError(f"Prepared dataset {dataset_dir}: its TFDS metadata (dataset_info.json, "
                     f"features.json) cannot be read ({type(e).__name__}: {e}); prepare the "
                     "dataset again.") from e
  for split in blocks.SPLITS:
    if not sum(splits.get(split, ((), ()))[1]):
      raise ValueError(_empty_split_message(dataset_dir, meta, split, fraction_flag))
  shards = [(path, expected) for split in blocks.SPLITS
            for path, expected in zip(*splits[split])]
  expected_lengths = (int(meta["max_seq_length"]), int(meta["max_examples_per_row"]))
  with concurrent.futures.ThreadPoolExecutor(min(_CHECK_THREADS, len(shards))) as pool:
    problems = pool.map(lambda shard: _shard_problem(*shard, expected_lengths), shards)
    problem = next((p for p in problems if p), None)  # The first in shard order.
  if problem:
    raise ValueError(f"Prepared dataset {dataset_dir}: {problem}; copy the dataset again (an "
                     "interrupted copy?) or prepare it again.")


def _empty_split_message(dataset_dir: str, meta: dict[str, Any], split: str,
                         fraction_flag: str) -> str:
  """Why `split` of a prepared dataset has no rows, and what to prepare instead."""
  if split == blocks.TRAIN:
    return (f"Prepared dataset {dataset_dir}: the train split has no rows; prepare it again "
            "with more text.")
  fraction = float(meta.get("settings", {}).get("validation_fraction", 0.0))
  stats = meta.get("stats", {})
  documents = int(stats.get(split, {}).get("documents", 0))
  if fraction <= 0:
    why = "it was prepared with validation_fraction=0"
  elif not documents:
    why = (f"none of the corpus's {stats.get(blocks.TRAIN, {}).get('documents', '?')} "
           f"documents fell into validation_fraction={fraction}")
  else:
    why = f"its {documents} validation document(s) made no example"
  return (f"Prepared dataset {dataset_dir}: the validation split is empty ({why}), and "
          "pretraining evaluates on it (at least at its last step): prepare it again with "
          f"{fraction_flag} > 0 (e.g. 0.01) and enough text for it (more documents).")


def _shard_problem(path: str, expected_records: int,
                   expected_lengths: tuple[int, int]) -> str | None:
  """What is wrong with one ArrayRecord shard (None: it reads). Its first and last records are
  read: a truncated file fails to open (its footer is gone), a damaged one often to read."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  if not os.path.isfile(path):
    return f"shard {path} is missing"
  try:
    # No read-ahead: two records are read, not the 16 MB default buffer.
    reader = array_record_module.ArrayRecordReader(path, "readahead_buffer_size:0")
  except Exception as e:  # pylint: disable=broad-except  (riegeli: RuntimeError, often blank)
    reason = _describe(e) or "truncated, or not an ArrayRecord file"
    return f"shard {path} cannot be opened ({reason})"
  try:
    if not reader.ok():  # A truncated file opens, with no records and this flag down.
      return f"shard {path} cannot be read (truncated or corrupt: no valid ArrayRecord footer)"
    found = int(reader.num_records())
    if found != expected_records:
      return (f"shard {path} holds {found} records but dataset_info.json says "
              f"{expected_records}")
    records = reader.read([0, found - 1])
    batch = decode_records(records)
  except Exception as e:  # pylint: disable=broad-except  (riegeli and protobuf errors)
    return f"shard {path} cannot be read ({_describe(e) or 'corrupt'})"
  finally:
    try:
      reader.close()
    except Exception:  # pylint: disable=broad-except  (riegeli reports a damaged file again)
      pass
  lengths = (batch["input_ids"].shape[1], batch[packing.NSP_WEIGHTS].shape[1])
  if lengths != expected_lengths:
    return (f"shard {path} holds rows of {lengths[0]} tokens and {lengths[1]} slots, but "
            f"bert_meta.json says {expected_lengths[0]} and {expected_lengths[1]}")
  return None


def _describe(error: BaseException) -> str:
  return " ".join(str(error).split())


def _as_batch(arrays: dict[str, np.ndarray]) -> Batch:
  """int32 arrays of the record features -> the batch (nsp_weights as float32)."""
  arrays[packing.NSP_WEIGHTS] = arrays[packing.NSP_WEIGHTS].astype(np.float32)  # [B, K]
  return arrays


def stack_examples(examples: Sequence[dict[str, Any]]) -> Batch:
  """TFDS-decoded rows -> one batch dict ([B, L] and [B, K] arrays)."""
  return _as_batch({name: np.asarray([e[name] for e in examples], dtype=np.int32)
                    for name in _FEATURES})


def decode_records(records: Sequence[bytes]) -> Batch:
  """Serialized rows (tf.train.Example) -> one batch dict ([B, L] and [B, K] arrays).

  Decodes the batch at once, about 4x faster than TFDS's per-example decoding; tests check it
  against `tfds.features` decoding.
  """
  features = [tf_example_pb2.Example.FromString(r).features.feature for r in records]
  return _as_batch({name: np.asarray([f[name].int64_list.value for f in features],
                                     dtype=np.int32) for name in _FEATURES})


def read_rows(source, indices: Sequence[int], dataset_dir: str, split: str) -> Batch:
  """The decoded rows `indices` of a split's source. A shard damaged where the start's check
  did not read (`check_dataset` reads each shard's first and last records) fails here, in
  training: one ValueError naming the shard, not riegeli's traceback from grain's threads."""
  try:
    return decode_records(source.__getitems__([int(i) for i in indices]))
  except Exception as e:  # pylint: disable=broad-except  (riegeli: RuntimeError; protobuf)
    problem = _describe(e) or type(e).__name__
    shard = _shard_of_bad_row(source, indices, dataset_dir, split)
    raise ValueError(f"Prepared dataset {dataset_dir}: {shard or f'the {split} split'} cannot be "
                     f"read ({problem}); copy the dataset again (an interrupted copy?) or "
                     "prepare it again. Checkpoints so far are kept.") from e


def _shard_of_bad_row(source, indices: Sequence[int], dataset_dir: str, split: str) -> str:
  """"shard <path> (row i)" of the first of `indices` that does not read, or "" if none is
  found (the failure was not one row's)."""
  for index in indices:
    try:
      decode_records(source.__getitems__([int(index)]))
      continue
    except Exception:  # pylint: disable=broad-except
      pass
    try:
      paths, lengths = tfds_builder.split_infos(dataset_dir)[split]
    except Exception:  # pylint: disable=broad-except
      return ""
    bounds = np.cumsum(lengths)
    shard = int(np.searchsorted(bounds, int(index), side="right"))
    first = int(bounds[shard - 1]) if shard else 0
    return f"shard {paths[shard]} (record {int(index) - first})" if shard < len(paths) else ""
  return ""


class HostRows(grain.transforms.Map):
  """Global batch of record indices [B] -> this host's contiguous rows [B / P]."""

  def __init__(self, process_index: int, rows_per_host: int):
    self._start, self._stop = process_index * rows_per_host, (process_index + 1) * rows_per_host

  def map(self, indices: np.ndarray) -> np.ndarray:
    return indices[self._start:self._stop]


class ReadBatch(grain.transforms.Map):
  """Batch of record indices [B] -> decoded batch (reads the records in one call)."""

  def __init__(self, source, dataset_dir: str, split: str):
    self._source, self._dataset_dir, self._split = source, dataset_dir, split

  def map(self, indices: np.ndarray) -> Batch:
    return read_rows(self._source, indices.tolist(), self._dataset_dir, self._split)


def split_source(dataset_dir: str, split: str):
  """The split's rows, raw bytes (decoded by `decode_records`)."""
  storage.require_local(dataset_dir, "The prepared dataset")  # ArrayRecord opens local files.
  prepare.load_meta(dataset_dir)  # Clear error when the directory is not a prepared dataset.
  count = tfds_builder.num_rows(dataset_dir, split)
  if count == 0:
    raise ValueError(f"{dataset_dir}: the {split!r} split has no rows (prepare with more "
                     "text, or a --validation_fraction > 0 for evaluation).")
  return tfds_builder.data_source(dataset_dir, split, raw=True)


def make_train_iterator(
    dataset_dir: str,
    *,
    global_batch_size: int,
    seed: int,
    process_index: int,
    process_count: int,
    num_workers: int = 0,
) -> grain.DatasetIterator:
  """Endless per-host train batches; `get_state()` / `set_state()` make it resumable.

  Save the state with `grain.checkpoint.CheckpointSave(iterator)` in an orbax checkpoint and
  restore with `grain.checkpoint.CheckpointRestore(iterator)` on a freshly made iterator.
  `num_workers` > 0 reads in that many grain worker processes (spawned: the calling script
  needs a `__main__` guard); the batches are the same for any `num_workers`.
  """
  batch_size = batching.per_host_batch_size(global_batch_size, process_count)
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, {process_count}).")
  source = split_source(dataset_dir, blocks.TRAIN)
  # Shuffle and batch record indices globally, keep this host's rows; records are read (only
  # this host's) a batch at a time.
  dataset = grain.MapDataset.range(len(source)).shuffle(seed=seed).repeat(None)
  dataset = dataset.batch(global_batch_size, drop_remainder=True)
  dataset = dataset.map(HostRows(process_index, batch_size)).map(
      ReadBatch(source, dataset_dir, blocks.TRAIN))
  iter_dataset = dataset.to_iter_dataset(grain.ReadOptions(
      num_threads=_READ_THREADS, prefetch_buffer_size=_READ_BUFFER))
  if num_workers > 0:
    if not flags.FLAGS.is_parsed():
      # grain reads its absl flags when starting workers; outside absl's app.run (tests,
      # notebooks) nothing has parsed them, so take their defaults.
      flags.FLAGS.mark_as_parsed()
    iter_dataset = iter_dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  return iter(iter_dataset)


class EvalBatches:
  """One deterministic pass over the validation split, this process's rows of each global batch
  (`batching.eval_rows`: contiguous per process, the last batch padded with copies of a row
  weighted 0.0 in `example_weight`), so `sum(w * x) / sum(w)` is exact over the split, the
  global batches are the same for any number of processes, and every process yields as many
  batches (none waits on another in a collective). Re-iterable."""

  def __init__(self, dataset_dir: str, *, global_batch_size: int, process_index: int,
               process_count: int, max_batches: int = 0):
    self._source = split_source(dataset_dir, blocks.VALIDATION)
    self._dataset_dir = dataset_dir
    self.num_rows = len(self._source)
    self._rows = lambda: batching.eval_rows(self.num_rows, global_batch_size, process_index,
                                            process_count, max_batches)
    self._num_batches = sum(1 for _ in self._rows())

  def __len__(self) -> int:
    return self._num_batches

  def __iter__(self) -> Iterator[Batch]:
    for indices, weights in self._rows():
      batch = read_rows(self._source, indices, self._dataset_dir, blocks.VALIDATION)
      batch["example_weight"] = weights  # [B]
      yield batch


def make_eval_batches(
    dataset_dir: str,
    *,
    global_batch_size: int,
    process_index: int,
    process_count: int,
    max_batches: int = 0,
) -> EvalBatches:
  """The validation split as padded, weighted per-host batches (`max_batches` > 0 caps it)."""
  return EvalBatches(dataset_dir, global_batch_size=global_batch_size,
                     process_index=process_index, process_count=process_count,
                     max_batches=max_batches)


class SyntheticBatch(grain.transforms.Map):
  """Step k -> a random batch of rows with the real layout and batch contract.

  Each row packs 1..K examples ([CLS] A [SEP] B [SEP], >= 5 tokens each: at most L // 5 of
  them), together filling half the row to all of it. Global batch k depends only on (seed, k);
  host p keeps rows [p * b, (p + 1) * b).
  """

  def __init__(self, *, batch_size: int, seq_len: int, vocab_size: int, pad_id: int,
               cls_id: int, sep_id: int, special_ids: Sequence[int], seed: int,
               process_index: int, process_count: int, max_examples_per_row: int = 1):
    if seq_len < 5:
      raise ValueError(f"seq_len={seq_len}: need at least 5 ([CLS] A [SEP] B [SEP]).")
    if max_examples_per_row < 1:
      raise ValueError(f"max_examples_per_row={max_examples_per_row} must be >= 1.")
    self.batch_size, self.seq_len, self.num_slots = batch_size, seq_len, max_examples_per_row
    self._ids = (pad_id, cls_id, sep_id)
    self._allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int32),
                                 np.asarray([pad_id, cls_id, sep_id, *special_ids], np.int32))
    if not len(self._allowed):
      raise ValueError(f"vocab_size={vocab_size} leaves no non-special token.")
    self._seed, self._process_index = seed, process_index
    self._global_batch_size = batch_size * process_count

  def map(self, step: int) -> Batch:
    pad_id, cls_id, sep_id = self._ids
    b, length, slots = self._global_batch_size, self.seq_len, self.num_slots
    rng = np.random.default_rng([self._seed, int(step)])
    num_examples = rng.integers(1, min(slots, length // 5) + 1, size=(b, 1))  # [B, 1]
    num_real = rng.integers(np.maximum(5 * num_examples, length // 2), length + 1)  # [B, 1]
    # Example lengths: 5 each, plus the rest of num_real split at random among the examples.
    used = np.arange(slots)[None, :] < num_examples  # [B, K]
    shares = (rng.random((b, slots)) + 0.01) * used  # > 0 on every used slot.
    extra = np.floor((num_real - 5 * num_examples) * shares / shares.sum(1, keepdims=True))
    lengths = np.where(used, 5 + extra.astype(np.int64), 0)  # [B, K]
    lengths[:, :1] += num_real - lengths.sum(1, keepdims=True)  # Rounding left to example 1.
    starts = np.cumsum(lengths, 1) - lengths  # [B, K]: [CLS] of each example.
    len_a = rng.integers(1, np.maximum(lengths - 3, 2))  # [B, K]: B gets >= 1 token.
    pos = np.arange(length)[None, :, None]  # [1, L, 1]
    inside = used[:, None, :] & (pos >= starts[:, None, :]) & (
        pos < (starts + lengths)[:, None, :])  # [B, L, K]: token of example k.
    real = inside.any(-1)  # [B, L]
    example = np.argmax(inside, -1)  # [B, L]: the example of a real token (0 on padding).
    offset = pos[..., 0] - np.take_along_axis(starts, example, 1)  # [B, L]: position in it.
    sep_a = 1 + np.take_along_axis(len_a, example, 1)  # [B, L]: offset of A's [SEP].
    last = np.take_along_axis(lengths, example, 1) - 1  # [B, L]: offset of B's [SEP].
    special = real & ((offset == 0) | (offset == sep_a) | (offset == last))
    input_ids = self._allowed[rng.integers(len(self._allowed), size=(b, length))]
    input_ids = np.where(real, input_ids, pad_id)
    input_ids = np.where(real & (offset == 0), cls_id, input_ids)
    input_ids = np.where(real & ((offset == sep_a) | (offset == last)), sep_id, input_ids)
    word_starts = (rng.random((b, length)) < 0.7) | (offset == 1) | (offset == sep_a + 1)
    word_starts &= real & ~special  # [B, L]
    batch = {
        "input_ids": input_ids.astype(np.int32),
        "token_type_ids": (real & (offset > sep_a)).astype(np.int32),
        "segment_ids": np.where(real, example + 1, 0).astype(np.int32),
        "position_ids": np.where(real, offset, 0).astype(np.int32),
        "word_starts": word_starts.astype(np.int32),
        "cls_positions": np.where(used, starts, 0).astype(np.int32),
        "next_sentence_label": (rng.integers(0, 2, size=(b, slots)) * used).astype(np.int32),
        packing.NSP_WEIGHTS: used.astype(np.float32),
    }
    rows = slice(self._process_index * self.batch_size, (self._process_index + 1) * self.batch_size)
    return {name: value[rows] for name, value in batch.items()}


def make_synthetic_iterator(
    *,
    global_batch_size: int,
    seq_len: int,
    vocab_size: int,
    pad_id: int,
    cls_id: int,
    sep_id: int,
    special_ids: Sequence[int] = (),
    seed: int,
    process_index: int,
    process_count: int,
    max_examples_per_row: int = 1,
) -> grain.DatasetIterator:
  """Endless random per-host batches of rows packing up to `max_examples_per_row` examples (no
  data needed), for benchmarks.

  A grain iterator over the step counter: `get_state()` / `set_state()` and the
  `grain.checkpoint` handlers work as for `make_train_iterator`.
  """
  make_batch = SyntheticBatch(
      batch_size=batching.per_host_batch_size(global_batch_size, process_count), seq_len=seq_len,
      vocab_size=vocab_size, pad_id=pad_id, cls_id=cls_id, sep_id=sep_id,
      special_ids=special_ids, seed=seed, process_index=process_index,
      process_count=process_count, max_examples_per_row=max_examples_per_row)
  steps = grain.MapDataset.range(2**62).map(make_batch)
  return iter(steps.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
