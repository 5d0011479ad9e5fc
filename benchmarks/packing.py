"""Packed vs unpacked pretraining on the built-in corpus: throughput and time to accuracy.

1. Data: the built-in docstring corpus prepared for configs/tiny.py twice, one NSP example per
   row (K = 1) and packed (K = --examples_per_row), cached under --workdir; their fill rates.
2. Throughput: configs/tiny.py's compiled train step on each dataset's batches, timed
   alternately (--reps rounds of --seconds_per_rep each); medians of slot tokens/s (rows x L)
   and real tokens/s (non-padding tokens, counted on the host batches).
3. Time to accuracy: configs/tiny.py trained on each dataset for the same wall-clock budget
   (--budget_minutes of training time each; the two runs alternate in slices of
   --slice_seconds, so machine load hits both alike; evaluation time is not counted), with the
   held-out MLM accuracy measured every --eval_every_minutes on the same rows: the unpacked
   validation split, same masks for both. A table, and learning curves as a PNG (needs
   matplotlib: <venv>/bin/pip install matplotlib).

Results: benchmarks/results/packing.jsonl and benchmarks/results/packing_time_to_accuracy.png.

Run:
  <venv>/bin/python benchmarks/packing.py --workdir=/tmp/packing_bench
"""

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
sys.path.insert(0, REPO)


def _config(examples_per_row: int):
  from configs import tiny
  config = tiny.get_config()
  config.data.max_examples_per_row = examples_per_row
  config.mesh.data = 1
  return config


class Variant:
  """One dataset (K examples per row) with its task, compiled program, state and iterator."""

  def __init__(self, name: str, examples_per_row: int, workdir: str):
    import jax
    import flax.linen as nn
    from bert_jax import programs, sharding, train
    from bert_jax.data import builtin, pipeline
    from bert_jax.model import BertConfig
    self.name, self.config = name, _config(examples_per_row)
    builtin.ensure_builtin(workdir, builtin.BuiltinSettings.from_config(self.config))
    self.dataset_dir, self.meta = pipeline.resolve_dataset(self.config, workdir)
    self.task = train.pretraining_task(self.config, BertConfig.from_config(self.config.model),
                                       self.meta)
    self.mesh = sharding.make_mesh(self.config.mesh, jax.devices()[:1])
    self.rules = sharding.logical_rules(self.config.mesh)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      self.program = programs.make_program(self.config, self.task, self.mesh)
    self.key = jax.random.fold_in(jax.random.key(self.config.seed), 2)
    self.reset()

  def reset(self) -> None:
    """A fresh start: initial params, the data from its first batch, no time spent."""
    import jax
    from bert_jax.data import pipeline
    with jax.set_mesh(self.mesh):
      self.state = self.program.init(jax.random.key(self.config.seed))
    self.iterator = pipeline.make_train_iterator(
        self.dataset_dir, global_batch_size=self.config.train.batch_size, seed=self.config.seed,
        process_index=0, process_count=1)
    self.train_seconds, self.steps, self.curve = 0.0, 0, []

  def run(self, seconds: float) -> tuple[int, int, float]:
    """Steps for about `seconds` -> (steps, real tokens, seconds taken)."""
    import jax
    from bert_jax import sharding
    steps, real, start, previous = 0, 0, time.perf_counter(), None
    with jax.set_mesh(self.mesh):
      while time.perf_counter() - start < seconds:
        local = next(self.iterator)
        real += int((local["segment_ids"] > 0).sum())
        batch = sharding.global_batch_from_local(local, self.mesh)
        self.state, metrics = self.program.train_step(self.state, batch, self.key)
        steps += 1
        if previous is not None:  # One step in flight: input overlaps compute, and the
          jax.block_until_ready(previous)  # clock measures finished steps.
        previous = metrics["loss"]
      jax.block_until_ready(previous)
    elapsed = time.perf_counter() - start
    self.steps += steps
    self.train_seconds += elapsed
    return steps, real, elapsed

  def evaluate(self, eval_batches) -> dict:
    """Held-out metrics of the variant's params on `eval_batches()` (the same rows for all)."""
    import jax
    import flax.linen as nn
    from bert_jax import evaluation
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      outputs, sums = evaluation.evaluate(self.state.params, self.program.eval_step,
                                          eval_batches(), self.mesh, self.config.seed,
                                          keep_outputs=False)
    return self.task.scores(outputs, sums, None).metrics


def throughput(variants, reps: int, seconds: float) -> list[dict]:
  for variant in variants:
    variant.run(2.0)  # Warm-up: first executions, prefetch threads.
  rows = {v.name: [] for v in variants}
  for rep in range(reps):
    for variant in (variants if rep % 2 == 0 else variants[::-1]):
      steps, real, elapsed = variant.run(seconds)
      slots = steps * variant.config.train.batch_size * variant.config.data.max_seq_length
      rows[variant.name].append((slots / elapsed, real / elapsed))
  results = []
  for variant in variants:
    slot_rates, real_rates = zip(*rows[variant.name])
    results.append({"kind": "throughput", "variant": variant.name,
                    "slot_tokens_per_sec": statistics.median(slot_rates),
                    "real_tokens_per_sec": statistics.median(real_rates),
                    "fill_rate_prepared": variant.meta["splits"]["train"]["fill_rate"],
                    "reps": reps})
  return results


def time_to_accuracy(variants, eval_run, budget: float, every: float, slice_seconds: float):
  """Alternating slices of training until each variant has `budget` seconds; eval at every
  multiple of `every` seconds of its own training time."""
  for variant in variants:
    variant.reset()  # Not the throughput phase's weights.
    variant.curve = [{"minutes": 0.0, "steps": 0, **variant.evaluate(eval_run)}]
  while any(v.train_seconds < budget for v in variants):
    for variant in variants:
      if variant.train_seconds >= budget:
        continue
      next_eval = every * len(variant.curve)
      left = min(next_eval, budget) - variant.train_seconds
      variant.run(min(slice_seconds, left))
      if variant.train_seconds >= next_eval - 1e-6 or variant.train_seconds >= budget:
        report = variant.evaluate(eval_run)
        variant.curve.append({"minutes": variant.train_seconds / 60, "steps": variant.steps,
                              **report})
        print(f"{variant.name}: {variant.train_seconds / 60:.1f} min, {variant.steps} steps, "
              f"mlm_acc {report['mlm_accuracy']:.4f}", flush=True)
  return [{"kind": "curve", "variant": v.name, "points": v.curve} for v in variants]


def plot(curves, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axis = plt.subplots(figsize=(6, 4))
  for curve in curves:
    axis.plot([p["minutes"] for p in curve["points"]],
              [p["mlm_accuracy"] for p in curve["points"]], marker="o", label=curve["variant"])
  axis.set_xlabel("training time (minutes, evaluation excluded)")
  axis.set_ylabel("held-out MLM accuracy")
  axis.set_title("configs/tiny.py on the built-in corpus")
  axis.grid(alpha=0.3)
  axis.legend()
  figure.tight_layout()
  figure.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="Prepared data is cached here.")
  parser.add_argument("--examples_per_row", type=int, default=4)
  parser.add_argument("--reps", type=int, default=6)
  parser.add_argument("--seconds_per_rep", type=float, default=15.0)
  parser.add_argument("--budget_minutes", type=float, default=10.0)
  parser.add_argument("--eval_every_minutes", type=float, default=2.0)
  parser.add_argument("--slice_seconds", type=float, default=30.0)
  parser.add_argument("--eval_max_batches", type=int, default=16)
  args = parser.parse_args()
  from bert_jax.data import pipeline

  variants = [Variant("unpacked (K=1)", 1, args.workdir),
              Variant(f"packed (K={args.examples_per_row})", args.examples_per_row, args.workdir)]
  unpacked = variants[0]
  eval_run = (  # The unpacked split's rows: the same held-out examples for both variants.
      lambda: pipeline.make_eval_batches(
          unpacked.dataset_dir, global_batch_size=unpacked.config.train.eval_batch_size,
          process_index=0, process_count=1, max_batches=args.eval_max_batches))
  results = throughput(variants, args.reps, args.seconds_per_rep)
  for row in results:
    print(json.dumps(row), flush=True)
  results += time_to_accuracy(variants, eval_run, args.budget_minutes * 60,
                              args.eval_every_minutes * 60, args.slice_seconds)
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "packing.jsonl"), "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in results)
  curves = [r for r in results if r["kind"] == "curve"]
  plot(curves, os.path.join(RESULTS, "packing_time_to_accuracy.png"))
  base, packed = results[0], results[1]
  print("\n| variant | fill | slot tokens/s | real tokens/s |")
  print("|---|---|---|---|")
  for row in results[:2]:
    print(f"| {row['variant']} | {row['fill_rate_prepared']:.1%} | "
          f"{row['slot_tokens_per_sec']:,.0f} | {row['real_tokens_per_sec']:,.0f} |")
  slot_ratio = packed["slot_tokens_per_sec"] / base["slot_tokens_per_sec"]
  real_ratio = packed["real_tokens_per_sec"] / base["real_tokens_per_sec"]
  print(f"packed / unpacked: slot tokens/s {slot_ratio:.3f}x, real tokens/s {real_ratio:.2f}x")
  print("\n| minutes | " + " | ".join(c["variant"] for c in curves) + " |")
  print("|---|" + "---|" * len(curves))
  for index in range(max(len(c["points"]) for c in curves)):
    cells = [f"{c['points'][index]['mlm_accuracy']:.4f} ({c['points'][index]['steps']} steps)"
             if index < len(c["points"]) else "" for c in curves]
    minutes = next(c["points"][index]["minutes"] for c in curves if index < len(c["points"]))
    print(f"| {minutes:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
