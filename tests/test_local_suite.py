"""The offline downstream suite (bert_jax/data/local_suite.py): the same bytes on every build,
train and validation apart, balanced labels, sizes that fine-tune in minutes, and files that the
real task encoders read (with a sentencepiece vocabulary trained here on the suite's text)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from bert_jax import tasks
from bert_jax.data import finetune as finetune_data
from bert_jax.data import local_suite
from bert_jax.data.vocab import Vocab, train_sentencepiece
from bert_jax.models.model import BertConfig
from configs import finetune_classification, finetune_qa, finetune_tagging

CONFIGS = {"classification": finetune_classification, "tagging": finetune_tagging,
           "qa": finetune_qa}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """Two builds of the suite in two directories."""
  first, second = tmp_path_factory.mktemp("suite_a"), tmp_path_factory.mktemp("suite_b")
  return local_suite.build(str(first)), local_suite.build(str(second)), first, second


@pytest.fixture(scope="module")
def suite(built):
  return built[0]


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def vocab(suite, tmp_path_factory):
  texts = []
  for task in suite:
    for row in _rows(task.train_file):
      texts += [row["text"]] + ([row["text_b"]] if "text_b" in row else [])
  prefix = str(tmp_path_factory.mktemp("vocab") / "sp")
  train_sentencepiece(texts, prefix, 8000, allow_smaller_vocab=True)  # The built-in size.
  return Vocab.load(prefix + ".model")


def test_build_is_deterministic(built):
  tasks_a, tasks_b, first, second = built
  names = sorted(os.listdir(first))
  assert names == sorted(os.listdir(second))
  for task_a, task_b in zip(tasks_a, tasks_b):
    assert dataclasses.replace(task_a, train_file="", validation_file="") == \
        dataclasses.replace(task_b, train_file="", validation_file="")
    for path_a, path_b in ((task_a.train_file, task_b.train_file),
                           (task_a.validation_file, task_b.validation_file)):
      with open(path_a, "rb") as a, open(path_b, "rb") as b:
        assert a.read() == b.read(), path_a
  with open(first / local_suite.SUMMARY_FILE, "rb") as a, \
       open(second / local_suite.SUMMARY_FILE, "rb") as b:
    assert a.read() == b.read()


def test_a_build_never_replaces_what_it_did_not_write(built, tmp_path):
  """The red team's data loss: `--suite=local_retrieval --output_dir=DIR` replaced the user's
  DIR/data/train.jsonl. A suite builds into an empty directory, or over its own earlier build
  (its suite.json there), and otherwise refuses in one line before writing anything."""
  from bert_jax.data import local_retrieval  # pylint: disable=import-outside-toplevel
  mine = tmp_path / "data"
  mine.mkdir()
  (mine / "train.jsonl").write_text('{"query": "mine", "positive": "keep me"}\n')
  with pytest.raises(ValueError, match=r"data/train.jsonl exists and \S+ is not a directory the "
                                       r"local_retrieval suite built \(no suite.json of it\)"):
    local_retrieval.build(str(mine))
  assert os.listdir(mine) == ["train.jsonl"]
  assert (mine / "train.jsonl").read_text() == '{"query": "mine", "positive": "keep me"}\n'
  (tmp_path / "local" / "code_tags").mkdir(parents=True)
  with pytest.raises(ValueError, match=r"local/code_tags exists and \S+ is not a directory the "
                                       r"local suite built"):
    local_suite.build(str(tmp_path / "local"))
  _, _, first, _ = built
  local_suite.claim_suite_dir(str(first), ["code_tags", local_suite.SUMMARY_FILE], "local")


def test_suite_has_a_single_text_a_pair_and_a_token_task(suite):
  assert len(suite) >= 3 and len({t.name for t in suite}) == len(suite)
  kinds = set()
  for task in suite:
    assert task.task in tasks.FINETUNE_TASKS
    first = _rows(task.train_file)[0]
    kinds.add("pair" if "text_b" in first and task.task == "classification" else
              "single" if task.task == "classification" else "token")
  assert kinds == {"single", "pair", "token"}


def test_no_text_is_shared_between_train_and_validation(suite):
  for task in suite:
    train, validation = _rows(task.train_file), _rows(task.validation_file)
    # A pair's first text is a parameter's entry line ("axis : int, optional"), common to many
    # functions by design; its description is the text that must not be seen in training.
    field = "text_b" if "text_b" in train[0] and task.task == "classification" else "text"
    seen = {row[field].lower() for row in train}
    assert not [row[field] for row in validation if row[field].lower() in seen], task.name


def test_split_is_by_file():
  counts = {f"pkg/module_{i}.py": 10 + i % 7 for i in range(200)}
  held_out = local_suite.validation_files(counts, 0.2)
  assert held_out == local_suite.validation_files(dict(reversed(counts.items())), 0.2)
  share = sum(counts[p] for p in held_out) / sum(counts.values())
  assert 0.2 <= share < 0.25
  # One file larger than the target never becomes the whole validation split.
  assert "big.py" not in local_suite.validation_files({"big.py": 5000, **counts}, 0.2)


def test_labels_are_balanced_and_sizes_fit_a_few_minutes(suite):
  for task in suite:
    train, validation = _rows(task.train_file), _rows(task.validation_file)
    assert 1000 <= len(train) <= 3000 and 300 <= len(validation) <= 1000, task.name
    counts = local_suite.label_counts(validation)
    if task.task == "classification":
      majority = max(counts.values()) / sum(counts.values())
      assert majority <= 1 / len(counts) + 0.05, (task.name, counts)
      assert task.chance == pytest.approx(majority)
      assert local_suite.label_counts(train).keys() == counts.keys()
    else:  # Code words are a minority, but not a rare one.
      assert 0.05 <= counts["CODE"] / sum(counts.values()) <= 0.5
      assert task.chance == 0.0


def _task(local_task, records):
  config = CONFIGS[local_task.task].get_config()
  config.data.max_seq_length = local_task.max_seq_length
  task_class = tasks.finetune_task(local_task.task)
  labels = task_class.labels_from(records, config)
  return task_class(BertConfig(), task_class.settings_class.from_config(config, labels,
                                                                         BertConfig()))


def test_files_encode_with_the_real_tasks_and_score_on_the_metric(suite, vocab):
  for local_task in suite:
    train = finetune_data.read_records(local_task.train_file)
    validation = finetune_data.read_records(local_task.validation_file)
    task = _task(local_task, train)
    assert task.main_metric() == local_task.metric
    train_data = task.encode(train, vocab, is_training=True)
    data = task.encode(validation, vocab)
    assert len(train_data.examples) == len(train) and len(data.examples) == len(validation)
    for name in task.input_names:
      assert data.arrays[name].shape == (len(data), local_task.max_seq_length)
    assert data.num_truncated <= 0.01 * len(validation), local_task.name
    # Gold outputs score 1.0 on the main metric (words cut off by max_seq_length are tagged
    # "O": a hair less), and the majority prediction scores `chance`.
    if local_task.task == "classification":
      labels = data.arrays["labels"]  # [N]
      gold = np.eye(len(task.settings.labels), dtype=np.float32)[labels]
      majority = np.bincount(labels).argmax()
      constant = np.zeros_like(gold)
      constant[:, majority] = 1.0
    else:
      gold = np.eye(len(task.settings.labels), dtype=np.float32)[data.arrays["labels"]]
      constant = np.zeros_like(gold)
      constant[..., task.settings.labels.index("O")] = 1.0
    perfect = 1.0 if data.num_truncated == 0 else pytest.approx(1.0, abs=0.01)
    for logits, expected in ((gold, perfect), (constant, pytest.approx(local_task.chance))):
      scores = task.score(task.predictions({"logits": logits}, data), data)
      assert scores[local_task.metric] == expected, local_task.name


@pytest.mark.parametrize("raw, text, code", [
    ("Use ``axis=None`` with :func:`~numpy.sum` here.", "Use axis=None with numpy.sum here.",
     ["axis=None", "numpy.sum"]),
    ("If `x` is given, see `the guide <https://x.org>`_ for more.",
     "If x is given, see the guide for more.", ["x"]),
    ("The value :math:`x^2` is returned.", None, None),
    ("A stray ` backtick.", None, None),
])
def test_markup_marks_code(raw, text, code):
  sentence = local_suite.parse_markup(raw)
  if text is None:
    assert sentence is None
  else:
    assert sentence.text == text
    assert [sentence.text[s:e] for s, e in sentence.code] == code


def test_tags_mark_the_words_of_code_spans():
  sentence = local_suite.parse_markup("Pass ``a, b`` or `x`, not y.")
  assert sentence.words() == [("Pass", False), ("a,", True), ("b", True), ("or", False),
                              ("x,", True), ("not", False), ("y.", False)]
