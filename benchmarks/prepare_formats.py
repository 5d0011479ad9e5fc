r"""Preparation throughput and peak memory of the same corpus as text, JSONL and Parquet:
`launch/prepare_data.py` end to end, one format after another, on this machine.

  python benchmarks/prepare_formats.py --size_mb=1000 \
      --output=benchmarks/results/prepare_formats.jsonl

The corpus is the built-in docstring corpus, repeated until --size_mb of text, each copy's
documents made distinct by a first sentence naming the copy, since preparation drops a repeated
document. It is written three ways:
- text: google-research/bert's format, a sentence a line, the path text corpora take;
- jsonl: one {"id", "text"} object a line, the text a document's sentences joined by spaces;
- parquet: the same records, row groups of 10,000.

The JSONL and Parquet texts are split into sentences again in preparation. Each format is
prepared with a sentencepiece unigram vocabulary of --vocab_size (--vocab), L=128, K=4,
--dupe_factor and --num_workers worker processes. A sampler sums VmRSS over the launcher and its
workers every 50 ms: "peak tree RSS" counts shared pages once per process, an upper bound.
MB/s is text MB (UTF-8, the bert-format file's size) per second of the launcher's wall time.
The corpora and the vocabulary are cached in --work_dir.
"""

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags
from proc_rss import run_with_peak_rss

flags.DEFINE_float("size_mb", 1000, "Corpus text in MB (the bert-format file's size).")
flags.DEFINE_list("formats", ["text", "jsonl", "parquet"], "What to prepare, in this order.")
flags.DEFINE_integer("dupe_factor", 1, "Passes over the corpus (--dupe_factor).")
flags.DEFINE_integer("num_workers", 2, "Preparation worker processes (--num_workers).")
flags.DEFINE_integer("vocab_size", 8192, "sentencepiece unigram vocabulary.")
flags.DEFINE_string("work_dir", "/tmp/bert_jax_bench_formats", "Corpora, vocabulary, outputs.")
flags.DEFINE_string("output", "", "Also append the JSON lines here.")
FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SUFFIX = {"text": "txt", "jsonl": "jsonl", "parquet": "parquet"}


def _documents() -> list[list[str]]:
  sys.path.insert(0, ROOT)
  from bert_jax.data import corpus  # pylint: disable=import-outside-toplevel
  return [[" ".join(s.split()) for s in doc] for doc in corpus.iter_builtin_docstrings()]


def _corpora() -> tuple[dict[str, str], str]:
  """({format: file}, vocabulary file), made once into --work_dir."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  from bert_jax.data import corpus  # pylint: disable=import-outside-toplevel
  from bert_jax.data import vocab as vocab_lib  # pylint: disable=import-outside-toplevel
  os.makedirs(FLAGS.work_dir, exist_ok=True)
  stem = os.path.join(FLAGS.work_dir, f"corpus_{FLAGS.size_mb:g}mb")
  paths = {f: f"{stem}.{_SUFFIX[f]}" for f in _SUFFIX}
  if not all(os.path.exists(p) for p in paths.values()):
    documents = _documents()
    limit, written, copy = FLAGS.size_mb * 1e6, 0, 0
    ids, texts = [], []
    with open(paths["text"] + ".tmp", "w", encoding="utf-8") as text, \
        open(paths["jsonl"] + ".tmp", "w", encoding="utf-8") as jsonl:
      while written < limit:
        for doc in documents:
          doc = [f"This is copy {copy} of the corpus.", *doc]
          block = "\n".join(doc) + "\n\n"
          text.write(block)
          record = {"id": len(ids), "text": " ".join(doc)}
          jsonl.write(json.dumps(record) + "\n")
          ids.append(record["id"])
          texts.append(record["text"])
          written += len(block.encode("utf-8"))
          if written >= limit:
            break
        copy += 1
    pq.write_table(pa.table({"id": ids, "text": texts}), paths["parquet"] + ".tmp",
                   row_group_size=10_000)
    for path in paths.values():
      os.replace(path + ".tmp", path)
  vocab_file = os.path.join(FLAGS.work_dir, "sp_unigram.model")
  if not os.path.exists(vocab_file):
    vocab_lib.train_sentencepiece(
        corpus.iter_sentences(corpus.iter_builtin_docstrings()), vocab_file[:-len(".model")],
        FLAGS.vocab_size, "unigram")
  return paths, vocab_file


def _measure(fmt: str, path: str, vocab_file: str) -> dict:
  output = os.path.join(FLAGS.work_dir, "out")
  shutil.rmtree(output, ignore_errors=True)
  command = [sys.executable, os.path.join(ROOT, "launch", "prepare_data.py"), f"--input={path}",
             f"--output_dir={output}", f"--vocab={vocab_file}", "--max_seq_length=128",
             "--max_examples_per_row=4", f"--dupe_factor={FLAGS.dupe_factor}",
             f"--num_workers={FLAGS.num_workers}", "--validation_fraction=0.01"]
  done, seconds, peak = run_with_peak_rss(command, ROOT)
  if done.returncode:
    raise RuntimeError(f"{fmt}: preparation failed:\n{done.stderr[-3000:]}")
  with open(os.path.join(output, "bert_meta.json")) as f:
    meta = json.load(f)
  dataset_bytes = sum(os.path.getsize(os.path.join(d, n))
                      for d, _, names in os.walk(output) for n in names)
  shutil.rmtree(output, ignore_errors=True)
  return {"format": fmt, "file_mb": round(os.path.getsize(path) / 1e6, 1),
          "seconds": round(seconds, 1), "rows": sum(s["rows"] for s in meta["splits"].values()),
          "documents": meta["corpus_stats"]["documents"],
          "duplicate_documents": meta["corpus_stats"]["duplicate_documents"],
          "peak_tree_rss_mb": round(peak / 2**20, 1),
          "dataset_mb": round(dataset_bytes / 1e6, 1), "line": done.stdout.strip()[-300:]}


def main(argv):
  del argv
  paths, vocab_file = _corpora()
  text_mb = os.path.getsize(paths["text"]) / 1e6
  results = []
  for fmt in FLAGS.formats:
    result = _measure(fmt, paths[fmt], vocab_file)
    result.update(text_mb=round(text_mb, 1), mb_per_s=round(text_mb / result["seconds"], 2),
                  num_workers=FLAGS.num_workers, dupe_factor=FLAGS.dupe_factor,
                  commit=subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                        capture_output=True, text=True).stdout.strip())
    results.append(result)
    print(json.dumps(result), flush=True)
    if FLAGS.output:
      with open(FLAGS.output, "a") as f:
        f.write(json.dumps(result) + "\n")
  print(f"\n{'format':<9}{'file MB':>9}{'s':>8}{'MB/s':>7}{'rows':>10}{'dataset MB':>12}"
        f"{'peak tree RSS MB':>18}")
  for r in results:
    print(f"{r['format']:<9}{r['file_mb']:>9}{r['seconds']:>8}{r['mb_per_s']:>7}"
          f"{r['rows']:>10}{r['dataset_mb']:>12}{r['peak_tree_rss_mb']:>18}")


if __name__ == "__main__":
  app.run(main)
