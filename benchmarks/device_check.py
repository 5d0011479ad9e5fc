r"""The accelerator check: bf16 train-step throughput of BERT-Base and BERT-Large, and a short
real-data run in bf16 vs float32. Run it through `benchmarks/device_check.sh` (one GPU, at most
8 minutes; `--dry_run`: the same code on the CPU with tiny shapes, under 2 minutes).

1. Throughput (section "throughput"): BERT-Base and BERT-Large (configs/base.py, large.py) at
   L=128 (P=20) and L=512 (P=80), bf16 compute with float32 params and optimizer state, attention
   dropout 0 so that attention takes `jax.nn.dot_product_attention` with implementation "cudnn"
   (fused) or "xla" (`config.model.attention_impl`), and BERT-Base L=128 once more with BERT's
   attention dropout 0.1 (the einsum path BERT's training takes), the trainer's own compiled
   step on a 1-device mesh. The batch fills the chip: a memory estimate picks it, XLA's memory
   analysis of the compiled step checks it (halved and recompiled when over 90% of the device),
   and a runtime out-of-memory halves it once more. Reported: tokens/s, MFU (model FLOPs of
   `bert_jax/models/flops.py` over the chip's dense bf16 peak in its table; --dry_run: over the
   CPU's measured f32 matmul peak), per-device memory (XLA's analysis), compile time.
2. Real data (section "real_data"): the built-in corpus (prepared in a background CPU process
   while section 1 runs), a small model trained 300 steps (--dry_run: 30) from the same seed in
   bfloat16 and in float32 compute; their held-out MLM losses must agree within 2%.

Every configuration runs inside its own try: a failure (out of memory, an implementation the
backend lacks) is recorded with its error and the check goes on. A time budget skips what no
longer fits. JSON lines go to benchmarks/results/device_check.jsonl (--dry_run:
device_check_dry_run.jsonl); a table is printed last. Exit status 1 when a configuration failed
or the losses disagree.

Run:
  bash benchmarks/device_check.sh              # on a GPU machine
  bash benchmarks/device_check.sh --dry_run    # anywhere (CPU), tiny shapes
"""

import argparse
import dataclasses
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
SPECIALS = dict(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)  # Synthetic rows' layout.


@dataclasses.dataclass(frozen=True)
class Shape:
  """One throughput configuration."""
  model: str  # "base" / "large" (configs/<model>.py), or "tiny" (--dry_run).
  seq_len: int  # L.
  predictions: int  # P: MLM targets per row (BERT: 20 at 128, 80 at 512).
  impl: str  # config.model.attention_impl.
  # Attention dropout: 0 takes `impl`; BERT's 0.1 takes the einsum path whatever `impl` says.
  attention_dropout: float = 0.0


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a mode runs: the shapes in priority order, and the real-data run's settings."""
  shapes: tuple[Shape, ...]
  max_tokens_per_step: int  # Cap on B x L (throughput no longer grows well before memory runs out).
  timed_seconds: float  # Wall time of timed steps per shape (at least 3 steps).
  real_steps: int  # Steps of each real-data run.
  real_model: dict[str, int]  # config.model overrides of the real-data run.
  real_seq_len: int
  real_batch: int
  builtin_max_mb: float  # Built-in corpus text used, MB.
  seconds_per_shape: dict[str, float]  # Rough cost of one shape (compile + run), by model.
  real_data_seconds: float  # Rough cost of the two real-data runs (kept in reserve).


def _with_bert_dropout(shapes: tuple[Shape, ...]) -> tuple[Shape, ...]:
  """Third, the first shape again with BERT's attention dropout 0.1 (the einsum path BERT's
  training takes), against the fused paths of the two before it."""
  bert = dataclasses.replace(shapes[0], impl="einsum", attention_dropout=0.1)
  return (*shapes[:2], bert, *shapes[2:])


GPU_PLAN = Plan(
    shapes=_with_bert_dropout(tuple(Shape(m, l, p, impl) for m, l, p in (
        ("base", 128, 20), ("large", 512, 80), ("base", 512, 80), ("large", 128, 20))
                                    for impl in ("cudnn", "xla"))),
    max_tokens_per_step=256 * 1024, timed_seconds=4.0, real_steps=300,
    real_model=dict(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=1024, max_position_embeddings=128),
    real_seq_len=128, real_batch=64, builtin_max_mb=8.0,
    seconds_per_shape={"base": 35.0, "large": 60.0}, real_data_seconds=100.0)
DRY_PLAN = Plan(
    shapes=_with_bert_dropout(tuple(Shape("tiny", l, p, impl) for l, p in ((32, 5), (64, 10))
                                    for impl in ("cudnn", "xla"))),
    max_tokens_per_step=256, timed_seconds=1.0, real_steps=30,
    real_model=dict(vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=256, max_position_embeddings=64),
    real_seq_len=64, real_batch=16, builtin_max_mb=0.3,
    seconds_per_shape={"tiny": 10.0}, real_data_seconds=40.0)
# The dry run's model: small, but BERT's vocabulary (30,522, padded to 30,592) and 2 heads.
TINY_MODEL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=256, max_position_embeddings=64)


class Stopped(BaseException):
  """SIGTERM (device_check.sh's hard time limit): stop measuring, report what was measured.
  A BaseException, so that the per-configuration `except Exception` does not swallow it."""


def _stop(signum, frame):
  del signum, frame
  raise Stopped()


# ------------------------------------------------------------------------------ configs


def shape_config(shape: Shape, batch: int):
  """The pretraining config of one throughput shape: bf16 compute, f32 params, attention dropout
  0 (the fused path), synthetic data, one device."""
  from configs import base, large  # pylint: disable=import-outside-toplevel
  config = (large if shape.model == "large" else base).get_config()
  if shape.model == "tiny":
    config.model.update(**TINY_MODEL)
  config.model.update(dtype="bfloat16", param_dtype="float32",
                      attention_probs_dropout_prob=shape.attention_dropout,
                      attention_impl=shape.impl)
  config.data.source = "synthetic"
  config.data.max_seq_length = shape.seq_len
  config.data.max_examples_per_row = 1
  config.masking.max_predictions_per_seq = shape.predictions
  config.train.batch_size = config.train.eval_batch_size = batch
  config.mesh.data = 1
  return config


def real_data_config(plan: Plan, dtype: str, impl: str, cache_dir: str):
  """The small model on the built-in corpus, `dtype` compute; the same seed for every dtype."""
  from configs import tiny  # pylint: disable=import-outside-toplevel
  config = tiny.get_config()
  config.model.update(**plan.real_model, dtype=dtype, attention_probs_dropout_prob=0.0,
                      attention_impl=impl)
  config.data.update(source="builtin", builtin_cache_dir=cache_dir,
                     max_seq_length=plan.real_seq_len, builtin_max_mb=plan.builtin_max_mb,
                     dupe_factor=1, validation_fraction=0.05,
                     max_examples_per_row=max(1, plan.real_seq_len // 32))
  config.masking.max_predictions_per_seq = round(0.15 * plan.real_seq_len) + 1
  config.train.update(batch_size=plan.real_batch, num_train_steps=plan.real_steps,
                      warmup_steps=plan.real_steps // 10, learning_rate=1e-3,
                      log_every_steps=max(plan.real_steps // 3, 1), eval_every_steps=0,
                      eval_batch_size=plan.real_batch, eval_max_batches=20)
  config.checkpoint.update(save_every_steps=10 * plan.real_steps, async_save=False)
  config.logging.tensorboard = False
  return config


# ------------------------------------------------------------------------------ throughput


def estimate_batch(config, shape: Shape, device_bytes: float | None, cap_tokens: int) -> int:
  """Sequences per step that should fill ~75% of the device: 16 bytes per parameter (f32
  params, grads, Adam moments) and, per sequence, Megatron's activation estimate
  L*H*(34 + 5*N*L/H) bytes per layer plus the [P, V'] f32 logits a few times over."""
  from bert_jax.models.model import BertConfig  # pylint: disable=import-outside-toplevel
  c = BertConfig.from_config(config.model)
  cap = max(cap_tokens // shape.seq_len, 1)
  if not device_bytes:
    return _round_batch(cap)
  params = 12 * c.hidden_size ** 2 * c.num_hidden_layers + c.padded_vocab_size * c.hidden_size
  per_layer = shape.seq_len * c.hidden_size * (
      34 + 5 * c.num_attention_heads * shape.seq_len / c.hidden_size)
  per_sequence = c.num_hidden_layers * per_layer + 4 * 4 * shape.predictions * c.padded_vocab_size
  fit = (0.75 * device_bytes - 16 * params) / per_sequence
  return _round_batch(min(cap, max(fit, 1)))


def _round_batch(batch: float) -> int:
  """Down to a multiple of 8 (of 1 below 8; at least 1)."""
  return max(int(batch), 1) if batch < 8 else int(batch) // 8 * 8


def synthetic_batch(batch: int, seq_len: int, vocab_size: int, seed: int = 0) -> dict:
  """Full rows of the batch contract, one example each ([CLS] A [SEP] B [SEP], no padding)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab_size, size=(batch, seq_len)).astype(np.int32)  # [B, L]
  split = seq_len // 2
  ids[:, 0], ids[:, split], ids[:, -1] = SPECIALS["cls_id"], SPECIALS["sep_id"], SPECIALS["sep_id"]
  types = np.zeros_like(ids)
  types[:, split + 1:] = 1
  ones = np.ones_like(ids)
  return {"input_ids": ids, "token_type_ids": types, "segment_ids": ones, "word_starts": ones,
          "position_ids": np.tile(np.arange(seq_len, dtype=np.int32), (batch, 1)),
          "cls_positions": np.zeros((batch, 1), np.int32),
          "next_sentence_label": rng.integers(0, 2, size=(batch, 1)).astype(np.int32),
          "nsp_weights": np.ones((batch, 1), np.float32)}


def _device_bytes(device) -> float | None:
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  return float(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def _is_oom(error: BaseException) -> bool:
  text = f"{type(error).__name__} {error}"
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def _compile(config, task, mesh, device_bytes: float | None):
  """(program, compiled step, XLA memory report, compile seconds), the batch halved while XLA's
  memory analysis says the step would not fit in 90% of the device."""
  from bert_jax.training import programs  # pylint: disable=import-outside-toplevel
  from bert_jax.training.settings import TrainSettings  # pylint: disable=import-outside-toplevel
  prog = programs.make_program(TrainSettings.from_config(config), task, mesh)
  while True:
    start = time.perf_counter()
    compiled = programs.compile_step(config.train.batch_size, task, mesh, prog,
                                     log=lambda message: None)
    seconds = time.perf_counter() - start
    memory = programs.memory_report(compiled)
    too_big = device_bytes and memory.get("total_gib", 0) * 2**30 > 0.9 * device_bytes
    if not too_big or config.train.batch_size <= 1:
      return prog, compiled, memory, seconds
    config.train.batch_size = config.train.eval_batch_size = config.train.batch_size // 2


def shape_name(shape: Shape) -> str:
  """model:L:attention, as --only names a shape."""
  return f"{shape.model}:{shape.seq_len}:{shape.impl}"


def select_shapes(shapes: tuple[Shape, ...], only: str) -> tuple[Shape, ...]:
  """The shapes --only names, in the plan's order; an unknown name is refused."""
  names = [name for name in only.split(",") if name]
  known = [shape_name(shape) for shape in shapes]
  unknown = [name for name in names if name not in known]
  if unknown:
    raise SystemExit(f"error: --only names unknown shapes {unknown}; known: {', '.join(known)}")
  return tuple(shape for shape in shapes if shape_name(shape) in names)


def run_shape(shape: Shape, plan: Plan, scale: float, peak: float, device) -> dict[str, Any]:
  """Compiles and times one shape at `scale` x the estimated batch; returns its row (raises on
  failure)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  from bert_jax.models import flops
  from bert_jax.training import sharding
  from bert_jax.models.model import BertConfig  # pylint: disable=import-outside-toplevel
  device_bytes = _device_bytes(device)
  config = shape_config(shape, 1)
  batch = _round_batch(scale * estimate_batch(config, shape, device_bytes,
                                              plan.max_tokens_per_step))
  config = shape_config(shape, batch)
  model_config = BertConfig.from_config(config.model)
  task = train.pretraining_task(config, model_config, None)
  mesh = sharding.make_mesh(config.mesh, [device])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    prog, compiled, memory, compile_s = _compile(config, task, mesh, device_bytes)
    batch = config.train.batch_size
    state = prog.init(jax.random.key(0))
    inputs = sharding.global_batch_from_local(
        synthetic_batch(batch, shape.seq_len, model_config.vocab_size), mesh)
    key = jax.random.key(1)
    for _ in range(2):  # Warm-up: first execution, allocations.
      state, metrics = compiled(state, inputs, key)
    jax.block_until_ready(metrics)
    timings = []
    for steps in (3, None):  # 3 steps estimate the step time; then ~timed_seconds of steps.
      steps = steps or max(3, round(plan.timed_seconds / timings[0]))
      start = time.perf_counter()
      for _ in range(steps):  # Dispatched back to back; one wait at the end.
        state, metrics = compiled(state, inputs, key)
      jax.block_until_ready(metrics)
      timings.append((time.perf_counter() - start) / steps)
    step_s = timings[-1]
    loss = float(metrics["loss"])
  del state, inputs, compiled, prog
  if loss != loss:
    raise FloatingPointError(f"loss is NaN after {steps + 5} steps")
  train_flops = batch * flops.train_flops_per_sequence(model_config, shape.seq_len,
                                                       shape.predictions)
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  peak_so_far = {"peak_gib_so_far": stats["peak_bytes_in_use"] / 2**30} if (
      stats and "peak_bytes_in_use" in stats) else {}  # The process's high-water mark.
  return {"batch": batch, "compile_s": compile_s, "step_s": step_s, "timed_steps": steps,
          "tokens_per_s": batch * shape.seq_len / step_s,
          "model_tflops_per_s": train_flops / step_s / 1e12, "mfu": train_flops / step_s / peak,
          "loss": loss, **{k: v for k, v in memory.items() if k.endswith("_gib")},
          **peak_so_far, "padded_vocab_size": model_config.padded_vocab_size}


def throughput(plan: Plan, deadline: float, peak: float, device, emit: Callable) -> str | None:
  """Section 1; returns the fastest attention implementation that ran, by mean tokens/s."""
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax.training import programs  # pylint: disable=import-outside-toplevel
  speeds: dict[str, list[float]] = {}
  for shape in plan.shapes:
    row = {"section": "throughput", **dataclasses.asdict(shape), "dtype": "bfloat16",
           "param_dtype": "float32"}
    left = deadline - time.time() - plan.real_data_seconds
    if shape.impl == "cudnn" and device.platform != "gpu":
      emit({**row, "status": "skipped", "error": f"cudnn needs an NVIDIA GPU (this is "
                                                 f"{device.platform})"})
      continue
    if left < plan.seconds_per_shape[shape.model]:
      emit({**row, "status": "skipped", "error": f"time budget ({left:.0f} s left)"})
      continue
    for attempt in range(2):  # A runtime out-of-memory halves the batch once.
      try:
        result = run_shape(shape, plan, 0.5 ** attempt, peak, device)
        emit({**row, "status": "ok", **result})
        if not shape.attention_dropout:  # The real-data run takes the fastest fused path.
          speeds.setdefault(shape.impl, []).append(result["tokens_per_s"])
        break
      except Exception as error:  # pylint: disable=broad-except
        if attempt == 0 and _is_oom(error):
          continue
        emit({**row, "status": "error", "error": f"{type(error).__name__}: {error}"[:2000],
              "traceback": traceback.format_exc()[-4000:]})
        break
      finally:
        programs.program.cache_clear()
        jax.clear_caches()
        gc.collect()
  if not speeds:
    return None
  return max(speeds, key=lambda impl: sum(speeds[impl]) / len(speeds[impl]))


# ------------------------------------------------------------------------------ real data


def start_preparation(plan: Plan, cache_dir: str, log_path: str) -> subprocess.Popen:
  """Prepares the built-in corpus in a background CPU process while section 1 runs."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  with open(log_path, "w") as log:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--prepare_only", cache_dir,
         *(["--dry_run"] if plan is DRY_PLAN else [])],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def prepare_only(plan: Plan, cache_dir: str) -> None:
  """The child of `start_preparation`."""
  from bert_jax.data import builtin, pipeline  # pylint: disable=import-outside-toplevel
  start = time.time()
  config = real_data_config(plan, "float32", "xla", cache_dir)
  prepared = builtin.ensure_builtin(cache_dir, builtin.BuiltinSettings.from_config(config))
  dataset_dir, meta = pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), cache_dir,
                                               prepared)
  print(json.dumps({"dataset_dir": dataset_dir, "seconds": time.time() - start,
                    "train_rows": meta["splits"]["train"]["rows"]}))


def real_data(plan: Plan, impl: str, cache_dir: str, preparation: subprocess.Popen,
              prep_log: str, deadline: float, emit: Callable,
              dtypes: tuple[str, ...] = ("bfloat16", "float32")) -> bool | None:
  """Section 2: bf16 vs f32 held-out MLM loss. -> agreement (None: not run)."""
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  row = {"section": "real_data", "steps": plan.real_steps, "attention_impl": impl,
         **plan.real_model, "seq_len": plan.real_seq_len, "batch": plan.real_batch}
  try:
    preparation.wait(timeout=max(deadline - time.time() - plan.real_data_seconds / 2, 1))
  except subprocess.TimeoutExpired:
    preparation.kill()
    emit({**row, "status": "skipped", "error": "corpus preparation did not finish in time"})
    return None
  with open(prep_log) as log:
    prep_output = log.read()
  if preparation.returncode != 0:
    emit({**row, "status": "error", "error": "corpus preparation failed: "
                                             + prep_output[-2000:]})
    return False
  losses = {}
  for dtype in dtypes:
    start = time.time()
    try:
      with tempfile.TemporaryDirectory(prefix=f"device_check_{dtype}_") as workdir:
        result = train.train_and_evaluate(real_data_config(plan, dtype, impl, cache_dir),
                                          workdir)
    except Exception as error:  # pylint: disable=broad-except
      emit({**row, "dtype": dtype, "status": "error",
            "error": f"{type(error).__name__}: {error}"[:2000],
            "traceback": traceback.format_exc()[-4000:]})
      return False
    validation = result["validation"]
    losses[dtype] = validation["mlm_loss"]
    emit({**row, "dtype": dtype, "status": "ok", "seconds": time.time() - start,
          "validation_mlm_loss": validation["mlm_loss"],
          "validation_mlm_accuracy": validation["mlm_accuracy"],
          "train_mlm_loss": result["train"]["mlm_loss"],
          "real_tokens_per_s": result["train"]["real_tokens_per_sec"],
          "input_wait_fraction": result["train"].get("input_wait_fraction")})
  difference = abs(losses["bfloat16"] - losses["float32"]) / losses["float32"]
  agree = difference <= 0.02
  emit({**row, "dtype": "bfloat16 vs float32", "status": "ok" if agree else "error",
        "relative_difference": difference, "agree_within_2pct": agree,
        **({} if agree else {"error": f"held-out MLM losses differ by {difference:.2%}"})})
  return agree


# ------------------------------------------------------------------------------ report


def print_table(rows: list[dict]) -> None:
  env = next(r for r in rows if r["section"] == "environment")
  print(f"\nDevice check on {env['device_kind']} ({env['backend']}), jax {env['jax']}; MFU over "
        f"{env['peak_tflops']:.1f} TFLOP/s ({env['peak_source']})")
  print("| model | L | attention | batch | status | tokens/s | MFU | GiB/device | compile s |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if r["section"] != "throughput":
      continue
    dropout = r.get("attention_dropout", 0.0)
    attention = f"{r['impl']}, attention dropout {dropout}" if dropout else r["impl"]
    if r["status"] != "ok":
      print(f"| {r['model']} | {r['seq_len']} | {attention} | - | {r['status']}: "
            f"{r['error'][:90]} | - | - | - | - |")
      continue
    print(f"| {r['model']} | {r['seq_len']} | {attention} | {r['batch']} | ok | "
          f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {r.get('total_gib', 0):.2f} | "
          f"{r['compile_s']:.1f} |")
  print("\n| real data | steps | held-out MLM loss | MLM accuracy | status |")
  print("|---|---|---|---|---|")
  for r in rows:
    if r["section"] != "real_data":
      continue
    if "relative_difference" in r:
      print(f"| bf16 vs f32 | {r['steps']} | differ by {r['relative_difference']:.2%} (<= 2%) | "
            f"- | {'agree' if r['agree_within_2pct'] else 'DISAGREE'} |")
    elif r["status"] == "ok":
      print(f"| {r['dtype']} | {r['steps']} | {r['validation_mlm_loss']:.4f} | "
            f"{r['validation_mlm_accuracy']:.3f} | ok |")
    else:
      print(f"| {r.get('dtype', '-')} | {r['steps']} | - | - | {r['status']}: "
            f"{r['error'][:90]} |")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--dry_run", action="store_true",
                      help="Tiny shapes on whatever backend there is (CPU): the same code paths.")
  parser.add_argument("--budget_s", type=float, default=0.0,
                      help="Wall-time budget; later sections are skipped past it (default: 440 "
                           "on a GPU, 100 with --dry_run).")
  parser.add_argument("--output", default="", help="JSON lines (default: benchmarks/results/"
                                                   "device_check[_dry_run].jsonl).")
  parser.add_argument("--only", default="",
                      help="Throughput shapes to run, comma-separated model:L:attention names "
                           "(e.g. base:128:cudnn,base:128:einsum); default: every shape.")
  parser.add_argument("--real_dtypes", default="bfloat16,float32",
                      help="The real-data runs' compute dtypes, in the order they run.")
  parser.add_argument("--prepare_only", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  sys.path.insert(0, REPO)
  plan = DRY_PLAN if args.dry_run else GPU_PLAN
  if args.only:
    plan = dataclasses.replace(plan, shapes=select_shapes(plan.shapes, args.only))
  if args.prepare_only:
    prepare_only(plan, args.prepare_only)
    return 0
  start = time.time()
  deadline = start + (args.budget_s or (100.0 if args.dry_run else 440.0))
  with tempfile.TemporaryDirectory(prefix="device_check_data_") as cache_dir:
    prep_log = os.path.join(cache_dir, "prepare.log")
    preparation = start_preparation(plan, cache_dir, prep_log)  # Before jax takes the GPU.
    try:
      return _check(args, plan, start, deadline, cache_dir, preparation, prep_log)
    finally:
      if preparation.poll() is None:
        preparation.kill()


def _check(args, plan: Plan, start: float, deadline: float, cache_dir: str,
           preparation: subprocess.Popen, prep_log: str) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax.models import flops  # pylint: disable=import-outside-toplevel
  try:  # Everything both sections import, checked before any device time is spent.
    importlib.import_module("bert_jax.train")
  except ImportError as error:
    raise SystemExit(f"bert_jax does not import here ({type(error).__name__}: {error}); bring "
                     "the missing packages as wheels: bash benchmarks/device_wheels.sh, then "
                     "carry runs/device_wheels (device_check.sh installs them)") from error
  device = jax.devices()[0]
  if device.platform != "gpu" and not args.dry_run:
    raise SystemExit(f"No GPU (jax sees {device.platform}: {device.device_kind}); run with "
                     "--dry_run to check the script on this machine")
  peak = flops.peak_flops_per_device(device.device_kind)
  peak_source = "the chip's dense bf16 peak (bert_jax/models/flops.py)"
  if peak is None:
    peak = flops.measure_matmul_peak()
    peak_source = "measured f32 matmul peak: no table entry for this device"
  output = args.output or os.path.join(
      RESULTS, "device_check_dry_run.jsonl" if args.dry_run else "device_check.jsonl")
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  rows: list[dict] = []
  with open(output, "w") as out:
    def emit(row: dict) -> None:
      rows.append(row)
      out.write(json.dumps(row) + "\n")
      out.flush()
      shown = {k: v for k, v in row.items() if k != "traceback"}
      print(json.dumps(shown), flush=True)

    emit({"section": "environment", "backend": device.platform, "device_kind": device.device_kind,
          "devices": jax.device_count(), "jax": jax.__version__, "peak_tflops": peak / 1e12,
          "peak_source": peak_source, "dry_run": args.dry_run,
          "device_bytes": _device_bytes(device)})
    fastest, agree, stopped = None, None, False
    signal.signal(signal.SIGTERM, _stop)
    try:
      fastest = throughput(plan, deadline, peak, device, emit)
      agree = real_data(plan, fastest or "xla", cache_dir, preparation, prep_log, deadline, emit,
                        tuple(args.real_dtypes.split(",")))
    except Stopped:
      stopped = True
    emit({"section": "summary", "seconds": time.time() - start, "fastest_attention": fastest,
          "losses_agree": agree, "stopped_by_time_limit": stopped})
  print_table(rows)
  print(f"\n{len(rows)} rows in {output}; {time.time() - start:.0f} s"
        + (" (stopped by the time limit)" if stopped else ""))
  failed = [r for r in rows if r.get("status") == "error"]
  return 124 if stopped else 1 if failed or agree is False else 0


if __name__ == "__main__":
  sys.exit(main())
