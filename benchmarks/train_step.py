"""Train-step throughput: bert_jax vs transformers' PyTorch and Flax `BertForPreTraining`.

What is timed, per implementation, is one full optimizer step on a [B, L] batch: forward with
dropout 0.1 (train mode), MLM + NSP loss, backward, global-norm clipping (1.0) and AdamW.
  - bert_jax: the trainer's compiled step (`bert_jax.training.programs.make_program`) on a
    1-device mesh (masking inside the jitted step, P gathered MLM positions, state donated), run
    as the train loop runs it (AOT-compiled).
  - hf_torch: transformers' PyTorch `BertForPreTraining` built from a `BertConfig` (no download),
    `model(..., labels=, next_sentence_label=)` (logits at all L positions, labels -100 except at
    P positions: its real cost), `loss.backward()`, `clip_grad_norm_`, `torch.optim.AdamW`;
    2 threads. Masking is done once beforehand (free for it).
  - hf_flax: `FlaxBertForPreTraining` from transformers < 5, in its own venv
    (`--hf_flax_python`), with the same loss at all positions, `optax.adamw` behind
    `clip_by_global_norm`, jitted with the state donated. Masking done beforehand (free for it).
Each implementation runs in its own worker process (JSON commands over stdin/stdout), so the
three are measured alternately, in one run, on the same machine state: after compilation and a
warm-up step, every repetition times each worker (order rotated) for as many steps as fill
`--seconds_per_rep`; the tables give medians. The bert_jax worker also measures the f32 matmul
peak (`bert_jax.models.flops.measure_matmul_peak`) in every repetition; MFU is achieved FLOP/s over
its median. Each row also records the process CPU seconds per step (less sensitive to other load on
the machine than wall time, for comparing bert_jax variants; not across implementations: torch's
OpenMP threads spin) and the load average: on a shared machine, rerun when it is above ~1.5.
FLOPs (`bert_jax/models/flops.py`, bidirectional attention): "useful" = the work BERT pretraining
needs (MLM head at the P targets); "actual" = the work the implementation does (HF: the vocabulary
projection at all L positions).
Compile: lower + compile (JAX), first step (PyTorch, eager). Peak RSS: the worker's high-water
mark (setup, compile and the timed steps).

Shapes are size:B:L, or size:B:L:K with K examples packed per bert_jax row (the peers get full
rows); sizes tiny, small and base; `--vocab_size` sets every model's vocabulary (default
30522). Other bert_jax trees join the same run as extra workers: `--checkouts=label=path,...`
(e.g. git worktrees of older commits: the step bisect in benchmarks/README.md) and
`--variants=label=section.field:value+...` (this tree with config overrides, e.g.
noremat=model.remat:none), each timed as bert_jax@<label>.

Suites: `compare` (the three side by side: small and base at B=8 L=128, base at B=8 L=512),
`scaling` (bert_jax alone over L and B), `all` (both). The last run's JSON lines are written to
`benchmarks/results/train_step.jsonl`.

Run (the HF Flax venv, anywhere: python3.11 -m venv <hf4-venv> && <hf4-venv>/bin/pip install
"jax==0.10.2" "flax==0.12.8" "optax==0.2.8" "transformers==4.57.*"):
  .venv/bin/python benchmarks/train_step.py --suite=all --hf_flax_python=<hf4-venv>/bin/python
  .venv/bin/python benchmarks/train_step.py --suite=compare --shapes=base:8:128 --reps=7
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import provenance  # benchmarks/ (this script's folder, first on sys.path)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results", "train_step.jsonl")

# Model sizes (HuggingFace BertConfig fields); dropout 0.1 everywhere (train mode).
MODELS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                  intermediate_size=1024),
}
COMMON = dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, hidden_act="gelu")
PAD, CLS, SEP, MASK = 0, 2, 3, 4  # sentencepiece layout (WORKSPACE.md); ids >= 5 are words.
COMPARE_SHAPES = ("small:8:128", "base:8:128", "base:8:512")
SCALING_SHAPES = ("small:4:128", "small:8:128", "small:16:128", "small:8:256", "small:4:512",
                  "small:8:512", "small:16:512", "base:8:128", "base:16:128", "base:8:512")


def num_predictions(length: int) -> int:
  """P: BERT's max_predictions_per_seq, 20 at L=128 and 80 at L=512 (0.15 * L, rounded up)."""
  return {128: 20, 256: 40, 512: 80}.get(length, -(-length * 15 // 100))


# ------------------------------------------------------------------------------------ workers
def make_batch(batch: int, length: int, predictions: int, seed: int = 0,
               vocab_size: int = COMMON["vocab_size"]) -> dict:
  """[CLS] A [SEP] B [SEP] rows (no padding) plus HF-style MLM labels at `predictions` random
  positions per row (-100 elsewhere; 80% of the targets replaced by [MASK] in `masked_ids`)."""
  import numpy as np
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab_size, size=(batch, length)).astype(np.int32)  # [B, L]
  split = length // 2
  ids[:, 0], ids[:, split], ids[:, -1] = CLS, SEP, SEP
  types = np.zeros_like(ids)
  types[:, split + 1:] = 1
  labels = np.full_like(ids, -100)
  masked_ids = ids.copy()
  candidates = np.array([i for i in range(length) if i not in (0, split, length - 1)])
  for row in range(batch):
    chosen = rng.choice(candidates, predictions, replace=False)
    labels[row, chosen] = ids[row, chosen]
    masked_ids[row, chosen[: int(0.8 * predictions)]] = MASK
  return {"input_ids": ids, "masked_ids": masked_ids, "token_type_ids": types,
          "attention_mask": np.ones_like(ids), "word_starts": np.ones_like(ids),
          "labels": labels, "next_sentence_label": (np.arange(batch) % 2).astype(np.int32)}


def packed_rows(batch: int, length: int, examples: int, vocab_size: int, seed: int = 0) -> dict:
  """bert_jax's batch contract with `examples` (K) examples packed in each row, each [CLS] A
  [SEP] B [SEP] of L / K tokens (the last takes the rest; no padding): segment ids 1..K,
  positions restarting at each [CLS], one NSP slot per example."""
  import numpy as np
  rng = np.random.default_rng(seed)
  size = length // examples
  starts = np.arange(examples) * size  # [K]
  ends = np.append(starts[1:], length)  # [K]
  ids = rng.integers(5, vocab_size, size=(batch, length)).astype(np.int32)  # [B, L]
  types, segments, positions = (np.zeros((batch, length), np.int32) for _ in range(3))
  for k, (start, end) in enumerate(zip(starts, ends)):
    split = start + (end - start) // 2
    ids[:, start], ids[:, split], ids[:, end - 1] = CLS, SEP, SEP
    types[:, split + 1:end] = 1
    segments[:, start:end] = k + 1
    positions[:, start:end] = np.arange(end - start)
  return {"input_ids": ids, "token_type_ids": types, "segment_ids": segments,
          "word_starts": np.ones_like(ids), "position_ids": positions,
          "cls_positions": np.tile(starts.astype(np.int32), (batch, 1)),
          "next_sentence_label": rng.integers(0, 2, size=(batch, examples)).astype(np.int32),
          "nsp_weights": np.ones((batch, examples), np.float32)}


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB.


class BertJaxWorker:
  """bert_jax's train step exactly as `bert_jax.train` builds and runs it, on one device."""

  def setup(self, model: dict, batch: int, length: int, predictions: int,
            examples: int = 1) -> dict:
    # --checkouts: another checkout's bert_jax and configs (this file's worker code).
    sys.path.insert(0, os.environ.get("BERT_JAX_REPO", REPO))
    import flax.linen as nn
    import jax
    import numpy as np
    from bert_jax.training import sharding
    try:
      from bert_jax.training import programs
    except ImportError:  # Before 7342f76 the trainer compiled the programs.
      from bert_jax.training import trainer as programs
    from bert_jax.objectives.masking import MaskingConfig
    from bert_jax.models.model import BertConfig
    from bert_jax.tasks import PretrainingTask
    from configs import base
    self.jax = jax
    config = base.get_config()
    for name, value in {**COMMON, **model}.items():
      config.model[name] = value
    config.train.batch_size = batch
    config.data.max_seq_length = length
    config.masking.max_predictions_per_seq = predictions
    config.mesh.data = 1
    # --variants: config overrides of this worker ("model.remat": "none", ...).
    for path, value in json.loads(os.environ.get("BERT_JAX_OVERRIDES", "{}")).items():
      section, _, name = path.partition(".")
      config[section][name] = value
    model_config = BertConfig.from_config(config.model)
    masking = MaskingConfig.from_config(config.masking, vocab_size=config.model.vocab_size,
                                        mask_token_id=MASK,
                                        special_token_ids=(PAD, 1, CLS, SEP, MASK), unk_token_id=1)
    # The batch contract: K examples per row, no padding (every slot is a real token).
    host = packed_rows(batch, length, examples, config.model.vocab_size)
    task = PretrainingTask(model_config, masking, length, examples)
    try:
      from bert_jax.training.settings import TrainSettings
      run_settings = TrainSettings.from_config(config)
    except ImportError:  # Before the typed settings the programs read the ConfigDict.
      run_settings = config
    self.mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
      program = programs.make_program(run_settings, task, self.mesh)
      self.state = program.init(jax.random.key(0))
      self.batch = sharding.global_batch_from_local(host, self.mesh)
      self.key = jax.random.key(1)
      start = time.perf_counter()
      self.step = program.train_step.lower(self.state, self.batch, self.key).compile()
      compile_s = time.perf_counter() - start
    cost = self.step.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    self.run(1)  # The first execution (allocations, thread pools) is not timed.
    return {"compile_s": compile_s, "xla_flops": float((cost or {}).get("flops", 0.0)),
            "versions": f"jax {jax.__version__}"}

  def run(self, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch, self.key)
    loss = float(metrics["loss"])  # Blocks on the last step.
    if loss != loss:
      raise FloatingPointError("bert_jax loss is NaN")
    return (time.perf_counter() - start) / steps

  def peak(self) -> float:
    from bert_jax.models import flops
    return flops.measure_matmul_peak()


class HfTorchWorker:
  """transformers' PyTorch BertForPreTraining: train mode, loss.backward(), clip, AdamW."""

  def setup(self, model: dict, batch: int, length: int, predictions: int,
            examples: int = 1) -> dict:
    del examples  # Fed full rows of one sequence (run_mlm's grouped text).
    import torch
    import transformers
    torch.set_num_threads(2)
    torch.manual_seed(0)
    self.torch = torch
    self.model = transformers.BertForPreTraining(transformers.BertConfig(**{**COMMON, **model}))
    self.model.train()
    decay = [p for n, p in self.model.named_parameters() if not n.endswith("bias")
             and "LayerNorm" not in n]
    no_decay = [p for n, p in self.model.named_parameters() if n.endswith("bias")
                or "LayerNorm" in n]
    self.optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.999), eps=1e-6)
    host = make_batch(batch, length, predictions, vocab_size=model['vocab_size'])
    self.inputs = dict(
        input_ids=torch.tensor(host["masked_ids"], dtype=torch.long),
        token_type_ids=torch.tensor(host["token_type_ids"], dtype=torch.long),
        attention_mask=torch.tensor(host["attention_mask"], dtype=torch.long),
        labels=torch.tensor(host["labels"], dtype=torch.long),
        next_sentence_label=torch.tensor(host["next_sentence_label"], dtype=torch.long))
    start = time.perf_counter()
    self.run(1)
    return {"compile_s": time.perf_counter() - start,  # Eager: the first step.
            "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, "
                        f"attn {self.model.config._attn_implementation}"}

  def run(self, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
      loss = self.model(**self.inputs).loss
      loss.backward()
      self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.optimizer.step()
      self.optimizer.zero_grad(set_to_none=True)
    if not bool(self.torch.isfinite(loss)):
      raise FloatingPointError("hf_torch loss is not finite")
    return (time.perf_counter() - start) / steps

  def peak(self) -> float:
    torch = self.torch
    a = torch.ones(1024, 1024)
    best = float("inf")
    for _ in range(10):
      start = time.perf_counter()
      a @ a
      best = min(best, time.perf_counter() - start)
    return 2 * 1024 ** 3 / best


class HfFlaxWorker:
  """FlaxBertForPreTraining (transformers < 5): jitted step, dropout rng per step, optax AdamW."""

  def setup(self, model: dict, batch: int, length: int, predictions: int,
            examples: int = 1) -> dict:
    del examples  # Fed full rows of one sequence.
    import jax
    import jax.numpy as jnp
    import optax
    import transformers
    self.jax = jax
    hf = transformers.FlaxBertForPreTraining(transformers.BertConfig(**{**COMMON, **model}), seed=0)

    def decay_mask(params):
      return jax.tree_util.tree_map_with_path(
          lambda path, _: path[-1].key in ("kernel", "embedding"), params)

    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=decay_mask))

    def train_step(state, batch, rng):
      params, opt_state, step = state
      dropout_rng = jax.random.fold_in(rng, step)

      def loss_fn(params):
        out = hf(batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"], params=params,
                 dropout_rng=dropout_rng, train=True)
        labels = batch["labels"]  # [B, L], -100 where no target.
        valid = (labels >= 0).astype(jnp.float32)
        nll = optax.softmax_cross_entropy_with_integer_labels(
            out.prediction_logits, jnp.maximum(labels, 0))  # [B, L]; logits at all L.
        mlm = jnp.sum(nll * valid) / jnp.maximum(jnp.sum(valid), 1.0)
        nsp = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
            out.seq_relationship_logits, batch["next_sentence_label"]))
        return mlm + nsp

      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state, step + 1), loss

    host = make_batch(batch, length, predictions, vocab_size=model['vocab_size'])
    self.batch = {"input_ids": jnp.asarray(host["masked_ids"]),
                  **{k: jnp.asarray(host[k]) for k in ("token_type_ids", "attention_mask",
                                                       "labels", "next_sentence_label")}}
    self.state = (hf.params, optimizer.init(hf.params), jnp.zeros((), jnp.int32))
    self.key = jax.random.key(1)
    start = time.perf_counter()
    self.step = jax.jit(train_step, donate_argnums=0).lower(
        self.state, self.batch, self.key).compile()
    compile_s = time.perf_counter() - start
    self.run(1)
    return {"compile_s": compile_s,
            "versions": f"jax {jax.__version__}, transformers {transformers.__version__}"}

  def run(self, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
      self.state, loss = self.step(self.state, self.batch, self.key)
    loss = float(loss)
    if loss != loss:
      raise FloatingPointError("hf_flax loss is NaN")
    return (time.perf_counter() - start) / steps

  def peak(self) -> float:
    import jax
    import jax.numpy as jnp
    a = jnp.ones((1024, 1024), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(10):
      start = time.perf_counter()
      matmul(a).block_until_ready()
      best = min(best, time.perf_counter() - start)
    return 2 * 1024 ** 3 / best


WORKERS = {"bert_jax": BertJaxWorker, "hf_torch": HfTorchWorker, "hf_flax": HfFlaxWorker}


def serve(kind: str) -> None:
  """Worker loop: one JSON command per stdin line, one JSON reply per line on the real stdout
  (library prints go to stderr)."""
  reply_to = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
  sys.stdout = sys.stderr
  worker = WORKERS[kind]()
  for line in sys.stdin:
    command = json.loads(line)
    op = command.pop("op")
    try:
      if op == "setup":
        result = worker.setup(**command)
      elif op == "run":
        cpu_start = time.process_time()
        result = {"seconds": worker.run(command["steps"])}
        result["cpu_seconds"] = (time.process_time() - cpu_start) / command["steps"]
      elif op == "peak":
        result = {"flops": worker.peak()}
      elif op == "exit":
        return
      else:
        raise ValueError(f"unknown op {op!r}")
      result["peak_rss_mb"] = peak_rss_mb()
    except Exception as error:  # Reported to the controller, which stops.
      result = {"error": f"{type(error).__name__}: {error}"}
    reply_to.write(json.dumps(result) + "\n")


# ------------------------------------------------------------------------------------ controller
class Worker:
  """Controller side of one worker process."""

  def __init__(self, kind: str, python: str, env: dict | None = None, script: str = __file__):
    """`script --worker=<kind>` serves the worker (this file's by default)."""
    self.kind = kind
    self.process = subprocess.Popen(
        [python, os.path.abspath(script), f"--worker={kind.split('@')[0]}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, bufsize=1, cwd=REPO,
        env={**os.environ, **(env or {})})

  def call(self, op: str, **kwargs) -> dict:
    self.process.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
    line = self.process.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.kind} worker exited (code {self.process.wait()})")
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(f"{self.kind} worker: {reply['error']}")
    return reply

  def close(self) -> None:
    try:
      self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
      self.process.stdin.close()
    except BrokenPipeError:
      pass
    self.process.wait(timeout=60)


def parse_shape(text: str) -> tuple[str, int, int, int]:
  """size:B:L[:K] -> (size, B, L, K); K (default 1): examples packed per bert_jax row."""
  size, batch, length, *packed = text.split(":")
  return size, int(batch), int(length), int(packed[0]) if packed else 1


def flops_per_step(size: str, batch: int, length: int, predictions: int,
                   vocab_size: int) -> float:
  sys.path.insert(0, REPO)
  from bert_jax.models import flops
  from bert_jax.models.model import BertConfig
  config = BertConfig(**{**COMMON, **MODELS[size], "vocab_size": vocab_size})
  return batch * flops.train_flops_per_sequence(config, length, predictions)


def measure(shape: str, kinds: list[str], pythons: dict[str, str], reps: int,
            seconds_per_rep: float, env: dict, vocab_size: int) -> list[dict]:
  """Sets up one worker per kind on `shape`, then times them alternately; one row per kind.
  Each worker runs as many steps per repetition as fill `seconds_per_rep` (at least one)."""
  size, batch, length, examples = parse_shape(shape)
  predictions = num_predictions(length)
  workers = {kind: Worker(kind, pythons[kind.split("@")[0]],
                          {**env, **WORKER_ENVS.get(kind, {})} if kind.startswith("bert_jax")
                          else None)
             for kind in kinds}
  model = {**MODELS[size], "vocab_size": vocab_size}
  try:
    setups = {kind: w.call("setup", model=model, batch=batch, length=length,
                           predictions=predictions, examples=examples)
              for kind, w in workers.items()}
    steps = {kind: max(1, round(seconds_per_rep / w.call("run", steps=1)["seconds"]))
             for kind, w in workers.items()}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu_times: dict[str, list[float]] = {kind: [] for kind in kinds}
    peaks: list[float] = []
    order = list(kinds)
    for rep in range(reps):
      for kind in order[rep % len(order):] + order[:rep % len(order)]:
        result = workers[kind].call("run", steps=steps[kind])
        times[kind].append(result["seconds"])
        cpu_times[kind].append(result["cpu_seconds"])
      if "bert_jax" in workers:
        peaks.append(workers["bert_jax"].call("peak")["flops"])
    rss = {kind: w.call("peak")["peak_rss_mb"] for kind, w in workers.items()}
  finally:
    for w in workers.values():
      w.close()
  peak = statistics.median(peaks) if peaks else float("nan")
  useful = flops_per_step(size, batch, length, predictions, vocab_size)
  rows = []
  for kind in kinds:
    seconds = statistics.median(times[kind])
    # HF computes the MLM head at all L positions; bert_jax at the P targets.
    actual = (useful if kind.startswith("bert_jax")
              else flops_per_step(size, batch, length, length, vocab_size))
    rows.append({
        "benchmark": "train_step", "impl": kind, "model": size, "batch": batch,
        "length": length, "examples_per_row": examples if kind.startswith("bert_jax") else 1,
        "vocab_size": vocab_size, "predictions": predictions, "reps": reps,
        "steps_per_rep": steps[kind], "step_s": round(seconds, 4),
        "step_s_all": [round(t, 4) for t in times[kind]],
        "cpu_s_per_step": round(statistics.median(cpu_times[kind]), 3),
        "tokens_per_s": round(batch * length / seconds, 1),
        "useful_gflop_per_step": round(useful / 1e9, 2),
        "actual_gflop_per_step": round(actual / 1e9, 2),
        "useful_gflops": round(useful / seconds / 1e9, 1),
        "actual_gflops": round(actual / seconds / 1e9, 1),
        "peak_gflops": round(peak / 1e9, 1),
        "useful_mfu": round(useful / seconds / peak, 3),
        "actual_mfu": round(actual / seconds / peak, 3),
        "compile_s": round(setups[kind]["compile_s"], 1),
        "peak_rss_mb": round(rss[kind]),
        "xla_gflop_per_step": round(setups[kind].get("xla_flops", 0.0) / 1e9, 2) or None,
        "versions": setups[kind]["versions"],
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "xla_flags": env.get("XLA_FLAGS", "") if kind == "bert_jax" else None,
    })
  return rows


# The extra bert_jax workers, "bert_jax@<label>" -> their environment: another checkout's path
# (--checkouts) or config overrides (--variants).
WORKER_ENVS: dict[str, dict[str, str]] = {}


def parse_checkouts(text: str) -> dict[str, dict[str, str]]:
  """"label=path,..." -> {"bert_jax@label": env}; each path a checkout with bert_jax/."""
  envs = {}
  for item in filter(None, text.split(",")):
    label, _, path = item.partition("=")
    if not label or not os.path.isdir(os.path.join(path, "bert_jax")):
      raise SystemExit(f"--checkouts: {item!r} is not a label=path of a bert_jax checkout")
    envs[f"bert_jax@{label}"] = {"BERT_JAX_REPO": os.path.abspath(path)}
  return envs


def parse_variants(text: str) -> dict[str, dict[str, str]]:
  """"label=section.field:value+...,..." -> {"bert_jax@label": env}; values read as JSON
  when they parse (numbers, true/false), else as strings."""
  envs = {}
  for item in filter(None, text.split(",")):
    label, _, settings = item.partition("=")
    overrides = {}
    for setting in filter(None, settings.split("+")):
      path, _, value = setting.partition(":")
      if "." not in path or not value:
        raise SystemExit(f"--variants: {setting!r} is not section.field:value")
      try:
        overrides[path] = json.loads(value)
      except json.JSONDecodeError:
        overrides[path] = value
    envs[f"bert_jax@{label}"] = {"BERT_JAX_OVERRIDES": json.dumps(overrides)}
  return envs


def print_compare(rows: list[dict]) -> None:
  print(f"\n{'shape':16s} {'impl':18s} {'tok/s':>8s} {'step s':>7s} {'vs torch':>8s} "
        f"{'vs flax':>8s} {'useful GF/s':>11s} {'MFU':>6s} {'actual MFU':>10s} "
        f"{'compile s':>9s} {'RSS MB':>7s}")
  for row in rows:
    peers = {r["impl"]: r for r in rows if (r["model"], r["batch"], r["length"])
             == (row["model"], row["batch"], row["length"])}
    ratio = lambda peer: (f"{row['tokens_per_s'] / peers[peer]['tokens_per_s']:.2f}x"
                          if peer in peers else "-")
    shape = f"{row['model']} {row['batch']}x{row['length']}"
    print(f"{shape:16s} {row['impl']:18s} {row['tokens_per_s']:8.0f} {row['step_s']:7.3f} "
          f"{ratio('hf_torch'):>8s} {ratio('hf_flax'):>8s} {row['useful_gflops']:11.1f} "
          f"{row['useful_mfu']:6.1%} {row['actual_mfu']:10.1%} {row['compile_s']:9.1f} "
          f"{row['peak_rss_mb']:7d}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
  parser.add_argument("--suite", choices=("compare", "scaling", "all"), default="compare")
  parser.add_argument("--shapes", default="", help="comma list of size:B:L (default per suite)")
  parser.add_argument("--impls", default="bert_jax,hf_torch,hf_flax")
  parser.add_argument("--hf_flax_python", default="",
                      help="python of a venv with transformers<5 (FlaxBertForPreTraining)")
  parser.add_argument("--reps", type=int, default=5, help="alternating repetitions")
  parser.add_argument("--seconds_per_rep", type=float, default=3.0,
                      help="steps per repetition: as many as fill this (at least one)")
  parser.add_argument("--xla_flags", default=None,
                      help="XLA_FLAGS for the bert_jax worker (default: the environment's)")
  parser.add_argument("--checkouts", default="",
                      help="label=path,...: other checkouts (e.g. git worktrees of older "
                           "commits) timed as bert_jax@<label>, side by side with the rest")
  parser.add_argument("--variants", default="",
                      help="label=section.field:value+...,...: this checkout with config "
                           "overrides, timed as bert_jax@<label> (e.g. noremat=model.remat:none)")
  parser.add_argument("--vocab_size", type=int, default=COMMON["vocab_size"],
                      help="vocabulary of every model (the issue's settings: 8000)")
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()
  if args.worker:
    serve(args.worker)
    return
  WORKER_ENVS.update(parse_checkouts(args.checkouts))
  WORKER_ENVS.update(parse_variants(args.variants))

  env = {} if args.xla_flags is None else {"XLA_FLAGS": args.xla_flags}
  pythons = {"bert_jax": sys.executable, "hf_torch": sys.executable,
             "hf_flax": args.hf_flax_python}
  kinds = [k for k in args.impls.split(",") if k] + list(WORKER_ENVS)
  if "hf_flax" in kinds and not os.path.exists(args.hf_flax_python):
    print(f"{args.hf_flax_python} not found: hf_flax skipped (see the docstring for its venv)")
    kinds.remove("hf_flax")
  machine = provenance.machine()
  print(f"{machine}; load {os.getloadavg()[0]:.1f}")
  rows = []
  if args.suite in ("compare", "all"):
    for shape in (args.shapes.split(",") if args.shapes else COMPARE_SHAPES):
      rows += measure(shape, kinds, pythons, args.reps, args.seconds_per_rep, env,
                      args.vocab_size)
      print_compare(rows)
  if args.suite in ("scaling", "all"):
    scaling = []
    for shape in (args.shapes.split(",") if args.shapes and args.suite == "scaling"
                  else SCALING_SHAPES):
      scaling += measure(shape, ["bert_jax"], pythons, max(3, args.reps - 2),
                         args.seconds_per_rep, env, args.vocab_size)
      print_compare(scaling)
    for row in scaling:
      row["benchmark"] = "train_step_scaling"
    rows += scaling
  for row in rows:
    row["machine"] = machine
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "w") as f:
    for row in rows:
      line = json.dumps(row)
      print(line)
      f.write(line + "\n")


if __name__ == "__main__":
  main()
