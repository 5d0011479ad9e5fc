"""Masked diffusion against MLM by the held-out likelihood bound, the sampler's speed, and
samples (issue #41), on the built-in corpus at tiny size.

Variants (one process, one CPU device, trained one after the other, each --steps steps with its
schedule ending there):
- classic_mlm: configs/tiny.py on FULL-SENTENCES rows (objective "mlm": the rows diffusion
  reads; tiny.py's NSP pairs would be another variable);
- modern_mlm: configs/modern_tiny.py (30% masking);
- diffusion: configs/diffusion_tiny.py (modern_tiny's encoder, objective "diffusion").
Every --eval_every steps each is scored on the same held-out rows (the MLM-only validation
split, --eval_max_batches of 64 rows) by `elbo_nats_per_token`: the NELBO per token over the
fixed grid of config.diffusion.eval_points times, with the same keys for every model, and its
perplexity bound exp(nats).

Then the diffusion encoder samples (`predict.generate`): tokens/s (generated pieces of
--num_samples rows of --length, after compiling) against the steps S, for both rules, and a
table of samples from --prompts.

Run:
  <venv>/bin/python benchmarks/diffusion.py --workdir=/tmp/diffusion_bench --steps=600
Results: benchmarks/results/diffusion.jsonl, the tables printed (docs/diffusion.md).
"""

import argparse
import json
import os
import time

import provenance
import recipes
from race import RESULTS, Variant

VARIANTS = {
    "classic_mlm": ("tiny", {"data.objective": "mlm"}),
    "modern_mlm": ("modern_tiny", {}),
    "diffusion": ("diffusion_tiny", {}),
}


def bound_curves(args) -> tuple[list[dict], str]:
  """Trains each variant, scoring it every --eval_every steps; -> (curves, the diffusion
  encoder's directory)."""
  eval_rows = recipes.eval_rows(args.workdir, args.eval_max_batches)
  curves, encoder = [], ""
  for name in VARIANTS:
    config = recipes.variant_config(  # The bound for every objective (MLM's default: off).
        name, {"train.num_train_steps": args.steps, "diffusion.eval_points": 8},
        variants=VARIANTS)
    variant = Variant(name, config, args.workdir)
    variant.reset()
    points = []
    while True:
      report = variant.evaluate(eval_rows)
      points.append({"steps": variant.steps, "minutes": variant.train_seconds / 60,
                     "elbo_nats_per_token": report["elbo_nats_per_token"],
                     "elbo_perplexity_bound": report["elbo_perplexity_bound"]})
      print(f"{name}: {variant.steps} steps, {points[-1]['minutes']:.1f} min, "
            f"{report['elbo_nats_per_token']:.4f} nats/token, bound "
            f"{report['elbo_perplexity_bound']:.1f}", flush=True)
      if variant.steps >= args.steps:
        break
      variant.run(1e9, max_steps=min(args.eval_every, args.steps - variant.steps))
    curves.append({"kind": "bound", "variant": name, "points": points})
    if name == "diffusion":
      encoder = variant.save(os.path.join(args.workdir, "encoders", "diffusion"))
  return curves, encoder


def sampling(encoder: str, args) -> tuple[list[dict], list[dict]]:
  """(tokens/s rows per rule and S, sample rows per prompt and rule)."""
  from bert_jax import predict  # pylint: disable=import-outside-toplevel
  from bert_jax.generation import diffusion as sampler  # pylint: disable=import-outside-toplevel
  from bert_jax.weights import load_pretrained  # pylint: disable=import-outside-toplevel
  loaded = load_pretrained(encoder)
  speed = []
  for rule in ("ancestral", "confidence"):
    for steps in args.sampler_steps:
      settings = sampler.SamplerSettings(steps=steps, rule=rule)
      predict.generate(loaded, args.length, settings, None, 0, args.num_samples)  # Compiles.
      start = time.perf_counter()
      for seed in range(args.repeats):
        predict.generate(loaded, args.length, settings, None, seed + 1, args.num_samples)
      seconds = (time.perf_counter() - start) / args.repeats
      row = {"kind": "speed", "rule": rule, "steps": steps, "length": args.length,
             "num_samples": args.num_samples, "seconds": seconds,
             "tokens_per_second": args.length * args.num_samples / seconds}
      speed.append(row)
      print(f"{rule} S={steps}: {row['tokens_per_second']:.0f} tokens/s", flush=True)
  samples = []
  for prompt in args.prompts:
    for rule in ("ancestral", "confidence"):
      settings = sampler.SamplerSettings(steps=args.sample_steps, rule=rule)
      (out,) = predict.generate(loaded, args.sample_length, settings, prompt, 0, 1)
      samples.append({"kind": "sample", "prompt": prompt, "rule": rule,
                      "steps": args.sample_steps, "length": args.sample_length, "seed": 0,
                      "text": out["text"]})
  return speed, samples


def print_tables(curves, speed, samples) -> None:
  steps = [p["steps"] for p in curves[0]["points"]] if curves else []
  print("\n| steps | " + " | ".join(c["variant"] for c in curves) + " |")
  print("|---|" + "---|" * len(curves))
  for i, step in enumerate(steps):
    cells = [f"{c['points'][i]['elbo_nats_per_token']:.3f} ({c['points'][i]['elbo_perplexity_bound']:.0f})"
             for c in curves]
    print(f"| {step} | " + " | ".join(cells) + " |")
  print("\n| rule | S | tokens/s |\n|---|---|---|")
  for row in speed:
    print(f"| {row['rule']} | {row['steps']} | {row['tokens_per_second']:.0f} |")
  print("\n| prompt | rule | generated |\n|---|---|---|")
  for row in samples:
    print(f"| {row['prompt']} | {row['rule']} | {row['text']} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, help="Prepared data and encoders go here.")
  parser.add_argument("--steps", type=int, default=600, help="Training steps of each variant.")
  parser.add_argument("--eval_every", type=int, default=150)
  parser.add_argument("--eval_max_batches", type=int, default=4, help="Batches of 64 rows.")
  parser.add_argument("--length", type=int, default=64, help="Pieces per sample (speed).")
  parser.add_argument("--num_samples", type=int, default=8, help="Rows sampled together.")
  parser.add_argument("--sampler_steps", type=lambda s: [int(x) for x in s.split(",")],
                      default=[8, 16, 32, 64])
  parser.add_argument("--repeats", type=int, default=3, help="Timed calls per setting.")
  parser.add_argument("--prompts", type=lambda s: s.split("|"),
                      default=["Return the", "If the file", "This module"])
  parser.add_argument("--sample_length", type=int, default=24)
  parser.add_argument("--sample_steps", type=int, default=24)
  parser.add_argument("--encoder", default="", help="Sample from this diffusion encoder (a "
                      "pretrained directory) instead of training the variants.")
  args = parser.parse_args()
  curves, encoder = ([], args.encoder) if args.encoder else bound_curves(args)
  speed, samples = sampling(encoder, args)
  commit = provenance.commit()
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "diffusion.jsonl" if curves else "diffusion_sampling.jsonl"),
            "w") as f:
    for row in [*curves, *speed, *samples]:
      f.write(json.dumps({**row, "commit": commit, "command": "benchmarks/diffusion.py " +
                          f"--steps={args.steps} --eval_every={args.eval_every}"}) + "\n")
  print_tables(curves, speed, samples)


if __name__ == "__main__":
  main()
