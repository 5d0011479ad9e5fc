"""Extractive question answering (SQuAD v1.1 and v2.0 layouts), as google-research/bert's
run_squad.py.

Records: `text` (the question), `text_b` (the passage) and `answers`, a list of {"text",
"answer_start"} with character offsets into the passage. A passage is never truncated: it
becomes one or more windows ("features", one model row each) of [CLS] question [SEP]
passage-window [SEP], stepping by `doc_stride` pieces (`doc_spans`). A window that does not hold
the whole answer is trained to point at [CLS]. Decoding (`predictions`): the best start <= end
by start + end logit over all windows of a question, inside a window's passage, at most
`max_answer_length` pieces, the start only in the window where that piece has its maximum
context (`max_context_windows`); mapped back to passage characters. SQuAD's exact match and F1
are scored once per question, as fractions in [0, 1] (`squad_scores`).

SQuAD 2.0 (`version_2_with_negative`, run_squad's flag): a question with an empty `answers`
list, or "is_impossible": true (SQuAD 2.0's JSON and TFDS's squad/v2.0 mark them so), is
trained to [CLS] in every one of its windows. Prediction (run_squad's write_predictions) takes
the null score, the least [CLS] start + end logit over the question's windows
(`null_scores`), and answers "" when null - best span score > `null_score_diff_threshold`; each
prediction keeps that difference (run_squad's null_odds.json). Scores are those of the official
evaluate-v2.0.py given the differences as na_probs (`squad_v2_scores`: HasAns_* / NoAns_*, the
best thresholds), as fractions too. Without the flag, a training question without an answer is
an error and an eval one is scored against "" (v1.1).

Offsets: the passage is split on whitespace and each word encoded on its own, so every piece
maps back to characters of the passage (`finetune_data.piece_spans`). The encoded data is a
`QAData`: `TaskData` plus the window of each row.
"""

import collections
import dataclasses
import re
import string
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import finetune as finetune_data
from bert_jax.data.finetune import Record, TaskData
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.tasks.finetuning import (CLASSIFIER, FinetuneSettings, FinetuneTask, head_dense,
                                       head_features, nll)

# Masked QA logits: finite, so an all-masked row still has a (uniform) softmax.
_MASKED_LOGIT = -1e9


class BertForQuestionAnswering(nn.Module):
  """[CLS] question [SEP] passage-window [SEP] -> (start_logits, end_logits), each [B, L] f32,
  with every position outside `context_mask` (1 on passage tokens) masked out except position
  0, [CLS]: the target of windows that do not hold the answer (run_squad's out-of-span rule).
  `head` "bert": HF's BertForQuestionAnswering (`qa_outputs` on the sequence, no dropout);
  "modernbert": ModernBertForQuestionAnswering (prediction head, dropout, `classifier`)."""
  config: BertConfig
  dropout_prob: float = 0.0
  head: str = "bert"

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, context_mask,
               deterministic: bool = True):
    sequence = head_features(self.config, self.head, input_ids, token_type_ids, attention_mask,
                             deterministic, pooled=False)  # [B, L, H]
    if self.head == "bert":
      logits = head_dense(self.config, 2, "qa_outputs")(sequence)
    else:
      sequence = nn.Dropout(self.dropout_prob)(sequence, deterministic=deterministic)
      logits = head_dense(self.config, 2, CLASSIFIER)(sequence)
    logits = mask_qa_logits(logits.astype(jnp.float32), context_mask)  # [B, L, 2]
    return logits[..., 0], logits[..., 1]


def mask_qa_logits(logits: jax.Array, context_mask: jax.Array) -> jax.Array:
  """logits [B, L, 2] -> the same with every position but the passage (`context_mask` [B, L])
  and [CLS] (position 0) set to a large negative value. Question, [SEP] and padding stay masked
  (run_squad leaves them in its softmax, but they are never targets nor answers); [CLS] must
  compete, or "the answer is not in this window" could not be learnt."""
  is_cls = jnp.arange(context_mask.shape[-1]) == 0  # [L]
  allowed = (context_mask > 0) | is_cls[None, :]  # [B, L]
  return jnp.where(allowed[..., None], logits, _MASKED_LOGIT)


# ------------------------------------------------------------------------------ windows


@dataclasses.dataclass
class Window:
  """One QA feature: a window of a passage's pieces in one model row (run_squad's _DocSpan plus
  where its pieces sit in the row and where each has its maximum context)."""
  example: int  # Index of its question in QAData.examples.
  doc_start: int  # First passage piece in the window (run_squad's DocSpan.start).
  doc_length: int  # Passage pieces in the window (DocSpan.length).
  offset: int  # Row position of the first of them: len(question) + 2 ([CLS] question [SEP]).
  max_context: np.ndarray  # [doc_length] bool: the piece has its maximum context here.


@dataclasses.dataclass
class QAData(TaskData):
  """Encoded questions: one row per window of a question's passage."""
  num_dropped: int = 0  # Training questions left out: their answer maps to no piece.
  windows: list[Window] = dataclasses.field(default_factory=list)  # One per row.
  num_split: int = 0  # Questions whose passage took more than one window.
  # Questions without an answer (with version_2_with_negative their windows target [CLS]).
  num_impossible: int = 0

  def counts(self) -> dict[str, int]:
    return {**super().counts(), "dropped": self.num_dropped, "split": self.num_split,
            "impossible": self.num_impossible}


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


# The target pieces of an unanswerable question (SQuAD 2.0): pieces no window holds, so every
# window points at [CLS] (`_add_targets`), as run_squad's tok_start_position =
# tok_end_position = -1 then start_position = end_position = 0 for is_impossible.
IMPOSSIBLE = (-1, -1)


def is_impossible(record: Record, answers: list) -> bool:
  """Whether a SQuAD 2.0 record has no answer in its passage: an empty `answers` list, or
  "is_impossible": true (SQuAD 2.0's JSON and TFDS squad/v2.0 mark those questions so; both
  at once contradict each other: run_squad would ignore the answers, the official evaluation
  would score them)."""
  flag = record[2].get("is_impossible", False)
  if not isinstance(flag, bool):
    raise ValueError(f"{finetune_data.where(record)}: field 'is_impossible' should be true or "
                     f"false, got {flag!r}")
  if flag and answers:
    raise ValueError(f"{finetune_data.where(record)}: 'is_impossible' is true but 'answers' is "
                     "not empty")
  return flag or not answers


def _answer_pieces(record: Record, context: str, spans: Sequence[tuple[int, int]],
                   answers: list) -> tuple[int, int] | None:
  """Checks the answers; -> (first, last) passage piece of the first one, None if it covers
  no piece (an empty or blank answer: run_squad skips such training examples)."""
  for answer in answers:
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) or \
        not isinstance(answer.get("answer_start"), int):
      raise ValueError(f"{finetune_data.where(record)}: each answer needs 'text' (str) and "
                       "'answer_start' (int)")
    start, text = answer["answer_start"], answer["text"]
    if context[start:start + len(text)] != text:
      raise ValueError(f"{finetune_data.where(record)}: answer {text!r} is not at character "
                       f"{start} of text_b")
  if not answers:
    return None
  start = answers[0]["answer_start"]
  end = start + len(answers[0]["text"])
  inside = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
  return (inside[0], inside[-1]) if inside else None


def _passage_pieces(vocab: Vocab, context: str) -> tuple[list[int], list[tuple[int, int]]]:
  """-> (piece ids of the passage, character span of each piece in the passage)."""
  words = [(m.start(), m.group()) for m in re.finditer(r"\S+", context)]
  word_ids = vocab.encode_batch([w for _, w in words]) if words else []
  ids, spans = [], []
  for (start, word), pieces in zip(words, word_ids):
    ids.extend(pieces)
    spans.extend((start + a, start + b) for a, b in finetune_data.piece_spans(vocab, word, pieces))
  return ids, spans


class Span(NamedTuple):
  """A question's best span: its score (start + end logit, float64), its first and last
  passage piece, and the two logits (run_squad's score difference subtracts them one by one)."""
  score: float
  first: int
  last: int
  start_logit: float
  end_logit: float


@dataclasses.dataclass
class _Rows:
  """Model rows of the windows, filled question by question."""
  columns: dict[str, list] = dataclasses.field(
      default_factory=lambda: collections.defaultdict(list))
  windows: list[Window] = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------------------ decoding


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, context_mask: np.ndarray,
              max_answer_length: int,
              max_context: np.ndarray | None = None) -> tuple[int, int, float]:
  """[L] logits and passage mask -> (start, end, score) maximising start + end logits over
  passage positions with start <= end < start + max_answer_length and, when `max_context` [L]
  is given, a start where it is set; (-1, -1, -inf) if none. Exhaustive over the valid spans:
  run_squad tries only the n_best_size (20) highest starts x ends, which gives the same span
  whenever the best valid one is among them (and no answer when none of them is valid)."""
  length = len(start_logits)
  ends = np.arange(length)[:, None] + np.arange(max_answer_length)[None, :]  # [L, A]
  inside = ends < length
  ends = np.minimum(ends, length - 1)
  starts_ok = context_mask > 0
  if max_context is not None:
    starts_ok = starts_ok & (max_context > 0)
  allowed = inside & starts_ok[:, None] & (context_mask[ends] > 0)  # [L, A]
  if not allowed.any():
    return -1, -1, float("-inf")
  scores = start_logits.astype(np.float64)[:, None] + end_logits.astype(np.float64)[ends]
  scores = np.where(allowed, scores, -np.inf)
  # Row-major argmax: ties go to the earliest start, then the shortest span.
  start, extra = np.unravel_index(int(np.argmax(scores)), scores.shape)
  return int(start), int(start + extra), float(scores[start, extra])


def null_scores(start_logits: np.ndarray, end_logits: np.ndarray, examples: Sequence[int],
                num_examples: int) -> np.ndarray:
  """[N, L] logits of the rows and the question of each row -> [num_examples] float64: each
  question's null score, run_squad's score_null: the least [CLS] (position 0) start + end logit
  over its windows (+inf for a question without rows; every encoded question has one)."""
  row_null = (np.asarray(start_logits)[:, 0].astype(np.float64)
              + np.asarray(end_logits)[:, 0].astype(np.float64))  # [N]
  scores = np.full((num_examples,), np.inf)
  np.minimum.at(scores, np.asarray(examples, np.int64), row_null)
  return scores


# ------------------------------------------------------------------------------ scoring


def normalize_answer(text: str) -> str:
  """SQuAD's normalisation: lowercase, no punctuation, no articles, single spaces."""
  text = "".join(c for c in text.lower() if c not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def _token_f1(prediction: str, truth: str) -> float:
  predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
  common = sum((collections.Counter(predicted) & collections.Counter(gold)).values())
  if common == 0:
    return 0.0
  precision, recall = common / len(predicted), common / len(gold)
  return 2 * precision * recall / (precision + recall)


def squad_scores(predicted: Sequence[str], answers: Sequence[Sequence[str]]) -> dict[str, float]:
  """exact_match and f1 in [0, 1]: each the max over the gold answers, averaged (SQuAD v1.1)."""
  em, f1 = [], []
  for prediction, truths in zip(predicted, answers):
    truths = list(truths) or [""]
    em.append(max(float(normalize_answer(prediction) == normalize_answer(t)) for t in truths))
    f1.append(max(_token_f1(prediction, t) for t in truths))
  return {"exact_match": float(np.mean(em)) if em else 0.0,
          "f1": float(np.mean(f1)) if f1 else 0.0}


def compute_exact(gold: str, prediction: str) -> int:
  """evaluate-v2.0.py's exact match of one gold answer."""
  return int(normalize_answer(gold) == normalize_answer(prediction))


def compute_f1(gold: str, prediction: str) -> float:
  """evaluate-v2.0.py's token F1 of one gold answer: unlike v1.1, two empty answers agree (1),
  which is how a correct "no answer" scores."""
  gold_tokens = normalize_answer(gold).split()
  predicted_tokens = normalize_answer(prediction).split()
  if not gold_tokens or not predicted_tokens:
    return float(gold_tokens == predicted_tokens)
  common = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
  if common == 0:
    return 0.0
  precision, recall = common / len(predicted_tokens), common / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def _raw_scores(predicted: Sequence[str],
                answers: Sequence[Sequence[str]]) -> tuple[list[float], list[float]]:
  """evaluate-v2.0.py's get_raw_scores: per question the max over its gold answers that do
  not normalise to "" ([""] when none is left: a question without an answer)."""
  exact, f1 = [], []
  for prediction, truths in zip(predicted, answers):
    golds = [t for t in truths if normalize_answer(t)] or [""]
    exact.append(max(compute_exact(g, prediction) for g in golds))
    f1.append(max(compute_f1(g, prediction) for g in golds))
  return exact, f1


def _apply_no_ans_threshold(scores: Sequence[float], na_probs: Sequence[float],
                            has_answer: Sequence[bool], na_prob_thresh: float) -> list[float]:
  """evaluate-v2.0.py's: a question whose na_prob exceeds the threshold counts as answered ""
  (1 if it has no answer, else 0), whatever its prediction."""
  return [float(not has) if na_prob > na_prob_thresh else score
          for score, na_prob, has in zip(scores, na_probs, has_answer)]


def _mean(values: Sequence[float]) -> float:
  return sum(values) / len(values) if values else 0.0


def find_best_thresh(predicted: Sequence[str], scores: Sequence[float],
                     na_probs: Sequence[float], has_answer: Sequence[bool]) -> tuple[float, float]:
  """evaluate-v2.0.py's find_best_thresh -> (best score as a fraction, its na_prob threshold):
  from every question answered "" (the unanswerable ones right), questions turn to their
  prediction in increasing na_prob (ties in question order); the first best total wins."""
  current = best = sum(not has for has in has_answer)
  best_thresh = 0.0
  for i in sorted(range(len(na_probs)), key=lambda i: na_probs[i]):
    if has_answer[i]:
      diff = scores[i]
    else:
      diff = -1 if predicted[i] else 0
    current += diff
    if current > best:
      best, best_thresh = current, na_probs[i]
  return (best / len(scores) if scores else 0.0), best_thresh


def squad_v2_scores(predicted: Sequence[str], answers: Sequence[Sequence[str]],
                    na_probs: Sequence[float], na_prob_thresh: float = 1.0) -> dict[str, float]:
  """The official evaluate-v2.0.py run with an na_prob file (`na_probs`: one value per
  question, here run_squad's null score differences) and --na-prob-thresh, its scores as
  fractions in [0, 1] where it prints percentages, and "exact_match" for its "exact" (the v1.1
  name). A question has an answer when its `answers` list is not empty (make_qid_to_has_ans).
  HasAns_* / NoAns_* are left out, as there, when no question is of that kind."""
  has_answer = [bool(truths) for truths in answers]
  exact_raw, f1_raw = _raw_scores(predicted, answers)
  exact = _apply_no_ans_threshold(exact_raw, na_probs, has_answer, na_prob_thresh)
  f1 = _apply_no_ans_threshold(f1_raw, na_probs, has_answer, na_prob_thresh)
  result = {"exact_match": _mean(exact), "f1": _mean(f1)}
  for prefix, kind in (("HasAns", True), ("NoAns", False)):
    ids = [i for i, has in enumerate(has_answer) if has == kind]
    if ids:
      result.update({f"{prefix}_exact": _mean([exact[i] for i in ids]),
                     f"{prefix}_f1": _mean([f1[i] for i in ids]), f"{prefix}_total": len(ids)})
  result["best_exact"], result["best_exact_thresh"] = find_best_thresh(
      predicted, exact_raw, na_probs, has_answer)
  result["best_f1"], result["best_f1_thresh"] = find_best_thresh(
      predicted, f1_raw, na_probs, has_answer)
  return result


# --------------------------------------------------------------------------------- task


@dataclasses.dataclass(frozen=True)
class QASettings(FinetuneSettings):
  max_query_length: int  # Pieces of a question kept.
  doc_stride: int  # Pieces between the starts of a passage's windows.
  max_answer_length: int  # Longest predicted answer, in pieces.
  # SQuAD 2.0: questions without an answer train to [CLS]; prediction may answer "".
  version_2_with_negative: bool = False
  # Answer "" when the null score exceeds the best span's score by more than this.
  null_score_diff_threshold: float = 0.0

  @classmethod
  def config_values(cls, config) -> dict[str, Any]:
    data = config.data
    return {**super().config_values(config), "max_query_length": data.max_query_length,
            "doc_stride": data.doc_stride, "max_answer_length": data.max_answer_length,
            "version_2_with_negative": bool(data.version_2_with_negative),
            "null_score_diff_threshold": float(data.null_score_diff_threshold)}

  @classmethod
  def from_meta(cls, meta: dict[str, Any]) -> "QASettings":
    # Checkpoints from before SQuAD 2.0 record neither field: they are v1.1 models.
    return super().from_meta({"version_2_with_negative": False,
                              "null_score_diff_threshold": 0.0, **meta})


@dataclasses.dataclass(frozen=True)
class QATask(FinetuneTask):
  """Start/end logits over passage windows; one answer per question."""
  settings: QASettings

  name = "qa"
  settings_class = QASettings
  predict_mode = "qa"
  text_b = "required"  # The passage.
  input_names = ("input_ids", "token_type_ids", "attention_mask", "context_mask")
  target_signature = {"start_positions": ((), jnp.int32), "end_positions": ((), jnp.int32),
                      "answer_weight": ((), jnp.float32)}
  hf_task = "ForQuestionAnswering"
  hf_labels = ("start", "end")  # The two outputs per token: start and end logits.

  @property
  def model(self) -> BertForQuestionAnswering:
    return BertForQuestionAnswering(self.model_config, self.settings.head_dropout_prob,
                                    self.settings.head)

  def outputs(self, raw) -> dict[str, jax.Array]:
    return {"start_logits": raw[0], "end_logits": raw[1]}

  def _terms(self, raw, batch) -> jax.Array:
    start_logits, end_logits = raw
    return 0.5 * (nll(start_logits, batch["start_positions"])
                  + nll(end_logits, batch["end_positions"]))  # [B]

  def _weights(self, batch) -> jax.Array:
    return batch["answer_weight"].astype(jnp.float32)  # [B]; 0: no gold answer.

  @classmethod
  def labels_from(cls, records: Sequence[Record], config) -> list[str]:
    del records, config
    return []

  def encode(self, records: Sequence[Record], vocab: Vocab, with_labels: bool = True,
             is_training: bool = False) -> QAData:
    """Every question's windows as rows (see the module docstring); a training question whose
    answer covers no piece is left out (counted in num_dropped), as run_squad skips it."""
    rows, examples, truncated, dropped, split, impossible = _Rows(), [], 0, 0, 0, 0
    for record in records:
      question, context = finetune_data.field(record, "text"), finetune_data.field(record, "text_b")
      question_ids = vocab.encode(question)
      truncated += len(question_ids) > self.settings.max_query_length
      question_ids = question_ids[:self.settings.max_query_length]
      context_ids, spans = _passage_pieces(vocab, context)
      answer, gold = None, []
      if with_labels:
        answer, gold = self._gold(record, context, spans, is_training)
        impossible += not gold
        if is_training and answer is None:
          dropped += 1  # Nothing to point at (run_squad skips it too).
          continue
      examples.append({"line": record[1], "context": context, "answers": gold,
                       "piece_spans": np.asarray(spans, np.int32).reshape(-1, 2)})  # [P, 2]
      split += self._add_windows(rows, record, len(examples) - 1, vocab, question_ids,
                                 context_ids, answer if with_labels else False) > 1
    if not examples:
      raise ValueError(f"{records[0][0]}: no usable QA examples (every answer is blank)")
    arrays = {name: np.stack(value) if name in self.input_names else
              np.asarray(value, np.float32 if name == "answer_weight" else np.int32)
              for name, value in rows.columns.items()}
    return QAData(records[0][0], arrays, examples, truncated, dropped, rows.windows, split,
                  num_impossible=impossible)

  def _gold(self, record: Record, context: str, spans: Sequence[tuple[int, int]],
            is_training: bool) -> tuple[tuple[int, int] | None, list[str]]:
    """-> (target pieces: the first answer's (first, last), IMPOSSIBLE for a SQuAD 2.0 question
    without an answer, None when the answer covers no piece or (v1.1 eval) there is none; the
    gold answer texts, [] for a question without an answer)."""
    answers = finetune_data.field(record, "answers", list)
    if self.settings.version_2_with_negative and is_impossible(record, answers):
      return IMPOSSIBLE, []
    if is_training and not answers:
      raise ValueError(f"{finetune_data.where(record)}: a training example needs an answer "
                       "(its 'answers' is empty); for SQuAD 2.0 questions without one set "
                       "config.data.version_2_with_negative=True")
    return _answer_pieces(record, context, spans, answers), [a["text"] for a in answers]

  def _add_windows(self, rows: _Rows, record: Record, example: int, vocab: Vocab,
                   question_ids: list[int], context_ids: list[int],
                   answer: tuple[int, int] | None | bool) -> int:
    """Appends the rows of one question's windows; `answer` False: no targets (prediction).
    -> the number of windows."""
    length = self.settings.max_seq_length
    max_tokens_for_doc = length - len(question_ids) - 3  # [CLS], [SEP], [SEP].
    if max_tokens_for_doc <= 0:
      raise ValueError(f"{finetune_data.where(record)}: max_seq_length={length} leaves no room "
                       f"for the passage after a {len(question_ids)}-piece question")
    spans = doc_spans(len(context_ids), max_tokens_for_doc, self.settings.doc_stride)
    best_window = max_context_windows(spans, len(context_ids))  # [P]
    offset = len(question_ids) + 2
    for window_index, (doc_start, doc_length) in enumerate(spans):
      ids = [vocab.cls_id, *question_ids, vocab.sep_id,
             *context_ids[doc_start:doc_start + doc_length], vocab.sep_id]
      row = {name: np.zeros((length,), np.int32) for name in self.input_names}
      row["input_ids"][:] = ids + [vocab.pad_id] * (length - len(ids))
      row["token_type_ids"][offset:len(ids)] = 1
      row["attention_mask"][:len(ids)] = 1
      row["context_mask"][offset:offset + doc_length] = 1
      for name, value in row.items():
        rows.columns[name].append(value)
      rows.windows.append(Window(example, doc_start, doc_length, offset,
                                 best_window[doc_start:doc_start + doc_length] == window_index))
      if answer is not False:
        self._add_targets(rows, answer, doc_start, doc_length, offset)
    return len(spans)

  @staticmethod
  def _add_targets(rows: _Rows, answer: tuple[int, int] | None, doc_start: int, doc_length: int,
                   offset: int) -> None:
    """run_squad's is_training targets: the answer's pieces when the window holds all of them,
    else [CLS] (position 0; the head leaves it unmasked for this), in every window for an
    IMPOSSIBLE answer. Eval rows get the same targets, so the validation loss measures what
    training minimises."""
    inside = answer is not None and answer[0] >= doc_start and \
        answer[1] < doc_start + doc_length
    rows.columns["start_positions"].append(offset + answer[0] - doc_start if inside else 0)
    rows.columns["end_positions"].append(offset + answer[1] - doc_start if inside else 0)
    # 0: no gold answer to point at (an unanswered eval record).
    rows.columns["answer_weight"].append(0.0 if answer is None else 1.0)

  def truncation_note(self, record: Record, vocab: Vocab) -> str | None:
    """Questions are cut at max_query_length (passages are read whole, in windows)."""
    pieces = len(vocab.encode(finetune_data.field(record, "text")))
    if pieces <= self.settings.max_query_length:
      return None
    return (f"the question has {pieces} pieces; the model reads the first "
            f"{self.settings.max_query_length} (max_query_length)")

  def predictions(self, outputs: dict[str, np.ndarray], data: QAData) -> list[dict[str, Any]]:
    """One {"answer", "start", "end", "score"} per question of `data` (start, end: characters
    of its passage; "" and -1 when no window has a valid span), over all of its windows: each
    window's best valid span (`best_span`, starts where the piece has its maximum context),
    the best of them by score (an earlier window wins a tie). With version_2_with_negative also
    "null_score" and "score_diff" (null - best span score; +inf without a span), and the
    answer is "" (start, end -1; "score" still the best span's) when score_diff >
    null_score_diff_threshold, as run_squad's write_predictions."""
    best = self._best_spans(outputs, data)
    if not self.settings.version_2_with_negative:
      return [self._answer(example, found) for example, found in zip(data.examples, best)]
    null = null_scores(outputs["start_logits"], outputs["end_logits"],
                       [window.example for window in data.windows], len(data.examples))
    return [self._answer_or_null(example, found, float(score))
            for example, found, score in zip(data.examples, best, null)]

  def _best_spans(self, outputs: dict[str, np.ndarray], data: QAData) -> list[Span | None]:
    """Per question its best valid span over its windows, None when no window has one."""
    best: list[Span | None] = [None] * len(data.examples)
    context_mask = data.arrays["context_mask"]  # [N, L]
    for row, window in enumerate(data.windows):
      max_context = np.zeros(context_mask.shape[1], bool)  # [L]
      max_context[window.offset:window.offset + window.doc_length] = window.max_context
      start, end, score = best_span(outputs["start_logits"][row], outputs["end_logits"][row],
                                    context_mask[row], self.settings.max_answer_length,
                                    max_context)
      current = best[window.example]
      if start >= 0 and (current is None or score > current.score):
        # Row positions -> passage pieces of the question.
        best[window.example] = Span(score, window.doc_start + start - window.offset,
                                    window.doc_start + end - window.offset,
                                    float(outputs["start_logits"][row][start]),
                                    float(outputs["end_logits"][row][end]))
    return best

  def _answer_or_null(self, example: dict[str, Any], found: Span | None,
                      null_score: float) -> dict[str, Any]:
    """run_squad's version_2_with_negative choice. Its n-best list always holds the null entry,
    so the best non-null entry is the best span (n_best_size >= 2); without any span it has
    none and run_squad fails (None.start_logit): here the difference is +inf and the answer
    "", whatever the threshold."""
    if found is None:
      best_score, score_diff = float("-inf"), float("inf")
    else:  # run_squad's order of operations, so that a threshold equal to it compares alike.
      best_score, score_diff = found.score, null_score - found.start_logit - found.end_logit
    abstain = score_diff > self.settings.null_score_diff_threshold
    return {**self._answer(example, None if abstain else found), "score": best_score,
            "null_score": null_score, "score_diff": score_diff}

  @staticmethod
  def _answer(example: dict[str, Any], found: Span | None) -> dict[str, Any]:
    if found is None:
      return {"answer": "", "start": -1, "end": -1, "score": float("-inf")}
    score, first, last = found.score, found.first, found.last
    char_start = int(example["piece_spans"][first][0])
    char_end = int(example["piece_spans"][last][1])
    return {"answer": example["context"][char_start:char_end], "start": char_start,
            "end": char_end, "score": score}

  def score(self, predicted: list[dict[str, Any]], data: QAData) -> dict[str, float]:
    """SQuAD v1.1's exact_match and f1; with version_2_with_negative the official v2.0
    evaluation with the score differences as na_probs, thresholded where the predictions
    were (so exact_match and f1 score the answers given; at the official default of 1.0 they
    would override spans of differences in (1, threshold] when the threshold is above 1)."""
    texts, answers = [p["answer"] for p in predicted], [e["answers"] for e in data.examples]
    if not self.settings.version_2_with_negative:
      return squad_scores(texts, answers)
    return squad_v2_scores(texts, answers, [p["score_diff"] for p in predicted],
                           self.settings.null_score_diff_threshold)

  def scores(self, outputs, sums, data: QAData):
    scores = super().scores(outputs, sums, data)
    scores.counts["windows"] = len(data)  # Model rows: a question's passage may take several.
    for name in ("HasAns_total", "NoAns_total"):  # SQuAD 2.0's question counts, not metrics.
      if name in scores.metrics:
        scores.counts[name] = scores.metrics.pop(name)
    return scores

  def main_metric(self) -> str:
    return "f1"

  def metric_names(self) -> list[str]:
    names = super().metric_names()
    if names is None or not self.settings.version_2_with_negative:
      return names
    # squad_v2_scores names these only when the questions include that kind.
    return sorted({*names, "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"})

  def describe(self, split: str, data: QAData) -> str:
    line = (f"{split}: {len(data.examples)} questions from {data.source} in {len(data)} windows "
            f"of max_seq_length={self.settings.max_seq_length} (doc_stride "
            f"{self.settings.doc_stride}); {data.num_split} passages took several windows; "
            f"{data.num_truncated} questions cut to "
            f"max_query_length={self.settings.max_query_length}")
    if data.num_impossible:
      line += f"; {data.num_impossible} without an answer"
    if data.num_dropped:
      line += f"; {data.num_dropped} examples dropped: their answer covers no piece"
    return line
