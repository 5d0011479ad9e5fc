"""Fine-tuned models leave with their heads: `convert.py --from_bert_jax=WORKDIR --to_hf=OUT` of
a fine-tuning workdir writes HF's task model (BertForSequenceClassification for classification
and regression, BertForTokenClassification, BertForQuestionAnswering; the ModernBertFor* ones
in tests/test_interop_modern.py through `check_export`), which transformers' AutoModelFor...
loads from the directory with logits equal to `predict.outputs`' and the label names in
config.json; `--encoder_only` writes the encoder alone; `config.init_from` of such a directory
takes the head when the task and labels match (its rows reordered to this run's labels), and
only the encoder, with a warning, when they do not.

BERT runs fine-tune a tiny encoder from scratch for 2 steps (tests/test_finetune.py's data):
the parity is of the computation, not of what it learnt.
"""

import json
import os
import random
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import finetune, predict, tasks
from bert_jax.weights import hf_export
from bert_jax.training import resume
from bert_jax.data import finetune as finetune_data
from configs import finetune_classification, finetune_qa, finetune_tagging
from tests import test_finetune as ft
from tests.suite_flags import xla_flags
from tests import forked_launch

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 1e-5  # Max abs logit difference, float32.
AUTO_MODELS = {"classification": transformers.AutoModelForSequenceClassification,
               "tagging": transformers.AutoModelForTokenClassification,
               "qa": transformers.AutoModelForQuestionAnswering}


def _regression_rows(n, rng):
  """Texts scored by how many sentiment words they hold, as numbers."""
  rows = []
  for row in ft._keyword_rows(n, rng):  # pylint: disable=protected-access
    rows.append({"text": row["text"], "label": 1.5 if row["label"] == "pos" else -0.5})
  return rows


# task -> (config module, record maker, config.data overrides)
BERT_TASKS = {
    "classification": (finetune_classification, ft._keyword_rows, {}),
    "regression": (finetune_classification, _regression_rows, {"regression": True}),
    "tagging": (finetune_tagging, ft._tagging_rows, {}),
    "qa": (finetune_qa, lambda n, rng: ft._qa_rows(n, rng, max_filler=14), {}),
}
ARCHITECTURES = {"classification": "BertForSequenceClassification",
                 "regression": "BertForSequenceClassification",
                 "tagging": "BertForTokenClassification", "qa": "BertForQuestionAnswering"}


def check_export(workdir: str, exported: str, records: list[dict]) -> float:
  """Exports a fine-tuned workdir (unless `exported` holds its export already), loads it with
  AutoModelFor... from the directory and checks its logits against `predict.outputs` on
  `records` (QA: at the passage and [CLS], what bert_jax's decoding reads; it masks the rest),
  the label names and their decoding; -> the max abs logit difference."""
  finetuned = predict.load_finetuned(workdir)
  task = finetuned.task
  if not os.path.isdir(exported):
    assert hf_export.export(workdir, exported) == task.hf_architecture
  model = AUTO_MODELS[task.name].from_pretrained(exported).eval()
  assert type(model).__name__ == task.hf_architecture
  labels = tuple(task.settings.labels) or task.hf_labels
  assert model.config.id2label == dict(enumerate(labels))
  assert model.config.label2id == {label: i for i, label in enumerate(labels)}
  data, ours = predict.outputs(finetuned, records, batch_size=8)
  inputs = {name: torch.tensor(data.arrays[name], dtype=torch.long)
            for name in ("input_ids", "token_type_ids", "attention_mask")}
  if task.settings.head == "modernbert":
    del inputs["token_type_ids"]  # ModernBERT has none.
  with torch.no_grad():
    output = model(**inputs)
  real = data.arrays["attention_mask"].astype(bool)  # [N, L]
  if task.name == "qa":
    read = real & ((data.arrays["context_mask"] > 0) | (np.arange(real.shape[1]) == 0))
    errors = [np.abs(ours[k] - getattr(output, k).numpy())[read].max()
              for k in ("start_logits", "end_logits")]
  elif task.name == "tagging":
    errors = [np.abs(ours["logits"] - output.logits.numpy())[real].max()]
  else:
    errors = [np.abs(ours["logits"] - output.logits.numpy()).max()]
    if not task.settings.regression:  # HF's argmax names the labels predict gives.
      names = [model.config.id2label[int(i)] for i in output.logits.argmax(-1)]
      assert names == [p["label"] for p in task.predictions(ours, data)]
    assert model.config.problem_type == task.hf_problem_type()
  return float(max(errors))


def bert_workdir(tmp_path, name: str, steps: int = 2) -> str:
  """A tiny BERT fine-tuned from scratch on task `name` of BERT_TASKS for `steps` steps."""
  module, rows, data = BERT_TASKS[name]
  vocab = ft._task_vocab(tmp_path)  # pylint: disable=protected-access
  config = ft.finetune_config(module, tmp_path, rows, steps, vocab=vocab, seq_len=32,
                              n_train=16, n_validation=8)
  config.data.update(data)
  config.train.update(batch_size=8, eval_batch_size=8, eval_every_steps=steps,
                      log_every_steps=steps)
  workdir = str(tmp_path / "run")
  finetune.finetune_and_evaluate(config, workdir)
  return workdir


def _records(name: str, n: int = 6) -> list[dict]:
  rows = BERT_TASKS[name][1](n, random.Random(5))
  return [{k: v for k, v in row.items() if k in ("text", "text_b")} for row in rows]


def _run_convert(*args) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(1)}
  return forked_launch.run([sys.executable, os.path.join(ROOT, "launch", "convert.py"), *args],
                        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
  """(workdir, its HF export through the launcher) of a fine-tuned BERT classifier."""
  directory = tmp_path_factory.mktemp("classifier")
  workdir = bert_workdir(directory, "classification")
  exported = str(directory / "hf")
  result = _run_convert(f"--from_bert_jax={workdir}", f"--to_hf={exported}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Wrote BertForSequenceClassification to {exported}" in result.stdout
  return workdir, exported


@pytest.mark.parametrize("name", list(BERT_TASKS))
def test_a_fine_tuned_bert_exports_as_hf_task_model_with_equal_logits(classifier, tmp_path,
                                                                      name):
  if name == "classification":
    workdir, exported = classifier  # Written by the launcher.
  else:
    workdir, exported = bert_workdir(tmp_path, name), str(tmp_path / "hf")
  error = check_export(workdir, exported, _records(name))
  print(f"\n{name}: max abs logit error {error:.1e}")
  assert error <= TOLERANCE
  with open(os.path.join(exported, "config.json")) as f:
    assert json.load(f)["architectures"] == [ARCHITECTURES[name]]
  if name == "classification":  # The tokenizer: AutoTokenizer gives the rows' ids.
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    record = _records(name, 1)
    data, _ = predict.outputs(predict.load_finetuned(workdir), record)
    ids = tokenizer(record[0]["text"])["input_ids"]
    assert ids == data.arrays["input_ids"][0][:len(ids)].tolist()


def test_encoder_only_exports_the_encoder_as_before(classifier, tmp_path):
  workdir, _ = classifier
  exported = str(tmp_path / "encoder")
  result = _run_convert(f"--from_bert_jax={workdir}", f"--to_hf={exported}", "--encoder_only")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Wrote BertModel" in result.stdout
  assert "left out the fine-tuning head classifier" in result.stderr
  model, loading = transformers.BertModel.from_pretrained(exported, output_loading_info=True)
  assert not loading["missing_keys"] and not loading["unexpected_keys"], loading


def _init_config(tmp_path, init_from: str, labels=(), name="classification"):
  module, rows, data = BERT_TASKS[name]
  config = ft.finetune_config(module, tmp_path, rows, 1, init_from=init_from, seq_len=32,
                              n_train=16, n_validation=8)
  config.data.update(data, labels=tuple(labels))
  config.train.update(batch_size=8, eval_batch_size=8, learning_rate=1e-12)
  return config


def _run_task(config):
  """(the task a run of `config` trains, the encoder it loads)."""
  encoder = finetune.load_encoder(config)
  task_class = tasks.finetune_task(config.task)
  labels = task_class.labels_from(finetune_data.read_records(config.data.train_file), config)
  return task_class(encoder.config, task_class.settings_class.from_config(
      config, labels, encoder.config)), encoder


def test_init_from_a_task_export_takes_its_head_when_task_and_labels_match(classifier, tmp_path,
                                                                           caplog):
  """The same labels in the other order: the head is taken, its rows reordered, so the run
  starts from the exported model's logits with the columns swapped (nothing left fresh); other
  labels, regression or another task: the encoder only, with a warning naming why."""
  workdir, exported = classifier
  finetuned = predict.load_finetuned(workdir)
  assert finetuned.task.settings.labels == ("neg", "pos")
  task, encoder = _run_task(_init_config(tmp_path / "swapped", exported, labels=("pos", "neg")))
  initial = finetune._with_task_head(encoder, task)  # pylint: disable=protected-access
  shapes = jax.eval_shape(lambda: task.model.init(jax.random.key(0), *task.example_inputs()))
  params, fresh = resume.merge_initial(nn.meta.unbox(shapes["params"]),
                                       task.initial_params(initial), exported)
  assert fresh == []
  records = _records("classification")
  data, before = predict.outputs(finetuned, records)
  after = jax.jit(task.apply)(params, data.arrays, None)
  np.testing.assert_allclose(np.asarray(after), before["logits"][:, ::-1], atol=1e-5)

  expected = {"labels": "labels ['neg', 'pos'] are not this run's ['bad', 'good']",
              "regression": "its head is a classifier, this run trains a regression",
              "task": "is a BertForSequenceClassification, this run trains a "
                      "BertForTokenClassification"}
  for case, (labels, name) in {"labels": (("bad", "good"), "classification"),
                               "regression": ((), "regression"),
                               "task": ((), "tagging")}.items():
    caplog.clear()
    task, encoder = _run_task(_init_config(tmp_path / case, exported, labels, name))
    with caplog.at_level("WARNING"):
      initial = finetune._with_task_head(encoder, task)  # pylint: disable=protected-access
    assert expected[case] in caplog.text and "the head starts fresh" in caplog.text, case
    assert set(initial) == {"bert"} and "pooler" in initial["bert"], case
