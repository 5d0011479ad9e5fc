"""TF-bundle reading: the hand-written CRC-32C and snappy decoder that `weights/tf_bundle.py` had
vs google-crc32c and cramjam, which it uses now, side by side in one process.

1. crc32c: the masked CRC-32C that TF stores (`mask_crc(crc32c(buf))`) of random buffers of
   --crc_sizes_mb (4 KB is an index block, 1-256 MB the sizes of tensors), MB/s.
2. snappy: raw snappy decompression of table blocks (a BERT-Large-like index with Adam slots,
   cut into blocks of --block_kb as tests/tf_bundle_writer.py cuts them; and float32 noise, the
   literal-heavy worst case for the hand-written decoder's back-references) compressed with
   cramjam's compressor; MB/s of decompressed output.
3. end to end: a BERT-Base-sized bundle (110M float32 parameters, 440 MB, written by
   tests/tf_bundle_writer.py under --workdir) opened with `BundleReader` and every tensor read
   and checked, old vs new reader; and a plain read of its data file (no checks) for scale.

Each measurement is the median of --reps repetitions, old and new alternating (which goes
first alternates too); a repetition of a small case loops until it has run --min_rep_s. Old and
new are checked to agree (CRC values, decoded bytes, tensors). MB = 10^6 bytes.

The old implementation is kept below verbatim (`_old_crc32c`, `_old_snappy_decompress`). The
old reader is a second copy of today's `bert_jax/weights/tf_bundle.py` module with those two
swapped back in: the switch changed nothing else in the reader.

Results: benchmarks/results/tf_bundle.jsonl (the first line describes the machine).

Run:
  .venv/bin/python benchmarks/tf_bundle.py --workdir=/tmp/tf_bundle_bench
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
sys.path.insert(0, REPO)

import cramjam
import google_crc32c

from bert_jax.weights import tf_bundle
from tests import tf_bundle_writer

# ------------------------------------------------- the old implementation (verbatim, renamed)


def _crc_tables() -> np.ndarray:
  """[4, 256] tables of the reflected Castagnoli CRC, for four bytes per step ("slicing-by-4")."""
  table = np.arange(256, dtype=np.uint32)
  for _ in range(8):
    table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
  tables = [table.astype(np.uint32)]
  for _ in range(3):
    tables.append((tables[-1] >> np.uint32(8)) ^ tables[0][tables[-1] & np.uint32(0xFF)])
  return np.stack(tables)


_CRC_TABLES = _crc_tables()
_CRC_TABLE = _CRC_TABLES[0]


def _apply(columns: np.ndarray, values: np.ndarray) -> np.ndarray:
  """A GF(2)-linear map on 32-bit CRC states (column i = image of bit i), applied to `values`."""
  out = np.zeros_like(values)
  for bit in range(32):
    out ^= np.where((values >> np.uint32(bit)) & np.uint32(1), columns[bit], np.uint32(0))
  return out


def _old_crc32c(data: bytes | memoryview | np.ndarray) -> int:
  """CRC-32C (Castagnoli) of `data`, vectorised with numpy (~1 s per 100 MB).

  The bytes are cut into equal chunks whose CRCs (with a zero initial state, which makes the
  CRC linear) are computed side by side, then combined pairwise: crc(A+B) = shift(crc(A), |B|)
  xor crc(B), where shifting over |B| zero bytes is a 32x32 bit matrix squared level by level.
  Leading zero bytes do not change a zero-initialised CRC, so padding goes in front.
  """
  arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else \
      data.reshape(-1).view(np.uint8)
  n = arr.size
  if n < 4:
    crc = 0xFFFFFFFF
    for byte in arr.tolist():
      crc = int(_CRC_TABLE[(crc ^ byte) & 0xFF]) ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
  arr = arr.copy()
  arr[:4] ^= 0xFF  # The initial state 0xFFFFFFFF, folded into the first four bytes.
  chunk = 64
  while n > chunk * 65536:
    chunk *= 2
  num_chunks = 1 << max(0, int(np.ceil(np.log2(-(-n // chunk)))))
  padded = np.zeros(num_chunks * chunk, dtype=np.uint8)
  padded[padded.size - n:] = arr
  words = padded.view("<u4").reshape(num_chunks, chunk // 4)
  state = np.zeros(num_chunks, dtype=np.uint32)
  low = np.uint32(0xFF)
  for j in range(chunk // 4):  # Four bytes of every chunk per step.
    s = state ^ words[:, j]
    state = (np.take(_CRC_TABLES[3], s & low) ^ np.take(_CRC_TABLES[2], (s >> np.uint32(8)) & low)
             ^ np.take(_CRC_TABLES[1], (s >> np.uint32(16)) & low)
             ^ np.take(_CRC_TABLES[0], s >> np.uint32(24)))
  basis = np.uint32(1) << np.arange(32, dtype=np.uint32)
  shift = _CRC_TABLE[basis & np.uint32(0xFF)] ^ (basis >> np.uint32(8))  # One zero byte.
  length = 1
  while length < chunk:
    shift, length = _apply(shift, shift), length * 2
  while state.size > 1:
    state = _apply(shift, state[0::2]) ^ state[1::2]
    shift = _apply(shift, shift)
  return int(state[0]) ^ 0xFFFFFFFF


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


def _old_snappy_decompress(data: bytes) -> bytes:
  """Raw snappy (no framing): a varint length, then literal and back-reference copy elements."""
  length, pos = _read_varint(data, 0)
  out = bytearray()
  while pos < len(data):
    tag = data[pos]
    pos += 1
    kind = tag & 3
    if kind == 0:  # Literal; lengths over 60 are stored in the next 1-4 bytes.
      size = tag >> 2
      if size >= 60:
        extra = size - 59
        size = int.from_bytes(data[pos:pos + extra], "little")
        pos += extra
      size += 1
      out += data[pos:pos + size]
      pos += size
      continue
    if kind == 1:
      size, offset = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | data[pos]
      pos += 1
    elif kind == 2:
      size, offset = (tag >> 2) + 1, int.from_bytes(data[pos:pos + 2], "little")
      pos += 2
    else:
      size, offset = (tag >> 2) + 1, int.from_bytes(data[pos:pos + 4], "little")
      pos += 4
    if not 0 < offset <= len(out):
      raise ValueError("bad snappy back-reference")
    for _ in range(size):  # Copies may overlap their own output.
      out.append(out[-offset])
  if len(out) != length:
    raise ValueError(f"snappy block decodes to {len(out)} bytes, header says {length}")
  return bytes(out)


def _old_tf_bundle():
  """A second instance of today's tf_bundle module, with the hand-written primitives back."""
  spec = importlib.util.spec_from_file_location("tf_bundle_old", tf_bundle.__file__)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up while it executes.
  spec.loader.exec_module(module)
  module.crc32c = _old_crc32c  # Looked up at call time by `_read_block` and `read`.
  module._snappy_decompress = _old_snappy_decompress
  return module


# ---------------------------------------------------------------------------------- timing


def _time_rep(fn: Callable[[], object], min_seconds: float) -> float:
  """Seconds per call of `fn`, looping until `min_seconds` have passed."""
  calls, start = 0, time.perf_counter()
  while True:
    fn()
    calls += 1
    elapsed = time.perf_counter() - start
    if elapsed >= min_seconds:
      return elapsed / calls


def _side_by_side(old: Callable[[], object], new: Callable[[], object], reps: int,
                  min_seconds: float) -> tuple[float, float]:
  """Median seconds per call of `old` and `new`, alternating (and alternating who is first)."""
  times = {"old": [], "new": []}
  for rep in range(reps):
    order = (("old", old), ("new", new)) if rep % 2 == 0 else (("new", new), ("old", old))
    for name, fn in order:
      times[name].append(_time_rep(fn, min_seconds))
  return statistics.median(times["old"]), statistics.median(times["new"])


def _row(bench: str, case: dict, nbytes: int, old_s: float, new_s: float, reps: int) -> dict:
  return {"bench": bench, **case, "bytes": nbytes, "reps": reps,
          "old_s": old_s, "new_s": new_s, "old_mb_s": nbytes / old_s / 1e6,
          "new_mb_s": nbytes / new_s / 1e6, "speedup": old_s / new_s,
          "load_avg_1m": os.getloadavg()[0]}


# ---------------------------------------------------------------------------------- crc32c


def bench_crc(sizes_mb: list[float], reps: int, min_seconds: float) -> list[dict]:
  rng = np.random.default_rng(0)
  rows = []
  for size_mb in sizes_mb:
    buf = rng.integers(0, 256, int(size_mb * 1e6), dtype=np.uint8).tobytes()
    def old(buf=buf) -> int:
      return tf_bundle.mask_crc(_old_crc32c(buf))

    def new(buf=buf) -> int:
      return tf_bundle.mask_crc(google_crc32c.value(buf))

    if old() != new():
      raise AssertionError(f"masked CRC-32C of {size_mb} MB: old {old():#x}, new {new():#x}")
    rows.append(_row("crc32c", {"case": f"{size_mb:g} MB"}, len(buf),
                     *_side_by_side(old, new, reps, min_seconds), reps))
    print(_format(rows[-1]), flush=True)
  return rows


# ---------------------------------------------------------------------------------- snappy


def _index_entries(target_bytes: int) -> list[tuple[bytes, bytes]]:
  """Sorted key/value pairs of a bundle index like BERT-Large's with Adam slots, layers added
  until the entries hold `target_bytes`."""
  rng = np.random.default_rng(1)
  per_layer = [(f"attention/self/{n}/kernel", (1024, 1024)) for n in ("query", "key", "value")]
  per_layer += [(f"attention/self/{n}/bias", (1024,)) for n in ("query", "key", "value")]
  per_layer += [("attention/output/dense/kernel", (1024, 1024)),
                ("attention/output/dense/bias", (1024,)),
                ("intermediate/dense/kernel", (1024, 4096)), ("intermediate/dense/bias", (4096,)),
                ("output/dense/kernel", (4096, 1024)), ("output/dense/bias", (1024,))]
  per_layer += [(f"{norm}/{p}", (1024,)) for norm in ("attention/output/LayerNorm",
                                                     "output/LayerNorm") for p in ("gamma", "beta")]
  entries, total, offset, layer = [], 0, 0, 0
  while total < target_bytes:
    for name, shape in per_layer:
      for slot in ("", "/adam_m", "/adam_v"):
        size = 4 * int(np.prod(shape))
        entry = tf_bundle.BundleEntry(dtype=1, shape=shape, shard_id=0, offset=offset, size=size,
                                      crc32c=int(rng.integers(0, 1 << 32)), sliced=False)
        key = f"bert/encoder/layer_{layer}/{name}{slot}".encode()
        value = tf_bundle_writer.serialize_entry(entry)
        entries.append((key, value))
        total += len(key) + len(value)
        offset += size
    layer += 1
  return sorted(entries)


def _index_blocks(entries: list[tuple[bytes, bytes]], block_size: int) -> list[bytes]:
  """The entries cut into table blocks as tests/tf_bundle_writer.py (and leveldb) cuts them."""
  builder = tf_bundle_writer._BlockBuilder  # pylint: disable=protected-access
  blocks, block = [], builder(restart_interval=16)
  for key, value in entries:
    block.add(key, value)
    if block.size() >= block_size:
      blocks.append(block.finish())
      block = builder(restart_interval=16)
  if block.count:
    blocks.append(block.finish())
  return blocks


def bench_snappy(block_kbs: list[int], total_mb: float, reps: int,
                 min_seconds: float) -> list[dict]:
  entries = _index_entries(int(total_mb * 1e6))
  noise = np.random.default_rng(2).standard_normal(int(total_mb * 1e6) // 4).astype(np.float32)
  noise = noise.tobytes()
  rows = []
  for kind in ("index", "float32"):
    for block_kb in block_kbs:
      block_size = block_kb * 1024
      if kind == "index":
        blocks = _index_blocks(entries, block_size)
      else:
        blocks = [noise[i:i + block_size] for i in range(0, len(noise), block_size)]
      compressed = [bytes(cramjam.snappy.compress_raw(b)) for b in blocks]
      nbytes = sum(map(len, blocks))
      def old(compressed=compressed) -> list[bytes]:
        return [_old_snappy_decompress(c) for c in compressed]

      def new(compressed=compressed) -> list[bytes]:
        return [bytes(cramjam.snappy.decompress_raw(c)) for c in compressed]

      if old() != blocks or new() != blocks:
        raise AssertionError(f"snappy {kind} {block_kb} KiB blocks do not round-trip")
      case = {"case": f"{kind}, {block_kb} KiB blocks", "blocks": len(blocks),
              "ratio": nbytes / sum(map(len, compressed))}
      rows.append(_row("snappy", case, nbytes, *_side_by_side(old, new, reps, min_seconds), reps))
      print(_format(rows[-1]), flush=True)
  return rows


# ------------------------------------------------------------------------------ end to end


def _bert_tensors(layers: int, hidden: int, vocab: int) -> dict[str, np.ndarray]:
  """google-research/bert's variables of a BERT model (BERT-Base: 12, 768, 30522), random."""
  rng = np.random.default_rng(3)
  shapes = {"bert/embeddings/word_embeddings": (vocab, hidden),
            "bert/embeddings/position_embeddings": (512, hidden),
            "bert/embeddings/token_type_embeddings": (2, hidden),
            "bert/embeddings/LayerNorm/gamma": (hidden,),
            "bert/embeddings/LayerNorm/beta": (hidden,),
            "bert/pooler/dense/kernel": (hidden, hidden), "bert/pooler/dense/bias": (hidden,),
            "cls/predictions/transform/dense/kernel": (hidden, hidden),
            "cls/predictions/transform/dense/bias": (hidden,),
            "cls/predictions/transform/LayerNorm/gamma": (hidden,),
            "cls/predictions/transform/LayerNorm/beta": (hidden,),
            "cls/predictions/output_bias": (vocab,),
            "cls/seq_relationship/output_weights": (2, hidden),
            "cls/seq_relationship/output_bias": (2,)}
  for i in range(layers):
    prefix = f"bert/encoder/layer_{i}"
    for name in ("query", "key", "value"):
      shapes[f"{prefix}/attention/self/{name}/kernel"] = (hidden, hidden)
      shapes[f"{prefix}/attention/self/{name}/bias"] = (hidden,)
    shapes[f"{prefix}/attention/output/dense/kernel"] = (hidden, hidden)
    shapes[f"{prefix}/attention/output/dense/bias"] = (hidden,)
    shapes[f"{prefix}/intermediate/dense/kernel"] = (hidden, 4 * hidden)
    shapes[f"{prefix}/intermediate/dense/bias"] = (4 * hidden,)
    shapes[f"{prefix}/output/dense/kernel"] = (4 * hidden, hidden)
    shapes[f"{prefix}/output/dense/bias"] = (hidden,)
    for norm in ("attention/output/LayerNorm", "output/LayerNorm"):
      shapes[f"{prefix}/{norm}/gamma"] = (hidden,)
      shapes[f"{prefix}/{norm}/beta"] = (hidden,)
  tensors = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}
  tensors["global_step"] = np.array(1_000_000, np.int64)
  return tensors


def _read_all(module, prefix: str) -> int:
  """Opens the bundle with `module.BundleReader` and reads (and checks) every tensor."""
  total = 0
  with module.BundleReader(prefix) as reader:
    for name in reader.names():
      total += reader.read(name).nbytes
  return total


def bench_end_to_end(workdir: str, layers: int, hidden: int, vocab: int, reps: int) -> list[dict]:
  prefix = os.path.join(workdir, "bert_model.ckpt")
  tensors = _bert_tensors(layers, hidden, vocab)
  num_params = sum(t.size for name, t in tensors.items() if name != "global_step")
  start = time.perf_counter()
  tf_bundle_writer.write_bundle(prefix, tensors)
  print(f"wrote {num_params / 1e6:.1f}M parameters to {prefix} in "
        f"{time.perf_counter() - start:.1f} s", flush=True)
  old_module = _old_tf_bundle()
  with old_module.BundleReader(prefix) as old_reader, tf_bundle.BundleReader(prefix) as reader:
    for name in reader.names():  # Also warms the page cache: both read from memory.
      np.testing.assert_array_equal(old_reader.read(name), tensors[name])
      np.testing.assert_array_equal(reader.read(name), tensors[name])
  del tensors
  data_file = tf_bundle.data_filename(prefix, 0, 1)
  nbytes = _read_all(tf_bundle, prefix)

  def plain_read() -> None:
    with open(data_file, "rb") as f:
      f.read()

  case = {"case": f"BERT L={layers} H={hidden} V={vocab}, {num_params / 1e6:.1f}M f32",
          "params": num_params}
  rows = [_row("end_to_end", case, nbytes,
               *_side_by_side(lambda: _read_all(old_module, prefix),
                              lambda: _read_all(tf_bundle, prefix), reps, 0.0), reps)]
  print(_format(rows[-1]), flush=True)
  plain = statistics.median(_time_rep(plain_read, 0.0) for _ in range(reps))
  rows[-1]["plain_read_s"] = plain
  rows[-1]["plain_read_mb_s"] = os.path.getsize(data_file) / plain / 1e6
  print(f"{'':>10}  plain read of the data file (no checks): {rows[-1]['plain_read_mb_s']:,.0f} "
        "MB/s", flush=True)
  return rows


# ------------------------------------------------------------------------------------ main


def _format(row: dict) -> str:
  return (f"{row['bench']:>10}  {row['case']:<40} old {row['old_mb_s']:>10,.1f} MB/s   new "
          f"{row['new_mb_s']:>10,.1f} MB/s   x{row['speedup']:,.1f}")


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True,
                      help="The end-to-end bundle is written here (and removed afterwards).")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--min_rep_s", type=float, default=0.3,
                      help="A repetition of a small case loops this long.")
  parser.add_argument("--crc_sizes_mb", default="0.004,1,16,256")
  parser.add_argument("--block_kb", default="4,256", help="Snappy table block sizes (KiB).")
  parser.add_argument("--snappy_mb", type=float, default=2.0,
                      help="Each snappy case's size: of the index entries (their blocks hold "
                      "about half: keys are prefix-compressed), of the float32 noise.")
  parser.add_argument("--layers", type=int, default=12, help="End to end: BERT-Base is 12.")
  parser.add_argument("--hidden", type=int, default=768)
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--skip", default="", help="Comma-separated: crc32c, snappy, end_to_end.")
  parser.add_argument("--output", default=os.path.join(RESULTS, "tf_bundle.jsonl"))
  args = parser.parse_args()
  skip = set(filter(None, args.skip.split(",")))

  meta = {"bench": "meta", "cpu": _cpu_model(), "cpus": os.cpu_count(),
          "python": platform.python_version(), "numpy": np.__version__,
          "google_crc32c": f"{_version('google-crc32c')} ({google_crc32c.implementation})",
          "cramjam": _version("cramjam"), "load_avg_1m": os.getloadavg()[0],
          "time": time.strftime("%Y-%m-%d %H:%M:%S")}
  print(json.dumps(meta), flush=True)
  rows = [meta]
  if "crc32c" not in skip:
    rows += bench_crc([float(s) for s in args.crc_sizes_mb.split(",")], args.reps,
                      args.min_rep_s)
  if "snappy" not in skip:
    rows += bench_snappy([int(s) for s in args.block_kb.split(",")], args.snappy_mb, args.reps,
                         args.min_rep_s)
  if "end_to_end" not in skip:
    os.makedirs(args.workdir, exist_ok=True)
    try:
      rows += bench_end_to_end(args.workdir, args.layers, args.hidden, args.vocab, args.reps)
    finally:
      for name in os.listdir(args.workdir):
        if name.startswith("bert_model.ckpt"):
          os.remove(os.path.join(args.workdir, name))
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  print(f"wrote {args.output}")


def _version(package: str) -> str:
  from importlib import metadata
  return metadata.version(package)


if __name__ == "__main__":
  main()
