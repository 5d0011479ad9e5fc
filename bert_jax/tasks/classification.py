"""Sequence classification (and regression) on the pooled vector, as BERT's GLUE setup (HF's
BertForSequenceClassification: the tanh pooler on [CLS]) or HF's
ModernBertForSequenceClassification (its prediction head on the [CLS] or mean vector).

Records: `text`, optional `text_b`, `label` (a string or int label; a number for regression).
Scores: accuracy and F1 (binary F1 of the second label for two classes, macro F1 otherwise);
MSE and Pearson for regression. Shapes: B batch, L sequence length, H hidden, C labels.
"""

import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import finetune as finetune_data
from bert_jax.data.encoding import encode_pair
from bert_jax.data.finetune import Record, TaskData
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.tasks.finetuning import (CLASSIFIER, FinetuneSettings, FinetuneTask, f1_from_counts,
                                       head_dense, head_features, nll)


class BertForSequenceClassification(nn.Module):
  """[CLS] A [SEP] (B [SEP]) -> logits [B, C] f32 (C = 1: a regression score); `head` "bert" or
  "modernbert" (`finetuning.head_features`)."""
  config: BertConfig
  num_labels: int
  dropout_prob: float = 0.1
  head: str = "bert"

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool = True):
    pooled = head_features(self.config, self.head, input_ids, token_type_ids, attention_mask,
                           deterministic, pooled=True)  # [B, H]
    pooled = nn.Dropout(self.dropout_prob)(pooled, deterministic=deterministic)
    return head_dense(self.config, self.num_labels, CLASSIFIER)(pooled).astype(jnp.float32)


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
    f1s.append(f1_from_counts(tp, fp, fn))
  scores["f1"] = f1s[1] if num_labels == 2 else float(np.mean(f1s))
  return scores


def regression_scores(predicted: Sequence[float], gold: Sequence[float]) -> dict[str, float]:
  predicted, gold = np.asarray(predicted, np.float64), np.asarray(gold, np.float64)
  scores = {"mse": float(np.mean((predicted - gold) ** 2))}
  both_vary = predicted.std() > 0 and gold.std() > 0
  scores["pearson"] = float(np.corrcoef(predicted, gold)[0, 1]) if both_vary else 0.0
  return scores


@dataclasses.dataclass(frozen=True)
class ClassificationSettings(FinetuneSettings):
  regression: bool  # One float output ("score") trained with MSE, instead of labels.

  @classmethod
  def config_values(cls, config) -> dict[str, Any]:
    return {**super().config_values(config), "regression": bool(config.data.regression)}


@dataclasses.dataclass(frozen=True)
class ClassificationTask(FinetuneTask):
  """Classification with cross-entropy, or regression (one output, MSE)."""
  settings: ClassificationSettings

  name = "classification"
  settings_class = ClassificationSettings
  predict_mode = "classify"
  target_signature = {"labels": ((), jnp.int32)}
  hf_task = "ForSequenceClassification"
  pretrained_heads_read = ("pooler",)  # BERT's classifier reads the pooled [CLS].

  @property
  def model(self) -> BertForSequenceClassification:
    return BertForSequenceClassification(self.model_config, self.num_outputs,
                                         self.settings.head_dropout_prob, self.settings.head)

  def batch_signature(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    signature = super().batch_signature()
    if self.settings.regression:
      signature["labels"] = ((), jnp.float32)
    return signature

  def describe_labels(self) -> str | None:
    return None if self.settings.regression else super().describe_labels()

  def hf_problem_type(self) -> str:
    return "regression" if self.settings.regression else "single_label_classification"

  def _terms(self, raw, batch) -> jax.Array:
    if self.settings.regression:
      return jnp.square(raw[:, 0] - batch["labels"].astype(jnp.float32))  # [B]
    return nll(raw, batch["labels"])  # [B]

  @classmethod
  def labels_from(cls, records: Sequence[Record], config) -> list[str]:
    if config.data.regression:
      return ["score"]
    return finetune_data.label_set(
        records, config.data.labels, lambda r: [finetune_data.field(r, "label", (str, int))])

  def encode(self, records: Sequence[Record], vocab: Vocab, with_labels: bool = True,
             is_training: bool = False) -> TaskData:
    """[CLS] text [SEP] (text_b [SEP]), longest-first truncation (counted), labels."""
    del is_training
    length = self.settings.max_seq_length
    texts = [(finetune_data.field(r, "text"), finetune_data.text_b(r)) for r in records]
    # Lengths first (batched), to count what encode_pair's truncation shortens.
    lengths_a = [len(ids) for ids in vocab.encode_batch([a for a, _ in texts])]
    lengths_b = [len(ids) for ids in vocab.encode_batch([b or "" for _, b in texts])]
    truncated = sum(a + b + (3 if text_b else 2) > length
                    for a, b, (_, text_b) in zip(lengths_a, lengths_b, texts))
    rows = [encode_pair(vocab, text, text_b, length) for text, text_b in texts]
    arrays = {name: np.stack([row[name] for row in rows]) for name in self.input_names}
    examples = [{"line": record[1]} for record in records]
    if with_labels:
      gold = [self._label(record) for record in records]
      for example, label in zip(examples, gold):
        example["label"] = label
      arrays["labels"] = np.asarray(gold, np.float32 if self.settings.regression else np.int32)
    return TaskData(records[0][0], arrays, examples, truncated)

  def _label(self, record: Record) -> int | float:
    value = finetune_data.field(record, "label", (str, int, float))
    if not self.settings.regression:
      return finetune_data.label_index(record, value, self.settings.labels)
    try:
      score = float(value)
    except ValueError as e:
      raise ValueError(f"{finetune_data.where(record)}: regression label {value!r} is not a "
                       "number") from e
    if not math.isfinite(score):  # NaN would show only as a non-finite loss, much later.
      raise ValueError(f"{finetune_data.where(record)}: regression label {value!r} is not a "
                       "finite number")
    return score

  def predictions(self, outputs: dict[str, np.ndarray], data: TaskData) -> list[dict[str, Any]]:
    """{"label", "label_index", "probabilities"} per example; {"score"} for regression."""
    logits = outputs["logits"]  # [N, C]
    if self.settings.regression:
      return [{"score": float(x)} for x in logits[:, 0]]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    labels = self.settings.labels
    return [{"label": labels[int(np.argmax(row))], "label_index": int(np.argmax(row)),
             "probabilities": {name: float(p) for name, p in zip(labels, row)}}
            for row in probs]

  def score(self, predicted: list[dict[str, Any]], data: TaskData) -> dict[str, float]:
    gold = [e["label"] for e in data.examples]
    if self.settings.regression:
      return regression_scores([p["score"] for p in predicted], gold)
    return classification_scores([p["label_index"] for p in predicted], gold,
                                 len(self.settings.labels))

  def main_metric(self) -> str:
    return "pearson" if self.settings.regression else "accuracy"
