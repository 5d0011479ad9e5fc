r"""Compile time and per-device memory of the pretraining train step against depth: BERT-Base
width (768, 12 heads, MLP 3072) at 12 and 24 layers, L=128, batch 32, bf16, one CPU device,
compiled against abstract shapes (nothing allocated, no data).

  python benchmarks/compile_time.py --output=benchmarks/results/compile_time.jsonl
  python benchmarks/compile_time.py --baseline_repo=../bert_jax_old   # side by side

With --baseline_repo (another checkout of bert_jax, e.g. a `git worktree` of an older commit)
both checkouts are measured alternately in fresh worker processes (one per measurement, so no
compilation cache is shared), --repeats times each, and the table gives medians and the ratio.
Every remat policy of this checkout (`config.model.remat`) is measured too, when the field
exists.
"""

import json
import os
import statistics
import subprocess
import sys

from absl import app, flags

flags.DEFINE_string("baseline_repo", "", "Another bert_jax checkout to measure side by side.")
flags.DEFINE_integer("repeats", 2, "Measurements per (checkout, depth), alternating.")
flags.DEFINE_list("layers", ["12", "24"], "Depths to compile.")
flags.DEFINE_string("output", "", "Also write the JSON lines here.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a fresh interpreter with the checkout on sys.path: one compile, one JSON line.
_WORKER = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, sys.argv[1])
from bert_jax import train
from configs import base
config = base.get_config()
config.model.num_hidden_layers = int(sys.argv[2])
config.model.dtype = "bfloat16"
config.train.batch_size = 32
config.train.eval_batch_size = 32
if sys.argv[3] != "-":
  config.model.remat = sys.argv[3]
report = train.compile_report(config)
# The train step's figures; checkouts before the TPU report (aot.py) named them without train_.
names = {"compile_seconds": "compile_seconds_train", "train_total_gib": "train_total_gib",
         "train_temporaries_gib": "train_temporaries_gib",
         "train_arguments_gib": "train_arguments_gib"}
print(json.dumps({k: report.get(new, report.get(new.replace("train_", ""), report.get(k)))
                  for k, new in names.items()}))
"""


def _measure(repo: str, layers: int, remat: str) -> dict:
  result = subprocess.run([sys.executable, "-c", _WORKER, repo, str(layers), remat],
                          capture_output=True, text=True, check=True)
  return json.loads(result.stdout.strip().splitlines()[-1])


def _remat_policies(repo: str) -> list[str]:
  """This checkout's remat policies, or ["-"] (the field's default / no such field)."""
  sys.path.insert(0, repo)
  from configs import base  # pylint: disable=g-import-not-at-top
  if "remat" not in base.get_config().model:
    return ["-"]
  from bert_jax.models import model  # pylint: disable=g-import-not-at-top
  return list(model.REMAT_POLICIES)


def main(argv):
  del argv
  f = flags.FLAGS
  checkouts = [("this", ROOT)] + ([("baseline", os.path.abspath(f.baseline_repo))]
                                  if f.baseline_repo else [])
  policies = {"this": _remat_policies(ROOT), "baseline": ["-"]}
  rows = []
  for repeat in range(f.repeats):
    for layers in (int(x) for x in f.layers):
      order = checkouts if repeat % 2 == 0 else checkouts[::-1]
      for name, repo in order:
        for remat in policies[name]:
          row = {"checkout": name, "layers": layers, "remat": remat, "repeat": repeat,
                 **_measure(repo, layers, remat)}
          rows.append(row)
          print(json.dumps(row), flush=True)
  if f.output:
    with open(f.output, "w") as out:
      out.writelines(json.dumps(r) + "\n" for r in rows)
  print("\n| checkout | remat | layers | compile s (median) | total GiB | temporaries GiB |")
  print("|---|---|---|---|---|---|")
  groups = {}
  for r in rows:
    groups.setdefault((r["checkout"], r["remat"], r["layers"]), []).append(r)
  for (name, remat, layers), group in groups.items():
    print(f"| {name} | {remat} | {layers} | "
          f"{statistics.median(g['compile_seconds'] for g in group):.1f} | "
          f"{group[0]['train_total_gib']:.2f} | {group[0]['train_temporaries_gib']:.2f} |")
  if f.baseline_repo:
    for layers in (int(x) for x in f.layers):
      base_s = statistics.median(g["compile_seconds"] for g in groups[("baseline", "-", layers)])
      for remat in policies["this"]:
        this_s = statistics.median(g["compile_seconds"] for g in groups[("this", remat, layers)])
        print(f"{layers} layers, remat {remat}: this / baseline compile time = "
              f"{this_s / base_s:.2f}")


if __name__ == "__main__":
  app.run(main)
