"""HuggingFace task models (BertForSequenceClassification, ModernBertForTokenClassification, ...):
their head's parameters and config.json fields <-> a `params.TaskHead`.

A task model's state dict is the encoder's (`bert.*` for BERT, `model.*` for ModernBERT) plus
its head's. The head's names are bert_jax's own (the fine-tuning heads are named as HF's, see
`tasks/finetuning.py`), so one rule converts any of them: `a.b.weight` of a Linear ([out, in])
is `a/b/kernel` ([in, out]), of a LayerNorm (one dimension) `a/b/scale`; `a.b.bias` is
`a/b/bias`. config.json names the class (`architectures`), the outputs (`id2label`,
`label2id`), regression (`problem_type`) and the dropout before the classifier
(`classifier_dropout`).
"""

from typing import Any, Mapping

import numpy as np

from bert_jax.weights.params import TaskHead, flatten, unflatten

# HF classes whose parameters are an encoder and pretraining heads only; any other class of a
# family is a task model (the encoder plus a task head).
PRETRAINING_ARCHITECTURES = {
    "bert": ("BertModel", "BertForPreTraining", "BertForMaskedLM",
             "BertForNextSentencePrediction"),
    "modernbert": ("ModernBertModel", "ModernBertForMaskedLM")}
# Where the encoder's parameters sit in a task model's state dict.
ENCODER_PREFIXES = {"bert": "bert.", "modernbert": "model."}


def task_architecture(hf_config: Mapping[str, Any], family: str) -> str | None:
  """The task model class config.json names (`architectures`), None for a pretraining class
  or none named."""
  names = hf_config.get("architectures") or []
  name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None
  return None if name is None or name in PRETRAINING_ARCHITECTURES[family] else name


def _labels(hf_config: Mapping[str, Any], source: str) -> tuple[str, ...]:
  """id2label's names in index order (keys "0" .. "n-1")."""
  id2label = hf_config.get("id2label") or {}
  try:
    names = {int(k): v for k, v in id2label.items()}
  except (AttributeError, TypeError, ValueError):
    names = None
  if names is None or sorted(names) != list(range(len(names))) or not all(
      isinstance(v, str) for v in names.values()):
    raise ValueError(f"{source}: id2label must map 0 .. n-1 to label names, got "
                     f"{str(id2label)[:80]}")
  return tuple(names[i] for i in range(len(names)))


def split_state(state: Mapping[str, np.ndarray], hf_config: Mapping[str, Any], family: str,
                source: str) -> tuple[dict[str, np.ndarray], TaskHead | None]:
  """(the encoder's part of a state dict, the task head of a task model or None)."""
  architecture = task_architecture(hf_config, family)
  if architecture is None:
    return dict(state), None
  prefix = ENCODER_PREFIXES[family]
  encoder = {k: v for k, v in state.items() if k.startswith(prefix)}
  head_state = {k: v for k, v in state.items() if not k.startswith(prefix)}
  head = TaskHead(architecture, _labels(hf_config, source), hf_config.get("problem_type"),
                  params_from_state(head_state, source), hf_config.get("classifier_dropout"))
  return encoder, head


def params_from_state(state: Mapping[str, np.ndarray], source: str) -> dict:
  """A head's HF state dict -> its bert_jax params tree (float32 numpy)."""
  flat = {}
  for key, value in state.items():
    *path, leaf = key.split(".")
    value = np.asarray(value, np.float32)
    if leaf == "weight" and value.ndim in (1, 2):
      leaf, value = ("scale", value) if value.ndim == 1 else ("kernel", value.T)
    elif leaf != "bias" or value.ndim != 1 or not path:
      raise ValueError(f"{source}: {key} {tuple(value.shape)} is no Linear or LayerNorm "
                       "parameter of a task head")
    flat[(*path, leaf)] = np.ascontiguousarray(value)
  return unflatten(flat)


def state_from_params(params: Mapping) -> dict[str, np.ndarray]:
  """A head's params tree -> HF's state dict names and layouts (the inverse)."""
  state = {}
  for path, value in flatten(params).items():
    value = np.asarray(value, np.float32)
    name = {"kernel": "weight", "scale": "weight"}.get(path[-1], path[-1])
    state[".".join((*path[:-1], name))] = np.ascontiguousarray(
        value.T if path[-1] == "kernel" else value)
  return state


def config_fields(head: TaskHead) -> dict[str, Any]:
  """The config.json fields of a task model with `head`."""
  fields = {"architectures": [head.architecture],
            "id2label": {str(i): label for i, label in enumerate(head.labels)},
            "label2id": {label: i for i, label in enumerate(head.labels)},
            "classifier_dropout": head.dropout}
  if head.problem_type is not None:
    fields["problem_type"] = head.problem_type
  return fields
