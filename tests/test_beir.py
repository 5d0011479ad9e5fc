"""Zero-shot retrieval suites in BEIR's layout (bert_jax/downstream/beir.py, `launch/downstream.py
--suite=beir`), on local files: the layout read as BEIR's, the metrics of exact search over the
model's embeddings, a table; bad layouts refused in one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import finetune, predict
from bert_jax.downstream import beir, retrieval
from tests.suite_flags import xla_flags
from tests.test_embedding import DOC_WORDS, FILLER, QUERY_WORDS, _pairs_config
from tests import forked_launch

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_task(directory, with_header=True):
  """The 24 (query, positive) pairs of tests/test_embedding.py in BEIR's layout, with 24
  distractor documents."""
  os.makedirs(os.path.join(directory, "qrels"), exist_ok=True)
  with open(os.path.join(directory, "corpus.jsonl"), "w") as f:
    for i, d in enumerate(DOC_WORDS):
      f.write(json.dumps({"_id": f"doc{i}", "title": FILLER[(i + 1) % 6],
                          "text": f"{d} {FILLER[(i + 2) % 6]}"}) + "\n")
      f.write(json.dumps({"_id": f"other{i}", "text": f"{DOC_WORDS[(i + 5) % 24]} "
                                                        f"{FILLER[(i + 3) % 6]}"}) + "\n")
  with open(os.path.join(directory, "queries.jsonl"), "w") as f:
    for i, q in enumerate(QUERY_WORDS):
      f.write(json.dumps({"_id": f"q{i}", "text": f"{q} {FILLER[i % 6]}"}) + "\n")
    f.write(json.dumps({"_id": "unjudged", "text": "the"}) + "\n")
  with open(os.path.join(directory, "qrels", "test.tsv"), "w") as f:
    f.write("query-id\tcorpus-id\tscore\n" if with_header else "")
    f.writelines(f"q{i}\tdoc{i}\t1\n" for i in range(24))


def test_the_layout_is_read_as_beir_reads_it(tmp_path):
  _write_task(tmp_path / "pairs")
  task = beir.read_task(str(tmp_path / "pairs"))
  assert len(task.corpus) == 48 and len(task.queries) == 24  # The unjudged query left out.
  assert task.corpus["doc0"] == "a d0 of"  # Title and text joined by a space.
  assert task.qrels["q3"] == {"doc3": 1}
  assert beir.find_tasks(str(tmp_path)) == [str(tmp_path / "pairs")]
  with pytest.raises(ValueError, match=r"--tasks: \['scifact'\] not in"):
    beir.find_tasks(str(tmp_path), ["scifact"])
  (tmp_path / "pairs" / "qrels" / "test.tsv").write_text("q1\tnowhere\t1\n")
  with pytest.raises(ValueError, match=r"judges documents the corpus lacks, e.g. \['nowhere'\]"):
    beir.read_task(str(tmp_path / "pairs"))
  (tmp_path / "pairs" / "qrels" / "test.tsv").write_text("q1\tdoc1\t1\nq99\tdoc2\t1\n")
  with pytest.raises(ValueError, match=r"test.tsv: judges 1 of its 2 queries that \S+queries.jsonl "
                                       r"lacks, e.g. \['q99'\]$"):
    beir.read_task(str(tmp_path / "pairs"))
  with open(tmp_path / "pairs" / "corpus.jsonl", "a") as f:
    f.write(json.dumps({"_id": "doc3", "text": "a second doc3"}) + "\n")
  with pytest.raises(ValueError, match=r"corpus.jsonl, line 49: _id 'doc3' again \(first on line "
                                       r"7\): ids must be unique$"):
    beir.read_task(str(tmp_path / "pairs"))
  _write_task(tmp_path / "pairs")
  with open(tmp_path / "pairs" / "corpus.jsonl", "a") as f:
    f.write(json.dumps({"_id": "blank", "title": "", "text": " "}) + "\n")
  with pytest.raises(ValueError, match=r"corpus.jsonl, line 49: _id 'blank' has no text \(nor a "
                                       r"title\)$"):
    beir.read_task(str(tmp_path / "pairs"))
  _write_task(tmp_path / "pairs")
  with open(tmp_path / "pairs" / "queries.jsonl", "ab") as f:
    f.write(b'{"_id": "q_latin1", "text": "caf\xe9"}\n')
  with pytest.raises(ValueError, match=r"queries.jsonl, line 26: not UTF-8 \(invalid continuation "
                                       r"byte at byte \d+ of the line\)$"):
    beir.read_task(str(tmp_path / "pairs"))
  os.remove(tmp_path / "pairs" / "queries.jsonl")
  with pytest.raises(ValueError, match=r"not a task in BEIR's layout \(missing queries.jsonl\)"):
    beir.read_task(str(tmp_path / "pairs"))


def test_the_suite_scores_a_trained_model_and_its_table(tmp_path):
  workdir = str(tmp_path / "run")
  finetune.finetune_and_evaluate(_pairs_config(tmp_path, 40), workdir)
  _write_task(tmp_path / "data" / "pairs", with_header=False)
  env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
  done = forked_launch.run([sys.executable, "launch/downstream.py", "--suite=beir",
                         f"--data_dir={tmp_path / 'data'}", f"--checkpoint={workdir}",
                         f"--output_dir={tmp_path / 'out'}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  results = json.loads((tmp_path / "out" / "results.json").read_text())["tasks"]["pairs"]
  assert results["queries"] == 24 and results["documents"] == 48
  assert results["ndcg@10"] >= 0.8
  assert "| pairs | " in (tmp_path / "out" / "results.md").read_text()
  # The same numbers as the model's embeddings searched and scored here.
  model = predict.load_embedding_model(workdir)
  task = beir.read_task(str(tmp_path / "data" / "pairs"))
  docs = predict.embed(model, list(task.corpus.values()), 16)
  queries = predict.embed(model, list(task.queries.values()), 16)
  full = queries @ docs.T
  ids = list(task.corpus)
  run = {q: {ids[j]: float(full[i, j]) for j in range(len(ids))}
         for i, q in enumerate(task.queries)}
  expected, _ = retrieval.evaluate(task.qrels, run)
  assert results["ndcg@10"] == pytest.approx(expected["ndcg@10"], abs=1e-6)
  assert np.isfinite(results["map"])
  # The same model as a search engine: each query's positive first.
  corpus = tmp_path / "docs.jsonl"
  corpus.write_text("".join(json.dumps({"id": d, "text": t}) + "\n"
                            for d, t in task.corpus.items()))
  queries = tmp_path / "queries.jsonl"
  queries.write_text("".join(json.dumps({"text": task.queries[f"q{i}"]}) + "\n"
                             for i in range(5)))
  done = forked_launch.run([sys.executable, "launch/predict.py", "--mode=search",
                         f"--checkpoint={workdir}", f"--corpus_file={corpus}",
                         f"--input_file={queries}", "--top_k=3"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = [json.loads(line) for line in done.stdout.splitlines()]
  assert [len(line["results"]) for line in lines] == [3] * 5
  hits = [line["results"][0]["id"] for line in lines]
  assert sum(hit == f"doc{i}" for i, hit in enumerate(hits)) >= 4, hits
  scores = [r["score"] for r in lines[0]["results"]]
  assert scores == sorted(scores, reverse=True)
  # Fine-tuning flags mean nothing here; --data_dir means nothing to the others.
  done = forked_launch.run([sys.executable, "launch/downstream.py", "--suite=beir",
                         f"--data_dir={tmp_path / 'data'}", f"--checkpoint={workdir}",
                         "--seeds=3", f"--output_dir={tmp_path / 'out2'}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode != 0 and "--seeds: not used by --suite=beir" in done.stderr
  done = forked_launch.run([sys.executable, "launch/downstream.py", "--suite=beir",
                         f"--data_dir={tmp_path / 'nowhere'}", f"--checkpoint={workdir}",
                         f"--output_dir={tmp_path / 'out3'}"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode != 0 and "error:" in done.stderr and "Traceback" not in done.stderr


def test_fine_tuning_raises_held_out_ndcg_on_the_offline_retrieval_suite(tmp_path):
  """The offline suite (numpy / scipy docstrings, split by file): a from-scratch encoder fine-tuned
  on its train pairs ranks the held-out documents better than the same encoder untrained."""
  from bert_jax.data import local_retrieval  # pylint: disable=import-outside-toplevel
  from bert_jax.data.vocab import train_sentencepiece  # pylint: disable=import-outside-toplevel
  from configs import finetune_embedding  # pylint: disable=import-outside-toplevel
  files = local_retrieval.build(str(tmp_path / "suite"))
  again = local_retrieval.build(str(tmp_path / "again"))
  for name in ("train_file", "validation_file"):
    assert open(files[name]).read() == open(again[name]).read()  # Same files, same bytes.
  rows = [json.loads(line) for line in open(files["train_file"])]
  held_out = [json.loads(line) for line in open(files["validation_file"])]
  assert len(rows) > 1000 and len(held_out) > 200
  assert not {r["query"] for r in rows} & {r["query"] for r in held_out}
  train_sentencepiece((t for r in rows for t in (r["query"], r["positive"])),
                      str(tmp_path / "sp"), 2000, "unigram")

  def config(steps, freeze):
    c = finetune_embedding.get_config()
    c.vocab, c.data.train_file = str(tmp_path / "sp.model"), files["train_file"]
    c.data.validation_file, c.data.max_seq_length = files["validation_file"], 48
    c.model.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=128, max_position_embeddings=48, vocab_size=0)
    c.train.update(batch_size=32, num_train_steps=steps, learning_rate=1e-3, warmup_steps=10,
                   eval_every_steps=0, log_every_steps=50, freeze_encoder=freeze)
    c.logging.tensorboard, c.checkpoint.save_every_steps = False, 10_000
    return c

  zero = finetune.finetune_and_evaluate(config(1, True), str(tmp_path / "zero"))["final"]
  tuned = finetune.finetune_and_evaluate(config(100, False), str(tmp_path / "tuned"))["final"]
  print(f"held-out nDCG@10: zero-shot {zero['ndcg@10']:.3f}, fine-tuned {tuned['ndcg@10']:.3f}")
  assert tuned["ndcg@10"] >= zero["ndcg@10"] + 0.08
