r"""Why the small model's bfloat16 step was slower than float32 on a GPU: the embedding lookup.

device_check.sh's real-data run (4 layers, width 256, V=8192, B=64, L=128) trained at 135k real
tokens/s in bf16 against 700k in f32 on an H200. The cause was the lookup of nn.Embed in the
compute dtype: its gradient is a bfloat16 scatter-add of every token's row into the table, many
tokens into a few rows ([CLS], [SEP], the 2 segment rows), which the GPU serialises.
`model.Embeddings` now looks rows up in the params' dtype and casts (same values; the
scatter-add stays float32). This script times the train step of that model on synthetic rows
with the lookup as it was ("compute_dtype", restored here by a patch) and as it is ("param_dtype"),
in f32 and bf16, one process, back to back.

Run (a GPU; the device tool: carry runs/device_wheels and this file):
  site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site \
      runs/device_wheels/*.whl && PYTHONPATH=$site python3 benchmarks/gpu_bf16_lookup.py
Rows go to benchmarks/results/gpu_bf16_lookup.jsonl (or $OUT when set).
"""

import json
import os
import sys
import time

import flax.linen as nn
import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import device_check  # pylint: disable=wrong-import-position
from bert_jax import train  # pylint: disable=wrong-import-position
from bert_jax.models import model
from bert_jax.training import programs, sharding
from bert_jax.training.settings import TrainSettings

PARAM_DTYPE_CALL = model.Embeddings.__call__


def compute_dtype_call(self, input_ids, token_type_ids, position_ids, deterministic):
  """The lookup before 2026-12-04: nn.Embed in the compute dtype (a bf16 table, bf16 scatter)."""
  c = self.config
  x = self.word_embeddings(input_ids)
  if c.type_vocab_size:
    x = x + self.token_type_embeddings(token_type_ids)
  x = self.positions(x, position_ids)
  return model._dropout(self, self.norm(x), c.hidden_dropout_prob, deterministic)  # pylint: disable=protected-access


def time_step(dtype: str, lookup: str, remat: str, batch: int = 64, steps: int = 50) -> dict:
  model.Embeddings.__call__ = PARAM_DTYPE_CALL if lookup == "param_dtype" else compute_dtype_call
  config = device_check.real_data_config(device_check.GPU_PLAN, dtype, "xla", "/tmp/unused")
  config.data.update(source="synthetic", max_examples_per_row=1)
  config.model.remat = remat
  config.train.batch_size = config.train.eval_batch_size = batch
  model_config = model.BertConfig.from_config(config.model)
  task = train.pretraining_task(config, model_config, None)
  mesh = sharding.make_mesh(config.mesh, [jax.devices()[0]])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    prog = programs.make_program(TrainSettings.from_config(config), task, mesh)
    start = time.time()
    compiled = programs.compile_step(batch, task, mesh, prog, log=lambda message: None)
    compile_s = time.time() - start
    state = prog.init(jax.random.key(0))
    inputs = sharding.global_batch_from_local(
        device_check.synthetic_batch(batch, 128, model_config.vocab_size), mesh)
    key = jax.random.key(1)
    for _ in range(3):
      state, metrics = compiled(state, inputs, key)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = compiled(state, inputs, key)
    jax.block_until_ready(metrics)
    step_s = (time.perf_counter() - start) / steps
  programs.program.cache_clear()
  jax.clear_caches()
  return {"dtype": dtype, "lookup": lookup, "remat": remat, "batch": batch,
          "step_ms": step_s * 1e3, "tokens_per_s": batch * 128 / step_s, "compile_s": compile_s,
          "device": jax.devices()[0].device_kind, "jax": jax.__version__}


def main() -> None:
  out_dir = os.environ.get("OUT") or os.path.join(ROOT, "benchmarks", "results")
  path = os.path.join(out_dir, "gpu_bf16_lookup.jsonl")
  for dtype, lookup, remat in (("float32", "compute_dtype", "dots"),
                               ("bfloat16", "compute_dtype", "dots"),
                               ("bfloat16", "param_dtype", "dots"),
                               ("bfloat16", "param_dtype", "none")):
    row = time_step(dtype, lookup, remat)
    print(json.dumps(row), flush=True)
    with open(path, "a") as f:
      f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
