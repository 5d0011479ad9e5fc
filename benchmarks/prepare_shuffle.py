r"""Preparation time and peak memory of this checkout against another, on 20 and 100 MB of text:
what the corpus-wide document shuffle (`bert_jax/data/shuffle.py`) costs.

  git worktree add /tmp/bert_jax_before 940d075     # the last commit without the shuffle
  python benchmarks/prepare_shuffle.py --baseline_repo=/tmp/bert_jax_before \
      --output=benchmarks/results/prepare_shuffle.jsonl

The corpus is the built-in docstring corpus (all of it, google-research/bert's format: a sentence
a line, a blank line between documents), concatenated with itself until --sizes_mb; a
sentencepiece unigram vocabulary of --vocab_size is trained on one copy. Both are cached in
--work_dir. Each preparation (`prepare.prepare_dataset`, L=128, K=4, --dupe_factor, --num_workers
worker processes) runs in a fresh interpreter with the checkout first on sys.path; a sampler sums
VmRSS over that process and its descendants (the worker pool) every 50 ms: "peak tree RSS" is the
whole preparation's footprint (shared pages counted once per process: an upper bound). The two
checkouts alternate, --repeats times each; the table gives the fastest run and the highest peak.
Then the shuffle alone (this checkout, one process): the seconds to read the corpus, to read and
shuffle it (`shuffle.shuffled_documents`, both passes), and that process's peak RSS.
"""

import json
import os
import shutil
import subprocess
import sys

from absl import app, flags
from proc_rss import run_with_peak_rss

flags.DEFINE_string("baseline_repo", "", "Another bert_jax checkout to measure side by side.")
flags.DEFINE_list("sizes_mb", ["20", "100"], "Corpus sizes in MB.")
flags.DEFINE_integer("dupe_factor", 5, "Passes over the corpus (config.data.dupe_factor).")
flags.DEFINE_integer("num_workers", 2, "Preparation worker processes.")
flags.DEFINE_integer("vocab_size", 8192, "sentencepiece unigram vocabulary.")
flags.DEFINE_integer("repeats", 1, "Runs per (checkout, size), alternating.")
flags.DEFINE_string("work_dir", "/tmp/bert_jax_bench_shuffle", "Corpora, vocabulary, outputs.")
flags.DEFINE_string("output", "", "Also write the JSON lines here.")
FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a fresh interpreter with the checkout first on sys.path: one preparation, one JSON line.
_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from bert_jax.data import corpus, prepare
from bert_jax.data import vocab as vocab_lib
vocab = vocab_lib.Vocab.load(sys.argv[2])
start = time.time()
meta = prepare.prepare_dataset(
    sys.argv[4], lambda: corpus.iter_bert_format(sys.argv[3]), vocab, max_seq_length=128,
    dupe_factor=int(sys.argv[5]), validation_fraction=0.01, seed=0, max_examples_per_row=4,
    num_workers=int(sys.argv[6]))
print(json.dumps({"seconds": time.time() - start,
                  "rows": sum(s["rows"] for s in meta["splits"].values()),
                  "examples": sum(s["examples"] for s in meta["splits"].values())}))
"""


# The shuffle alone: reading the corpus vs reading and shuffling it, and the peak RSS.
_SHUFFLE_WORKER = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from bert_jax.data import corpus, shuffle
start = time.time()
documents = sum(1 for _ in corpus.iter_bert_format(sys.argv[2]))
read = time.time() - start
with tempfile.TemporaryDirectory(dir=os.path.dirname(sys.argv[2])) as work_dir:
  start = time.time()
  shuffled = sum(1 for _ in shuffle.shuffled_documents(
      corpus.iter_bert_format(sys.argv[2]), seed=0, work_dir=os.path.join(work_dir, "s")))
  seconds = time.time() - start
# VmHWM, this process image's peak (ru_maxrss would carry over a larger parent's, from the fork).
with open("/proc/self/status") as f:
  peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"documents": documents, "read_seconds": read, "shuffle_seconds": seconds,
                  "peak_rss_mb": peak / 1024}))
"""


def _corpora() -> tuple[dict[float, str], str]:
  """({size in MB: corpus file}, vocabulary file), made once into --work_dir."""
  sys.path.insert(0, ROOT)
  from bert_jax.data import corpus
  from bert_jax.data import vocab as vocab_lib

  os.makedirs(FLAGS.work_dir, exist_ok=True)
  base = os.path.join(FLAGS.work_dir, "docstrings.txt")
  if not os.path.exists(base):
    with open(base + ".tmp", "w", encoding="utf-8") as f:
      for doc in corpus.iter_builtin_docstrings():
        f.write("\n".join(" ".join(s.split()) for s in doc) + "\n\n")
    os.replace(base + ".tmp", base)
  vocab_file = os.path.join(FLAGS.work_dir, "sp_unigram.model")
  if not os.path.exists(vocab_file):
    vocab_lib.train_sentencepiece(corpus.iter_sentences(corpus.iter_bert_format(base)),
                                  vocab_file[:-len(".model")], FLAGS.vocab_size, "unigram")
  with open(base, "rb") as f:
    text = f.read()
  paths = {}
  for size in sorted(float(s) for s in FLAGS.sizes_mb):
    path = os.path.join(FLAGS.work_dir, f"corpus_{size:g}mb.txt")
    paths[size] = path
    if not os.path.exists(path):
      with open(path + ".tmp", "wb") as f:
        written = 0
        while written < size * 1e6:
          left = int(size * 1e6 - written)
          cut = len(text) if left >= len(text) else text.rfind(b"\n\n", 0, left) + 2
          if cut < 2:
            break
          f.write(text[:cut])  # Whole documents only.
          written += cut
      os.replace(path + ".tmp", path)
  return paths, vocab_file


def _measure(repo: str, corpus_file: str, vocab_file: str) -> dict:
  output = os.path.join(FLAGS.work_dir, "out")
  shutil.rmtree(output, ignore_errors=True)
  done, _, peak = run_with_peak_rss(
      [sys.executable, "-c", _WORKER, repo, vocab_file, corpus_file, output,
       str(FLAGS.dupe_factor), str(FLAGS.num_workers)], repo)
  shutil.rmtree(output, ignore_errors=True)
  if done.returncode:
    raise RuntimeError(f"{repo}: preparation failed:\n{done.stderr[-3000:]}")
  stdout = done.stdout
  result = json.loads(stdout.strip().splitlines()[-1])
  result["peak_tree_rss_mb"] = round(peak / 2**20, 1)
  return result


def main(argv):
  del argv
  corpora, vocab_file = _corpora()
  checkouts = [("this", ROOT)] + ([("baseline", os.path.abspath(FLAGS.baseline_repo))]
                                  if FLAGS.baseline_repo else [])
  results = []
  for size, corpus_file in corpora.items():
    runs: dict[str, list[dict]] = {name: [] for name, _ in checkouts}
    for _ in range(FLAGS.repeats):
      for name, repo in (checkouts if len(runs["this"]) % 2 == 0 else checkouts[::-1]):
        runs[name].append(_measure(repo, corpus_file, vocab_file))
    for name, repo in checkouts:
      best = min(runs[name], key=lambda r: r["seconds"])
      mb = os.path.getsize(corpus_file) / 1e6
      results.append({
          "bench": "prepare_shuffle", "checkout": name, "repo": repo, "corpus_mb": round(mb, 1),
          "dupe_factor": FLAGS.dupe_factor, "num_workers": FLAGS.num_workers,
          "seconds": round(best["seconds"], 2), "mb_per_s": round(mb / best["seconds"], 2),
          "rows": best["rows"], "examples": best["examples"],
          "peak_tree_rss_mb": max(r["peak_tree_rss_mb"] for r in runs[name]),
          "seconds_all": [round(r["seconds"], 2) for r in runs[name]],
          "load_avg_1m": round(os.getloadavg()[0], 2)})
  for size, corpus_file in corpora.items():
    done = subprocess.run([sys.executable, "-c", _SHUFFLE_WORKER, ROOT, corpus_file],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    results.append({"bench": "shuffle_only", "corpus_mb": round(size, 1),
                    **{k: round(v, 2) for k, v in result.items()},
                    "load_avg_1m": round(os.getloadavg()[0], 2)})
  print(f"\n{'checkout':<10}{'MB':>7}{'s':>9}{'MB/s':>7}{'rows':>10}{'peak tree RSS MB':>18}")
  for r in results[:-len(corpora)]:
    print(f"{r['checkout']:<10}{r['corpus_mb']:>7.1f}{r['seconds']:>9.2f}{r['mb_per_s']:>7.2f}"
          f"{r['rows']:>10}{r['peak_tree_rss_mb']:>18.1f}")
  for r in results[-len(corpora):]:
    print(f"shuffle alone, {r['corpus_mb']:g} MB: read {r['read_seconds']} s, read + shuffle "
          f"{r['shuffle_seconds']} s, peak RSS {r['peak_rss_mb']} MB")
  lines = "".join(json.dumps(r) + "\n" for r in results)
  print("\n" + lines, end="")
  if FLAGS.output:
    with open(FLAGS.output, "w") as f:
      f.write(lines)


if __name__ == "__main__":
  app.run(main)
