"""Fine-tuning outputs -> predictions -> scores, on the host in numpy.

Predictions: a label per example, a tag per word (read at each word's first piece), an answer
span per question: as run_squad.py's `write_predictions`, the best start <= end by start + end
logit over all windows of the question, inside a window's passage, at most `max_answer_length`
pieces, the start only in the window where that piece has its maximum context; mapped back to
passage characters. Scores: accuracy and F1 (binary F1 of the second label for two classes,
macro F1 otherwise), MSE / Pearson for regression, token accuracy and F1 plus seqeval-style
entity F1 for BIO tags, SQuAD's exact match and F1 (once per question).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Sequence

import numpy as np

from bert_jax.finetune_data import TaskData

# ----------------------------------------------------------------------------- predictions


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


def qa_predictions(outputs: dict[str, np.ndarray], data: TaskData,
                   max_answer_length: int) -> list[dict[str, Any]]:
  """One {"answer", "start", "end", "score"} per question of `data` (start, end: characters of
  its passage; "" and -1 when no window has a valid span), over all of its windows: each
  window's best valid span (`best_span`, starts where the piece has its maximum context), the
  best of them by score (an earlier window wins a tie)."""
  best: list[tuple[float, int, int] | None] = [None] * len(data.examples)  # Score, pieces.
  context_mask = data.arrays["context_mask"]  # [N, L]
  for row, window in enumerate(data.windows):
    max_context = np.zeros(context_mask.shape[1], bool)  # [L]
    max_context[window.offset:window.offset + window.doc_length] = window.max_context
    start, end, score = best_span(outputs["start_logits"][row], outputs["end_logits"][row],
                                  context_mask[row], max_answer_length, max_context)
    current = best[window.example]
    if start >= 0 and (current is None or score > current[0]):
      # Row positions -> passage pieces of the question.
      best[window.example] = (score, window.doc_start + start - window.offset,
                              window.doc_start + end - window.offset)
  result = []
  for example, found in zip(data.examples, best):
    if found is None:
      result.append({"answer": "", "start": -1, "end": -1, "score": float("-inf")})
      continue
    score, first, last = found
    char_start = int(example["piece_spans"][first][0])
    char_end = int(example["piece_spans"][last][1])
    result.append({"answer": example["context"][char_start:char_end], "start": char_start,
                   "end": char_end, "score": score})
  return result


def predictions(task: str, outputs: dict[str, np.ndarray], data: TaskData,
                labels: Sequence[str], max_answer_length: int = 30) -> list[dict[str, Any]]:
  """Per example of `data` (`outputs` per row): {"label", "probabilities"} (classification;
  {"score"} for regression), {"tags"} one per word (tagging), {"answer", "start", "end",
  "score"} per question (qa, its windows merged; character offsets into text_b)."""
  result = []
  if task == "classification":
    logits = outputs["logits"]  # [N, C]
    if logits.shape[-1] == 1:
      return [{"score": float(x)} for x in logits[:, 0]]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for row in probs:
      result.append({"label": labels[int(np.argmax(row))], "label_index": int(np.argmax(row)),
                     "probabilities": {name: float(p) for name, p in zip(labels, row)}})
    return result
  if task == "tagging":
    best = np.argmax(outputs["logits"], axis=-1)  # [N, L]
    outside = "O" if "O" in labels else labels[0]
    for row, example in enumerate(data.examples):
      tags = [labels[int(best[row, p])] if p >= 0 else outside for p in example["word_positions"]]
      result.append({"words": example["words"], "tags": tags})
    return result
  if task == "qa":
    return qa_predictions(outputs, data, max_answer_length)
  raise ValueError(f"Unknown task {task!r}")


# ---------------------------------------------------------------------------- classification


def classification_scores(predicted: Sequence[int], gold: Sequence[int],
                          num_labels: int) -> dict[str, float]:
  """accuracy and f1: binary F1 of label 1 (the second label) for 2 classes, else macro F1."""
  predicted, gold = np.asarray(predicted), np.asarray(gold)
  scores = {"accuracy": float(np.mean(predicted == gold)) if len(gold) else 0.0}
  f1s = []
  for label in range(num_labels):
    tp = np.sum((predicted == label) & (gold == label))
    fp = np.sum((predicted == label) & (gold != label))
    fn = np.sum((predicted != label) & (gold == label))
    f1s.append(_f1(tp, fp, fn))
  scores["f1"] = f1s[1] if num_labels == 2 else float(np.mean(f1s))
  return scores


def regression_scores(predicted: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
  predicted, gold = np.asarray(predicted, np.float64), np.asarray(gold, np.float64)
  scores = {"mse": float(np.mean((predicted - gold) ** 2))}
  both_vary = predicted.std() > 0 and gold.std() > 0
  scores["pearson"] = float(np.corrcoef(predicted, gold)[0, 1]) if both_vary else 0.0
  return scores


def _f1(tp, fp, fn) -> float:
  denominator = 2 * tp + fp + fn
  return float(2 * tp / denominator) if denominator else 0.0


# ----------------------------------------------------------------------------------- tagging


def is_bio(labels: Sequence[str]) -> bool:
  """BIO (IOB2) tag set: every tag is O or B-/I- with a type."""
  return any(t != "O" for t in labels) and all(
      t == "O" or re.fullmatch(r"[BI]-.+", t) for t in labels)


def entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """(type, first word, last word) chunks of a BIO sequence, with seqeval's default (conlleval)
  rules: a chunk starts at B-, or at I- after O or after another type, and ends before O, B- or
  a type change."""
  chunks, start, kind = set(), None, None
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, _, tag_type = tag.partition("-")
    ends = start is not None and (prefix in ("O", "B") or tag_type != kind)
    if ends:
      chunks.add((kind, start, i - 1))
      start, kind = None, None
    if prefix == "B" or (prefix == "I" and start is None):
      start, kind = i, tag_type
  return chunks


def tagging_scores(predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]],
                   labels: Sequence[str]) -> dict[str, float]:
  """token_accuracy (every word), token_f1 (micro over tags other than "O"), and for BIO tags
  entity precision / recall / F1 (exact chunk matches, as seqeval)."""
  pairs = [(p, g) for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs)]
  scores = {"token_accuracy": float(np.mean([p == g for p, g in pairs])) if pairs else 0.0}
  tp = sum(p == g and g != "O" for p, g in pairs)
  fp = sum(p != "O" and p != g for p, g in pairs)
  fn = sum(g != "O" and p != g for p, g in pairs)
  scores["token_f1"] = _f1(tp, fp, fn)
  if is_bio(labels):
    tp = fp = fn = 0
    for ps, gs in zip(predicted, gold):
      p, g = entities(ps), entities(gs)
      tp, fp, fn = tp + len(p & g), fp + len(p - g), fn + len(g - p)
    scores["entity_precision"] = tp / (tp + fp) if tp + fp else 0.0
    scores["entity_recall"] = tp / (tp + fn) if tp + fn else 0.0
    scores["entity_f1"] = _f1(tp, fp, fn)
  return scores


# ---------------------------------------------------------------------------------------- QA


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


# ------------------------------------------------------------------------------ per task


def main_metric(task: str, labels: Sequence[str], regression: bool) -> str:
  """The metric that picks the best checkpoint."""
  if task == "classification":
    return "pearson" if regression else "accuracy"
  if task == "tagging":
    return "entity_f1" if is_bio(labels) else "token_f1"
  return "f1"


def score(task: str, predicted: list[dict[str, Any]], data: TaskData,
          labels: Sequence[str]) -> dict[str, float]:
  """The task's scores of `predictions(...)` against the gold labels in `data.examples` (QA:
  once per question, whatever its number of windows)."""
  if task == "classification":
    gold = [e["label"] for e in data.examples]
    if predicted and "score" in predicted[0]:
      return regression_scores([p["score"] for p in predicted], gold)
    return classification_scores([p["label_index"] for p in predicted], gold, len(labels))
  if task == "tagging":
    gold = [[labels[t] for t in e["tags"]] for e in data.examples]
    return tagging_scores([p["tags"] for p in predicted], gold, labels)
  return squad_scores([p["answer"] for p in predicted], [e["answers"] for e in data.examples])
