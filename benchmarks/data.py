"""Data preparation and input pipeline throughput, and preparation memory vs corpus size.

Run:
  python benchmarks/data.py                        # ~5 and ~20 MB corpora, L=128
  python benchmarks/data.py --sizes_mb=5 --dupe_factors=1 --compare_tfds_writer=false

Corpora are English-like text generated from the built-in docstring corpus (documents of 2-30
sentences drawn from its sentences with a fixed seed), cached in --work_dir. Each preparation
runs in a child process; a sampler sums VmRSS over the child and all its descendants (the
worker pool) every 50 ms, so "peak tree RSS" is the whole preparation's footprint (shared pages
counted once per process: an upper bound). google-research/bert's create_pretraining_data.py
reference on this machine: ~0.25 MB/s per dupe pass, memory growing ~28 MB per MB of text.

With --beam, the preparation runs instead go through the Apache Beam pipeline
(`bert_jax/data/beam.py`, DirectRunner in multi_processing mode at each of --beam_workers
workers; needs requirements-beam.txt) beside the local path, alternating, in the same run:
  python benchmarks/data.py --beam --sizes_mb=100 --dupe_factors=1 --beam_workers=1,2,4
Each Beam row also gets its ratio to the local path's MB/s; "max proc MB" is then the largest
single process (the launcher or one Beam worker).

Prints a table, then one JSON line per measurement.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags
from proc_rss import tree_rss_bytes

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_WORK_DIR = flags.DEFINE_string("work_dir", "/tmp/bert_jax_bench_data", "Corpora and outputs.")
_SIZES_MB = flags.DEFINE_list("sizes_mb", ["5", "20"], "Corpus sizes in MB.")
_DUPE_FACTORS = flags.DEFINE_list("dupe_factors", ["1", "5"], "dupe_factor values to run.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "Tokens per row.")
_MAX_EXAMPLES_PER_ROW = flags.DEFINE_integer("max_examples_per_row", 4,
                                             "K: NSP examples packed per row (1: unpacked).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8192, "sentencepiece unigram vocabulary.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", -1, "Preparation workers (-1: cores).")
_COMPARE_TFDS_WRITER = flags.DEFINE_bool(
    "compare_tfds_writer", True,
    "Also prepare (dupe_factor=1) through TFDS's own download_and_prepare, to show its memory.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs per measurement; the fastest is reported "
                                "(the machine is shared), with the highest peak RSS.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Pipeline benchmark batch size.")
_PIPELINE_BATCHES = flags.DEFINE_integer("pipeline_batches", 200, "Batches timed.")
_BEAM = flags.DEFINE_bool("beam", False, "Measure the Beam pipeline (DirectRunner) beside the "
                          "local path instead of the TFDS writer and the input pipeline.")
_BEAM_WORKERS = flags.DEFINE_list("beam_workers", ["1", "2", "4"],
                                  "DirectRunner direct_num_workers values (with --beam).")
_MODE = flags.DEFINE_enum("mode", "main", ["main", "child_prepare", "child_tfds", "child_beam"],
                          "Internal: what this process does.")
_CORPUS = flags.DEFINE_string("corpus", "", "Internal: corpus file of a child.")
_OUTPUT = flags.DEFINE_string("output", "", "Internal: output dir of a child.")
_DUPE = flags.DEFINE_integer("dupe", 1, "Internal: dupe_factor of a child.")

_SOURCE_MB = 3.0  # Built-in docstring text the sentence pool is drawn from.


def _vocab_path() -> str:
  return os.path.join(_WORK_DIR.value, "sp_unigram.model")


def _make_corpora() -> dict[float, str]:
  """Generated corpora by size (cached), and the vocabulary trained on the first."""
  from bert_jax.data import corpus
  from bert_jax.data import vocab as vocab_lib

  os.makedirs(_WORK_DIR.value, exist_ok=True)
  pool_path = os.path.join(_WORK_DIR.value, "docstring_sentences.txt")
  if not os.path.exists(pool_path):
    with open(pool_path + ".tmp", "w") as f:
      for doc in corpus.iter_builtin_docstrings(int(_SOURCE_MB * 1e6)):
        f.write("\n".join(" ".join(s.split()) for s in doc) + "\n")
    os.replace(pool_path + ".tmp", pool_path)
  with open(pool_path) as f:
    sentences = [line.rstrip("\n") for line in f if line.strip()]
  paths = {}
  for size in sorted(float(s) for s in _SIZES_MB.value):
    path = os.path.join(_WORK_DIR.value, f"corpus_{size:g}mb.txt")
    paths[size] = path
    if os.path.exists(path):
      continue
    rng = random.Random(int(size * 1000))
    written = 0
    with open(path + ".tmp", "w") as f:
      while written < size * 1e6:
        doc = "\n".join(rng.choice(sentences) for _ in range(rng.randint(2, 30))) + "\n\n"
        f.write(doc)
        written += len(doc.encode())
    os.replace(path + ".tmp", path)
  if not os.path.exists(_vocab_path()):
    smallest = paths[min(paths)]
    vocab_lib.train_sentencepiece(
        corpus.iter_sentences(corpus.iter_bert_format(smallest)),
        _vocab_path()[:-len(".model")], _VOCAB_SIZE.value, "unigram")
  return paths


def _run_child(args: list[str]) -> dict:
  """Runs this script in a child mode; returns its JSON result plus the tree's peak RSS."""
  process = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  peak = [0, 0]

  def sample() -> None:
    while process.poll() is None:
      total, largest = tree_rss_bytes(process.pid)
      peak[0], peak[1] = max(peak[0], total), max(peak[1], largest)
      time.sleep(0.05)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  stdout, stderr = process.communicate()
  sampler.join()
  if process.returncode:
    raise RuntimeError(f"child {args} failed:\n{stderr[-3000:]}")
  result = json.loads(stdout.strip().splitlines()[-1])
  result["peak_tree_rss_mb"] = round(peak[0] / 2**20, 1)
  result["peak_process_rss_mb"] = round(peak[1] / 2**20, 1)
  return result


def _child_prepare() -> None:
  from bert_jax.data import corpus
  from bert_jax.data import prepare
  from bert_jax.data import vocab as vocab_lib

  vocab = vocab_lib.Vocab.load(_vocab_path())
  start = time.time()
  meta = prepare.prepare_dataset(
      _OUTPUT.value, lambda: corpus.iter_bert_format(_CORPUS.value), vocab,
      max_seq_length=_MAX_SEQ_LENGTH.value, dupe_factor=_DUPE.value, validation_fraction=0.01,
      seed=0, max_examples_per_row=_MAX_EXAMPLES_PER_ROW.value,
      num_workers=None if _NUM_WORKERS.value < 0 else _NUM_WORKERS.value)
  seconds = time.time() - start
  print(json.dumps({"seconds": seconds, "rows": sum(s["rows"] for s in meta["splits"].values()),
                    "examples": sum(s["examples"] for s in meta["splits"].values())}))


def _child_beam() -> None:
  """The Beam pipeline on DirectRunner with --num_workers processes."""
  from bert_jax.data import beam
  from bert_jax.data import blocks
  from bert_jax.data import vocab as vocab_lib

  vocab = vocab_lib.Vocab.load(_vocab_path())
  settings = blocks.ExampleSettings(max_seq_length=_MAX_SEQ_LENGTH.value, dupe_factor=_DUPE.value,
                                    validation_fraction=0.01, seed=0,
                                    max_examples_per_row=_MAX_EXAMPLES_PER_ROW.value)
  start = time.time()
  meta = beam.prepare_dataset(
      _OUTPUT.value, [_CORPUS.value], "bert", vocab, settings,
      beam_options=[f"--direct_num_workers={_NUM_WORKERS.value}",
                    "--direct_running_mode=multi_processing"])
  seconds = time.time() - start
  print(json.dumps({"seconds": seconds, "rows": sum(s["rows"] for s in meta["splits"].values()),
                    "examples": sum(s["examples"] for s in meta["splits"].values())}))


def _child_tfds() -> None:
  """TFDS's own writer (download_and_prepare of the builder), single process."""
  from bert_jax.data import blocks
  from bert_jax.data import corpus
  from bert_jax.data import tfds_builder
  from bert_jax.data import vocab as vocab_lib

  vocab = vocab_lib.Vocab.load(_vocab_path())
  settings = blocks.ExampleSettings(max_seq_length=_MAX_SEQ_LENGTH.value, dupe_factor=_DUPE.value,
                                    validation_fraction=0.01, seed=0,
                                    max_examples_per_row=_MAX_EXAMPLES_PER_ROW.value)
  builder = tfds_builder.BertPretraining(
      max_seq_length=_MAX_SEQ_LENGTH.value, max_examples_per_row=settings.examples_per_row,
      data_dir=_OUTPUT.value,
      examples_fn=lambda split: blocks.iter_rows(
          corpus.iter_bert_format(_CORPUS.value), vocab, settings, split))
  start = time.time()
  builder.download_and_prepare()
  seconds = time.time() - start
  rows = sum(int(s.num_examples) for s in builder.info.splits.values())  # TFDS: records.
  print(json.dumps({"seconds": seconds, "rows": rows}))


def _pipeline_throughput(dataset_dir: str, num_workers: int) -> dict:
  from bert_jax.data import pipeline

  iterator = pipeline.make_train_iterator(
      dataset_dir, global_batch_size=_BATCH_SIZE.value, seed=0, process_index=0,
      process_count=1, num_workers=num_workers)
  for _ in range(10):  # Warm-up (and worker start-up).
    next(iterator)
  seconds = float("inf")
  for _ in range(_REPEATS.value):
    start = time.time()
    for _ in range(_PIPELINE_BATCHES.value):
      next(iterator)
    seconds = min(seconds, time.time() - start)
  return {"bench": "pipeline", "batch_size": _BATCH_SIZE.value,
          "seq_len": _MAX_SEQ_LENGTH.value, "num_workers": num_workers,
          "batches_per_s": round(_PIPELINE_BATCHES.value / seconds, 1),
          "rows_per_s": round(_PIPELINE_BATCHES.value * _BATCH_SIZE.value / seconds)}


def main(argv):
  del argv
  if _MODE.value == "child_prepare":
    return _child_prepare()
  if _MODE.value == "child_tfds":
    return _child_tfds()
  if _MODE.value == "child_beam":
    return _child_beam()
  corpora = _make_corpora()
  results = []
  last_dataset = None
  workers = _NUM_WORKERS.value if _NUM_WORKERS.value >= 0 else os.cpu_count()
  # (writer, dupe_factor, workers): the pool, the same in one process, TFDS's own writer.
  runs = [("bert_jax", d, workers) for d in sorted(int(x) for x in _DUPE_FACTORS.value)]
  if _BEAM.value:  # Local and Beam alternate per repeat: both see the same machine load.
    runs = [("bert_jax", d, workers) for d in sorted(int(x) for x in _DUPE_FACTORS.value)]
    runs += [("beam", d, int(w)) for d in sorted(int(x) for x in _DUPE_FACTORS.value)
             for w in _BEAM_WORKERS.value]
  else:
    runs.append(("bert_jax", 1, 0))
    if _COMPARE_TFDS_WRITER.value:
      runs.append(("tfds_writer", 1, 0))
  modes = {"bert_jax": "child_prepare", "tfds_writer": "child_tfds", "beam": "child_beam"}
  repeats: dict[tuple, list[dict]] = {}
  for _ in range(_REPEATS.value):
    for writer, dupe, num_workers in runs:
      for size, path in corpora.items():
        output = os.path.join(_WORK_DIR.value,
                              f"out_{writer}_{size:g}mb_dupe{dupe}_w{num_workers}")
        shutil.rmtree(output, ignore_errors=True)
        repeats.setdefault((writer, dupe, num_workers, size), []).append(_run_child([
            f"--mode={modes[writer]}", f"--corpus={path}", f"--output={output}",
            f"--dupe={dupe}", f"--work_dir={_WORK_DIR.value}",
            f"--max_seq_length={_MAX_SEQ_LENGTH.value}",
            f"--max_examples_per_row={_MAX_EXAMPLES_PER_ROW.value}",
            f"--num_workers={num_workers}"]))
        if not (writer == "bert_jax" and dupe == 1 and num_workers):
          shutil.rmtree(output, ignore_errors=True)
  for writer, dupe, num_workers in runs:
    for size, path in corpora.items():
      output = os.path.join(_WORK_DIR.value, f"out_{writer}_{size:g}mb_dupe{dupe}_w{num_workers}")
      repeats_of = repeats[writer, dupe, num_workers, size]
      result = min(repeats_of, key=lambda r: r["seconds"])
      for key in ("peak_tree_rss_mb", "peak_process_rss_mb"):
        result[key] = max(r[key] for r in repeats_of)
      mb = os.path.getsize(path) / 1e6
      result.update({
          "bench": "prepare", "writer": writer, "workers": num_workers,
          "corpus_mb": round(mb, 2), "dupe_factor": dupe, "seq_len": _MAX_SEQ_LENGTH.value,
          "seconds": round(result["seconds"], 2), "mb_per_s": round(mb / result["seconds"], 2),
          "mb_per_s_per_pass": round(mb * dupe / result["seconds"], 2),
          "load_avg_1m": os.getloadavg()[0]})
      if writer == "beam":
        local = next(r for r in results if r["writer"] == "bert_jax"
                     and r["dupe_factor"] == dupe and r["corpus_mb"] == round(mb, 2))
        result["vs_local"] = round(result["mb_per_s"] / local["mb_per_s"], 2)
      results.append(result)
      if writer == "bert_jax" and dupe == 1 and num_workers:
        last_dataset = output
      else:
        shutil.rmtree(output, ignore_errors=True)
  if not _BEAM.value:
    for num_workers in (0, 2):
      results.append(_pipeline_throughput(last_dataset, num_workers))

  print(f"\n{'writer':<12}{'workers':>8}{'MB':>7}{'dupe':>6}{'rows':>10}{'s':>8}"
        f"{'MB/s':>8}{'MB/s/pass':>11}{'tree RSS MB':>13}{'max proc MB':>13}{'load':>6}"
        f"{'vs local':>10}")
  for r in results:
    if r["bench"] == "prepare":
      print(f"{r['writer']:<12}{r['workers']:>8}{r['corpus_mb']:>7.1f}{r['dupe_factor']:>6}"
            f"{r['rows']:>10}{r['seconds']:>8.2f}{r['mb_per_s']:>8.2f}"
            f"{r['mb_per_s_per_pass']:>11.2f}{r['peak_tree_rss_mb']:>13.1f}"
            f"{r['peak_process_rss_mb']:>13.1f}{r['load_avg_1m']:>6.1f}"
            f"{r.get('vs_local', ''):>10}")
  for r in results:
    if r["bench"] == "pipeline":
      print(f"pipeline B={r['batch_size']} L={r['seq_len']} workers={r['num_workers']}: "
            f"{r['batches_per_s']} batches/s ({r['rows_per_s']} rows/s)")
  print()
  for r in results:
    print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
