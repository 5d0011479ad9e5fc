"""Pretraining recipes compared downstream, offline: each encoder fine-tuned on the local suite
(bert_jax/data/local_suite.py: scipy_topic, param_match, code_tags, built from the installed
numpy / scipy docstrings) with the same recipe, and a table of the validation scores.

--retrieval adds the offline retrieval suite (bert_jax/data/local_retrieval.py) as the task
`local_retrieval`: the embedding task (configs/finetune_embedding.py: InfoNCE with in-batch
negatives, scale 20, mean pooling, normalised; packed rows) on its train pairs, scored by
nDCG@10 of every held-out query against every held-out document (split by source file). Its
`chance` is the expected nDCG@10 of a random ranking.

Encoders: `name=path` pairs, a path being anything config.init_from takes (a pretraining
workdir, a bert_jax pretrained directory, ...), or `name=scratch`: random init, the model of
--scratch_config and the vocabulary of --scratch_vocab (default: the first listed encoder's, so
that the runs differ in the initial weights only); `name=scratch:configs.modern_tiny` takes the
model of that config module instead.

--train_examples N fine-tunes on a seeded sample of N training examples of each task (the same
N for every encoder and seed; validation unchanged): the low-data regime, where what an encoder
brings from pretraining shows most.

Fine-tuning recipe, the same for every encoder and task: configs/finetune_<task>.py with batch
32, 3 epochs, warmup 10%, learning rate --learning_rate, one evaluation at the end, in-process
(`finetune.finetune_and_evaluate`) on one CPU device. 3e-4, not BERT-Base's 2e-5..5e-5 nor
1e-4: a width-128 encoder barely moves in the ~200 steps of 3 epochs there (scipy_topic after
3 epochs: 0.20 at 1e-4, 0.25-0.28 at 3e-4, chance 0.14), and at 5e-4 or 1e-3 fine-tuning from a
short-pretrained encoder stalled at chance (loss ln 7), from scratch it did not. Turc et al.
2019 fine-tuned BERT-Tiny / Mini at 1e-4..3e-4.

Results (rewritten): benchmarks/results/local_suite.jsonl, one row per (task, encoder, seed);
the table printed at the end.

Run:
  .venv/bin/python launch/train.py --config=configs/tiny.py --workdir=/tmp/ls_tiny \
      --config.train.num_train_steps=800
  .venv/bin/python benchmarks/local_suite.py --encoders=tiny800=/tmp/ls_tiny,scratch
  # Embedding models from pretrained encoders against their from-scratch twins (docs/embeddings.md):
  .venv/bin/python benchmarks/local_suite.py --retrieval --tasks=local_retrieval --seeds=3 \
      --encoders=tiny=/tmp/twins/tiny,tiny_scratch=scratch --output=<file>
"""

import argparse
import dataclasses
import importlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import finetune  # noqa: E402
from bert_jax.data import local_retrieval, local_suite  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "local_suite.jsonl")
SCRATCH = "scratch"


def parse_encoders(text: str) -> dict[str, str]:
  """"a=path,b=scratch" -> {"a": "path", "b": "scratch"}; a bare "scratch" is scratch=scratch."""
  encoders = {}
  for item in filter(None, text.split(",")):
    name, _, path = (f"{SCRATCH}={SCRATCH}" if item == SCRATCH else item).partition("=")
    if not name or not path or name in encoders:
      raise SystemExit(f"--encoders: {item!r} is not a new name=path")
    encoders[name] = path
  return encoders


def is_scratch(path: str) -> bool:
  """"scratch" or "scratch:<config module>": random init."""
  return path == SCRATCH or path.startswith(SCRATCH + ":")


def random_ndcg_at_10(documents: int) -> float:
  """Expected nDCG@10 of a uniformly random ranking of `documents` with one relevant: the
  relevant one lies at each rank r with probability 1/documents (ideal DCG 1)."""
  return sum(1 / math.log2(r + 1) for r in range(1, min(10, documents) + 1)) / documents


def retrieval_task(directory: str) -> local_suite.LocalTask:
  """The offline retrieval suite as a LocalTask of the embedding task."""
  files = local_retrieval.build(directory)
  with open(files["validation_file"]) as f:
    documents = len({json.loads(line)["positive"] for line in f})
  return local_suite.LocalTask("local_retrieval", "embedding", files["train_file"],
                               files["validation_file"], "ndcg@10", 128,
                               random_ndcg_at_10(documents))


def sample_train(task: local_suite.LocalTask, n: int, directory: str) -> local_suite.LocalTask:
  """The task with a seeded sample of `n` of its training examples (file order kept)."""
  with open(task.train_file) as f:
    lines = f.readlines()
  if n > len(lines):
    raise SystemExit(f"--train_examples={n}: {task.name} has only {len(lines)}")
  keep = sorted(random.Random(f"{task.name}-{n}").sample(range(len(lines)), n))
  path = os.path.join(directory, f"{task.name}-train-{n}.jsonl")
  with open(path, "w") as f:
    f.writelines(lines[i] for i in keep)
  return dataclasses.replace(task, train_file=path)


def scratch_vocab(encoders: dict[str, str], given: str) -> str:
  """The vocabulary file of from-scratch runs: --scratch_vocab, else the first encoder's."""
  if given:
    return given
  pretrained = [p for p in encoders.values() if not is_scratch(p)]
  if not pretrained:
    raise SystemExit("--encoders has no pretrained encoder to take the vocabulary of; "
                     "give --scratch_vocab")
  from bert_jax import weights  # pylint: disable=g-import-not-at-top
  _, _, vocab = weights.load_pretrained(pretrained[0])
  return vocab.path


def task_config(task: local_suite.LocalTask, init_from: str, args, vocab: str, seed: int):
  """configs/finetune_<task>.py with the suite's files and the benchmark's recipe."""
  config = importlib.import_module(f"configs.finetune_{task.task}").get_config()
  config.seed = seed
  if is_scratch(init_from):
    module = init_from.partition(":")[2] or args.scratch_config
    model = importlib.import_module(module).get_config().model
    config.model.update({k: v for k, v in model.items() if k != "vocab_size"})
    config.vocab = vocab
  else:
    config.init_from = init_from
  config.data.update(train_file=task.train_file, validation_file=task.validation_file,
                     max_seq_length=task.max_seq_length)
  config.train.update(batch_size=32, num_train_epochs=args.epochs,
                      learning_rate=args.learning_rate, eval_every_steps=0,
                      log_every_steps=100, freeze_encoder=args.freeze_encoder)
  if task.task == "embedding":  # Pairs only (no hard negatives), packed several texts a row.
    config.embedding.update(num_negatives=0, pack=True)
  config.checkpoint.save_every_steps = 0  # The last step only.
  config.logging.tensorboard = False
  return config


def run_one(task, name, init_from, args, vocab, seed, root) -> dict:
  workdir = os.path.join(root, f"{task.name}-{name}-{seed}")
  config = task_config(task, init_from, args, vocab, seed)
  start = time.time()
  result = finetune.finetune_and_evaluate(config, workdir)
  return {"benchmark": "local_suite", "task": task.name, "kind": task.task,
          "metric": task.metric, "chance": round(task.chance, 4), "encoder": name,
          "init_from": init_from, "seed": seed, "score": round(result["final"][task.metric], 4),
          "scores": {k: round(v, 4) for k, v in result["final"].items()
                     if isinstance(v, float)},
          "minutes": round((time.time() - start) / 60, 2),
          "train_examples": result["train_examples"],
          "validation_examples": result["validation_examples"],
          "validation_truncated": result["validation_truncated"],
          "learning_rate": args.learning_rate, "epochs": args.epochs, "batch_size": 32,
          "freeze_encoder": args.freeze_encoder, "train_sample": args.train_examples}


def run_to_file(encoders: dict[str, str], args, stem: str) -> list[dict]:
  """`run`, its rows written to benchmarks/results/<stem>.jsonl and tabulated."""
  rows = run(encoders, args)
  with open(os.path.join(os.path.dirname(RESULTS), f"{stem}.jsonl"), "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  print_table(rows, list(encoders))
  return rows


def print_table(rows: list[dict], encoders: list[str]) -> None:
  """task | metric | chance | mean score per encoder (min-max over seeds) | minutes each."""
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  head = f"{'task':12s} {'metric':9s} {'chance':>6s} " + " ".join(f"{e:>20s}" for e in encoders)
  print("\n" + head + "   minutes per run (" + ", ".join(encoders) + ")")
  for task in tasks:
    mine = [r for r in rows if r["task"] == task]
    cells, minutes = [], []
    for encoder in encoders:
      runs = [r for r in mine if r["encoder"] == encoder]
      scores = [r["score"] for r in runs]
      spread = f" ({min(scores):.2f}-{max(scores):.2f})" if len(scores) > 1 else ""
      cells.append(f"{statistics.mean(scores):.3f}{spread}".rjust(20))
      minutes.append(f"{statistics.mean(r['minutes'] for r in runs):.1f}")
    print(f"{task:12s} {mine[0]['metric']:9s} {mine[0]['chance']:6.3f} " + " ".join(cells)
          + "   " + ", ".join(minutes))
  for encoder in encoders:
    total = sum(r["minutes"] for r in rows if r["encoder"] == encoder)
    print(f"{encoder}: {total:.1f} min for the suite ({len(tasks)} tasks, all seeds)")


def plot(rows: list[dict], encoders: list[str], path: str, title: str) -> None:
  """One panel per task: each encoder's mean score (a bar) and its seeds (points), chance as a
  dashed line (matplotlib: requirements-bench.txt)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  tasks = list(dict.fromkeys(r["task"] for r in rows))
  figure, axes = plt.subplots(1, len(tasks), figsize=(1.0 + 1.2 * len(encoders) * len(tasks), 4),
                              squeeze=False)
  for axis, task in zip(axes[0], tasks):
    mine = [r for r in rows if r["task"] == task]
    for x, encoder in enumerate(encoders):
      scores = [r["score"] for r in mine if r["encoder"] == encoder]
      axis.bar(x, statistics.mean(scores), color=f"C{x}", alpha=0.6)
      axis.plot([x] * len(scores), scores, "k.", markersize=5)
    axis.axhline(mine[0]["chance"], color="gray", linestyle="--", linewidth=1, label="chance")
    axis.set_xticks(range(len(encoders)), encoders, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel(f"{mine[0]['metric']} (validation)")
    axis.set_title(task, fontsize=9)
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=7)
  figure.suptitle(title, fontsize=9)
  figure.tight_layout()
  figure.savefig(path, dpi=120)


def parser() -> argparse.ArgumentParser:
  """The suite's flags (benchmarks/recipes.py --finetune takes them too)."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
  p.add_argument("--suite_dir", default="", help="where the suite's files go (default: a "
                 "temporary directory)")
  p.add_argument("--tasks", default="", help="comma-separated task names (default: all)")
  p.add_argument("--seeds", type=int, default=1)
  p.add_argument("--retrieval", action="store_true", help="add the offline retrieval suite as "
                 "the task local_retrieval (the embedding task, nDCG@10)")
  p.add_argument("--train_examples", type=int, default=0, help="fine-tune on a seeded sample "
                 "of this many training examples of each task (0: all)")
  p.add_argument("--learning_rate", type=float, default=3e-4)
  p.add_argument("--epochs", type=float, default=3.0)
  p.add_argument("--freeze_encoder", action="store_true", help="train the head only (a probe "
                 "of the encoder's features; wants a larger --learning_rate)")
  p.add_argument("--scratch_config", default="configs.tiny",
                 help="config module whose model a scratch encoder has")
  p.add_argument("--scratch_vocab", default="", help="vocabulary of scratch encoders")
  return p


def run(encoders: dict[str, str], args) -> list[dict]:
  """Every (task, seed, encoder) fine-tuned and scored: one row each, printed as it ends."""
  vocab = (scratch_vocab(encoders, args.scratch_vocab)
           if any(map(is_scratch, encoders.values())) else "")
  rows = []
  with tempfile.TemporaryDirectory(prefix="local_suite_") as tmp:
    suite_dir = args.suite_dir or os.path.join(tmp, "suite")
    suite = local_suite.build(suite_dir)
    if args.retrieval:
      suite.append(retrieval_task(os.path.join(suite_dir, "retrieval")))
    wanted = set(filter(None, args.tasks.split(",")))
    suite = [t for t in suite if not wanted or t.name in wanted]
    if args.train_examples:
      suite = [sample_train(t, args.train_examples, tmp) for t in suite]
    for task in suite:
      for seed in range(args.seeds):
        for name, init_from in encoders.items():
          rows.append(run_one(task, name, init_from, args, vocab, seed, tmp))
          print(json.dumps(rows[-1]), flush=True)
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[parser()])
  p.add_argument("--encoders", required=True, help="name=path,...; path 'scratch' or "
                 "'scratch:<config module>': random init")
  p.add_argument("--output", default=RESULTS, help="JSONL of one row per run (rewritten)")
  p.add_argument("--plot", default="", help="PNG of the scores: a panel per task, a bar per "
                 "encoder (mean) with its seeds as points")
  args = p.parse_args()
  if args.plot:
    from race import check_plotting  # pylint: disable=import-outside-toplevel
    check_plotting()  # Stops before any fine-tuning when the plot could not be drawn.
  encoders = parse_encoders(args.encoders)
  rows = run(encoders, args)
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  print_table(rows, list(encoders))
  if args.plot:
    plot(rows, list(encoders), args.plot, f"{args.seeds} seeds, {args.epochs:g} epochs, "
         f"lr {args.learning_rate:g}, batch 32")


if __name__ == "__main__":
  main()
