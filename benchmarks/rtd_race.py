"""Replaced-token detection against MLM at equal compute (issue #40's race), on the built-in
corpus, classic and modern encoders at tiny size.

Variants (one process, one CPU device, alternating 30 s slices as benchmarks/race.py):
- classic_mlm: configs/tiny.py on FULL-SENTENCES rows (objective "mlm": the rows RTD reads, so
  the objective is the only difference; tiny.py's NSP pairs are another variable);
- classic_rtd: configs/electra_tiny.py (the same discriminator, a generator 1/4 wide, tied
  embeddings, λ 50);
- modern_mlm: configs/modern_tiny.py (30% masking);
- modern_rtd: configs/modern_electra_tiny.py with ELECTRA's tied embeddings;
- modern_rtd_gdes: configs/modern_electra_tiny.py (gradient-disentangled sharing).

Compute is counted two ways, in one race:
- wall time: each variant trains --minutes of its own (raced) clock;
- FLOPs: the model count of a step (`task.flops_per_example`, the generator and the
  discriminator's head included for RTD) x steps. The budget F is --flop_steps steps of
  classic_mlm; every variant's encoder is saved at F (`<name>@F`) and the MLM variants' also at
  2F (`<name>@2F`): "RTD reaches MLM's score in half the compute" means RTD@F >= MLM@2F.
Each variant runs until it has passed both its wall-time budget and its last FLOP mark.
Held-out points (every --eval_every_seconds of training and at each mark) on the same rows (the
MLM-only validation split, 15% masked with the same draws): MLM accuracy (an RTD variant's is
its generator's), and for RTD the discriminator's AUC, accuracy and its trivial baseline
(1 - replaced fraction).

Encoders go to <workdir>/encoders/<name>@<mark> (the discriminator of an RTD run, as
bert_jax pretrained directories); --finetune runs the local suite (benchmarks/local_suite.py,
its flags: --tasks, --seeds, --train_examples) on them and on random-init twins of the classic
and modern discriminators.

Run:
  <venv>/bin/python benchmarks/rtd_race.py --workdir=/tmp/rtd_race --minutes=4 --flop_steps=600
  <venv>/bin/python benchmarks/rtd_race.py --workdir=/tmp/rtd_race --finetune --seeds=3 \
      --tasks=scipy_topic,param_match
Results: benchmarks/results/rtd_race.jsonl, rtd_race_finetune.jsonl, the tables printed
(docs/training.md).
"""

import argparse
import json
import os

import local_suite
import recipes
from race import RESULTS, Variant

VARIANTS = {
    "classic_mlm": ("tiny", {"data.objective": "mlm"}),
    "classic_rtd": ("electra_tiny", {}),
    "modern_mlm": ("modern_tiny", {}),
    "modern_rtd": ("modern_electra_tiny", {"rtd.embedding_sharing": "electra"}),
    "modern_rtd_gdes": ("modern_electra_tiny", {}),
}


def flops_per_step(variant: Variant) -> float:
  return variant.task.flops_per_example() * variant.config.train.batch_size


def marks(variants, flop_steps: int) -> dict[str, dict[str, int]]:
  """name -> {mark: step}: F for all (F = flop_steps of classic_mlm, or of the first variant
  when it is not raced), 2F for the MLM variants."""
  reference = next((v for v in variants if v.name == "classic_mlm"), variants[0])
  budget = flop_steps * flops_per_step(reference)
  out = {}
  for v in variants:
    steps = {"F": int(budget // flops_per_step(v))}
    if getattr(v.task, "rtd", None) is None:
      steps["2F"] = int(2 * budget // flops_per_step(v))
    out[v.name] = steps
  return out


def point(variant: Variant, eval_batches, mark: str | None) -> dict:
  report = variant.evaluate(eval_batches)
  p = {"minutes": variant.train_seconds / 60, "steps": variant.steps,
       "gflops": variant.steps * flops_per_step(variant) / 1e9, "mark": mark, **report}
  if "disc_auc" in report:
    p["disc_trivial_accuracy"] = 1.0 - report["replaced_fraction"]
  variant.curve.append(p)
  extra = (f", disc_auc {p['disc_auc']:.4f}, disc_acc {p['disc_accuracy']:.4f} (trivial "
           f"{p['disc_trivial_accuracy']:.4f})" if "disc_auc" in p else "")
  print(f"{variant.name}: {p['minutes']:.1f} min, {p['steps']} steps, {p['gflops']:.0f} GFLOP, "
        f"mlm_acc {p['mlm_accuracy']:.4f}{extra}" + (f" [{mark}]" if mark else ""), flush=True)
  return p


def race(variants, eval_batches, args, workdir: str) -> list[dict]:
  """Alternating slices until every variant has its wall-time budget and all its marks."""
  steps_at = marks(variants, args.flop_steps)
  budget = args.minutes * 60
  for v in variants:
    v.reset()
    point(v, eval_batches, None)
  pending = {v.name: dict(sorted(steps_at[v.name].items(), key=lambda kv: kv[1]))
             for v in variants}
  timed = set()
  while any(pending[v.name] or v.name not in timed for v in variants):
    for v in variants:
      if not pending[v.name] and v.name in timed:
        continue
      next_mark = min(pending[v.name].values(), default=None)
      next_eval = args.eval_every_seconds * len([p for p in v.curve if p["mark"] is None])
      seconds = min(args.slice_seconds, max(next_eval - v.train_seconds, 0.5))
      if v.name not in timed:
        seconds = min(seconds, max(budget - v.train_seconds, 0.5))
      v.run(seconds, max_steps=None if next_mark is None else next_mark - v.steps)
      for mark, step in list(pending[v.name].items()):
        if v.steps >= step:
          point(v, eval_batches, mark)
          v.save(os.path.join(workdir, "encoders", f"{v.name}@{mark}"))
          del pending[v.name][mark]
      if v.name not in timed and v.train_seconds >= budget - 1e-6:
        point(v, eval_batches, "time")
        v.save(os.path.join(workdir, "encoders", f"{v.name}@time"))
        timed.add(v.name)
      elif v.train_seconds >= next_eval:
        point(v, eval_batches, None)
  return [{"kind": "curve", "variant": v.name, "flops_per_step": flops_per_step(v),
           "marks": steps_at[v.name], "points": v.curve} for v in variants]


def print_race(curves: list[dict]) -> None:
  print("\n| variant | mark | steps | GFLOP | minutes | held-out MLM acc | disc AUC | disc acc "
        "(trivial) |")
  print("|---|---|---|---|---|---|---|---|")
  for curve in curves:
    for p in curve["points"]:
      if p["mark"]:
        disc = (f"{p['disc_auc']:.3f} | {p['disc_accuracy']:.4f} "
                f"({p['disc_trivial_accuracy']:.4f})" if "disc_auc" in p else "- | -")
        print(f"| {curve['variant']} | {p['mark']} | {p['steps']} | {p['gflops']:.0f} | "
              f"{p['minutes']:.1f} | {p['mlm_accuracy']:.2%} | {disc} |")


def finetune(args) -> None:
  directory = os.path.join(args.workdir, "encoders")
  wanted = set(filter(None, args.only.split(",")))
  names = sorted(n for n in os.listdir(directory)
                 if not wanted or n in wanted or n.split("@")[0] in wanted)
  if not names:
    raise SystemExit(f"--finetune: no raced encoder under {directory}")
  encoders = {n: os.path.join(directory, n) for n in names}
  if not wanted:  # Random-init twins of the two discriminators (the same vocabulary).
    encoders.update(scratch="scratch:configs.tiny", scratch_modern="scratch:configs.modern_tiny")
  local_suite.run_to_file(encoders, args, f"{args.tag}_finetune")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   parents=[local_suite.parser()])
  parser.add_argument("--workdir", required=True, help="Prepared data and encoders go here.")
  parser.add_argument("--only", default="", help="Comma-separated variants (default all); with "
                      "--finetune, encoders (name@mark) or variants.")
  parser.add_argument("--minutes", type=float, default=4.0, help="Wall-time budget each.")
  parser.add_argument("--flop_steps", type=int, default=600,
                      help="The FLOP budget F: this many classic_mlm steps.")
  parser.add_argument("--eval_every_seconds", type=float, default=60.0)
  parser.add_argument("--eval_max_batches", type=int, default=16, help="Batches of 64 rows.")
  parser.add_argument("--slice_seconds", type=float, default=30.0)
  parser.add_argument("--tag", default="rtd_race", help="Results file name stem.")
  parser.add_argument("--finetune", action="store_true",
                      help="Instead of racing: the local suite on <workdir>/encoders/*.")
  args = parser.parse_args()
  if args.finetune:
    finetune(args)
    return
  names = args.only.split(",") if args.only else list(VARIANTS)
  variants = [Variant(n, recipes.variant_config(n, variants=VARIANTS), args.workdir)
              for n in names]
  for v in variants:
    print(f"{v.name}: {v.num_params:,} params, {flops_per_step(v) / 1e9:.1f} GFLOP/step",
          flush=True)
  curves = race(variants, recipes.eval_rows(args.workdir, args.eval_max_batches), args,
                args.workdir)
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, f"{args.tag}.jsonl"), "w") as f:
    f.writelines(json.dumps(c) + "\n" for c in curves)
  print_race(curves)


if __name__ == "__main__":
  main()
