"""Fine-tuning data: records from JSONL / CSV (or TFDS), label sets, encoding into model arrays,
and the host-side batches (shuffled for training, padded and weighted for eval).

A record has `text`, optional `text_b`, and per task
- classification: `label` (string or int; a float for regression);
- tagging: `tags`, one per whitespace-separated word of `text` (labels go on each word's first
  piece, as BERT's NER setup);
- qa: `answers`, a list of {"text", "answer_start"} with character offsets into `text_b`, the
  passage; `text` is the question (SQuAD's layout).
Bad records raise ValueError naming the file and line. Classification and tagging text longer
than `max_seq_length` is truncated and counted. A QA passage is never truncated: as
google-research/bert's run_squad.py (`convert_examples_to_features`) it becomes one or more
windows ("features", one model row each) of [CLS] question [SEP] passage-window [SEP], stepping
by `doc_stride` pieces; see `doc_spans` and `max_context_windows`.

Offsets: the passage is split on whitespace and each word encoded on its own, so every piece
maps back to characters of the passage (`Vocab` has no offsets API). Within a word the pieces
are aligned to its characters; a word they do not spell out (e.g. [UNK]) maps as a whole.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import unicodedata
from typing import Any, Iterator, Sequence

import numpy as np

from bert_jax.data.vocab import Vocab
from bert_jax.pretrained import encode_pair

Record = tuple[str, int, dict[str, Any]]  # (file, line, fields)


@dataclasses.dataclass
class Window:
  """One QA feature: a window of a passage's pieces in one model row (run_squad's _DocSpan plus
  where its pieces sit in the row and where each has its maximum context)."""
  example: int  # Index of its question in TaskData.examples.
  doc_start: int  # First passage piece in the window (run_squad's DocSpan.start).
  doc_length: int  # Passage pieces in the window (DocSpan.length).
  offset: int  # Row position of the first of them: len(question) + 2 ([CLS] question [SEP]).
  max_context: np.ndarray  # [doc_length] bool: the piece has its maximum context here.


@dataclasses.dataclass
class TaskData:
  """Encoded examples of one source: model arrays plus what eval needs to score them. A row is
  an example, except in QA where a question gets one row per window of its passage."""
  source: str
  arrays: dict[str, np.ndarray]  # Model inputs and targets, one row each: [N, ...].
  examples: list[dict[str, Any]]  # Per example (QA: per question): gold labels, words, passage.
  num_truncated: int = 0  # Texts cut to max_seq_length (QA: questions cut to max_query_length).
  num_dropped: int = 0  # QA training questions left out: their answer maps to no piece.
  windows: list[Window] = dataclasses.field(default_factory=list)  # QA: one per row.
  num_split: int = 0  # QA: questions whose passage took more than one window.

  def __len__(self) -> int:
    """Model rows (what the batches iterate over); len(examples) counts what is scored."""
    return len(next(iter(self.arrays.values())))


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


def _csv_value(name: str, value: str) -> Any:
  """CSV cells are strings: list fields are JSON (tags may also be space-separated)."""
  if name == "tags":
    return json.loads(value) if value.lstrip().startswith("[") else value.split()
  if name == "answers":
    return json.loads(value)
  return value


def read_records(path: str, data_format: str = "auto") -> list[Record]:
  """(file, line, fields) of every record of a JSONL or CSV file (blank lines skipped)."""
  if not os.path.isfile(path):
    raise ValueError(f"Data file {path} does not exist")
  records = []
  with open(path, encoding="utf-8", newline="") as f:
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
    raise ValueError(f"{path} holds no records")
  return records


def _where(record: Record) -> str:
  return f"{record[0]}, line {record[1]}"


def _field(record: Record, name: str, kind: type | tuple[type, ...] = str) -> Any:
  fields = record[2]
  if name not in fields or fields[name] is None:
    raise ValueError(f"{_where(record)}: missing field {name!r}")
  value = fields[name]
  if not isinstance(value, kind) or isinstance(value, bool):
    raise ValueError(f"{_where(record)}: field {name!r} should be "
                     f"{getattr(kind, '__name__', kind)}, got {type(value).__name__}")
  return value


def _text_b(record: Record) -> str | None:
  value = record[2].get("text_b")
  if value is not None and not isinstance(value, str):
    raise ValueError(f"{_where(record)}: field 'text_b' should be str, got "
                     f"{type(value).__name__}")
  return value or None


# --------------------------------------------------------------------------------- labels


def label_name(value: Any) -> str:
  """Labels are named by strings: 1 and "1" are the same label."""
  return str(value)


def label_set(task: str, records: Sequence[Record], configured: Sequence[Any] = ()) -> list[str]:
  """The label names: `configured` when given, else every label (classification) or tag
  (tagging) of the training records, sorted ("O" first). QA has none."""
  if task == "qa":
    return []
  if configured:
    return [label_name(v) for v in configured]
  found = set()
  for record in records:
    if task == "classification":
      found.add(label_name(_field(record, "label", (str, int))))
    else:
      found.update(label_name(t) for t in _field(record, "tags", list))
  names = sorted(found, key=lambda n: (n != "O", int(n) if n.lstrip("-").isdigit() else 0, n))
  if not names:
    raise ValueError(f"{records[0][0]}: no labels found")
  return names


def _label_index(record: Record, value: Any, labels: dict[str, int]) -> int:
  name = label_name(value)
  if name not in labels:
    raise ValueError(f"{_where(record)}: label {name!r} is not in the label set "
                     f"{sorted(labels)}")
  return labels[name]


# ------------------------------------------------------------------------------- encoding


def _classification(records, vocab, labels, max_length, with_labels, regression) -> TaskData:
  index = {name: i for i, name in enumerate(labels)}
  columns: dict[str, list] = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
  gold, examples = [], []
  texts = [(_field(record, "text"), _text_b(record)) for record in records]
  # Lengths first (batched), to count what encode_pair's truncation shortens.
  lengths_a = [len(ids) for ids in vocab.encode_batch([a for a, _ in texts])]
  lengths_b = [len(ids) for ids in vocab.encode_batch([b or "" for _, b in texts])]
  truncated = sum(a + b + (3 if text_b else 2) > max_length
                  for a, b, (_, text_b) in zip(lengths_a, lengths_b, texts))
  for record, (text, text_b) in zip(records, texts):
    for name, value in encode_pair(vocab, text, text_b, max_length).items():
      columns[name].append(value)
    example: dict[str, Any] = {"line": record[1]}
    if with_labels:
      value = _field(record, "label", (str, int, float))
      if regression:
        try:
          example["label"] = float(value)
        except ValueError as e:
          raise ValueError(f"{_where(record)}: regression label {value!r} is not a number") from e
      else:
        example["label"] = _label_index(record, value, index)
      gold.append(example["label"])
    examples.append(example)
  arrays = {k: np.stack(v) for k, v in columns.items()}
  if with_labels:
    arrays["labels"] = np.asarray(gold, np.float32 if regression else np.int32)
  return TaskData(records[0][0], arrays, examples, truncated)


def _tagging(records, vocab, labels, max_length, with_labels) -> TaskData:
  index = {name: i for i, name in enumerate(labels)}
  n = len(records)
  arrays = {name: np.zeros((n, max_length), np.int32) for name in
            ("input_ids", "token_type_ids", "attention_mask", "labels")}
  arrays["label_weights"] = np.zeros((n, max_length), np.float32)
  examples, truncated = [], 0
  for row, record in enumerate(records):
    words = _field(record, "text").split()
    tags = None
    if with_labels:
      tags = _field(record, "tags", list)
      if len(tags) != len(words):
        raise ValueError(f"{_where(record)}: {len(tags)} tags for {len(words)} words (one tag "
                         "per whitespace-separated word of 'text')")
      tags = [_label_index(record, t, index) for t in tags]
    pieces = vocab.encode_batch(words) if words else []
    ids = [vocab.cls_id]
    word_positions = []  # Position of each word's first piece, -1 if it got none.
    for word_pieces in pieces:
      room = max_length - 1 - len(ids)
      word_positions.append(len(ids) if word_pieces and room > 0 else -1)
      ids.extend(word_pieces[:max(room, 0)])
    if sum(len(p) for p in pieces) + 2 > max_length:
      truncated += 1
    ids.append(vocab.sep_id)
    arrays["input_ids"][row] = ids + [vocab.pad_id] * (max_length - len(ids))
    arrays["attention_mask"][row, :len(ids)] = 1
    for word, position in enumerate(word_positions):
      if position >= 0:
        arrays["label_weights"][row, position] = 1.0
        if tags is not None:
          arrays["labels"][row, position] = tags[word]
    examples.append({"line": record[1], "words": words, "word_positions": word_positions,
                     "tags": tags})
  if not with_labels:
    del arrays["labels"]
  return TaskData(records[0][0], arrays, examples, truncated)


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


def doc_spans(num_pieces: int, max_tokens_for_doc: int,
              doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) of each window over a passage of `num_pieces` pieces, as run_squad's
  `convert_examples_to_features`: at most `max_tokens_for_doc` pieces each, the next one starting
  min(length, doc_stride) pieces later, stopping at the first that reaches the end of the passage.
  An empty passage still gets one (empty) window, so every question has a row to predict from."""
  if doc_stride <= 0 or max_tokens_for_doc <= 0:
    raise ValueError(f"doc_stride={doc_stride} and the room for the passage "
                     f"({max_tokens_for_doc} pieces) must be positive")
  spans, start = [], 0
  while start < num_pieces:
    length = min(num_pieces - start, max_tokens_for_doc)
    spans.append((start, length))
    if start + length == num_pieces:
      break
    start += min(length, doc_stride)
  return spans or [(0, 0)]


def max_context_windows(spans: Sequence[tuple[int, int]], num_pieces: int) -> np.ndarray:
  """[num_pieces] int: the window in which each passage piece has its maximum context, as
  run_squad's `_check_is_max_context`: score min(pieces left of it, pieces right of it in the
  window) + 0.01 * window length; on a tie the earlier window wins (its comparison is strict)."""
  best = np.full((num_pieces,), -1, np.int64)
  best_score = np.full((num_pieces,), -np.inf)
  for index, (start, length) in enumerate(spans):
    positions = np.arange(start, start + length)
    score = np.minimum(positions - start, start + length - 1 - positions) + 0.01 * length
    better = score > best_score[positions]
    best[positions[better]] = index
    best_score[positions[better]] = score[better]
  return best


def _answer_pieces(record: Record, context: str, spans: Sequence[tuple[int, int]],
                   answers: list) -> tuple[int, int] | None:
  """Checks the answers; -> (first, last) passage piece of the first one, None if it covers
  no piece (an empty or blank answer: run_squad skips such training examples)."""
  for answer in answers:
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) or \
        not isinstance(answer.get("answer_start"), int):
      raise ValueError(f"{_where(record)}: each answer needs 'text' (str) and "
                       "'answer_start' (int)")
    start, text = answer["answer_start"], answer["text"]
    if context[start:start + len(text)] != text:
      raise ValueError(f"{_where(record)}: answer {text!r} is not at character {start} of "
                       "text_b")
  if not answers:
    return None
  start = answers[0]["answer_start"]
  end = start + len(answers[0]["text"])
  inside = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
  return (inside[0], inside[-1]) if inside else None


def _qa(records, vocab, max_length, max_query_length, doc_stride, with_labels,
        is_training) -> TaskData:
  columns: dict[str, list] = {name: [] for name in ("input_ids", "token_type_ids",
                                                    "attention_mask", "context_mask")}
  targets: dict[str, list] = {"start_positions": [], "end_positions": [], "answer_weight": []}
  examples, windows, truncated, dropped, split = [], [], 0, 0, 0
  for record in records:
    question, context = _field(record, "text"), _field(record, "text_b")
    question_ids = vocab.encode(question)
    truncated += len(question_ids) > max_query_length
    question_ids = question_ids[:max_query_length]
    words = [(m.start(), m.group()) for m in re.finditer(r"\S+", context)]
    word_ids = vocab.encode_batch([w for _, w in words]) if words else []
    context_ids, spans = [], []  # Spans: characters of the passage, per passage piece.
    for (start, word), ids in zip(words, word_ids):
      context_ids.extend(ids)
      spans.extend((start + a, start + b) for a, b in piece_spans(vocab, word, ids))
    max_tokens_for_doc = max_length - len(question_ids) - 3  # [CLS], [SEP], [SEP].
    if max_tokens_for_doc <= 0:
      raise ValueError(f"{_where(record)}: max_seq_length={max_length} leaves no room for the "
                       f"passage after a {len(question_ids)}-piece question")
    answer = None  # (first, last) passage piece of the target answer.
    gold = []
    if with_labels:
      answers = _field(record, "answers", list)
      if is_training and not answers:
        raise ValueError(f"{_where(record)}: a training example needs an answer")
      answer = _answer_pieces(record, context, spans, answers)
      gold = [a["text"] for a in answers]
      if is_training and answer is None:
        dropped += 1  # Nothing to point at (run_squad skips it too).
        continue
    index = len(examples)
    examples.append({"line": record[1], "context": context, "answers": gold,
                     "piece_spans": np.asarray(spans, np.int32).reshape(-1, 2)})  # [P, 2]
    spans_of_windows = doc_spans(len(context_ids), max_tokens_for_doc, doc_stride)
    split += len(spans_of_windows) > 1
    best_window = max_context_windows(spans_of_windows, len(context_ids))  # [P]
    offset = len(question_ids) + 2
    for window_index, (doc_start, doc_length) in enumerate(spans_of_windows):
      ids = [vocab.cls_id, *question_ids, vocab.sep_id,
             *context_ids[doc_start:doc_start + doc_length], vocab.sep_id]
      row = {name: np.zeros((max_length,), np.int32) for name in columns}
      row["input_ids"][:] = ids + [vocab.pad_id] * (max_length - len(ids))
      row["token_type_ids"][offset:len(ids)] = 1
      row["attention_mask"][:len(ids)] = 1
      row["context_mask"][offset:offset + doc_length] = 1
      for name, value in row.items():
        columns[name].append(value)
      windows.append(Window(index, doc_start, doc_length, offset,
                            best_window[doc_start:doc_start + doc_length] == window_index))
      if with_labels:
        # run_squad's is_training targets: the answer's pieces when the window holds all of
        # them, else [CLS] (position 0; the QA head leaves it unmasked for this). Eval rows get
        # the same targets, so the validation loss measures what training minimises.
        inside = answer is not None and answer[0] >= doc_start and \
            answer[1] < doc_start + doc_length
        targets["start_positions"].append(offset + answer[0] - doc_start if inside else 0)
        targets["end_positions"].append(offset + answer[1] - doc_start if inside else 0)
        # 0: no gold answer to point at (an unanswered eval record).
        targets["answer_weight"].append(0.0 if answer is None else 1.0)
  if not examples:
    raise ValueError(f"{records[0][0]}: no usable QA examples (every answer is blank)")
  arrays = {name: np.stack(value) for name, value in columns.items()}
  if with_labels:
    arrays["start_positions"] = np.asarray(targets["start_positions"], np.int32)  # [N]
    arrays["end_positions"] = np.asarray(targets["end_positions"], np.int32)  # [N]
    arrays["answer_weight"] = np.asarray(targets["answer_weight"], np.float32)  # [N]
  return TaskData(records[0][0], arrays, examples, truncated, dropped, windows, split)


def encode(task: str, records: Sequence[Record], vocab: Vocab, *, labels: Sequence[str] = (),
           max_length: int = 128, max_query_length: int = 64, doc_stride: int = 128,
           with_labels: bool = True, is_training: bool = False,
           regression: bool = False) -> TaskData:
  """Records -> TaskData of `task`. `with_labels=False` encodes inputs only (prediction).
  QA: `doc_stride` pieces between the starts of a passage's windows (run_squad's default 128)."""
  if not records:
    raise ValueError("No records to encode")
  if task == "classification":
    return _classification(records, vocab, labels, max_length, with_labels, regression)
  if task == "tagging":
    return _tagging(records, vocab, labels, max_length, with_labels)
  if task == "qa":
    return _qa(records, vocab, max_length, max_query_length, doc_stride, with_labels,
               is_training)
  raise ValueError(f"Unknown task {task!r}")


# --------------------------------------------------------------------------------- TFDS

# TFDS dataset name (prefix) -> (text field, text_b field or None). Labels: "label"; SQuAD's
# answers come as {"text": [...], "answer_start": [...]}.
_TFDS_FIELDS = {
    "glue/sst2": ("sentence", None), "glue/cola": ("sentence", None),
    "glue/mrpc": ("sentence1", "sentence2"), "glue/stsb": ("sentence1", "sentence2"),
    "glue/rte": ("sentence1", "sentence2"), "glue/wnli": ("sentence1", "sentence2"),
    "glue/qqp": ("question1", "question2"), "glue/qnli": ("question", "sentence"),
    "glue/mnli": ("premise", "hypothesis"), "imdb_reviews": ("text", None),
    "squad": ("question", "context"),
}


def _decoded(value):
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    return [_decoded(v) for v in value.tolist()]
  if isinstance(value, list):
    return [_decoded(v) for v in value]
  return value


def read_tfds(name: str, split: str, data_dir: str | None = None) -> list[Record]:
  """Records of a TFDS dataset through `tfds.data_source` (random access; it downloads and
  prepares the dataset in ArrayRecord format on first use, so it needs internet access then):
  GLUE tasks, imdb_reviews, squad (v1.1 layout). Class labels keep their TFDS names."""
  import tensorflow_datasets as tfds

  key = next((k for k in _TFDS_FIELDS if name == k or name.startswith(k + ":")), None)
  if key is None:
    raise ValueError(f"TFDS dataset {name!r} has no field mapping; supported: "
                     f"{sorted(_TFDS_FIELDS)} (or export it to JSONL)")
  text_field, text_b_field = _TFDS_FIELDS[key]
  source = tfds.data_source(name, split=split, data_dir=data_dir)
  features = source.dataset_info.features
  names = getattr(features["label"], "names", None) if "label" in features.keys() else None
  records = []
  for index in range(len(source)):
    item = source[index]
    fields = {"text": _decoded(item[text_field])}
    if text_b_field:
      fields["text_b"] = _decoded(item[text_b_field])
    if key == "squad":
      answers = item["answers"]
      fields["answers"] = [{"text": t, "answer_start": int(s)} for t, s in
                           zip(_decoded(answers["text"]), _decoded(answers["answer_start"]))]
    elif "label" in item:
      label = _decoded(item["label"])
      fields["label"] = names[int(label)] if names and int(label) >= 0 else label
    records.append((f"tfds:{name}/{split}", index + 1, fields))
  return records


# -------------------------------------------------------------------------------- batches


def train_batches(data: TaskData, global_batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
  """Endless shuffled batches of rows (QA: windows; a new permutation each epoch, batches
  cross epoch ends), this process's rows of each global batch."""
  rng = np.random.default_rng(seed)
  per_host = global_batch_size // process_count
  order = np.zeros((0,), np.int64)
  while True:
    while len(order) < global_batch_size:
      order = np.concatenate([order, rng.permutation(len(data))])
    rows = order[:global_batch_size][process_index * per_host:(process_index + 1) * per_host]
    order = order[global_batch_size:]
    yield {name: value[rows] for name, value in data.arrays.items()}


def eval_batches(data: TaskData, global_batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
  """(global row indices [B], this process's rows) over every row (QA: window) once; the last
  batch is padded with copies of row 0 that weigh 0 (`example_weight`), so shapes stay static."""
  per_host = global_batch_size // process_count
  for begin in range(0, len(data), global_batch_size):
    indices = np.arange(begin, begin + global_batch_size)
    weight = (indices < len(data)).astype(np.float32)
    rows = np.where(indices < len(data), indices, 0)
    mine = slice(process_index * per_host, (process_index + 1) * per_host)
    batch = {name: value[rows[mine]] for name, value in data.arrays.items()}
    batch["example_weight"] = weight[mine]
    yield indices, batch
