r"""What a held-out evaluation of configs/tiny.py costs with and without the diffusion bound
(#55: the bound, on by default for every MLM evaluation since the masked-diffusion work, made one
evaluation of tiny.py take 241 s instead of 6 s on a 2-core machine).

The same params (tiny.py's model, initialised) and the same eval batches (tiny.py's
eval_batch_size x max_seq_length, synthetic rows as `launch/train.py
--config.data.source=synthetic` reads them) go through the jitted evaluation of the pretraining
task (`prepare_eval` then `eval_outputs`, what the trainer's eval step computes) under
config.diffusion.eval_points = -1 (the default now: no bound for MLM), 0 (no bound) and 8 (the
bound asked for). Compiles are excluded (one warm-up call each); the settings are timed in
turns, --rounds times, and each row reports the median seconds per batch and the ratio to
eval_points=0. Side by side in one process, so the ratio holds on a loaded machine.

Run:
  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/eval_cost.py --output=benchmarks/results/eval_cost.jsonl
"""

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import commit, machine  # noqa: E402

SETTINGS = (-1, 0, 8)  # config.diffusion.eval_points.


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", type=int, default=4, help="Eval batches per timed turn.")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--objective", default="mlm_nsp")
  parser.add_argument("--output", default="")
  args = parser.parse_args()

  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  from bert_jax.data import pipeline  # pylint: disable=import-outside-toplevel
  from bert_jax.models.model import BertConfig  # pylint: disable=import-outside-toplevel
  from configs import tiny  # pylint: disable=import-outside-toplevel

  base = tiny.get_config()
  base.data.objective = args.objective
  model_config = BertConfig.from_config(base.model)
  s = train.SYNTHETIC_SPECIALS
  rows = pipeline.make_synthetic_iterator(
      seq_len=base.data.max_seq_length, vocab_size=model_config.vocab_size, pad_id=s["pad_id"],
      cls_id=s["cls_id"], sep_id=s["sep_id"], special_ids=tuple(s.values()),
      max_examples_per_row=train.examples_per_row(base),
      global_batch_size=base.train.eval_batch_size, seed=0, process_index=0, process_count=1)
  batches = []
  for _ in range(args.batches):
    batch = dict(next(rows))
    batch["example_weight"] = np.ones(batch["input_ids"].shape[0], np.float32)
    batches.append(batch)

  programs, params = {}, None
  for points in SETTINGS:
    config = base.copy_and_resolve_references()
    config.diffusion.eval_points = points
    task = train.pretraining_task(config, model_config, None)
    if params is None:
      params = task.model.init(jax.random.key(0), *task.example_inputs(),
                               deterministic=True)["params"]

    def evaluate(params, batch, key, task=task):
      return task.eval_outputs(params, task.prepare_eval(batch, key))[1]

    programs[points] = (jax.jit(evaluate), task.diffusion.eval_points)
  key = jax.random.key(1)
  for points, (run, _) in programs.items():  # Compile (excluded).
    jax.block_until_ready(run(params, batches[0], key))
  seconds = {points: [] for points in programs}
  for _ in range(args.rounds):
    for points, (run, _) in programs.items():
      start = time.perf_counter()
      for batch in batches:
        jax.block_until_ready(run(params, batch, key))
      seconds[points].append((time.perf_counter() - start) / len(batches))
  plain = statistics.median(seconds[0])
  rows_out = []
  for points, (_, used) in programs.items():
    median = statistics.median(seconds[points])
    row = {"benchmark": "eval_cost", "commit": commit(), "machine": machine(),
           "config": "tiny", "objective": args.objective, "eval_points": points,
           "bound_points_used": used, "eval_batch_size": base.train.eval_batch_size,
           "max_seq_length": base.data.max_seq_length, "batches": args.batches,
           "rounds": args.rounds, "seconds_per_batch": median,
           "ratio_to_no_bound": median / plain,
           "command": "benchmarks/eval_cost.py " + " ".join(sys.argv[1:])}
    rows_out.append(row)
    print(f"eval_points={points:>2} (bound on {used} points): {median * 1e3:8.1f} ms per batch, "
          f"x{median / plain:.2f} of no bound", flush=True)
  if args.output:
    with open(args.output, "a") as f:
      for row in rows_out:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
