"""The tasks of the downstream suites (`launch/downstream.py`, run by `bert_jax/downstream/suite.py`):
what each fine-tunes on, how it is set up and how it is scored.

- GLUE as in BERT's paper (Table 1): CoLA, SST-2, MRPC, QQP, STS-B, MNLI, QNLI, RTE from TFDS
  `glue/<task>` (fields and label names as TFDS has them: `finetune_data.read_tfds`), trained at
  max_seq_length 128 and scored on the dev sets (`validation`; MNLI: `validation_matched`, and
  `validation_mismatched` as a second evaluation of the same model) with the official metrics:
  CoLA Matthews correlation, MRPC / QQP F1 of the positive class and accuracy, STS-B Spearman
  and Pearson, accuracy for the others. WNLI is left out, as BERT did (its dev set is
  adversarial to any model that learns it; BERT predicted the majority class).
- SQuAD v1.1 / v2.0 (`squad/v1.1`, `squad/v2.0`: the qa task at max_seq_length 384, doc_stride
  128; v2.0 with `version_2_with_negative`), scored by the task itself (exact match and F1).
- The offline local suite (`bert_jax.data.local_suite`): its JSONL files, scored by the task.

Metrics are fractions in [0, 1], as the tasks' own scores.
"""

import dataclasses
from typing import Any, Sequence

import numpy as np

from bert_jax.data import finetune as finetune_data
from bert_jax.tasks.classification import classification_scores, regression_scores


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task of a suite. `metrics` are the score keys reported, the main one first (it picks
  the learning rate); an evaluation split's scores carry its suffix (MNLI: "accuracy_mm")."""
  name: str
  task: str  # config.task: "classification" | "tagging" | "qa".
  metrics: tuple[str, ...]
  max_seq_length: int
  tfds_name: str = ""  # "" for file tasks (train_file / validation_file).
  labels: tuple[str, ...] = ()  # Label names in TFDS's index order (positive class second).
  regression: bool = False
  # (score suffix, split) of each evaluation; the first is the trainer's validation split.
  eval_splits: tuple[tuple[str, str], ...] = (("", "validation"),)
  doc_stride: int = 128
  version_2_with_negative: bool = False
  train_file: str = ""
  validation_file: str = ""

  @property
  def scored_by_glue_metrics(self) -> bool:
    """GLUE tasks are scored here, from the predictions of the fine-tuned model (MCC and
    Spearman are not among the classification task's scores); the others by their task."""
    return self.tfds_name.startswith("glue/")

  @property
  def main_metric(self) -> str:
    return self.metrics[0]


def _glue(name: str, metrics: tuple[str, ...], labels: tuple[str, ...] = (),
          **fields: Any) -> TaskSpec:
  return TaskSpec(name, "classification", metrics, 128, f"glue/{name}", labels,
                  regression=not labels, **fields)


# BERT's order (Table 1). Label names as TFDS's glue builder defines them (a test checks).
GLUE = {spec.name: spec for spec in (
    _glue("mnli", ("accuracy_m", "accuracy_mm"), ("entailment", "neutral", "contradiction"),
          eval_splits=(("m", "validation_matched"), ("mm", "validation_mismatched"))),
    _glue("qqp", ("f1", "accuracy"), ("not_duplicate", "duplicate")),
    _glue("qnli", ("accuracy",), ("entailment", "not_entailment")),
    _glue("sst2", ("accuracy",), ("negative", "positive")),
    _glue("cola", ("mcc",), ("unacceptable", "acceptable")),
    _glue("stsb", ("spearman", "pearson")),
    _glue("mrpc", ("f1", "accuracy"), ("not_equivalent", "equivalent")),
    _glue("rte", ("accuracy",), ("entailment", "not_entailment")),
)}
GLUE_LEFT_OUT = ("wnli",)
# BERT's GLUE average: the mean of these nine numbers (Table 1's "Average": 79.6 for
# BERT-Base = the mean of its MNLI-m, MNLI-mm, QQP, QNLI, SST-2, CoLA, STS-B, MRPC, RTE).
GLUE_AVERAGE = (("mnli", "accuracy_m"), ("mnli", "accuracy_mm"), ("qqp", "f1"),
                ("qnli", "accuracy"), ("sst2", "accuracy"), ("cola", "mcc"),
                ("stsb", "spearman"), ("mrpc", "f1"), ("rte", "accuracy"))

SQUAD = {
    "squad1": TaskSpec("squad1", "qa", ("f1", "exact"), 384, "squad/v1.1"),
    "squad2": TaskSpec("squad2", "qa", ("f1", "exact", "HasAns_f1", "NoAns_f1", "best_f1"), 384,
                       "squad/v2.0", version_2_with_negative=True),
}
SUITES = ("glue", "squad1", "squad2", "local")
# How results.md names a score key (others: as they are).
METRIC_NAMES = {"accuracy": "acc", "accuracy_m": "acc (m)", "accuracy_mm": "acc (mm)",
                "f1": "F1", "mcc": "MCC", "spearman": "Spearman", "pearson": "Pearson",
                "exact": "EM", "HasAns_f1": "HasAns F1", "NoAns_f1": "NoAns F1",
                "best_f1": "best F1"}


def local_specs(output_dir: str) -> list[TaskSpec]:
  """The local suite's tasks, their files built (or found built) under `output_dir`."""
  from bert_jax.data import local_suite  # Reads installed docstrings: only when asked for.
  return [TaskSpec(t.name, t.task, (t.metric,), t.max_seq_length, train_file=t.train_file,
                   validation_file=t.validation_file) for t in local_suite.build(output_dir)]


def suite_specs(suite: str, output_dir: str) -> list[TaskSpec]:
  """Every task of `suite` (one of SUITES), in the order they run."""
  if suite == "glue":
    return list(GLUE.values())
  if suite in SQUAD:
    return [SQUAD[suite]]
  if suite == "local":
    return local_specs(output_dir)
  raise ValueError(f"unknown suite {suite!r}; one of {', '.join(SUITES)}")


def register_tfds_builders() -> None:
  """Registers the TFDS builders of the suites (`finetune.register_tfds_builder`: GLUE's is
  imported lazily), before the runner lists their sizes or the tests mock them."""
  for name in ("glue", "squad"):
    finetune_data.register_tfds_builder(name)


# ------------------------------------------------------------------------------ metrics


def matthews_corrcoef(predicted: Sequence[int], gold: Sequence[int]) -> float:
  """Matthews correlation (multi-class form, as scikit-learn's); 0.0 when undefined."""
  predicted, gold = np.asarray(predicted, np.int64), np.asarray(gold, np.int64)
  classes = np.union1d(predicted, gold)
  confusion = np.zeros((len(classes), len(classes)), np.float64)  # [gold, predicted]
  np.add.at(confusion, (np.searchsorted(classes, gold), np.searchsorted(classes, predicted)), 1)
  true_counts, predicted_counts = confusion.sum(1), confusion.sum(0)
  correct, total = np.trace(confusion), confusion.sum()
  covariance = correct * total - predicted_counts @ true_counts
  denominator = np.sqrt((total ** 2 - predicted_counts @ predicted_counts)
                        * (total ** 2 - true_counts @ true_counts))
  return float(covariance / denominator) if denominator > 0 else 0.0


def average_ranks(values: Sequence[float]) -> np.ndarray:
  """Ranks from 1, ties sharing their average rank (scipy.stats.rankdata's "average")."""
  values = np.asarray(values, np.float64)
  order = np.argsort(values, kind="stable")
  ordered = values[order]
  starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # First of each tie group.
  ends = np.r_[starts[1:], len(values)]
  group_rank = (starts + ends + 1) / 2.0  # Mean of ranks start+1 .. end.
  ranks = np.empty(len(values), np.float64)
  ranks[order] = np.repeat(group_rank, ends - starts)
  return ranks


def pearson(predicted: Sequence[float], gold: Sequence[float]) -> float:
  return regression_scores(predicted, gold)["pearson"]


def spearman(predicted: Sequence[float], gold: Sequence[float]) -> float:
  """Pearson correlation of the average ranks (0.0 when either side is constant)."""
  return pearson(average_ranks(predicted), average_ranks(gold))


def glue_scores(spec: TaskSpec, predicted: Sequence[Any], gold: Sequence[Any]) -> dict[str, float]:
  """Every official GLUE metric that applies: accuracy, F1 (binary: of the second label, the
  positive class; MNLI: macro) and MCC for classification (label indices); Pearson and
  Spearman for regression (scores)."""
  if spec.regression:
    return {"pearson": pearson(predicted, gold), "spearman": spearman(predicted, gold)}
  scores = classification_scores(predicted, gold, len(spec.labels))
  return {**scores, "mcc": matthews_corrcoef(predicted, gold)}
