"""Long context: the modern encoder's compiled train step at 8192 tokens (configs/modern_base.py,
one row per device, 30% of 8192 = 2458 MLM targets), with local attention (window 128, a global
layer every third) against every layer global, for each remat policy: per-device memory from
XLA's analysis of the compiled step (abstract shapes: nothing is allocated, no data read), the
model's FLOPs per step (`bert_jax/models/flops.py`: a local layer's attention covers its window, a
global one all 8192 keys) and compile time, on this CPU.

XLA's own FLOP count (`xla_flops_per_device`) is printed too, but it counts a scanned loop's
body once, and the body is 3 layers with local attention against 1 without: compare the model
FLOPs instead.

Results: benchmarks/results/long_context.jsonl (docs/modern_encoder.md).

Run:
  <venv>/bin/python benchmarks/long_context.py [--length=8192] [--remat=dots,full,none]
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def report(length: int, window: int, remat: str) -> dict:
  from bert_jax import train
  from configs import modern_base
  config = modern_base.get_config()
  config.data.max_seq_length = length
  config.masking.max_predictions_per_seq = round(config.masking.mask_prob * length) + 1
  config.train.batch_size = config.train.eval_batch_size = 1
  config.mesh.data = 1
  config.model.remat = remat
  config.model.local_attention = window
  config.model.global_attn_every_n_layers = 3 if window else 1
  result = train.compile_report(config)
  return {"length": length, "local_attention": window, "remat": remat,
          "layers": config.model.num_hidden_layers, **result}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=int, default=8192)
  parser.add_argument("--remat", default="dots,full,none")
  args = parser.parse_args()
  rows = []
  for remat in args.remat.split(","):
    for window in (128, 0):
      row = report(args.length, window, remat)
      rows.append(row)
      print(json.dumps(row), flush=True)
  os.makedirs(os.path.join(REPO, "benchmarks", "results"), exist_ok=True)
  with open(os.path.join(REPO, "benchmarks", "results", "long_context.jsonl"), "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)
  print(f"\n| remat | attention | GiB per device | model TFLOPs per step | compile s |")
  print("|---|---|---|---|---|")
  for row in rows:
    kind = "local 128 + global every 3rd" if row["local_attention"] else "all global"
    print(f"| {row['remat']} | {kind} | {row['train_total_gib']:.2f} | "
          f"{row['model_flops_per_step'] / 1e12:.2f} | {row['compile_seconds_train']:.1f} |")


if __name__ == "__main__":
  main()
