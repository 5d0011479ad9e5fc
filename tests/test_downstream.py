"""`launch/downstream.py` and `bert_jax/downstream/suite.py`: a GLUE suite end to end on TFDS's mock
data (real GLUE feature specs) with a tiny encoder, killed and restarted without redoing a
finished run; the official metrics against scikit-learn and scipy; the learning rate chosen by
the median over seeds and BERT's GLUE average; device groups; the recipe's configs; bad flags in
one line."""

import json
import os
import random
import signal
import subprocess
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
from absl import flags

from bert_jax import weights
from bert_jax.downstream import suite as downstream, tasks as suites
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig, BertModel
from configs import finetune_base
from tests import forked_launch
from tests.suite_flags import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "launch", "downstream.py")

# The launcher under `tfds.testing.mock_data` (no download): examples drawn from the real
# builders' feature specs. mock_data gives scalar features as 0-d arrays where a prepared
# ArrayRecord dataset gives Python scalars; the wrapper gives scalars, as the real data does.
MOCKED = """
import runpy, sys
import numpy as np
import tensorflow_datasets as tfds

class Scalars:
  def __init__(self, source):
    self.source, self.dataset_info = source, source.dataset_info
  def __len__(self):
    return len(self.source)
  def __getitem__(self, i):
    return {k: v.item() if isinstance(v, np.ndarray) and v.ndim == 0 else v
            for k, v in self.source[i].items()}

sys.argv = sys.argv[1:]
with tfds.testing.mock_data(num_examples=64, policy=tfds.testing.MockPolicy.USE_CODE):
  mocked = tfds.data_source
  tfds.data_source = lambda *args, **kwargs: Scalars(mocked(*args, **kwargs))
  runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _command(*args, mocked: bool = False) -> list[str]:
  return [sys.executable, *(["-c", MOCKED] if mocked else []), LAUNCHER, *args]


def _env() -> dict[str, str]:
  return dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
  """A tiny random encoder as a bert_jax pretrained directory, its WordPiece vocabulary the
  letters of mock_data's text (a-j) as words and continuations."""
  directory = tmp_path_factory.mktemp("encoder")
  letters = "abcdefghij"
  with open(directory / "vocab.txt", "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters,
                       *("##" + c for c in letters)]) + "\n")
  vocab = Vocab.load(str(directory / "vocab.txt"))
  config = BertConfig(vocab_size=vocab.size, hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = nn.unbox(BertModel(config, add_pooling_layer=True).init(
      jax.random.key(0), ids, ids, jnp.ones_like(ids))["params"])
  return weights.save_pretrained(str(directory / "pretrained"), {"bert": params}, config, vocab)


def _local_downloads(tmp_path, monkeypatch):
  """TFDS's download step answered with local files in the layout of GLUE's SST-2 zip and
  SQuAD v1.1's JSON: the builders' own code then prepares them (no network)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  sst2 = tmp_path / "downloads" / "SST-2"
  sst2.mkdir(parents=True)
  for split, rows in (("train", ["a b c\t1", "d e\t0", "f g h\t1"]), ("dev", ["b c\t0"])):
    (sst2 / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
  (sst2 / "test.tsv").write_text("index\tsentence\n0\ta b\n")
  context = "bob paid the bill ."
  squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
      {"id": "q1", "question": "who paid ?", "answers": [{"text": "bob", "answer_start": 0}]}]}]}]}
  for name in ("train", "dev"):
    (tmp_path / "downloads" / f"{name}-v1.1.json").write_text(json.dumps(squad))

  def download_and_extract(self, resources):
    del self
    if isinstance(resources, dict):  # SQuAD: {"train": url, "dev": url}.
      return {k: str(tmp_path / "downloads" / f"{k}-v1.1.json") for k in resources}
    return str(tmp_path / "downloads")  # A GLUE task's zip, extracted.
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                      download_and_extract)


def test_the_suites_tfds_builders_prepare_with_the_requirements_installed(tmp_path,
                                                                          monkeypatch):
  """launch/downstream.py --suite=glue from a requirements.txt install ended in an 86-line
  ModuleNotFoundError (importlib_resources, #37): GLUE's and SQuAD's real TFDS builders
  prepare here (requirements-downstream.txt), and a missing module is one line naming it."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from bert_jax.data import finetune as finetune_data  # pylint: disable=import-outside-toplevel
  _local_downloads(tmp_path, monkeypatch)
  data_dir = str(tmp_path / "tfds")
  train = finetune_data.read_tfds("glue/sst2", "train", data_dir)
  assert sorted((r[2]["text"], r[2]["label"]) for r in train) == [
      ("a b c", "positive"), ("d e", "negative"), ("f g h", "positive")]
  (question,) = finetune_data.read_tfds("squad/v1.1", "validation", data_dir)
  assert question[2]["text"] == "who paid ?" and question[2]["answers"] == [
      {"text": "bob", "answer_start": 0}]

  def missing(*args, **kwargs):
    raise ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources")
  monkeypatch.setattr(tfds, "data_source", missing)
  with pytest.raises(ValueError, match=r"^TFDS dataset 'glue/cola' needs the module "
                                       r"'importlib_resources', which is not installed: pip "
                                       r"install -r requirements-downstream.txt$"):
    finetune_data.read_tfds("glue/cola", "train", data_dir)


# ------------------------------------------------------------------------------ end to end


def test_glue_suite_runs_tabulates_and_resumes_after_a_kill(encoder, tmp_path):
  output = tmp_path / "glue"
  args = _command(f"--checkpoint={encoder}", "--suite=glue", "--tasks=mrpc,stsb,mnli",
                  "--learning_rates=1e-3", "--seeds=1", f"--output_dir={output}",
                  "--config.data.max_seq_length=32", "--config.logging.tensorboard=false",
                  mocked=True)
  # Killed hard once the second run has started: the first one is finished by then.
  process = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
  seen = ""
  for line in process.stdout:
    seen += line
    if line.startswith("[2/3] stsb"):
      break
  process.kill()
  process.wait()
  assert "[2/3] stsb lr 0.001 seed 0: fine-tuning" in seen, seen[-3000:]
  first = output / "runs" / "mrpc" / "lr0.001_seed0"
  stamps = {name: os.stat(first / name).st_mtime_ns
            for name in ("final_eval.json", downstream.SCORES_FILE, "metrics.jsonl")}

  resumed = forked_launch.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True,
                           timeout=300)
  assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
  assert f"[1/3] mrpc lr 0.001 seed 0: finished already ({first})" in resumed.stdout
  assert "[2/3] stsb lr 0.001 seed 0: fine-tuning" in resumed.stdout
  assert {name: os.stat(first / name).st_mtime_ns for name in stamps} == stamps

  # Other settings in the same --output_dir: refused in one line before anything runs (the
  # finished runs would otherwise be tabulated as this command's).
  recorded = json.load(open(first / downstream.SETTINGS_FILE))
  assert recorded["train.num_train_epochs"] == 3.0 and recorded["init_from"] == encoder
  changed = forked_launch.run(args + ["--config.train.num_train_epochs=2"], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=300)
  assert changed.returncode == 1, (changed.stdout + changed.stderr)[-3000:]
  assert changed.stderr.strip().splitlines()[-1] == (
      f"error: --output_dir={output} holds runs made with other settings (mrpc lr0.001_seed0: "
      "train.num_train_epochs=3.0 there, 2.0 now); give another --output_dir, or remove "
      f"{first} to redo that run")
  assert {name: os.stat(first / name).st_mtime_ns for name in stamps} == stamps

  results = json.load(open(output / downstream.RESULTS_JSON))
  assert list(results["tasks"]) == ["mrpc", "stsb", "mnli"]
  for task, metrics in (("mrpc", ["f1", "accuracy"]), ("stsb", ["spearman", "pearson"]),
                        ("mnli", ["accuracy_m", "accuracy_mm"])):
    summary = results["tasks"][task]
    run = summary["runs"]["0.001"]["0"]
    assert summary["metrics"] == metrics and summary["chosen_lr"] == 1e-3
    assert summary["seeds"] == 1 and run["steps"] == 6  # int(64 / 32 x 3 epochs).
    assert run["workdir"] == str(output / "runs" / task / "lr0.001_seed0")
    assert summary["median"] == {m: run["scores"][m] for m in metrics}
    # The dev split scored from the best export agrees with the trainer's own evaluation.
    best = json.load(open(os.path.join(run["workdir"], "final_eval.json")))["best"]
    trainer_metric, ours = ("pearson", "pearson") if task == "stsb" else (
        "accuracy", "accuracy_m" if task == "mnli" else "accuracy")
    assert run["scores"][ours] == pytest.approx(best[trainer_metric], abs=1e-5)
  assert "mcc" in results["tasks"]["mrpc"]["runs"]["0.001"]["0"]["scores"]
  average = results["glue_average"]
  assert not average["complete"] and average["left_out"] == ["wnli"]
  parts = [results["tasks"][t]["median"][m] for t, m in (
      ("mnli", "accuracy_m"), ("mnli", "accuracy_mm"), ("stsb", "spearman"), ("mrpc", "f1"))]
  assert average["value"] == pytest.approx(np.mean(parts))

  table = open(output / downstream.RESULTS_MD).read()
  mrpc = results["tasks"]["mrpc"]["median"]
  assert (f"| mrpc | F1 / acc | 0.001 | {100 * mrpc['f1']:.1f} / {100 * mrpc['accuracy']:.1f} "
          "| 1 |") in table
  assert "| mnli | acc (m) / acc (mm) | 0.001 |" in table
  assert "| stsb | Spearman / Pearson | 0.001 |" in table
  assert f"GLUE average: {100 * average['value']:.1f}" in table
  assert "Left out: WNLI, as BERT did." in table


# --------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("seed", range(4))
def test_glue_metrics_match_scikit_learn_and_scipy(seed):
  rng = np.random.default_rng(seed)
  for num_labels in (2, 3):
    spec = suites.GLUE["mrpc" if num_labels == 2 else "mnli"]
    gold = rng.integers(0, num_labels, 200)
    # Predictions right 60% of the time, random otherwise.
    predicted = np.where(rng.random(200) < 0.6, gold, rng.integers(0, num_labels, 200))
    scores = suites.glue_scores(spec, predicted, gold)
    assert scores["mcc"] == pytest.approx(sklearn.metrics.matthews_corrcoef(gold, predicted))
    assert scores["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(gold, predicted))
    average = "binary" if num_labels == 2 else "macro"
    assert scores["f1"] == pytest.approx(sklearn.metrics.f1_score(gold, predicted,
                                                                  average=average))
  # Degenerate: one class predicted (MCC undefined -> 0.0, as scikit-learn).
  gold = rng.integers(0, 2, 50)
  assert suites.matthews_corrcoef(np.zeros(50, int), gold) == sklearn.metrics.matthews_corrcoef(
      gold, np.zeros(50, int)) == 0.0

  gold = rng.normal(size=300)
  for predicted in (gold + rng.normal(size=300), np.round(gold * 2) / 2):  # ties: rounded
    gold_with_ties = np.round(gold, 1)
    scores = suites.glue_scores(suites.GLUE["stsb"], predicted, gold_with_ties)
    assert scores["pearson"] == pytest.approx(scipy.stats.pearsonr(predicted,
                                                                   gold_with_ties)[0])
    assert scores["spearman"] == pytest.approx(scipy.stats.spearmanr(predicted,
                                                                     gold_with_ties)[0])
  values = rng.integers(0, 5, 40).astype(float)
  np.testing.assert_allclose(suites.average_ranks(values), scipy.stats.rankdata(values))


def test_glue_labels_and_splits_are_those_of_tfds():
  suites.register_tfds_builders()
  from tensorflow_datasets.text import glue  # pylint: disable=g-import-not-at-top
  configs = {config.name: config for config in glue.Glue.BUILDER_CONFIGS}
  for name, spec in suites.GLUE.items():
    assert tuple(configs[name].label_classes or ()) == spec.labels, name
    assert spec.regression == (name == "stsb")
  assert set(suites.GLUE) == set(configs) - {"wnli", "ax", "mnli_matched", "mnli_mismatched"}


# --------------------------------------------------------------------------- the table


def _records(task, scores_by_lr):
  return {downstream.Run(task, lr, seed): {"scores": scores, "steps": 10, "workdir": "w"}
          for lr, per_seed in scores_by_lr.items() for seed, scores in enumerate(per_seed)}


def test_the_learning_rate_is_chosen_by_the_median_over_seeds():
  # 3e-5 has the best single run and the best mean, 2e-5 the best median.
  records = _records("mrpc", {
      2e-5: [{"f1": 0.80, "accuracy": 0.70}, {"f1": 0.81, "accuracy": 0.74},
             {"f1": 0.79, "accuracy": 0.72}],
      3e-5: [{"f1": 0.99, "accuracy": 0.99}, {"f1": 0.40, "accuracy": 0.50},
             {"f1": 0.78, "accuracy": 0.60}]})
  results = downstream.summarize("glue", "ckpt", [suites.GLUE["mrpc"]], records,
                                 [2e-5, 3e-5], 3)
  mrpc = results["tasks"]["mrpc"]
  assert mrpc["chosen_lr"] == 2e-5 and mrpc["seeds"] == 3
  assert mrpc["median"] == {"f1": 0.80, "accuracy": 0.72}  # Each metric's own median.
  assert mrpc["median_main_by_lr"] == {"2e-05": 0.80, "3e-05": 0.78}
  assert mrpc["runs"]["3e-05"]["1"]["scores"]["f1"] == 0.40
  assert downstream.choose_learning_rate({1e-5: [0.5, 0.5], 2e-5: [0.5, 0.5]}) == 1e-5


def test_the_glue_average_is_berts():
  # BERT-Base's Table 1 scores give its average, 79.6 (WNLI left out).
  paper = {("mnli", "accuracy_m"): 84.6, ("mnli", "accuracy_mm"): 83.4, ("qqp", "f1"): 71.2,
           ("qnli", "accuracy"): 90.5, ("sst2", "accuracy"): 93.5, ("cola", "mcc"): 52.1,
           ("stsb", "spearman"): 85.8, ("mrpc", "f1"): 88.9, ("rte", "accuracy"): 66.4}
  records = {}
  for spec in suites.GLUE.values():
    scores = {m: paper.get((spec.name, m), 50.0) / 100 for m in spec.metrics}
    records.update(_records(spec.name, {2e-5: [scores]}))
  results = downstream.summarize("glue", "ckpt", list(suites.GLUE.values()), records, [2e-5], 1)
  assert results["glue_average"]["complete"]
  assert round(100 * results["glue_average"]["value"], 1) == 79.6
  table = downstream.markdown(results)
  assert "GLUE average: 79.6" in table and "partial" not in table
  assert "| cola | MCC | 2e-05 | 52.1 | 1 | 2e-05: 52.1 |" in table


# ------------------------------------------------------------------------ devices, plan


def test_devices_split_into_groups_and_runs_spread_longest_first():
  assert downstream.device_groups(8, 0) == [tuple(range(8))]
  assert downstream.device_groups(8, 2) == [(0, 1), (2, 3), (4, 5), (6, 7)]
  assert downstream.device_groups(4, 1) == [(0,), (1,), (2,), (3,)]
  for bad in (3, 16):
    with pytest.raises(ValueError, match=f"--devices_per_run={bad} does not divide the 8"):
      downstream.device_groups(8, bad)
  # MNLI-like runs (cost 100) and RTE-like ones (cost 1): the long ones first, one per group.
  costs = [100, 100, 100, 1, 1, 1, 1, 1, 1]
  shares = downstream.assign_runs(costs, 3)
  assert sorted(i for share in shares for i in share) == list(range(len(costs)))
  assert [sum(costs[i] for i in share) for share in shares] == [102, 102, 102]
  assert all(share == sorted(share) for share in shares)  # Plan order within a group.
  assert downstream.assign_runs([5, 4, 3, 3, 3], 2) == [[0, 3], [1, 2, 4]]  # 8 vs 10.
  assert downstream.assign_runs([1, 1], 4) == [[0], [1], [], []]

  base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --other", "PATH": "/bin"}
  assert downstream.group_env("gpu", (2, 3), 1, base)["CUDA_VISIBLE_DEVICES"] == "2,3"
  tpu = downstream.group_env("tpu", (3,), 3, base)
  assert (tpu["TPU_VISIBLE_CHIPS"], tpu["TPU_CHIPS_PER_PROCESS_BOUNDS"],
          tpu["TPU_PROCESS_BOUNDS"], tpu["TPU_PROCESS_PORT"]) == ("3", "1,1,1", "1,1,1", "8479")
  cpu = downstream.group_env("cpu", (0, 1), 0, base)
  assert cpu["XLA_FLAGS"] == "--other --xla_force_host_platform_device_count=2"
  assert cpu["PATH"] == "/bin" and base["XLA_FLAGS"].startswith("--xla_force")


def test_runs_get_the_recipe_and_the_overrides_win(monkeypatch, tmp_path):
  specs = [suites.GLUE["mnli"], suites.SQUAD["squad2"]]
  runs = downstream.plan(specs, [2e-5, 3e-5], 2)
  assert [(r.task, r.learning_rate, r.seed) for r in runs[:3]] == [
      ("mnli", 2e-5, 0), ("mnli", 2e-5, 1), ("mnli", 3e-5, 0)]
  assert runs[-1].workdir("/out") == "/out/runs/squad2/lr3e-05_seed1"
  base = finetune_base.get_config()
  mnli = downstream.run_config(base, {"train.num_train_epochs": 1.0}, specs[0], runs[1], "/ckpt")
  assert (mnli.seed, mnli.task, mnli.init_from, mnli.train.learning_rate) == (
      1, "classification", "/ckpt", 2e-5)
  assert (mnli.data.tfds_name, mnli.data.tfds_validation_split, mnli.data.max_seq_length,
          tuple(mnli.data.labels)) == ("glue/mnli", "validation_matched", 128,
                                       ("entailment", "neutral", "contradiction"))
  assert (mnli.train.batch_size, mnli.train.num_train_steps, mnli.train.num_train_epochs,
          mnli.train.warmup_proportion, mnli.train.eval_every_steps) == (32, 0, 1.0, 0.1, 0)
  squad = downstream.run_config(base, {"data.max_seq_length": 256}, specs[1], runs[-1], "/c")
  assert (squad.task, squad.data.tfds_name, squad.data.version_2_with_negative,
          squad.data.max_seq_length, squad.data.doc_stride) == ("qa", "squad/v2.0", True, 256, 128)
  assert base.seed == finetune_base.get_config().seed  # The base is left as it was.

  # The local suite: its tasks and files from bert_jax.data.local_suite.build.
  built = []

  def build(output_dir):
    built.append(output_dir)
    return [types.SimpleNamespace(name="code_tags", task="tagging", train_file="t.jsonl",
                                  validation_file="v.jsonl", metric="token_f1",
                                  max_seq_length=64, chance=0.5)]
  from bert_jax.data import local_suite
  monkeypatch.setattr(local_suite, "build", build)
  options = downstream.Options("/ckpt", "local", (), (1e-4,), 1, str(tmp_path))
  (spec,) = downstream.select_tasks(options)
  assert built == [str(tmp_path / "data" / "local")]
  config = downstream.run_config(base, {}, spec, downstream.Run("code_tags", 1e-4, 0), "/ckpt")
  assert (config.task, config.data.train_file, config.data.validation_file,
          config.data.tfds_name, config.data.max_seq_length, spec.metrics) == (
              "tagging", "t.jsonl", "v.jsonl", "", 64, ("token_f1",))
  with pytest.raises(ValueError, match="--tasks=nope: nope not in --suite=local"):
    downstream.select_tasks(downstream.Options("/c", "local", ("nope",), (1e-4,), 1, "/o"))


def test_runs_made_with_other_settings_are_refused_and_where_they_run_is_not(tmp_path):
  spec, run = suites.GLUE["mrpc"], downstream.Run("mrpc", 2e-5, 0)
  base = finetune_base.get_config()
  config = downstream.run_config(base, {}, spec, run, "/ckpt")
  run_dir = run.workdir(str(tmp_path))
  downstream.check_settings([run], {run: config}, str(tmp_path))  # Nothing recorded yet.
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, downstream.SETTINGS_FILE), "w") as f:
    json.dump(downstream.run_settings(config), f)
  # Where and how it runs (mesh, checkpointing, logging) may change between restarts.
  same = downstream.run_config(base, {"mesh.data": 2, "logging.tensorboard": False,
                                      "checkpoint.max_to_keep": 1}, spec, run, "/ckpt")
  downstream.check_settings([run], {run: same}, str(tmp_path))
  for overrides, checkpoint, named in (
      ({"model.hidden_dropout_prob": 0.2}, "/ckpt", "model.hidden_dropout_prob=0.1 there, 0.2 now"),
      ({}, "/other", "init_from='/ckpt' there, '/other' now"),
      ({"data.max_seq_length": 64, "train.batch_size": 16}, "/ckpt",
       "data.max_seq_length=128 there, 64 now; train.batch_size=32 there, 16 now")):
    other = downstream.run_config(base, overrides, spec, run, checkpoint)
    with pytest.raises(ValueError) as error:
      downstream.check_settings([run], {run: other}, str(tmp_path))
    assert str(error.value) == (
        f"--output_dir={tmp_path} holds runs made with other settings (mrpc lr2e-05_seed0: "
        f"{named}); give another --output_dir, or remove {run_dir} to redo that run")


def _fake_training_checkpoint(workdir, step: int, checksum: str) -> None:
  """What `encoder_identity` reads of a training workdir: a committed step, its record."""
  step_dir = workdir / "checkpoints" / str(step)
  os.makedirs(step_dir / "meta")
  (step_dir / "commit_success.txt").write_text("done")
  (step_dir / "bert_jax_manifest.json").write_text(json.dumps(
      {"version": 2, "files": {"state/x": {"bytes": 4, "checksum": checksum}}}))


def test_runs_are_keyed_by_the_encoders_content_not_its_path(encoder, tmp_path, capsys):
  """An encoder trained further at the same --checkpoint path had the old runs' scores
  reported as its own ("finished already", #37): its runs are kept aside and run again."""
  workdir = tmp_path / "pretraining"
  _fake_training_checkpoint(workdir, 12, "crc32:0000000a")
  first = downstream.encoder_identity(str(workdir))
  assert first["encoder.step"] == 12 and len(first["encoder.fingerprint"]) == 64
  _fake_training_checkpoint(workdir, 20, "crc32:0000000b")  # Trained on.
  further = downstream.encoder_identity(str(workdir))
  assert further["encoder.step"] == 20 and further != first
  pretrained = downstream.encoder_identity(encoder)
  assert pretrained["encoder.step"] is None
  assert downstream.encoder_identity(encoder) == pretrained  # Content: the same every time.

  output = tmp_path / "suite"
  runs = [downstream.Run("mrpc", 2e-5, 0), downstream.Run("rte", 2e-5, 0),
          downstream.Run("cola", 2e-5, 0)]
  recorded = {"init_from": str(workdir), **first}
  for run, settings in zip(runs, (recorded, {**recorded, **further}, {"init_from": "x"})):
    os.makedirs(run.workdir(str(output)))
    for name, content in ((downstream.SETTINGS_FILE, settings),
                          (downstream.SCORES_FILE, {"scores": {"f1": 0.5}})):
      with open(os.path.join(run.workdir(str(output)), name), "w") as f:
        json.dump(content, f)
  downstream.set_aside_other_encoders(runs, str(output), further)
  old = runs[0].workdir(str(output))
  aside = f"{old}.encoder-step12-{first['encoder.fingerprint'][:12]}"
  assert not os.path.exists(old) and os.path.isfile(os.path.join(aside, downstream.SCORES_FILE))
  assert f"mrpc lr2e-05_seed0: made from another encoder at {old} (step 12, this one's 20); " \
         f"kept as {os.path.basename(aside)}, and run again" in capsys.readouterr().out
  for run in runs[1:]:  # This encoder's run, and one recorded before encoders were.
    assert os.path.isfile(os.path.join(run.workdir(str(output)), downstream.SCORES_FILE))


# -------------------------------------------------------------------------------- bad flags


@pytest.mark.parametrize("args, message", [
    (["--suite=superglue"], "--suite=superglue: unknown suite; one of glue, squad1, squad2, local"),
    (["--tasks=cola,wnli"], "--tasks=cola,wnli: wnli is left out of GLUE, as BERT did"),
    (["--tasks=cola,squad1"], "--tasks=cola,squad1: squad1 is not a task of --suite=glue"),
    (["--learning_rates=2e-5,x"], "--learning_rates=2e-5,x: expected distinct numbers"),
    (["--learning_rates=0"], "--learning_rates=0: expected distinct numbers"),
    (["--seeds=0"], "--seeds=0: the number of seeds per learning rate must be >= 1"),
    (["--devices_per_run=-1"], "--devices_per_run=-1: must be >= 0"),
    (["--checkpoint="], "--checkpoint is empty"),
    (["--checkpoint=MISSING"], "--checkpoint=MISSING does not exist"),
    (["--checkpoint=EMPTY"], "--checkpoint=EMPTY is an empty directory"),
    (["--run_group=1/2/3"], "--run_group=1/2/3: expected index/count with 0 <= index < count"),
    (["--run_group=2/2"], "--run_group=2/2: expected index/count"),
    (["--run_group=a/b"], "--run_group=a/b: expected index/count"),
    # Inside the encoder's workdir its own run would rotate the suite's files, or it theirs.
    (["--output_dir=ENCODER/glue"], "--output_dir ENCODER/glue lies inside the encoder's "
     "workdir (--checkpoint) ENCODER"),
    (["--output_dir=ENCODER"], "--output_dir ENCODER is the encoder's workdir"),
    (["--output_dir=TMP", "--checkpoint=STEP"], "--output_dir TMP holds the encoder's workdir "
     "(--checkpoint) TMP/run"),
])
def test_bad_options_name_their_flag(encoder, tmp_path, args, message):
  (tmp_path / "empty").mkdir()
  _fake_training_checkpoint(tmp_path / "run", 12, "crc32:0000000a")
  places = {"MISSING": str(tmp_path / "missing"), "EMPTY": str(tmp_path / "empty"),
            "ENCODER": encoder, "STEP": str(tmp_path / "run" / "checkpoints" / "12"),
            "TMP": str(tmp_path)}
  values = {"checkpoint": encoder, "suite": "glue", "tasks": [], "learning_rates": "2e-5",
            "seeds": 1, "output_dir": str(tmp_path / "out")}
  for arg in args:
    name, value = arg[2:].split("=", 1)
    for place, path in places.items():
      value = value.replace(place, path)
    values[name] = value.split(",") if name == "tasks" else (
        int(value) if name in ("seeds", "devices_per_run") else value)
  for place, path in places.items():
    message = message.replace(place, path)
  with pytest.raises(ValueError) as error:
    downstream.parse_options(**values)
  assert str(error.value).startswith(message)


def test_overrides_of_fields_the_suite_sets_are_refused():
  flag_values = flags.FlagValues()
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True)
  config_file = os.path.join(ROOT, "configs", "finetune_base.py")
  argv = ["prog", f"--config={config_file}", "--config.train.num_train_epochs=2"]
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sys, "argv", argv)
    flag_values(argv)
  assert downstream.given_overrides(flag_values) == {"train.num_train_epochs": 2.0}
  argv = ["prog", f"--config={config_file}", "--config.train.learning_rate=1e-4"]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sys, "argv", argv)
    flag_values(argv)
  with pytest.raises(ValueError, match=r"--config.train.learning_rate: the suite sets it for "
                                       r"every run; use --learning_rates"):
    downstream.given_overrides(flag_values)


def test_the_launcher_reports_a_bad_flag_in_one_line(encoder, tmp_path):
  for args, status, last in (
      ([f"--checkpoint={encoder}", "--suite=superglue", f"--output_dir={tmp_path}"], 2,
       "error: --suite=superglue: unknown suite; one of glue, squad1, squad2, local"),
      ([f"--checkpoint={encoder}", "--suite=glue", f"--output_dir={tmp_path}",
        "--config.seed=3"], 2,
       "error: --config.seed: the suite sets it for every run; use --seeds"),
      (["--suite=glue", f"--output_dir={tmp_path}"], 2,
       "error: bad flag or config override: flag --checkpoint=None: Flag --checkpoint must "
       "have a value other than None.")):
    result = forked_launch.run(_command(*args), cwd=ROOT, env=_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == status, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == last
  assert not os.listdir(tmp_path)  # Nothing written.


def test_each_device_group_runs_its_share_in_a_process_of_its_own(tmp_path):
  # A stand-in for the launcher: records its arguments and the devices it was given.
  script = tmp_path / "group.py"
  script.write_text("import json, os, sys\n"
                    "index = sys.argv[-1].split('=')[1].split('/')[0]\n"
                    f"open(os.path.join({str(tmp_path)!r}, index + '.json'), 'w').write(\n"
                    "    json.dumps([sys.argv[1:], os.environ['XLA_FLAGS']]))\n"
                    "sys.exit(3 if index == '1' else 0)\n")
  failed = downstream.run_groups([(0, 1), (2, 3)], "cpu", [str(script), "--suite=glue"])
  assert failed == ["device group 1 stopped with exit status 3"]
  for index in (0, 1):
    args, xla = json.load(open(tmp_path / f"{index}.json"))
    assert args == ["--suite=glue", f"--run_group={index}/2"]
    assert xla.endswith("--xla_force_host_platform_device_count=2")

  # A group's share: runs spread by training examples x sequence length.
  small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
  small.write_text('{"text": "a", "label": "x"}\n' * 10)
  large.write_text('{"text": "a", "label": "x"}\n' * 100)
  specs = [suites.TaskSpec("big", "classification", ("accuracy",), 128, train_file=str(large)),
           suites.TaskSpec("few", "classification", ("accuracy",), 128, train_file=str(small))]
  runs = downstream.plan(specs, [1e-4], 3)
  configs = {run: downstream.run_config(finetune_base.get_config(), {}, specs[run.task == "few"],
                                        run, "/c") for run in runs}
  shares = downstream.spread(specs, runs, configs, 3)
  assert [[(r.task, r.seed) for r in share] for share in shares] == [
      [("big", 0), ("few", 0)], [("big", 1), ("few", 1)], [("big", 2), ("few", 2)]]
  assert [len(share) for share in downstream.spread(specs, runs, configs, 2)] == [2, 4]


def test_an_override_no_run_of_the_suite_reads_is_refused(tmp_path):
  """`--config.embedding.pooling=cls` on GLUE: no classification run reads config.embedding, so
  the suite refuses it in one line before anything runs, as train.py and finetune.py do."""
  options = downstream.Options("/ckpt", "glue", ("sst2",), (2e-5,), 1, str(tmp_path / "out"))
  with pytest.raises(ValueError) as error:
    downstream.run_suite(options, finetune_base.get_config(), {"embedding.pooling": "cls"}, [])
  assert str(error.value).startswith(
      "--config.embedding.pooling is not read by task 'classification'"), str(error.value)
  assert not (tmp_path / "out").exists()
