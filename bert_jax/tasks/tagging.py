"""Token tagging (e.g. BIO named entities), as BERT's NER setup: a label per whitespace word,
predicted and trained at the word's first piece (the other pieces weigh 0).

Records: `text`, `tags` (one per word). Scores: token accuracy and micro token F1 (tags other
than "O"); for BIO tag sets, seqeval-style entity precision / recall / F1.
"""

import dataclasses
import re
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import finetune as finetune_data
from bert_jax.data.finetune import Record, TaskData
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.tasks.finetuning import (CLASSIFIER, FinetuneTask, f1_from_counts, head_dense,
                                       head_features, nll)


class BertForTokenClassification(nn.Module):
  """Tokens -> per-position logits [B, L, C] f32 (HF's BertForTokenClassification, or with
  `head` "modernbert" ModernBertForTokenClassification). No pooler: it would get no gradient."""
  config: BertConfig
  num_labels: int
  dropout_prob: float = 0.1
  head: str = "bert"

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool = True):
    sequence = head_features(self.config, self.head, input_ids, token_type_ids, attention_mask,
                             deterministic, pooled=False)  # [B, L, H]
    sequence = nn.Dropout(self.dropout_prob)(sequence, deterministic=deterministic)
    return head_dense(self.config, self.num_labels, CLASSIFIER)(sequence).astype(jnp.float32)


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
  scores["token_f1"] = f1_from_counts(tp, fp, fn)
  if is_bio(labels):
    tp = fp = fn = 0
    for ps, gs in zip(predicted, gold):
      p, g = entities(ps), entities(gs)
      tp, fp, fn = tp + len(p & g), fp + len(p - g), fn + len(g - p)
    scores["entity_precision"] = tp / (tp + fp) if tp + fp else 0.0
    scores["entity_recall"] = tp / (tp + fn) if tp + fn else 0.0
    scores["entity_f1"] = f1_from_counts(tp, fp, fn)
  return scores


def _tags_of(record: Record) -> list:
  """The record's `tags`: a list (JSON), or in a CSV cell a space-separated string."""
  tags = finetune_data.field(record, "tags", (list, str))
  return tags.split() if isinstance(tags, str) else tags


@dataclasses.dataclass(frozen=True)
class TaggingTask(FinetuneTask):
  """A label per word, at its first piece."""

  name = "tagging"
  predict_mode = "tag"
  text_b = "unused"
  target_signature = {"labels": (("L",), jnp.int32), "label_weights": (("L",), jnp.float32)}
  hf_task = "ForTokenClassification"

  @property
  def model(self) -> BertForTokenClassification:
    return BertForTokenClassification(self.model_config, self.num_outputs,
                                      self.settings.head_dropout_prob, self.settings.head)

  def _terms(self, raw, batch) -> jax.Array:
    return nll(raw, batch["labels"])  # [B, L]

  def _weights(self, batch) -> jax.Array:
    return batch["label_weights"].astype(jnp.float32)  # [B, L]: 1 at first pieces.

  @classmethod
  def labels_from(cls, records: Sequence[Record], config) -> list[str]:
    return finetune_data.label_set(records, config.data.labels, _tags_of)

  def encode(self, records: Sequence[Record], vocab: Vocab, with_labels: bool = True,
             is_training: bool = False) -> TaskData:
    """[CLS] pieces of the words [SEP], cut at max_seq_length (counted); each word's label at
    its first piece (words cut off keep no piece and are predicted as "O")."""
    del is_training
    length, n = self.settings.max_seq_length, len(records)
    arrays = {name: np.zeros((n, length), np.int32) for name in
              ("input_ids", "token_type_ids", "attention_mask", "labels")}
    arrays["label_weights"] = np.zeros((n, length), np.float32)
    examples, truncated = [], 0
    for row, record in enumerate(records):
      words = finetune_data.field(record, "text").split()
      tags = self._tags(record, words) if with_labels else None
      pieces = vocab.encode_batch(words) if words else []
      ids, word_positions = self._row_ids(vocab, pieces)
      truncated += sum(len(p) for p in pieces) + 2 > length
      arrays["input_ids"][row] = ids + [vocab.pad_id] * (length - len(ids))
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

  def _tags(self, record: Record, words: list[str]) -> list[int]:
    tags = _tags_of(record)
    if len(tags) != len(words):
      raise ValueError(f"{finetune_data.where(record)}: {len(tags)} tags for {len(words)} words "
                       "(one tag per whitespace-separated word of 'text')")
    return [finetune_data.label_index(record, t, self.settings.labels) for t in tags]

  def _row_ids(self, vocab: Vocab, pieces: list[list[int]]) -> tuple[list[int], list[int]]:
    """-> ([CLS] pieces... [SEP] cut to the row, position of each word's first piece or -1)."""
    ids, word_positions = [vocab.cls_id], []
    for word_pieces in pieces:
      room = self.settings.max_seq_length - 1 - len(ids)
      word_positions.append(len(ids) if word_pieces and room > 0 else -1)
      ids.extend(word_pieces[:max(room, 0)])
    return ids + [vocab.sep_id], word_positions

  def truncation_note(self, record: Record, vocab: Vocab) -> str | None:
    words = finetune_data.field(record, "text").split()
    pieces = sum(len(p) for p in vocab.encode_batch(words)) + 2 if words else 2
    length, labels = self.settings.max_seq_length, self.settings.labels
    if pieces <= length:
      return None
    outside = "O" if "O" in labels else (labels or ("O",))[0]  # What `predictions` gives them.
    return (f"the text has {pieces} pieces with [CLS] and [SEP]; the model reads the first "
            f"{length} (max_seq_length); the words past them are tagged {outside}")

  def predictions(self, outputs: dict[str, np.ndarray], data: TaskData) -> list[dict[str, Any]]:
    """{"words", "tags"} per example, a tag per word."""
    labels = self.settings.labels
    best = np.argmax(outputs["logits"], axis=-1)  # [N, L]
    outside = "O" if "O" in labels else labels[0]
    return [{"words": example["words"],
             "tags": [labels[int(best[row, p])] if p >= 0 else outside
                      for p in example["word_positions"]]}
            for row, example in enumerate(data.examples)]

  def score(self, predicted: list[dict[str, Any]], data: TaskData) -> dict[str, float]:
    labels = self.settings.labels
    gold = [[labels[t] for t in e["tags"]] for e in data.examples]
    return tagging_scores([p["tags"] for p in predicted], gold, labels)

  def main_metric(self) -> str:
    return "entity_f1" if is_bio(self.settings.labels) else "token_f1"
