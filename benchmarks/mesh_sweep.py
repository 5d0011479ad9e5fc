r"""Compile-only sweep of the train step over simulated meshes (pod-scale shapes checked on paper).

For each (model, mesh) it runs what `launch/train.py --compile_only` runs
(`bert_jax.train.compile_report`: the mesh checks, then an AOT compile against abstract shapes;
nothing is allocated) on N forced CPU devices, and prints one JSON line: the per-device memory
and compile time, or the one-line error a user would see (e.g. 12 heads on tensor 8). With
--compile naming a subset, the others are only lowered (the mesh checks, every sharding
resolved against the mesh: where an indivisible dimension would fail; about 1 s instead of 10).

  --sizes=full: BERT-Base / BERT-Large as configured (configs/base.py, configs/large.py), bf16,
    L=128, global batch --batch (1024: the issue's pod-scale check; minutes per compile here).
  --sizes=reduced: the real head counts (12 / 16) and vocabulary (30,522), one layer, head size
    8, MLP 4x, L=32, batch 32: the same sharded dimensions for the divisibility of heads, MLP,
    vocabulary, hidden and batch, in seconds (tests/test_mesh_sweep.py runs this).

Run:
  .venv/bin/python benchmarks/mesh_sweep.py --sizes=reduced
  .venv/bin/python benchmarks/mesh_sweep.py --sizes=reduced --compile=large:1x4x8
  .venv/bin/python benchmarks/mesh_sweep.py --sizes=full --batch=1024 \
      --meshes=4x8x1,1x32x1,1x16x2,1x8x4,1x4x8 --output=benchmarks/results/mesh_sweep_full.jsonl
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (data, fsdp, tensor) meshes of 32 devices: fsdp only, data x fsdp, tensor 2 / 4 / 8 x fsdp.
DEFAULT_MESHES = "1x32x1,4x8x1,1x16x2,1x8x4,1x4x8"
MODELS = ("base", "large")


def parse_mesh(text: str) -> tuple[int, int, int]:
  """"4x8x1" -> (data, fsdp, tensor) = (4, 8, 1)."""
  sizes = tuple(int(x) for x in text.split("x"))
  if len(sizes) != 3:
    raise ValueError(f"--meshes entry {text!r}: expected DATAxFSDPxTENSOR, e.g. 4x8x1")
  return sizes


def sweep_config(model: str, sizes: str, mesh: tuple[int, int, int], batch: int):
  """The config of one compile: configs/base.py or large.py, bf16 compute, L=128 (full) or the
  reduced shape that keeps the head count and vocabulary."""
  from configs import base, large  # pylint: disable=import-outside-toplevel
  config = (base if model == "base" else large).get_config()
  config.model.dtype = "bfloat16"
  if sizes == "reduced":
    heads = config.model.num_attention_heads
    config.model.update(num_hidden_layers=1, hidden_size=8 * heads, intermediate_size=32 * heads,
                        max_position_embeddings=32)
    config.data.max_seq_length = 32
    config.masking.max_predictions_per_seq = 5
  config.data.source = "synthetic"
  config.train.batch_size = config.train.eval_batch_size = batch
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  return config


def lower_report(config) -> dict:
  """What `train.compile_report` does short of XLA's compile: the config and mesh checks, then
  the train step lowered with every sharding resolved against the mesh."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax import config_checks, train  # pylint: disable=import-outside-toplevel
  from bert_jax.training import programs, sharding
  from bert_jax.models.model import BertConfig  # pylint: disable=import-outside-toplevel
  from bert_jax.training.settings import TrainSettings  # pylint: disable=import-outside-toplevel
  config_checks.check_pretraining(config)
  task = train.pretraining_task(config, BertConfig.from_config(config.model), None)
  mesh = sharding.make_mesh(config.mesh)
  settings = TrainSettings.from_config(config)
  programs.check_mesh(settings, task.model_config, mesh)
  prog = programs.make_program(settings, task, mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    target = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                          prog.abstract_state, prog.state_shardings)
    prog.train_step.lower(target, programs.batch_spec(task, config.train.batch_size, mesh),
                          jax.random.key(0))
  return {}


def run_one(model: str, sizes: str, mesh: tuple[int, int, int], batch: int, compile_: bool,
            vocab_pad_multiple: int | None = None) -> dict:
  """One compile-only (or lower-only) report, or the error a user would read."""
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  config = sweep_config(model, sizes, mesh, batch)
  if vocab_pad_multiple is not None:
    config.model.vocab_pad_multiple = vocab_pad_multiple
  from provenance import commit  # pylint: disable=import-outside-toplevel
  row = {"commit": commit(), "model": model, "sizes": sizes, "mesh": "x".join(map(str, mesh)),
         "batch": batch,
         "vocab_pad_multiple": config.model.vocab_pad_multiple,
         "stage": "compiled" if compile_ else "lowered"}
  start = time.time()
  try:
    report = train.compile_report(config) if compile_ else lower_report(config)
  except ValueError as error:  # What launch/train.py prints as its one `error:` line.
    return {**row, "ok": False, "error": str(error), "seconds": time.time() - start}
  keep = ("compile_seconds_train", "train_arguments_gib", "train_temporaries_gib",
          "train_total_gib")
  return {**row, "ok": True, **{k: report[k] for k in keep if k in report},
          "seconds": time.time() - start}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", choices=("reduced", "full"), default="reduced")
  parser.add_argument("--models", default=",".join(MODELS), help="Comma-separated: base,large.")
  parser.add_argument("--meshes", default=DEFAULT_MESHES,
                      help="Comma-separated DATAxFSDPxTENSOR meshes; their product is the "
                           "number of forced CPU devices (all equal).")
  parser.add_argument("--compile", default="all",
                      help="MODEL:MESH pairs to compile, comma-separated (e.g. large:1x4x8); the "
                           "others are only lowered. 'all' (default): compile every one; 'none': "
                           "lower every one.")
  parser.add_argument("--vocab_pad_multiple", type=int, default=None,
                      help="Override config.model.vocab_pad_multiple (default: the config's 128).")
  parser.add_argument("--batch", type=int, default=0,
                      help="Global batch (default: 32 reduced, 1024 full).")
  parser.add_argument("--output", default="", help="Also write the JSON lines here.")
  args = parser.parse_args()
  meshes = [parse_mesh(m) for m in args.meshes.split(",")]
  devices = {m[0] * m[1] * m[2] for m in meshes}
  if len(devices) != 1:
    raise SystemExit(f"--meshes must all have the same number of devices, got {sorted(devices)}")
  # Before jax starts: the forced CPU device count.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_"
                             f"device_count={devices.pop()}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, REPO)
  batch = args.batch or (32 if args.sizes == "reduced" else 1024)
  rows = []
  for model in args.models.split(","):
    for mesh in meshes:
      compile_ = args.compile == "all" or f"{model}:{'x'.join(map(str, mesh))}" in (
          args.compile.split(","))
      rows.append(run_one(model, args.sizes, mesh, batch, compile_, args.vocab_pad_multiple))
      print(json.dumps(rows[-1]), flush=True)
  print("\n| model | mesh (data x fsdp x tensor) | result | per-device GiB | compile s |")
  print("|---|---|---|---|---|")
  for r in rows:
    result = ("compiles" if r["stage"] == "compiled" else "lowers") if r["ok"] else (
        f"error: {r['error']}")
    memory = f"{r['train_total_gib']:.3f}" if "train_total_gib" in r else "-"
    compile_s = f"{r['compile_seconds_train']:.1f}" if "compile_seconds_train" in r else "-"
    print(f"| {r['model']} | {r['mesh']} | {result} | {memory} | {compile_s} |")
  if args.output:
    with open(args.output, "w") as out:
      out.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
  main()
