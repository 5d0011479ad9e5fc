"""Writes TensorFlow tensor bundles as TF's BundleWriter does, so the tests can build
google-research/bert checkpoints without TensorFlow. Only the tests write bundles: bert_jax reads
them (`bert_jax/weights/tf_bundle.py`), and its format constants and checksums are shared here."""

import dataclasses
import os
import struct
from typing import Any

import numpy as np

from bert_jax.runtime.varint import encode_varint
from bert_jax.weights import tf_bundle

_TF_DTYPE_OF = {np.dtype(v): k for k, v in tf_bundle.DTYPES.items() if v != "bfloat16"}


def _field(number: int, wire: int, value: int | bytes) -> bytes:
  """One protobuf field: key varint, then a varint, length-delimited bytes or a fixed32."""
  key = encode_varint(number << 3 | wire)
  if wire == 0:
    return key + encode_varint(value)
  if wire == 2:
    return key + encode_varint(len(value)) + value
  if wire == 5:
    return key + struct.pack("<I", value)
  raise ValueError(wire)


def serialize_entry(entry: tf_bundle.BundleEntry) -> bytes:
  """A `BundleEntryProto` (what `BundleEntry.parse` reads back)."""
  dims = b"".join(_field(2, 2, _field(1, 0, d)) for d in entry.shape)
  return (_field(1, 0, entry.dtype) + _field(2, 2, dims) + _field(3, 0, entry.shard_id)
          + _field(4, 0, entry.offset) + _field(5, 0, entry.size) + _field(6, 5, entry.crc32c))


class _BlockBuilder:
  """A leveldb block: prefix-compressed entries, a full key every `restart_interval` entries."""

  def __init__(self, restart_interval: int):
    self.restart_interval = restart_interval
    self.buffer = bytearray()
    self.restarts = [0]
    self.count = 0
    self.last_key = b""

  def add(self, key: bytes, value: bytes) -> None:
    shared = 0
    if self.count < self.restart_interval:
      while shared < min(len(key), len(self.last_key)) and key[shared] == self.last_key[shared]:
        shared += 1
    else:
      self.restarts.append(len(self.buffer))
      self.count = 0
    self.buffer += (encode_varint(shared) + encode_varint(len(key) - shared)
                    + encode_varint(len(value)))
    self.buffer += key[shared:] + value
    self.last_key = key
    self.count += 1

  def finish(self) -> bytes:
    return bytes(self.buffer) + b"".join(struct.pack("<I", r) for r in self.restarts) + \
        struct.pack("<I", len(self.restarts))

  def size(self) -> int:
    return len(self.buffer) + 4 * len(self.restarts) + 4


def write_table(path: str, entries: list[tuple[bytes, bytes]], block_size: int = 4096) -> None:
  """A leveldb-format table (uncompressed, as TF writes bundles) of sorted key/value pairs."""
  out = bytearray()

  def emit(contents: bytes) -> bytes:
    handle = encode_varint(len(out)) + encode_varint(len(contents))
    trailer = bytes([tf_bundle.NO_COMPRESSION])
    out.extend(contents + trailer)
    out.extend(struct.pack("<I", tf_bundle.mask_crc(tf_bundle.crc32c(contents + trailer))))
    return handle

  index = _BlockBuilder(restart_interval=1)
  block = _BlockBuilder(restart_interval=16)
  for key, value in entries:
    block.add(key, value)
    if block.size() >= block_size:
      index.add(block.last_key, emit(block.finish()))
      block = _BlockBuilder(restart_interval=16)
  if block.count or not index.count:
    index.add(block.last_key, emit(block.finish()))
  metaindex = emit(_BlockBuilder(restart_interval=16).finish())
  footer = ((metaindex + emit(index.finish())).ljust(40, b"\0")
            + struct.pack("<Q", tf_bundle.TABLE_MAGIC))
  with open(path, "wb") as f:
    f.write(bytes(out) + footer)


def write_bundle(prefix: str, tensors: dict[str, np.ndarray], block_size: int = 4096,
                 tamper: dict[str, dict[str, Any]] | None = None) -> None:
  """Writes `tensors` as a one-shard TF tensor bundle (`<prefix>.index` + one data file).
  `tamper`: tensor name -> `BundleEntry` fields whose recorded values the index gets instead of
  the true ones (e.g. {"w": {"shape": (100000, 100000)}}), for tests of damaged indexes."""
  os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
  entries, offset = [], 0
  with open(tf_bundle.data_filename(prefix, 0, 1), "wb") as data:
    for name in sorted(tensors, key=lambda n: n.encode("utf-8")):
      array = np.asarray(tensors[name], order="C")  # (ascontiguousarray makes scalars 1-d.)
      array = array.astype(array.dtype.newbyteorder("<"))
      raw = array.tobytes()
      entry = tf_bundle.BundleEntry(
          dtype=_TF_DTYPE_OF[array.dtype], shape=tuple(array.shape), shard_id=0, offset=offset,
          size=len(raw), crc32c=tf_bundle.mask_crc(tf_bundle.crc32c(raw)), sliced=False)
      entry = dataclasses.replace(entry, **(tamper or {}).get(name, {}))
      data.write(raw)
      offset += len(raw)
      entries.append((name.encode("utf-8"), serialize_entry(entry)))
  version = _field(1, 0, 1)  # VersionDef.producer = 1 (TF's kTensorBundleVersion).
  header = _field(1, 0, 1) + _field(2, 0, 0) + _field(3, 2, version)  # One shard, little-endian.
  write_table(prefix + tf_bundle.INDEX_SUFFIX, [(b"", header)] + entries, block_size)
