"""Fine-tuning data: records from JSONL / CSV (or TFDS), label sets, encoding into model arrays,
and the host-side batches (shuffled for training, padded and weighted for eval).

A record has `text`, optional `text_b`, and per task
- classification: `label` (string or int; a float for regression);
- tagging: `tags`, one per whitespace-separated word of `text` (labels go on each word's first
  piece, as BERT's NER setup);
- qa: `answers`, a list of {"text", "answer_start"} with character offsets into `text_b`, the
  passage; `text` is the question (SQuAD's layout).
Bad records raise ValueError naming the file and line. Text longer than `max_seq_length` is
truncated and counted; a QA answer cut off by truncation drops that example from training.

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
class TaskData:
  """Encoded examples of one source: model arrays plus what eval needs to score them."""
  source: str
  arrays: dict[str, np.ndarray]  # Model inputs and targets, each [N, ...].
  examples: list[dict[str, Any]]  # Per example: gold labels, words, passage, token spans.
  num_truncated: int = 0  # Examples whose text did not fit in max_seq_length.
  num_dropped: int = 0  # QA training examples whose answer truncation cut off.

  def __len__(self) -> int:
    return len(self.examples)


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


def _qa(records, vocab, max_length, max_query_length, with_labels, is_training) -> TaskData:
  n = len(records)
  arrays = {name: np.zeros((n, max_length), np.int32) for name in
            ("input_ids", "token_type_ids", "attention_mask", "context_mask")}
  arrays["start_positions"] = np.zeros((n,), np.int32)
  arrays["end_positions"] = np.zeros((n,), np.int32)
  arrays["answer_weight"] = np.zeros((n,), np.float32)  # 0: truncation cut the answer off.
  examples, keep, truncated, dropped = [], [], 0, 0
  for row, record in enumerate(records):
    question, context = _field(record, "text"), _field(record, "text_b")
    question_ids = vocab.encode(question)[:max_query_length]
    words = [(m.start(), m.group()) for m in re.finditer(r"\S+", context)]
    word_ids = vocab.encode_batch([w for _, w in words]) if words else []
    context_ids, spans = [], []  # Spans: characters of the passage, per context piece.
    for (start, word), ids in zip(words, word_ids):
      context_ids.extend(ids)
      spans.extend((start + a, start + b) for a, b in piece_spans(vocab, word, ids))
    budget = max_length - len(question_ids) - 3
    if budget <= 0:
      raise ValueError(f"{_where(record)}: max_seq_length={max_length} leaves no room for the "
                       f"passage after a {len(question_ids)}-piece question")
    if len(context_ids) > budget:
      truncated += 1
      context_ids, spans = context_ids[:budget], spans[:budget]
    offset = len(question_ids) + 2  # [CLS] question [SEP]
    ids = [vocab.cls_id, *question_ids, vocab.sep_id, *context_ids, vocab.sep_id]
    arrays["input_ids"][row] = ids + [vocab.pad_id] * (max_length - len(ids))
    arrays["token_type_ids"][row, offset:len(ids)] = 1
    arrays["attention_mask"][row, :len(ids)] = 1
    arrays["context_mask"][row, offset:offset + len(context_ids)] = 1
    token_spans = np.full((max_length, 2), -1, np.int32)
    if spans:
      token_spans[offset:offset + len(spans)] = spans
    example = {"line": record[1], "context": context, "token_spans": token_spans,
               "answers": []}
    usable = True
    if with_labels:
      answers = _field(record, "answers", list)
      for answer in answers:
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) or \
            not isinstance(answer.get("answer_start"), int):
          raise ValueError(f"{_where(record)}: each answer needs 'text' (str) and "
                           "'answer_start' (int)")
        start, text = answer["answer_start"], answer["text"]
        if context[start:start + len(text)] != text:
          raise ValueError(f"{_where(record)}: answer {text!r} is not at character {start} of "
                           "text_b")
        example["answers"].append(text)
      if is_training and not answers:
        raise ValueError(f"{_where(record)}: a training example needs an answer")
      if answers:
        start = answers[0]["answer_start"]
        end = start + len(answers[0]["text"])
        inside = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
        if inside and spans[inside[-1]][1] >= end:
          arrays["start_positions"][row] = offset + inside[0]
          arrays["end_positions"][row] = offset + inside[-1]
          arrays["answer_weight"][row] = 1.0
        elif is_training:
          usable = False  # Truncation cut the answer off: nothing to learn from here.
          dropped += 1
    examples.append(example)
    keep.append(usable)
  if not with_labels:
    del arrays["start_positions"], arrays["end_positions"], arrays["answer_weight"]
  if not all(keep):
    arrays = {k: v[np.asarray(keep)] for k, v in arrays.items()}
    examples = [e for e, k in zip(examples, keep) if k]
  return TaskData(records[0][0], arrays, examples, truncated, dropped)


def encode(task: str, records: Sequence[Record], vocab: Vocab, *, labels: Sequence[str] = (),
           max_length: int = 128, max_query_length: int = 64, with_labels: bool = True,
           is_training: bool = False, regression: bool = False) -> TaskData:
  """Records -> TaskData of `task`. `with_labels=False` encodes inputs only (prediction)."""
  if not records:
    raise ValueError("No records to encode")
  if task == "classification":
    return _classification(records, vocab, labels, max_length, with_labels, regression)
  if task == "tagging":
    return _tagging(records, vocab, labels, max_length, with_labels)
  if task == "qa":
    return _qa(records, vocab, max_length, max_query_length, with_labels, is_training)
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
  """Endless shuffled batches (a new permutation each epoch, batches cross epoch ends), this
  process's rows of each global batch."""
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
  """(global example indices [B], this process's rows) over every example once; the last batch
  is padded with copies of example 0 that weigh 0 (`example_weight`), so shapes stay static."""
  per_host = global_batch_size // process_count
  for begin in range(0, len(data), global_batch_size):
    indices = np.arange(begin, begin + global_batch_size)
    weight = (indices < len(data)).astype(np.float32)
    rows = np.where(indices < len(data), indices, 0)
    mine = slice(process_index * per_host, (process_index + 1) * per_host)
    batch = {name: value[rows[mine]] for name, value in data.arrays.items()}
    batch["example_weight"] = weight[mine]
    yield indices, batch
