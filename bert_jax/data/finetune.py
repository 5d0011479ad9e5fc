"""Fine-tuning data, whatever the task: records from JSONL / CSV (or TFDS), field and label
helpers, the encoded `TaskData`, and host-side batches (a checkpointable shuffled stream for
training; padded, weighted batches for eval, by `batching.eval_rows`). Each task
(`bert_jax/tasks/`) reads its own fields and encodes records into `TaskData` (or a subclass
with what it needs besides) itself.

A record has `text`, optional `text_b`, and the task's target fields (see the task modules).
Bad records raise ValueError naming the file and line.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import socket
import unicodedata
import urllib.parse
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from bert_jax.runtime import storage
from bert_jax.data import batching
from bert_jax.data.vocab import Vocab

Record = tuple[str, int, dict[str, Any]]  # (file, line, fields)
# A global train batch -> (its per-example arrays [B, ...], its packed rows [R, ...]).
Packer = Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]


@dataclasses.dataclass
class TaskData:
  """Encoded examples of one source: model arrays plus what eval needs to score them. A row is
  an example, unless the task splits an example over several rows (QA's windows: its own
  subclass says which rows are whose)."""
  source: str
  arrays: dict[str, np.ndarray]  # Model inputs and targets, one row each: [N, ...].
  examples: list[dict[str, Any]]  # Per scored example: gold labels, words, passage...
  num_truncated: int = 0  # Inputs the task's encoding cut.

  def __len__(self) -> int:
    """Model rows (what the batches iterate over); len(examples) counts what is scored."""
    return len(next(iter(self.arrays.values())))

  def counts(self) -> dict[str, int]:
    """What a run's summary (final_eval.json) records of this data, as <split>_<name>."""
    return {"examples": len(self.examples), "truncated": self.num_truncated, "rows": len(self)}


# ------------------------------------------------------------------------------ reading


def _format_of(path: str, data_format: str) -> str:
  if data_format != "auto":
    return data_format
  if path.endswith(".csv"):
    return "csv"
  if path.endswith((".jsonl", ".json")):
    return "jsonl"
  raise ValueError(f"{path}: cannot tell the format from the name; use a .jsonl or .csv file or "
                   "set config.data.format")


# Fields that hold text (or a label) and are never read as JSON, whatever they start with: a
# CSV text "[citation needed] ..." or "{x}" is that text (the red team: such texts were parsed
# as JSON and refused, so they could not be given in CSV at all).
TEXT_FIELDS = ("text", "text_b", "query", "positive", "prompt", "response", "label")


def _csv_value(name: str, value: str) -> Any:
  """CSV cells are strings; a cell of a structured field holding a JSON list or object (a task's
  tags, answers or negatives) is that list or object."""
  if name in TEXT_FIELDS or not value.lstrip().startswith(("[", "{")):
    return value
  return json.loads(value)


def read_records(path: str, data_format: str = "auto") -> list[Record]:
  """(file, line, fields) of every record of a JSONL or CSV file, local or in a bucket (blank
  lines skipped)."""
  if not storage.isfile(path):
    raise ValueError(f"Data file {path} does not exist")
  try:
    return _read_records(path, data_format)
  except UnicodeDecodeError:  # Decoded in chunks: find the line (the red team: no file, no line).
    for number, raw in enumerate(storage.read_bytes(path).splitlines(), 1):
      try:
        raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}, line {number}: not UTF-8 ({e.reason} at byte {e.start} of "
                         "the line); save the file as UTF-8") from None
    raise


def _read_records(path: str, data_format: str) -> list[Record]:
  records = []
  # Bytes decoded here (local or in a bucket), with newline="" so that csv
  # sees line ends as written (quoted fields may hold them). A bucket's file streams too.
  with io.TextIOWrapper(storage.open_binary(path), encoding="utf-8", newline="") as f:
    if _format_of(path, data_format) == "jsonl":
      for line_number, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          fields = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}, line {line_number}: not valid JSON ({e})") from e
        if not isinstance(fields, dict):
          raise ValueError(f"{path}, line {line_number}: expected a JSON object")
        records.append((path, line_number, fields))
    else:
      reader = csv.DictReader(f)
      line_number = 1  # The header.
      for row in reader:
        start = line_number + 1
        line_number = reader.line_num
        fields = {}
        for name, value in row.items():
          if name is None or value is None or value == "":
            continue  # Extra cells, missing trailing cells, empty optional fields.
          try:
            fields[name] = _csv_value(name, value)
          except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {start}: field {name!r} is not valid JSON ({e})") from e
        records.append((path, start, fields))
  if not records:
    raise ValueError(f"Data file {path} holds no records (it is empty, or holds blank lines or a "
                     "CSV header only)")
  for record in records:
    _check_not_blank(record)
  return records


# Fields that must hold something when given: an empty text would train on [CLS] [SEP] alone,
# an empty label would become a class of its own. (An empty text_b means "no second text".)
_NOT_BLANK = ("text", "label")


def _check_not_blank(record: Record) -> None:
  for name in _NOT_BLANK:
    value = record[2].get(name)
    if isinstance(value, str) and not value.strip():
      raise ValueError(f"{where(record)}: field {name!r} is empty")
    if name in record[2] and value is None:  # JSON null: not a class "None", not a text.
      raise ValueError(f"{where(record)}: field {name!r} is null; give a value or leave the "
                       "record out")


def where(record: Record) -> str:
  """"file, line N": where a record came from, for error messages."""
  return f"{record[0]}, line {record[1]}"


def field(record: Record, name: str, kind: type | tuple[type, ...] = str) -> Any:
  """The record's `name` field, checked to be of `kind`; a clear error when missing or not."""
  fields = record[2]
  if name not in fields or fields[name] is None:
    raise ValueError(f"{where(record)}: missing field {name!r}")
  value = fields[name]
  if not isinstance(value, kind) or isinstance(value, bool):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    raise ValueError(f"{where(record)}: field {name!r} should be "
                     f"{' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
  return value


def text_b(record: Record) -> str | None:
  """The optional second text of a pair (None when absent or empty)."""
  value = record[2].get("text_b")
  if value is not None and not isinstance(value, str):
    raise ValueError(f"{where(record)}: field 'text_b' should be str, got "
                     f"{type(value).__name__}")
  return value or None


# --------------------------------------------------------------------------------- labels


def label_name(value: Any) -> str:
  """Labels are named by strings: 1 and "1" are the same label."""
  return str(value)


def label_set(records: Sequence[Record], configured: Sequence[Any],
              values_of: Callable[[Record], list[Any]]) -> list[str]:
  """The label names: `configured` when given, else every label `values_of` finds in the
  training records, sorted ("O" first, then numbers in numeric order)."""
  if configured:
    return [label_name(v) for v in configured]
  found = set()
  for record in records:
    for value in values_of(record):
      if not label_name(value).strip():
        raise ValueError(f"{where(record)}: an empty label ({value!r})")
      found.add(label_name(value))
  names = sorted(found, key=lambda n: (n != "O", int(n) if n.lstrip("-").isdigit() else 0, n))
  if not names:
    raise ValueError(f"{records[0][0]}: no labels found" if records else
                     "no labels: no training records, and config.data.labels is empty")
  return names


def label_index(record: Record, value: Any, labels: Sequence[str]) -> int:
  """The index of the record's label `value` in `labels`; a clear error if it is unknown."""
  name = label_name(value)
  if name not in labels:
    raise ValueError(f"{where(record)}: label {name!r} is not in the label set "
                     f"{sorted(labels)}")
  return list(labels).index(name)


# ------------------------------------------------------------------------------- pieces


def _normalized_char(c: str) -> str:
  """Lowercased, accents stripped: how BERT-uncased and most normalisers change a character."""
  return "".join(x for x in unicodedata.normalize("NFD", c.lower())
                 if unicodedata.category(x) != "Mn")


def piece_spans(vocab: Vocab, word: str, ids: Sequence[int]) -> list[tuple[int, int]]:
  """Character span [start, end) within `word` of each piece in `ids` (the word's encoding).
  Pieces are matched to the word's characters in order; from the first one that does not
  match (an [UNK], a byte piece, a normaliser change) the pieces share the rest of the word."""
  spans, cursor, aligned = [], 0, True
  for i in ids:
    piece = vocab.id_to_piece(i)
    if vocab.kind == "sentencepiece":
      piece = piece.replace("\u2581", "")
    elif vocab.kind == "bpe":
      piece = piece.replace("\u0120", "")  # Byte-level BPE's space.
    elif piece.startswith("##"):
      piece = piece[2:]
    if aligned and i != vocab.unk_id:
      end = cursor
      for char in piece:
        while end < len(word) and not _normalized_char(word[end]):
          end += 1  # Characters a normaliser drops (combining marks, control characters).
        if end < len(word) and _normalized_char(word[end]) == _normalized_char(char):
          end += 1
        else:
          aligned = False
          break
    else:
      aligned = False
    if aligned:
      spans.append((cursor, end))
      cursor = end
    else:
      spans.append((cursor, len(word)))
  return spans


# --------------------------------------------------------------------------------- TFDS

# TFDS dataset name (prefix) -> (text field, text_b field or None). Targets keep their TFDS
# names: "label" (class labels by name), "answers" (SQuAD's {"text": [...], "answer_start":
# [...]} as a list of {"text", "answer_start"}).
_TFDS_FIELDS = {
    "glue/sst2": ("sentence", None), "glue/cola": ("sentence", None),
    "glue/mrpc": ("sentence1", "sentence2"), "glue/stsb": ("sentence1", "sentence2"),
    "glue/rte": ("sentence1", "sentence2"), "glue/wnli": ("sentence1", "sentence2"),
    "glue/qqp": ("question1", "question2"), "glue/qnli": ("question", "sentence"),
    "glue/mnli": ("premise", "hypothesis"), "imdb_reviews": ("text", None),
    "squad": ("question", "context"), "squad/v1.1": ("question", "context"),
    "squad/v2.0": ("question", "context"),
}


def _decoded(value):
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    return [_decoded(v) for v in value.tolist()]
  if isinstance(value, list):
    return [_decoded(v) for v in value]
  return value


# TFDS builders that `tfds.data_source(name)` does not find until their module is imported
# (TFDS registers `glue` lazily: "Dataset glue not found" otherwise).
_TFDS_BUILDER_MODULES = {"glue": "tensorflow_datasets.text.glue"}


def register_tfds_builder(name: str) -> None:
  """Imports the module of `name`'s TFDS builder where TFDS does not do it itself."""
  import importlib
  module = _TFDS_BUILDER_MODULES.get(name.split("/")[0].split(":")[0])
  if module:
    importlib.import_module(module)


# What TFDS's builders of the suites import beyond requirements.txt.
TFDS_REQUIREMENTS = "requirements-downstream.txt"


class _Unreachable(OSError):
  """A download's host cannot be reached at all (offline, DNS, firewall)."""


@contextlib.contextmanager
def _downloads_fail_at_once_offline():
  """TFDS retries a download that cannot connect 10 times with backoff: offline, GLUE printed
  its error after 209 s (the red team). Each URL's host is tried once (5 s) before TFDS opens
  it; unreachable, that is one error at once. Only real downloads pass here: a download step
  answered locally (tfds.testing.mock_data, a patched DownloadManager) never does."""
  try:
    from tensorflow_datasets.core.download import downloader  # pylint: disable=import-outside-toplevel
  except ImportError:
    yield
    return
  open_url = getattr(downloader, "_open_url", None)
  if open_url is None:  # Another TFDS layout: its own behaviour.
    yield
    return

  def checked(url: str, **kwargs):
    parsed = urllib.parse.urlparse(url)
    if parsed.hostname:
      port = parsed.port or (443 if parsed.scheme == "https" else 80)
      try:
        socket.create_connection((parsed.hostname, port), timeout=5).close()
      except OSError as e:
        raise _Unreachable(f"cannot reach {parsed.hostname} to download {url} ({e})") from None
    return open_url(url, **kwargs)

  downloader._open_url = checked  # pylint: disable=protected-access
  try:
    yield
  finally:
    downloader._open_url = open_url  # pylint: disable=protected-access


def _unreachable_cause(error: BaseException) -> _Unreachable | None:
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, _Unreachable):
      return error
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return None


def tfds_data_source(name: str, split: str, data_dir: str | None = None):
  """`tfds.data_source` of a registered TFDS dataset (downloaded and prepared on first use; a
  download host that cannot be reached is one line at once); a module its builder lacks is one
  line naming the requirements file that installs it."""
  import tensorflow_datasets as tfds
  try:
    register_tfds_builder(name)
    # Prepared as ArrayRecord, which TFDS writes without TensorFlow (its default, TFRecord,
    # needs it) and which random access reads.
    with _downloads_fail_at_once_offline():
      return tfds.data_source(name, split=split, data_dir=data_dir,
                              builder_kwargs={"file_format": "array_record"})
  except ModuleNotFoundError as e:
    module = e.name or str(e).rsplit("No module named ", 1)[-1].strip("'\" ")
    raise ValueError(f"TFDS dataset {name!r} needs the module {module!r}, which is not "
                     f"installed: pip install -r {TFDS_REQUIREMENTS}") from e
  except Exception as e:  # pylint: disable=broad-except
    unreachable = _unreachable_cause(e)
    if unreachable is None:
      raise
    raise ValueError(
        f"TFDS dataset {name!r} is not prepared in {data_dir or tfds.core.constants.DATA_DIR} "
        f"and this machine {unreachable}: prepare it where there is internet and copy its TFDS "
        "data directory here (--config.data.tfds_data_dir), or give the data as JSONL/CSV "
        "files") from None


def read_tfds(name: str, split: str, data_dir: str | None = None) -> list[Record]:
  """Records of a TFDS dataset through `tfds.data_source` (random access; it downloads and
  prepares the dataset in ArrayRecord format on first use, so it needs internet access then):
  GLUE tasks, imdb_reviews, squad (v1.1 layout; squad/v2.0 adds is_impossible). Class labels
  keep their TFDS names."""
  key = next((k for k in _TFDS_FIELDS if name == k or name.startswith(k + ":")), None)
  if key is None:
    raise ValueError(f"TFDS dataset {name!r} has no field mapping; supported: "
                     f"{sorted(_TFDS_FIELDS)} (or export it to JSONL)")
  text_field, text_b_field = _TFDS_FIELDS[key]
  source = tfds_data_source(name, split, data_dir)
  features = source.dataset_info.features
  names = getattr(features["label"], "names", None) if "label" in features.keys() else None
  records = []
  for index in range(len(source)):
    item = source[index]
    fields = {"text": _decoded(item[text_field])}
    if text_b_field:
      fields["text_b"] = _decoded(item[text_b_field])
    if "answers" in item:
      answers = item["answers"]
      fields["answers"] = [{"text": t, "answer_start": int(s)} for t, s in
                           zip(_decoded(answers["text"]), _decoded(answers["answer_start"]))]
    if "is_impossible" in item:  # squad/v2.0: a numpy bool here, a JSON bool in a record.
      fields["is_impossible"] = bool(item["is_impossible"])
    if "label" in item:
      label = _decoded(item["label"])
      fields["label"] = names[int(label)] if names and int(label) >= 0 else label
    records.append((f"tfds:{name}/{split}", index + 1, fields))
  if not records:
    raise ValueError(f"TFDS dataset {name!r} split {split!r} holds no records")
  return records


# -------------------------------------------------------------------------------- batches


class TrainBatches:
  """Endless shuffled batches of rows (QA: windows), this process's rows of each global batch.

  Epoch e visits the rows in the permutation drawn from (seed, e); batches run across epoch ends.
  The position is the number of batches taken, so `get_state` / `set_state` resume exactly (and
  the global batches are the same for any number of processes).

  With `pack` (a task's `batch_packer`: the whole global batch -> (per-example arrays [B, ...],
  packed rows [R, ...] with R divisible by the process count)) each process takes its slice of
  both: the packing is a function of the global batch alone, so it is the same on any number of
  processes and after a resume."""

  def __init__(self, data: TaskData, global_batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, pack: Packer | None = None):
    if not len(data):  # Before any compile, rather than a division by zero at the first batch.
      raise ValueError(f"{data.source}: no training rows to fine-tune on (its records encode to "
                       "none)")
    self.data, self.global_batch_size, self.seed = data, global_batch_size, seed
    self.per_host = batching.per_host_batch_size(global_batch_size, process_count)
    self.first = process_index * self.per_host
    self.process_index, self.process_count, self.pack = process_index, process_count, pack
    self.batches = 0
    self._epoch, self._order = -1, np.zeros((0,), np.int64)

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch != self._epoch:
      self._epoch = epoch
      self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.data))
    return self._order

  def __iter__(self) -> "TrainBatches":
    return self

  def _rows(self, first: int, count: int) -> np.ndarray:
    size = len(self.data)
    positions = self.batches * self.global_batch_size + first + np.arange(count)
    return np.asarray([self._permutation(int(p) // size)[int(p) % size] for p in positions])

  def __next__(self) -> dict[str, np.ndarray]:
    if self.pack is None:
      rows = self._rows(self.first, self.per_host)
      self.batches += 1
      return {name: value[rows] for name, value in self.data.arrays.items()}
    rows = self._rows(0, self.global_batch_size)
    self.batches += 1
    examples, packed = self.pack({name: value[rows] for name, value in self.data.arrays.items()})
    per_host = {name: value[self.first:self.first + self.per_host]
                for name, value in examples.items()}
    (num_rows,) = {len(value) for value in packed.values()}
    share = num_rows // self.process_count
    mine = slice(self.process_index * share, (self.process_index + 1) * share)
    return {**per_host, **{name: value[mine] for name, value in packed.items()}}

  def get_state(self) -> dict[str, int]:
    return {"batches": self.batches, "seed": self.seed}

  def set_state(self, state: dict[str, int]) -> None:
    if state["seed"] != self.seed:
      raise ValueError(f"The checkpoint's data order has seed {state['seed']}, the config "
                       f"{self.seed}; resume with the same config.seed")
    self.batches = int(state["batches"])


def eval_batches(data: TaskData, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
  """This process's rows of global batches over every row of `data` once, in order
  (`batching.eval_rows`), with `example_weight` 0 on the padding rows of the last batch."""
  for rows, weight in batching.eval_rows(len(data), global_batch_size, process_index,
                                         process_count):
    yield {**{name: value[rows] for name, value in data.arrays.items()},
           "example_weight": weight}
