"""TensorFlow tensor bundles (TF1/TF2 "V2" checkpoints, e.g. google-research/bert's
`bert_model.ckpt`) read with numpy, google-crc32c (checksums) and cramjam (snappy blocks):
TensorFlow is not a dependency.

A bundle is `<prefix>.index`, a leveldb-format table (data blocks of prefix-compressed key/value
entries with restart points, an index block, a 48-byte footer) mapping each variable name to a
serialized `BundleEntryProto` (dtype, shape, shard id, offset, size, masked crc32c), and
`<prefix>.data-0000i-of-0000n`, the raw little-endian tensor bytes. `BundleReader` reads it and
checks every tensor's size and checksum. This module knows nothing of BERT: `weights/tf.py` maps
google-research/bert's variable names. (The tests write bundles with `tests/tf_bundle_writer.py`.)

Bundles may be local or in a bucket (gs://): the index is read whole, the data files through
seekable handles (`storage.open_binary`), so only the tensors asked for are fetched.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import struct
from typing import BinaryIO

import cramjam
import google_crc32c
import numpy as np

from bert_jax.runtime import storage

INDEX_SUFFIX = ".index"
TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # Two block handles padded to 40 bytes, then the 8-byte magic.
_BLOCK_TRAILER_SIZE = 5  # Compression type byte + masked crc32c.
NO_COMPRESSION, _SNAPPY = 0, 1

# TensorFlow DataType enum values -> numpy dtypes (little-endian, as TF writes on x86/ARM).
DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 9: "<i8", 10: "?",
          14: "bfloat16", 17: "<u2", 19: "<f2", 22: "<u4", 23: "<u8"}
_DT_STRING = 7
# More data shards than any real checkpoint has (TF writes one per saving device): a header
# that claims more is damaged, and its data file names would never end.
_MAX_SHARDS = 1 << 20


# ---------------------------------------------------------------------------------- crc32c


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli) of `data` (bytes or a numpy array: google_crc32c refuses writable
  buffers such as bytearray and memoryview), with the CPU's CRC instruction where it has one."""
  return google_crc32c.value(data)


def mask_crc(crc: int) -> int:
  """leveldb/TF store CRCs 'masked' so a CRC of data holding CRCs stays well distributed."""
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ------------------------------------------------------------------------- protobuf decoding


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
  result, shift = 0, 0
  while True:
    if pos >= len(buf):
      raise ValueError("truncated varint")
    byte = buf[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    if not byte & 0x80:
      return result, pos
    shift += 7
    if shift > 63:
      raise ValueError("varint too long")


def _signed64(value: int) -> int:
  return value - (1 << 64) if value >= 1 << 63 else value


def _proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
  """(field number, value) pairs of a serialized protobuf message (no schema needed)."""
  fields, pos = [], 0
  while pos < len(buf):
    key, pos = _read_varint(buf, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, pos = _read_varint(buf, pos)
    elif wire == 1:
      value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
    elif wire == 2:
      size, pos = _read_varint(buf, pos)
      value, pos = bytes(buf[pos:pos + size]), pos + size
      if pos > len(buf):
        raise ValueError("truncated length-delimited field")
    elif wire == 5:
      value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
    else:
      raise ValueError(f"unsupported protobuf wire type {wire}")
    fields.append((number, value))
  return fields


@dataclasses.dataclass(frozen=True)
class BundleEntry:
  """A parsed `BundleEntryProto`: where one tensor's bytes are and how to check them."""
  dtype: int
  shape: tuple[int, ...]
  shard_id: int
  offset: int
  size: int
  crc32c: int  # Masked.
  sliced: bool  # A partitioned variable (its slices are separate entries).

  @classmethod
  def parse(cls, buf: bytes) -> "BundleEntry":
    values = dict(dtype=0, shape=(), shard_id=0, offset=0, size=0, crc32c=0, sliced=False)
    for number, value in _proto_fields(buf):
      if number == 1:
        values["dtype"] = value
      elif number == 2:  # TensorShapeProto: repeated Dim dim = 2 {int64 size = 1}.
        dims = []
        for dim_number, dim in _proto_fields(value):
          if dim_number == 2:
            size = dict(_proto_fields(dim)).get(1, 0)
            dims.append(_signed64(size))
          elif dim_number == 3 and dim:
            raise ValueError("tensor of unknown rank")
        values["shape"] = tuple(dims)
      elif number in (3, 4, 5):
        values[{3: "shard_id", 4: "offset", 5: "size"}[number]] = _signed64(value)
      elif number == 6:
        values["crc32c"] = value
      elif number == 7:
        values["sliced"] = True
    return cls(**values)


# ------------------------------------------------------------------------- leveldb table format


# cramjam allocates the length a snappy block's header claims before decoding, so a damaged
# header must not reach it with gigabytes. Raw snappy's densest element, a 3-byte copy, yields
# 64 bytes: no real block decodes to more than 22 times its size.
_SNAPPY_MAX_EXPANSION = 22


def _snappy_decompress(data: bytes) -> bytes:
  """Raw snappy (no framing), as leveldb tables compress blocks."""
  try:
    length = cramjam.snappy.decompress_raw_len(data)
    if length > _SNAPPY_MAX_EXPANSION * len(data):
      raise ValueError(f"a {len(data)}-byte snappy block claims to decode to {length} bytes")
    return bytes(cramjam.snappy.decompress_raw(data))
  except cramjam.DecompressionError as e:  # A ValueError, the reader reports it naming the index.
    raise ValueError(f"bad snappy block ({e})") from e


def _read_block(index_bytes: bytes, offset: int, size: int) -> bytes:
  end = offset + size + _BLOCK_TRAILER_SIZE
  if end > len(index_bytes):
    raise ValueError(f"block at {offset} (+{size}) runs past the end of the file")
  contents = index_bytes[offset:offset + size]
  kind = index_bytes[offset + size]
  stored = struct.unpack_from("<I", index_bytes, offset + size + 1)[0]
  if mask_crc(crc32c(index_bytes[offset:offset + size + 1])) != stored:
    raise ValueError(f"checksum mismatch in the block at offset {offset}")
  if kind == _SNAPPY:
    return _snappy_decompress(contents)
  if kind != NO_COMPRESSION:
    raise ValueError(f"unknown block compression type {kind}")
  return contents


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
  """Key/value pairs of a block: prefix-compressed entries, then the restart array."""
  if len(block) < 4:
    raise ValueError("block too short")
  num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
  limit = len(block) - 4 - 4 * num_restarts
  if limit < 0:
    raise ValueError("bad restart count")
  entries, pos, key = [], 0, b""
  while pos < limit:
    shared, pos = _read_varint(block, pos)
    non_shared, pos = _read_varint(block, pos)
    value_size, pos = _read_varint(block, pos)
    if shared > len(key) or pos + non_shared + value_size > limit:
      raise ValueError("corrupt block entry")
    key = key[:shared] + block[pos:pos + non_shared]
    pos += non_shared
    entries.append((key, block[pos:pos + value_size]))
    pos += value_size
  return entries


def _read_handle(buf: bytes, pos: int) -> tuple[int, int, int]:
  offset, pos = _read_varint(buf, pos)
  size, pos = _read_varint(buf, pos)
  return offset, size, pos


def read_table(index_bytes: bytes) -> list[tuple[bytes, bytes]]:
  """All key/value pairs of a leveldb-format table, in key order."""
  if len(index_bytes) < _FOOTER_SIZE:
    raise ValueError(f"file too short for a table ({len(index_bytes)} bytes)")
  footer = index_bytes[-_FOOTER_SIZE:]
  if struct.unpack_from("<Q", footer, 40)[0] != TABLE_MAGIC:
    raise ValueError("no table magic number at the end of the file")
  _, _, pos = _read_handle(footer, 0)  # The metaindex block: TF writes no filters.
  index_offset, index_size, _ = _read_handle(footer, pos)
  entries = []
  for _, handle in _block_entries(_read_block(index_bytes, index_offset, index_size)):
    offset, size, _ = _read_handle(handle, 0)
    entries.extend(_block_entries(_read_block(index_bytes, offset, size)))
  return entries


# ------------------------------------------------------------------------------ tensor bundles


def resolve_prefix(path: str) -> str:
  """`bert_model.ckpt`, `bert_model.ckpt.index` or a directory holding one `*.index` -> prefix."""
  if path.endswith(INDEX_SUFFIX):
    path = path[:-len(INDEX_SUFFIX)]
  if storage.isdir(path):
    state_file = storage.join(path, "checkpoint")  # TF's "model_checkpoint_path: ..." file.
    if storage.isfile(state_file):
      match = re.search(r'^model_checkpoint_path:\s*"(.*)"', storage.read_text(state_file), re.M)
      if match:
        prefix = match.group(1)
        if os.path.isabs(prefix) or storage.is_remote(prefix):
          return prefix
        return storage.join(path, prefix)
    indexes = [n for n in storage.listdir(path) if n.endswith(INDEX_SUFFIX)]
    if len(indexes) != 1:
      raise ValueError(f"{path}: expected one TensorFlow checkpoint (<prefix>.index) in the "
                       f"directory, found {indexes or 'none'}")
    return storage.join(path, indexes[0][:-len(INDEX_SUFFIX)])
  return path


def data_filename(prefix: str, shard: int, num_shards: int) -> str:
  return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


class BundleReader:
  """Reads the tensors of a TF tensor-bundle checkpoint (`<prefix>.index` + data shards), local
  or in a bucket.

  Data files stay open between reads (a bucket file's handle keeps what it fetched ahead, and
  is not looked up again per tensor): `close()` them, or use the reader as a context manager.
  """

  def __init__(self, prefix: str):
    self.prefix = prefix
    self.index_file = prefix + INDEX_SUFFIX
    self._data_files: dict[int, BinaryIO] = {}
    if not storage.isfile(self.index_file):
      hint = (" (this looks like a TF1 'V1' checkpoint, which is not supported)"
              if storage.isfile(prefix) else "")
      raise ValueError(f"TensorFlow checkpoint index {self.index_file} does not exist{hint}; "
                       "pass the checkpoint prefix, e.g. .../bert_model.ckpt")
    self._data_sizes: dict[int, int] = {}
    index_bytes = storage.read_bytes(self.index_file)
    try:
      table = read_table(index_bytes)
      if not table or table[0][0] != b"":
        raise ValueError("no bundle header entry")
      header = dict(_proto_fields(table[0][1]))
      self.entries = {key.decode("utf-8"): BundleEntry.parse(value) for key, value in table[1:]}
      num_shards = header.get(1, 1)
      if not isinstance(num_shards, int) or not 1 <= num_shards <= _MAX_SHARDS:
        raise ValueError(f"the header records {num_shards!r} data shards")
    # TypeError / IndexError: a field of the wrong wire type where a number or message belongs.
    except (ValueError, struct.error, UnicodeDecodeError, TypeError, IndexError) as e:
      raise ValueError(f"{self.index_file} is not a readable TensorFlow tensor-bundle index "
                       f"({e})") from e
    self.num_shards = num_shards
    if header.get(2, 0) != 0:
      raise ValueError(f"{self.index_file}: big-endian checkpoints are not supported")

  def __enter__(self) -> "BundleReader":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def close(self) -> None:
    """Closes the data files opened by `read` (a later `read` opens them again)."""
    files, self._data_files = list(self._data_files.values()), {}
    for f in files:
      f.close()

  def _data_file(self, shard: int) -> tuple[BinaryIO, int]:
    """The open data file of `shard` (seekable: tensors are read at their offsets) and its size
    in bytes."""
    if shard not in self._data_files:
      data_file = data_filename(self.prefix, shard, self.num_shards)
      if not storage.isfile(data_file):
        raise ValueError(f"TensorFlow checkpoint data file {data_file} does not exist")
      f = storage.open_binary(data_file)
      self._data_sizes[shard] = f.seek(0, os.SEEK_END)
      self._data_files[shard] = f
    return self._data_files[shard], self._data_sizes[shard]

  def names(self) -> list[str]:
    return sorted(self.entries)

  def read(self, name: str) -> np.ndarray:
    """The tensor `name`, checked against its recorded size and crc32c."""
    entry = self.entries[name]
    if entry.sliced:
      raise ValueError(f"{self.index_file}: {name} is a partitioned variable (not supported)")
    if entry.dtype == _DT_STRING or entry.dtype not in DTYPES:
      raise ValueError(f"{self.index_file}: {name} has TF dtype {entry.dtype}, not a numeric type")
    dtype = DTYPES[entry.dtype]
    if dtype == "bfloat16":
      import ml_dtypes  # A jax dependency.
      dtype = ml_dtypes.bfloat16
    dtype = np.dtype(dtype)
    # Every claim of the entry checked against the others and against the data file before a
    # byte is read: a damaged index must not ask for 40 GB (a MemoryError, or swap).
    if any(d < 0 for d in entry.shape):
      raise ValueError(f"{self.index_file}: {name} has shape {entry.shape}, with a negative "
                       "dimension (a damaged index)")
    nbytes = math.prod(entry.shape) * dtype.itemsize  # Python ints: no overflow.
    if entry.size != nbytes:
      raise ValueError(f"{self.index_file}: {name} records {entry.size} bytes for shape "
                       f"{entry.shape} of {dtype} ({nbytes} bytes; a damaged index)")
    if not 0 <= entry.shard_id < self.num_shards:
      raise ValueError(f"{self.index_file}: {name} is in data shard {entry.shard_id}, the "
                       f"checkpoint has {self.num_shards}")
    data_file = data_filename(self.prefix, entry.shard_id, self.num_shards)
    f, file_size = self._data_file(entry.shard_id)
    if entry.offset < 0 or entry.offset + entry.size > file_size:
      raise ValueError(f"{data_file} is truncated, or {self.index_file} damaged: {name} (shape "
                       f"{entry.shape} of {dtype}) needs bytes {entry.offset}.."
                       f"{entry.offset + entry.size}, the file has {file_size}")
    f.seek(entry.offset)
    raw = f.read(entry.size)
    if len(raw) != entry.size:
      raise ValueError(f"{data_file} is truncated: {name} needs bytes {entry.offset}.."
                       f"{entry.offset + entry.size}, the file has fewer")
    if mask_crc(crc32c(raw)) != entry.crc32c:
      raise ValueError(f"{data_file} is corrupted: the checksum of {name} does not match")
    return np.frombuffer(raw, dtype=dtype).reshape(entry.shape)
