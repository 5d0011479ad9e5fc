"""The TFDS dataset of prepared BERT rows (ArrayRecord, read back without TensorFlow).

Each record is one row (`packing`'s layout): int32 token features [L] and slot features [K].
`nsp_weights` is stored as int32 0/1 (one byte a value); the input pipeline reads it as float32.

`BertPretraining` is a `GeneratorBasedBuilder` whose `_generate_examples` streams the rows.
TFDS's own writer (`download_and_prepare`) buffers every serialized example of a split in memory
(its `Shuffler` keeps up to 1 GB in a list and then sorts whole buckets; `disable_shuffling`
changes the order, not the buffering), so preparation instead writes the ArrayRecord shards
itself, block by block in worker processes, and `write_tfds_layout` renames them to TFDS's shard
names and writes `dataset_info.json` / `features.json` from this builder's `DatasetInfo`. Both
paths give directories that `tfds.builder_from_directory(dir).as_data_source(split)` reads.

The class lives in a module (never `__main__`) so grain worker processes can unpickle it.
"""

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from bert_jax.runtime import storage
from bert_jax.data import blocks
from bert_jax.data import packing

VERSION = "3.0.0"  # Follows prepare.FORMAT_VERSION.
FILE_FORMAT = "array_record"


def make_features(max_seq_length: int, max_examples_per_row: int) -> tfds.features.FeaturesDict:
  """The row schema: int32 [L] token features and int32 [K] slot features."""
  tensors = {name: tfds.features.Tensor(shape=(max_seq_length,), dtype=np.int32)
             for name in packing.TOKEN_FEATURES}
  tensors.update({name: tfds.features.Tensor(shape=(max_examples_per_row,), dtype=np.int32)
                  for name in packing.SLOT_FEATURES})
  return tfds.features.FeaturesDict(tensors)


class _LocalInfo(tfds.core.DatasetInfo):
  """The DatasetInfo of a dataset that exists only here."""

  def initialize_from_bucket(self) -> None:
    """Nothing to fetch: TFDS's version looks for precomputed metadata in its public bucket, and
    leaves an empty temporary directory in $TMPDIR behind every time."""


class BertPretraining(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Rows of packed NSP pairs ([CLS] A [SEP] B [SEP]) or FULL-SENTENCES sequences."""

  VERSION = tfds.core.Version(VERSION)
  # TFDS locates download checksums next to the builder's code; nothing is downloaded here, and
  # that lookup needs the `importlib_resources` package for a builder inside a package.
  code_path = None

  def __init__(
      self,
      *,
      max_seq_length: int,
      max_examples_per_row: int,
      examples_fn: Callable[[str], Iterator[Mapping[str, Any]]] | None = None,
      **kwargs,
  ):
    """`examples_fn(split)` streams a split's rows as feature dicts (only needed to generate)."""
    self._max_seq_length = max_seq_length
    self._max_examples_per_row = max_examples_per_row
    self._examples_fn = examples_fn
    kwargs.setdefault("file_format", FILE_FORMAT)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalInfo(
        builder=self,
        description="BERT pretraining rows (packed next-sentence pairs or full sentences), "
                    "bert_jax.",
        features=make_features(self._max_seq_length, self._max_examples_per_row),
    )

  def _split_generators(self, dl_manager) -> dict[str, Iterator[tuple[int, Mapping[str, Any]]]]:
    del dl_manager
    return {split: self._generate_examples(split) for split in blocks.SPLITS}

  def _generate_examples(self, split: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if self._examples_fn is None:
      raise ValueError("BertPretraining was built without examples_fn: nothing to generate")
    for key, example in enumerate(self._examples_fn(split)):
      yield key, example


def write_tfds_layout(
    dataset_dir: str,
    max_seq_length: int,
    max_examples_per_row: int,
    split_shards: Mapping[str, Sequence[tuple[str, int, int]]],
) -> None:
  """Turns finished ArrayRecord files into a TFDS dataset in `dataset_dir`.

  `split_shards[split]` lists (file path, rows, bytes) in shard order; the files are moved to
  TFDS's `<name>-<split>.array_record-NNNNN-of-MMMMM` names (local or in a bucket; a file
  already moved by an earlier attempt is skipped). A split may have no shards.
  """
  builder = BertPretraining(max_seq_length=max_seq_length,
                            max_examples_per_row=max_examples_per_row,
                            data_dir=os.path.join(dataset_dir, ".tfds_builder_unused"))
  info = builder.info
  split_infos = []
  for split, shards in split_shards.items():
    template = tfds.core.ShardedFileTemplate(
        data_dir=dataset_dir, dataset_name=builder.name, split=split,
        filetype_suffix=FILE_FORMAT)
    for shard_index, (path, _, _) in enumerate(shards):
      target = os.fspath(template.sharded_filepath(shard_index=shard_index,
                                                   num_shards=len(shards)))
      if storage.exists(path) or not storage.exists(target):  # Done by a failed attempt.
        storage.rename(path, target)
    split_infos.append(tfds.core.SplitInfo(
        name=split,
        shard_lengths=[int(n) for _, n, _ in shards],
        num_bytes=int(sum(b for _, _, b in shards)),
        filename_template=template,
    ))
  info.set_splits(tfds.core.SplitDict(split_infos))
  info.write_to_directory(dataset_dir)


def data_source(dataset_dir: str, split: str, raw: bool = False):
  """Random-access source of one split: decoded rows (numpy int32), or record bytes."""
  builder = tfds.builder_from_directory(dataset_dir)
  if split not in builder.info.splits:
    raise ValueError(f"{dataset_dir} has no {split!r} split (has: {list(builder.info.splits)})")
  if raw:
    return builder.as_data_source(
        split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
  return builder.as_data_source(split=split)


def split_infos(dataset_dir: str) -> dict[str, tuple[list[str], list[int]]]:
  """{split: (shard file paths, records of each shard)} from the dataset's TFDS metadata (no
  shard is opened)."""
  builder = tfds.builder_from_directory(dataset_dir)
  return {name: ([os.fspath(p) for p in info.filepaths], [int(n) for n in info.shard_lengths])
          for name, info in builder.info.splits.items()}


def num_rows(dataset_dir: str, split: str) -> int:
  """Rows (records) in `split` from the dataset's metadata (no file is opened)."""
  builder = tfds.builder_from_directory(dataset_dir)
  if split not in builder.info.splits:
    return 0
  return int(builder.info.splits[split].num_examples)
