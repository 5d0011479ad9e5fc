"""Classic BERT vs the modern encoder's recipe, and one ablation row per element, pretrained on
the same text on this machine.

Every variant is configs/tiny.py (classic BERT: post-LN, learned positions, GELU MLP, 15%
masking, NSP pairs packed K=4, BERT's optimizer and schedule) with one element of the modern
recipe switched on, plus the whole recipe (configs/modern_tiny.py: rotary, GeGLU, pre-LN without
biases, 3 deep-narrow layers with local attention, MLM-only rows, 30% masking, StableAdamW,
warmup-stable-decay) with and without the example-length warmup. The layers hold the same
parameter budget (GeGLU 344 or 3 layers of GeGLU 176 against 2 layers of MLP 512: printed).
All read the built-in corpus (the same documents; NSP pairs or contiguous rows by objective),
train their config's 2,000 steps of 32 rows of 128 tokens in alternating 30 s slices (machine
load hits all alike; one process, one CPU device), and are scored every --eval_every steps on
the same held-out contiguous rows (the MLM-only validation split) masked at 15% with the same
draws: held-out MLM accuracy against training minutes (evaluation excluded).

The race's clock counts whatever else loads the machine, so `--retime` afterwards measures each
variant's step time on a quiet machine (3 alternating rounds, median) and puts minutes = steps
x that time into the results (the raced clock stays as minutes_raced): a step costs the same
throughout a run. The final params of each variant are saved as bert_jax pretrained
directories under <workdir>/encoders/<variant>/ for fine-tuning.

Results: benchmarks/results/recipes.jsonl, benchmarks/results/recipes_time_to_accuracy.png, and
the tables printed at the end (docs/modern_encoder.md).

Run:
  <venv>/bin/python benchmarks/recipes.py --workdir=/tmp/recipes_bench
  <venv>/bin/python benchmarks/recipes.py --workdir=/tmp/recipes_bench --retime
  <venv>/bin/python benchmarks/recipes.py --workdir=/tmp/recipes_bench --only=classic,modern
  <venv>/bin/python benchmarks/recipes.py --workdir=/tmp/recipes_bench --finetune --seeds=3

--finetune fine-tunes each raced encoder and a scratch encoder of each base config among them
(tiny's and/or modern_tiny's model; --only picks encoders, "scratch" and "scratch_modern"
included) on the local suite
(benchmarks/local_suite.py, whose flags it takes, e.g. --train_examples):
benchmarks/results/<tag>_finetune[_n<N>].jsonl and a table.
"""

import argparse
import json
import os
import re

import local_suite
from race import RESULTS, Variant, check_plotting, plot, quiet_step_seconds, race, retimed

# name -> (base config module, overrides): each element of the modern recipe alone on classic
# BERT, then the whole recipe.
VARIANTS = {
    "classic": ("tiny", {}),
    "+rotary": ("tiny", {"model.position_embedding": "rotary"}),
    "+geglu": ("tiny", {"model.mlp": "glu", "model.intermediate_size": 344}),
    "+preln_nobias": ("tiny", {"model.norm_placement": "pre", "model.attention_bias": False,
                               "model.mlp_bias": False, "model.norm_bias": False,
                               "model.classifier_bias": False, "model.layer_norm_eps": 1e-5}),
    "+mask30": ("tiny", {"masking.mask_prob": 0.3, "masking.eval_mask_prob": 0.15,
                         "masking.max_predictions_per_seq": 40}),
    "+wsd": ("tiny", {"train.schedule": "wsd", "train.decay_fraction": 0.2}),
    # ModernBERT's settings of it: its weight decay is decoupled from the learning rate (a
    # step takes weight_decay x lr / peak of each weight), so BERT's 0.01 would shrink every
    # weight by 1% a step at the peak: 1e-5 as modern_base.
    "+stable_adamw": ("tiny", {"train.optimizer": "stable_adamw", "train.b2": 0.98,
                               "train.eps": 1e-6, "train.weight_decay": 1e-5}),
    "+mlm_rows": ("tiny", {"data.objective": "mlm"}),
    "modern": ("modern_tiny", {}),
    "modern+span_warmup": ("modern_tiny", {"data.span_warmup_steps": 1000,
                                           "data.span_warmup_start": 32}),
}


# The scratch encoder of each base config: its model, random weights, the same vocabulary.
SCRATCH = {"scratch": "tiny", "scratch_modern": "modern_tiny"}


def variant_config(name: str, overrides: dict | None = None, variants: dict | None = None):
  """The config of variant `name` of `variants` (default VARIANTS: module, overrides), with
  `overrides` on top, on one device."""
  import importlib
  module, changes = (variants or VARIANTS)[name]
  config = importlib.import_module(f"configs.{module}").get_config()
  for path, value in {**changes, **(overrides or {})}.items():
    section, field = path.split(".")
    config[section][field] = value
  config.mesh.data = 1
  return config


def eval_rows(workdir: str, max_batches: int):
  """The held-out contiguous rows every variant is scored on: the MLM-only validation split of
  the built-in corpus (the same documents every objective holds out)."""
  from bert_jax.data import builtin, pipeline
  config = variant_config("modern")
  prepared = builtin.ensure_builtin(workdir, builtin.BuiltinSettings.from_config(config))
  dataset_dir, _ = pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), workdir,
                                            prepared)
  return lambda: pipeline.make_eval_batches(
      dataset_dir, global_batch_size=64, process_index=0, process_count=1,
      max_batches=max_batches)


def summary(curves: list[dict], reference: str = "classic") -> list[dict]:
  """Per variant: final accuracy, minutes, and the minutes it took to reach the reference's
  final accuracy (linear between evaluations; None if never, and for the reference itself)."""
  final = next(c for c in curves if c["variant"] == reference)["points"][-1]["mlm_accuracy"]
  rows = []
  for curve in curves:
    points, reached = curve["points"], None
    for before, after in zip(points, points[1:]) if curve["variant"] != reference else ():
      if after["mlm_accuracy"] >= final:
        share = (final - before["mlm_accuracy"]) / max(
            after["mlm_accuracy"] - before["mlm_accuracy"], 1e-12)
        reached = before["minutes"] + max(share, 0.0) * (after["minutes"] - before["minutes"])
        break
    rows.append({"kind": "summary", "variant": curve["variant"],
                 "final_mlm_accuracy": points[-1]["mlm_accuracy"],
                 "final_mlm_loss": points[-1].get("mlm_loss"), "minutes": points[-1]["minutes"],
                 "steps": points[-1]["steps"], "minutes_to_reference_final": reached,
                 "time_share": None if reached is None else reached / next(
                     c for c in curves if c["variant"] == reference)["points"][-1]["minutes"]})
  return rows


_LOG_POINT = re.compile(r"^(\S+): ([\d.]+) min, (\d+) steps, mlm_acc ([\d.]+)$")
_LOG_PARAMS = re.compile(r"^(\S+): ([\d,]+) params ")


def rows_from_log(path: str) -> list[dict]:
  """The params and curves a race printed (its evaluation lines: minutes, steps, held-out MLM
  accuracy; no loss), for a race stopped before it wrote its results."""
  params, points = {}, {}
  with open(path) as f:
    for line in f:
      if match := _LOG_PARAMS.match(line):
        params[match[1]] = int(match[2].replace(",", ""))
      elif match := _LOG_POINT.match(line.strip()):
        points.setdefault(match[1], []).append(
            {"minutes": float(match[2]), "steps": int(match[3]),
             "mlm_accuracy": float(match[4])})
  return ([{"kind": "params", "variant": n, "params": p} for n, p in params.items()]
          + [{"kind": "curve", "variant": n, "points": p} for n, p in points.items()])


def write_results(rows: list[dict], tag: str) -> None:
  """results/<tag>.jsonl, the plot, and the table on stdout (docs/modern_encoder.md)."""
  curves = [r for r in rows if r["kind"] == "curve"]
  names = [c["variant"] for c in curves]
  rows = [r for r in rows if r["kind"] not in ("curve", "summary")] + curves
  rows += summary(curves) if "classic" in names else []
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, f"{tag}.jsonl"), "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  plot(curves, os.path.join(RESULTS, f"{tag}_time_to_accuracy.png"),
       "classic BERT vs the modern recipe (tiny, built-in corpus)")
  seconds = {c["variant"]: c.get("step_seconds") for c in curves}
  print("\n| variant | final MLM acc | MLM loss | steps | ms/step | minutes | to classic's final |")
  print("|---|---|---|---|---|---|---|")
  for row in rows:
    if row["kind"] == "summary":
      reached = row["minutes_to_reference_final"]
      cell = ("-" if row["variant"] == "classic" else "never" if reached is None
              else f"{reached:.1f} min ({row['time_share']:.0%})")
      step = seconds[row["variant"]]
      loss = row["final_mlm_loss"]
      print(f"| {row['variant']} | {row['final_mlm_accuracy']:.2%} | "
            f"{'-' if loss is None else f'{loss:.3f}'} "
            f"| {row['steps']} | {'-' if step is None else f'{1000 * step:.0f}'} "
            f"| {row['minutes']:.1f} | {cell} |")


def finetune(args) -> None:
  """The local suite on each raced encoder (in VARIANTS order), then on a scratch encoder of
  each base config among them (tiny, modern_tiny; the same vocabulary: the built-in corpus's)."""
  directory = os.path.join(args.workdir, "encoders")
  wanted = args.only.split(",") if args.only else None
  unknown = set(wanted or ()) - set(VARIANTS) - set(SCRATCH)
  if unknown:
    raise SystemExit(f"--only: {', '.join(sorted(unknown))} not among "
                     f"{', '.join([*VARIANTS, *SCRATCH])}")
  names = [n for n in VARIANTS if os.path.isdir(os.path.join(directory, n))
           and (wanted is None or n in wanted)]
  if not names:
    raise SystemExit(f"--finetune: no raced encoder under {directory}")
  encoders = {n: os.path.join(directory, n) for n in names}
  bases = {VARIANTS[n][0] for n in names}  # By default a scratch twin of each base config.
  encoders.update({name: f"scratch:configs.{base}" for name, base in SCRATCH.items()
                   if (name in wanted if wanted else base in bases)})
  local_suite.run_to_file(encoders, args, f"{args.tag}_finetune"
                          + (f"_n{args.train_examples}" if args.train_examples else ""))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   parents=[local_suite.parser()])
  parser.add_argument("--workdir", required=True, help="Prepared data is cached here.")
  parser.add_argument("--only", default="", help="Comma-separated variant names (default all).")
  parser.add_argument("--eval_every", type=int, default=250, help="Steps between evaluations.")
  parser.add_argument("--eval_max_batches", type=int, default=16, help="Batches of 64 rows.")
  parser.add_argument("--slice_seconds", type=float, default=30.0)
  parser.add_argument("--steps", type=int, default=0, help="Override num_train_steps (0: 2000).")
  parser.add_argument("--tag", default="recipes", help="Results file name stem.")
  parser.add_argument("--retime", action="store_true",
                      help="Instead of racing: measure each raced variant's step time on a quiet "
                      "machine and put minutes = steps x step time into the results.")
  parser.add_argument("--retime_seconds", type=float, default=15.0,
                      help="Seconds per measurement (3 rounds, median).")
  parser.add_argument("--from_log", default="",
                      help="With --retime: the curves from races' printed output (comma-"
                      "separated logs; a later one's variants win) instead of the results file.")
  parser.add_argument("--finetune", action="store_true",
                      help="Instead of racing: fine-tune the raced encoders (<workdir>/encoders/"
                      "<variant>) and a scratch encoder of each base config on the local suite "
                      "(benchmarks/local_suite.py; its flags apply).")
  args = parser.parse_args()
  if args.finetune:
    finetune(args)
    return
  check_plotting()
  overrides = {"train.num_train_steps": args.steps} if args.steps else {}
  if args.retime:
    if args.from_log:
      rows = []  # A later log's variant replaces an earlier one's.
      for log in args.from_log.split(","):
        new = rows_from_log(log)
        names = {r["variant"] for r in new}
        rows = [r for r in rows if r["variant"] not in names] + new
      order = list(VARIANTS)
      rows.sort(key=lambda r: (r["kind"] != "params", order.index(r["variant"])))
    else:
      with open(os.path.join(RESULTS, f"{args.tag}.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    curves = [r for r in rows if r["kind"] == "curve"]
    variants = [Variant(c["variant"], variant_config(c["variant"], overrides), args.workdir)
                for c in curves]
    step_seconds = quiet_step_seconds(variants, args.retime_seconds, rounds=3)
    for name, seconds in step_seconds.items():
      print(f"{name}: {1000 * seconds:.1f} ms/step", flush=True)
    rows = [r for r in rows if r["kind"] != "curve"] + retimed(curves, step_seconds)
    write_results(rows, args.tag)
    return
  names = args.only.split(",") if args.only else list(VARIANTS)
  variants = [Variant(name, variant_config(name, overrides), args.workdir) for name in names]
  for variant in variants:
    print(f"{variant.name}: {variant.num_params:,} params "
          f"({variant.num_params - variant.config.model.vocab_size * 128:,} outside the "
          "word embeddings)", flush=True)
  curves = race(variants, eval_rows(args.workdir, args.eval_max_batches), args.slice_seconds,
                every_steps=args.eval_every)
  for variant in variants:  # The pretrained encoders, for fine-tuning (launch/downstream.py).
    variant.save(os.path.join(args.workdir, "encoders", variant.name))
  rows = [{"kind": "params", "variant": v.name, "params": v.num_params} for v in variants]
  write_results(rows + curves, args.tag)


if __name__ == "__main__":
  main()
