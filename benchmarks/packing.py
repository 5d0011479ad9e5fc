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

from race import RESULTS, Variant, check_plotting, plot, race


def _variant(name: str, examples_per_row: int, workdir: str) -> Variant:
  from configs import tiny
  config = tiny.get_config()
  config.data.max_examples_per_row = examples_per_row
  config.mesh.data = 1
  return Variant(name, config, workdir)


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
  check_plotting()
  from bert_jax.data import pipeline

  variants = [_variant("unpacked (K=1)", 1, args.workdir),
              _variant(f"packed (K={args.examples_per_row})", args.examples_per_row,
                       args.workdir)]
  unpacked = variants[0]
  eval_run = (  # The unpacked split's rows: the same held-out examples for both variants.
      lambda: pipeline.make_eval_batches(
          unpacked.dataset_dir, global_batch_size=unpacked.config.train.eval_batch_size,
          process_index=0, process_count=1, max_batches=args.eval_max_batches))
  results = throughput(variants, args.reps, args.seconds_per_rep)
  for row in results:
    print(json.dumps(row), flush=True)
  results += race(variants, eval_run, args.slice_seconds,
                  budget_seconds=args.budget_minutes * 60,
                  every_seconds=args.eval_every_minutes * 60)
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "packing.jsonl"), "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in results)
  curves = [r for r in results if r["kind"] == "curve"]
  plot(curves, os.path.join(RESULTS, "packing_time_to_accuracy.png"),
       "configs/tiny.py on the built-in corpus")
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
