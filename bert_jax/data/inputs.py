"""The input files of a preparation (`launch/prepare_data.py --input`): text files (`corpus`'s
two formats) and record files, a document per record from its text field:
- JSONL (`.jsonl`, `.ndjson`, `.json`; `.gz` and `.zst` compressed too): one JSON object a line;
- Parquet (`.parquet`, `.pq`): read a row group at a time, the text column alone;
- a HuggingFace `datasets` directory (`Dataset.save_to_disk`): its Arrow files, a record batch at
  a time.

A record's text is split into sentences as TFDS articles are (`corpus.text_to_document`: each
line a paragraph). A record whose field is null or blank makes no document (counted). Input the
corpus readers refuse fails on one line that names the file and the row: not JSON, not an
object, the field missing or not text, mostly undecodable bytes, a file without records.

The format comes from the file name (`--input_format=auto`), or is given. Imported by Beam
workers: free of TFDS and JAX; pyarrow is imported when a Parquet, Arrow or `.zst` file is read.
"""

import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, IO

from bert_jax.data import corpus
from bert_jax.runtime import storage

TEXT_FORMATS = ("bert", "paragraphs")
RECORD_FORMATS = ("jsonl", "parquet", "arrow")
FORMATS = ("auto", *TEXT_FORMATS, *RECORD_FORMATS)
_RECORD_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
                    ".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow"}
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_HF_STATE = "state.json"  # What `Dataset.save_to_disk` writes beside its Arrow files.
_HF_SPLITS = "dataset_dict.json"  # `DatasetDict.save_to_disk`: a directory per split.


def _compression(path: str) -> str | None:
  return _COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def file_format(path: str, input_format: str = "auto") -> str:
  """The format `path` is read in: `input_format`, or with "auto" its name's (a record format's
  suffix, compressed or not; any other file is text in google-research/bert's format)."""
  if input_format not in FORMATS:
    raise ValueError(f"--input_format={input_format!r} is not one of {', '.join(FORMATS)}")
  if input_format != "auto":
    return input_format
  name = path[:-len(os.path.splitext(path)[1])] if _compression(path) else path
  return _RECORD_SUFFIXES.get(os.path.splitext(name)[1].lower(), "bert")


def expand(patterns: str | Sequence[str]) -> list[str]:
  """`corpus.expand_paths` of `patterns`, where a HuggingFace `datasets` directory stands for
  its Arrow files (in its own order)."""
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [p for p in str(patterns).split(",") if p.strip()]
  paths: list[str] = []
  for pattern in patterns:
    pattern = os.path.expanduser(str(pattern).strip())
    if storage.isdir(pattern) and not any(c in pattern for c in "*?["):
      paths.extend(_dataset_files(pattern))
    else:
      paths.extend(corpus.expand_paths([pattern]))
  return list(dict.fromkeys(paths))


def _dataset_files(directory: str) -> list[str]:
  """The Arrow files of a `save_to_disk` directory, from its state.json."""
  if storage.exists(storage.join(directory, _HF_SPLITS)):
    splits = json.loads(storage.read_bytes(storage.join(directory, _HF_SPLITS)))["splits"]
    raise ValueError(f"Input path {directory!r} is a HuggingFace DatasetDict (splits: "
                     f"{', '.join(splits)}); pass one split's directory, e.g. "
                     f"{storage.join(directory, splits[0])!r}.")
  state = storage.join(directory, _HF_STATE)
  if not storage.exists(state):
    raise ValueError(f"Input path {directory!r} is a directory; pass files or a glob (e.g. "
                     f"{os.path.join(directory, '*.jsonl')!r}), or a HuggingFace datasets "
                     "directory (save_to_disk: it has a state.json).")
  files = [storage.join(directory, f["filename"])
           for f in json.loads(storage.read_bytes(state)).get("_data_files", [])]
  if not files:
    raise ValueError(f"Input path {directory!r}: its {_HF_STATE} lists no data files.")
  return files


def check_files(paths: Sequence[str], input_format: str = "auto") -> None:
  """`corpus.check_text_files` for the text files among `paths`, before any work (record files
  are checked as they are read: their rows are decoded one by one)."""
  corpus.check_text_files([p for p in paths if file_format(p, input_format) in TEXT_FORMATS])


def file_documents(path: str, input_format: str, stats: corpus.CorpusStats,
                   text_field: str = "text") -> Iterator[corpus.Document]:
  """The documents of one input file (`input_format`, "auto": by its name), counted into
  `stats`. Files are read independently (the Beam pipeline reads each on its own worker)."""
  fmt = file_format(path, input_format)
  if fmt in TEXT_FORMATS:
    yield from corpus.file_documents(path, fmt, stats)
    return
  stats.files += 1
  records = 0
  for row, text in _TEXTS[fmt](path, text_field, stats):
    records += 1
    document = corpus.text_to_document(text) if text else []
    if document:
      stats.documents += 1
      stats.sentences += len(document)
      yield document
    else:
      stats.empty_records += 1
  stats.records += records
  if not records:
    raise ValueError(f"Input file {path} holds no records.")


def iter_documents(paths: Sequence[str], input_format: str = "auto",
                   stats: corpus.CorpusStats | None = None,
                   text_field: str = "text") -> Iterator[corpus.Document]:
  """The documents of every file of `paths`, in order. Raises naming the files when the whole
  corpus holds no document."""
  stats = corpus.CorpusStats() if stats is None else stats
  found = stats.documents
  for path in paths:
    yield from file_documents(path, input_format, stats, text_field)
  if stats.documents == found:
    raise corpus.empty_corpus_error(paths)


# ------------------------------------------------------------------------------- the readers


class _Undecodable:
  """Counts a file's bytes that are not UTF-8; refuses the file once more than
  `corpus.MAX_INVALID_SHARE` of at least `corpus.SNIFF_BYTES` read are."""

  def __init__(self, path: str, stats: corpus.CorpusStats):
    self.path, self.stats, self.read, self.invalid = path, stats, 0, 0

  def decode(self, raw: bytes, row: str) -> str:
    text, invalid = corpus.decode_utf8(raw)
    self.read += len(raw)
    self.stats.bytes += len(raw)
    if invalid:
      self.invalid += invalid
      self.stats.invalid_bytes += invalid
      if (self.read >= corpus.SNIFF_BYTES
          and self.invalid > corpus.MAX_INVALID_SHARE * self.read):
        raise ValueError(f"Input file {self.path} is not text: {self.invalid / self.read:.0%} "
                         f"of its first {self.read:,} bytes (to {row}) are not UTF-8.")
    return text


def _open(path: str) -> IO[bytes]:
  """`path` opened for reading bytes, decompressed as its name says."""
  raw = storage.open_binary(path)
  compression = _compression(path)
  if compression == "gzip":
    return gzip.GzipFile(fileobj=raw)
  if compression == "zstd":
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    return io.BufferedReader(pa.CompressedInputStream(raw, "zstd"))
  return raw


def _type_name(value: Any) -> str:
  return {bool: "a boolean", int: "a number", float: "a number", list: "a list",
          dict: "an object"}.get(type(value), type(value).__name__)


def _jsonl_texts(path: str, field: str,
                 stats: corpus.CorpusStats) -> Iterator[tuple[str, str | None]]:
  undecodable = _Undecodable(path, stats)
  with _open(path) as f:
    try:
      for number, raw in enumerate(f, start=1):
        row = f"line {number}"
        line = undecodable.decode(raw, row).strip()
        if not line:
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"Input file {path} {row} is not JSON ({e.msg}, column {e.colno})."
                           ) from None
        if not isinstance(record, dict):
          raise ValueError(f"Input file {path} {row} is {_type_name(record)}, not a record "
                           "(a JSON object).")
        if field not in record:
          raise ValueError(f"Input file {path} {row} has no field {field!r} (its fields: "
                           f"{', '.join(sorted(record)) or 'none'}); set --text_field.")
        text = record[field]
        if text is not None and not isinstance(text, str):
          raise ValueError(f"Input file {path} {row}: field {field!r} is {_type_name(text)}, "
                           "not text.")
        yield row, text
    except (EOFError, OSError) as e:  # gzip.BadGzipFile is an OSError.
      raise ValueError(f"Input file {path} cannot be read: {e}") from None


def _text_column(path: str, schema, field: str) -> None:
  """Refuses a table whose `field` column is absent or not text."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  if field not in schema.names:
    raise ValueError(f"Input file {path} has no column {field!r} (its columns: "
                     f"{', '.join(schema.names)}); set --text_field.")
  kind = schema.field(field).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
          or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
          or pa.types.is_null(kind)):
    raise ValueError(f"Input file {path}: column {field!r} is {kind}, not text.")


def _column_texts(path: str, batches, field: str, stats: corpus.CorpusStats,
                  first_row: int = 0) -> Iterator[tuple[str, str | None]]:
  """The texts of `field` in `batches` (pyarrow arrays of one column), rows numbered on."""
  undecodable = _Undecodable(path, stats)
  number = first_row
  for batch in batches:
    for value in batch.to_pylist():
      number += 1
      if isinstance(value, bytes):
        value = undecodable.decode(value, f"row {number}")
      elif value is not None:
        stats.bytes += len(value.encode("utf-8", "surrogatepass"))
      yield f"row {number}", value


def _parquet_texts(path: str, field: str,
                   stats: corpus.CorpusStats) -> Iterator[tuple[str, str | None]]:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  with storage.open_binary(path) as f:
    try:
      table = pq.ParquetFile(f)
    except pa.ArrowException as e:
      raise ValueError(f"Input file {path} is not Parquet ({e}).") from None
    _text_column(path, table.schema_arrow, field)
    groups = (table.read_row_group(i, columns=[field]).column(field)
              for i in range(table.num_row_groups))
    yield from _column_texts(path, (chunk for group in groups for chunk in group.chunks),
                             field, stats)


def _arrow_texts(path: str, field: str,
                 stats: corpus.CorpusStats) -> Iterator[tuple[str, str | None]]:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  with storage.open_binary(path) as f:
    try:
      reader = pa.ipc.open_stream(f)  # What `datasets` writes.
    except pa.ArrowInvalid:
      f.seek(0)
      try:
        reader = pa.ipc.open_file(f)
      except pa.ArrowInvalid as e:
        raise ValueError(f"Input file {path} is not an Arrow file ({e}).") from None
      batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
      batches = iter(reader)
    _text_column(path, reader.schema, field)
    yield from _column_texts(path, (batch.column(field) for batch in batches), field, stats)


_TEXTS = {"jsonl": _jsonl_texts, "parquet": _parquet_texts, "arrow": _arrow_texts}
