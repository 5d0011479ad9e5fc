"""Weighted mixtures of prepared datasets (`config.data.source="mixture"`, data/mixture.py):
realised proportions, phases, temperature, epochs, an exact resume after SIGKILL with the rows
drawn per source in every train record, per-source evaluation, and one line for each bad
mixture."""

import dataclasses
import json
import os
import signal

import numpy as np
import pytest

from bert_jax.data import mixture, pipeline, sources
from tests import test_record_inputs as records
from tests.test_train_e2e import _env, _read_until, ROOT

STEPS = 12


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
  """Two prepared datasets of one vocabulary, 'web' (120 documents) and 'code' (30), and one
  of another vocabulary; their vocabulary dir."""
  root = tmp_path_factory.mktemp("mixture")
  texts = records._texts(150, seed=3)  # pylint: disable=protected-access
  vocab = records.vocab_lib.train_sentencepiece(
      records.corpus.iter_sentences(records.corpus.text_to_document(t) for t in texts),
      str(root / "sp"), 300, "bpe")
  vocab.save(str(root / "vocab"))
  out = {}
  for name, part in (("web", texts[:120]), ("code", texts[120:])):
    out[name] = str(root / name)
    sources.prepare_corpus(out[name], sources.CorpusSource(
        input=[records.write_jsonl(str(root / f"{name}.jsonl"), part)]),
        sources.VocabSource(path=str(root / "vocab")), records.SETTINGS, num_workers=0)
  out["other_vocab"] = str(root / "other_vocab")
  sources.prepare_corpus(out["other_vocab"], sources.CorpusSource(
      input=[records.write_jsonl(str(root / "o.jsonl"), records._texts(150, seed=9))]),  # pylint: disable=protected-access
      sources.VocabSource(size=300, model_type="bpe"), records.SETTINGS, num_workers=0)
  return out


def _iterator(dirs, spec: str, steps: int = 500, batch: int = 16, **kwargs):
  phases = mixture.phase_weights(mixture.MixtureSpec.parse(spec, **kwargs), mixture.sizes(dirs),
                                 steps)
  lines = []
  iterator = mixture.MixtureIterator(dirs, phases, global_batch_size=batch, seed=0,
                                     process_index=0, process_count=1, log=lines.append)
  return iterator, lines


def test_draws_follow_the_weights_phases_and_temperature(datasets):
  web, code = datasets["web"], datasets["code"]
  iterator, lines = _iterator([web, code], f"{web}:0.8,{code}:0.2")
  for _ in range(500):
    next(iterator)
  drawn = iterator.get_state()["mixture_rows"]
  assert sum(drawn.values()) == 500 * 16
  assert abs(drawn["web"] / 8000 - 0.8) < 0.02, drawn
  # 'code' (few rows) ran out and started again, each epoch announced.
  code_rows = mixture.sizes([code])[0]
  assert f"mixture: code starts epoch 2 (all {code_rows} of its rows drawn; reshuffled)" in lines
  assert len([l for l in lines if l.startswith("mixture: code")]) == (drawn["code"] - 1) // code_rows
  # From 90% of the run on, 'code' alone.
  iterator, _ = _iterator([web, code], f"{web}:0.5,{code}:0.5", steps=100,
                          phases="0.9:0,1")
  counts = []
  for _ in range(100):
    next(iterator)
    counts.append(dict(iterator.get_state()["mixture_rows"]))
  assert counts[-1]["web"] == counts[89]["web"] and counts[89]["code"] < 90 * 16
  # Without weights: each source weighs its rows ^ tau.
  rows = np.array(mixture.sizes([web, code]), np.float64)
  phases = mixture.phase_weights(mixture.MixtureSpec.parse(f"{web},{code}", 0.5), rows, 10)
  np.testing.assert_allclose(phases[0][1], rows ** 0.5 / (rows ** 0.5).sum())


def test_a_restored_iterator_continues_the_same_batches(datasets):
  dirs = [datasets["web"], datasets["code"]]
  straight, _ = _iterator(dirs, f"{dirs[0]}:0.6,{dirs[1]}:0.4", batch=8)
  for _ in range(7):
    next(straight)
  state = json.loads(json.dumps(straight.get_state()))  # As a checkpoint holds it.
  resumed, _ = _iterator(dirs, f"{dirs[0]}:0.6,{dirs[1]}:0.4", batch=8)
  resumed.set_state(state)
  for _ in range(5):
    expected, got = next(straight), next(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
      np.testing.assert_array_equal(expected[name], got[name])
  # A checkpoint of another mixture's sources.
  with pytest.raises(ValueError, match="same config.data.mixture"):
    _iterator([dirs[0], datasets["other_vocab"]], f"{dirs[0]},{datasets['other_vocab']}")[
        0].set_state(state)


def test_each_host_reads_its_rows_of_the_global_batch(datasets):
  dirs = [datasets["web"], datasets["code"]]
  phases = mixture.phase_weights(mixture.MixtureSpec.parse(f"{dirs[0]}:0.7,{dirs[1]}:0.3"),
                                 mixture.sizes(dirs), 10)
  hosts = [mixture.MixtureIterator(dirs, phases, global_batch_size=8, seed=0, process_index=p,
                                   process_count=2) for p in range(2)]
  whole = mixture.MixtureIterator(dirs, phases, global_batch_size=8, seed=0, process_index=0,
                                  process_count=1)
  for _ in range(3):
    parts, expected = [next(h) for h in hosts], next(whole)
    np.testing.assert_array_equal(
        np.concatenate([p["input_ids"] for p in parts]), expected["input_ids"])


def _launch_mixture(workdir, datasets, *flags, wait=True):
  import sys  # pylint: disable=import-outside-toplevel
  from tests import forked_launch  # pylint: disable=import-outside-toplevel
  command = [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--workdir={workdir}",
             "--config=configs/tiny.py", "--config.data.source=mixture",
             f"--config.data.mixture={datasets['web']}:0.8,{datasets['code']}:0.2",
             "--config.model.vocab_size=300", "--config.model.hidden_size=32",
             "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2",
             "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=48",
             "--config.data.max_seq_length=48", "--config.data.max_examples_per_row=2",
             "--config.masking.max_predictions_per_seq=10", "--config.train.batch_size=8",
             "--config.train.eval_batch_size=8", "--config.train.warmup_steps=2",
             "--config.train.log_every_steps=1", "--config.checkpoint.save_every_steps=4",
             f"--config.train.num_train_steps={STEPS}", f"--config.train.eval_every_steps={STEPS}",
             "--config.logging.tensorboard=false", *flags]
  if not wait:
    return forked_launch.popen(command, cwd=ROOT, env=_env())
  return forked_launch.run(command, cwd=ROOT, env=_env(), timeout=300)


def _records(workdir, split):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f) if r["split"] == split}


def test_a_mixture_resumes_after_sigkill_as_if_never_stopped(datasets, tmp_path):
  straight = str(tmp_path / "straight")
  done = _launch_mixture(straight, datasets)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "Mixture: web 0.800, code 0.200" in done.stdout
  reference = _records(straight, "train")
  assert sum(reference[STEPS]["mixture_rows"].values()) == STEPS * 8
  # Each source scored apart and together.
  validation = _records(straight, "validation")[STEPS]
  assert {"mlm_accuracy", "web/mlm_accuracy", "code/mlm_accuracy"} <= set(validation)
  killed = str(tmp_path / "killed")
  process = _launch_mixture(killed, datasets, wait=False)
  output = _read_until(process, "step 10/12")
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert "step 10/12" in output, output
  done = _launch_mixture(killed, datasets)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  resumed_from = int(done.stdout.split("Resumed from ")[1].split()[0].rsplit("/", 1)[1])
  assert resumed_from in (4, 8)
  resumed = _records(killed, "train")
  for step in range(resumed_from + 1, STEPS + 1):
    assert resumed[step]["loss"] == reference[step]["loss"], step
    assert resumed[step]["mixture_rows"] == reference[step]["mixture_rows"], step


def test_a_bad_mixture_is_one_line(datasets, tmp_path):
  web, code, other = datasets["web"], datasets["code"], datasets["other_vocab"]
  cases = [
      (("--config.data.mixture=" + f"{web}:0.8,{other}:0.2",),
       f"{other} was prepared with another vocabulary than {web}"),
      (("--config.data.mixture=" + f"{web}:0.8,{code}:-1",), "weights must be >= 0"),
      (("--config.data.mixture=" + f"{web}:0.8,{code}:0.2", "--config.data.mixture_phases=0.5:1"),
       "gives 1 weights for 2 datasets"),
      (("--config.data.mixture=" + f"{web}:0.8,{code}:0.2",
        "--config.data.mixture_temperature=0.3"), "applies to a mixture without weights"),
      (("--config.data.mixture=" + f"{web}:0.8,{tmp_path}/none:0.2",),
       f"config.data.mixture: {tmp_path}/none: "),
      (("--config.data.mixture=" + f"{web}:1",), "names 1 dataset(s): give two or more"),
      (("--config.data.mixture=" + f"{web}:0.5,{tmp_path}/x/web:0.5",),
       "two datasets named 'web'"),
      (("--config.data.mixture=" + f"{web}:0.8,{code}:0.2",
        "--config.data.mixture_phases=0.9:1,0;0.5:0,1"), "starts at or before the phase before"),
      (("--config.data.mixture=" + f"{web}:0.8,{code}:0.2", "--config.data.mixture_phases=1.5:1,0"),
       "with 0 < FRACTION < 1"),
      (("--config.data.source=builtin",),
       "config.data.mixture='" + f"{web}:0.8,{code}:0.2' is read by config.data.source="
       "'mixture' only"),
  ]
  for flags, text in cases:
    done = _launch_mixture(str(tmp_path / "never"), datasets, *flags)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and text in last, last
    assert not os.path.exists(tmp_path / "never")


def test_sources_of_another_row_format_are_refused(datasets, tmp_path):
  mlm = str(tmp_path / "mlm")
  sources.prepare_corpus(mlm, sources.CorpusSource(
      input=[records.write_jsonl(str(tmp_path / "m.jsonl"), records._texts(40, seed=5))]),  # pylint: disable=protected-access
      sources.VocabSource(path=os.path.join(datasets["web"], "vocab")),
      dataclasses.replace(records.SETTINGS, max_examples_per_row=1), num_workers=0)
  metas = [pipeline.prepare.load_meta(d) for d in (datasets["web"], mlm)]
  with pytest.raises(ValueError, match="has max_examples_per_row 1 where .* has 2"):
    mixture.check_sources([datasets["web"], mlm], metas)
