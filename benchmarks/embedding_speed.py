r"""Embedding training speed: bert_jax's embedding task (packed and one text per row) against
sentence-transformers' MultipleNegativesRankingLoss training in PyTorch, side by side in one run,
on the same (query, positive) pairs, encoder, tokenizer and batch size.

The pairs are the offline retrieval suite's training pairs (`bert_jax/data/local_retrieval.py`:
numpy's and scipy's function summaries and their parameter descriptions), their sentencepiece
vocabulary (8000 BPE pieces) trained on them. One bert_jax run of one step from random init is
exported with `launch/convert.py --to_sentence_transformers`, and both sides start from it.

  - bert_jax: `finetune.finetune_and_evaluate` (the driver a user runs: its prefetch, packing on
    the host, logging) for --warmup_steps + --steps steps, logged every step; the rate is over
    the last --steps (metrics.jsonl's `steps_per_sec`, `real_tokens_per_sec`), less a step that
    compiled a new bucket of packed rows. With config.embedding.pack on and off.
  - sentence-transformers: `SentenceTransformer(export)`, `MultipleNegativesRankingLoss` (scale
    20), AdamW at the same learning rate, a loop of tokenize (dynamic padding to the batch's
    longest text, sentence-transformers' own) -> loss -> backward -> step over the same pairs,
    timed over the last --steps of --warmup_steps + --steps batches; real tokens are the
    attention masks' sums (the same ids as bert_jax's: the exported tokenizer).

Each measurement is its own process, run in turn (jax, jax unpacked, torch; --repeats times), so
the machine's load hits all alike; torch and XLA get the same cores. Ratios are bert_jax /
sentence-transformers in pairs per second (a pair: a query and its positive) and real tokens per
second, and slots (token positions computed, padding included: real tokens / fill rate) per
second: pairs/s = slots/s x fill / tokens per pair, so the pairs ratio is the product of the
slots/s ratio (speed per position) and the fill ratio (positions not spent on padding). One JSON
line per measurement, then one with the ratios, appended to
benchmarks/results/embedding_speed.jsonl with the commit and the CPU. The ratios depend on the
CPU (PyTorch's and XLA's kernels differ per instruction set): compare runs on one machine.

  .venv/bin/python benchmarks/embedding_speed.py                 # ~10 min on 2 cores
  .venv/bin/python benchmarks/embedding_speed.py --model=tiny --batch=32 --steps=10
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from provenance import commit, machine  # noqa: E402  (benchmarks/, put on sys.path above)

RESULTS = os.path.join(REPO, "benchmarks", "results", "embedding_speed.jsonl")
# (layers, width, heads, intermediate): speed_guard's "small" and "tiny".
MODELS = {"small": (4, 256, 4, 1024), "tiny": (2, 128, 2, 512), "base": (12, 768, 12, 3072)}
LEARNING_RATE = 2e-5


def _config(args, workdir_data: str, steps: int, pack: bool):
  from configs import finetune_embedding  # pylint: disable=import-outside-toplevel
  layers, width, heads, intermediate = MODELS[args.model]
  config = finetune_embedding.get_config()
  config.vocab = os.path.join(workdir_data, "sp.model")
  config.data.train_file = os.path.join(workdir_data, "train.jsonl")
  config.data.validation_file = ""
  config.data.max_seq_length = args.length
  config.model.update(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                      intermediate_size=intermediate, max_position_embeddings=512, vocab_size=0)
  config.embedding.update(num_negatives=0, pooling="mean", pack=pack)
  config.train.update(batch_size=args.batch, num_train_steps=steps, learning_rate=LEARNING_RATE,
                      warmup_steps=0, log_every_steps=max(1, args.steps), eval_every_steps=0)
  config.checkpoint.save_every_steps = 0
  config.checkpoint.async_save = False
  config.logging.tensorboard = False
  config.mesh.data = -1
  return config


def setup(args, directory: str) -> dict:
  """The pairs, their vocabulary, a one-step bert_jax run and its sentence-transformers export."""
  from bert_jax import finetune  # pylint: disable=import-outside-toplevel
  from bert_jax.data import local_retrieval, vocab  # pylint: disable=import-outside-toplevel
  from bert_jax.weights import hf_export  # pylint: disable=import-outside-toplevel
  files = local_retrieval.build(os.path.join(directory, "suite"))
  records = [json.loads(line) for line in open(files["train_file"])]
  random.Random(0).shuffle(records)
  with open(os.path.join(directory, "train.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  texts = [r[k] for r in records for k in ("query", "positive")]
  vocab.train_sentencepiece(iter(texts), os.path.join(directory, "sp"), 8000, "bpe")
  run = os.path.join(directory, "init")
  finetune.finetune_and_evaluate(_config(args, directory, 1, False), run)
  hf_export.export_sentence_transformers(run, os.path.join(directory, "st"))
  return {"pairs": len(records)}


def measure_jax(args, directory: str, pack: bool) -> dict:
  """Logged every step; the timed steps are the last --steps, less any that compiled a new
  packed-row bucket (a step over 5x the median: counted in `compiles_dropped`)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from bert_jax import finetune  # pylint: disable=import-outside-toplevel
  config = _config(args, directory, args.warmup_steps + args.steps, pack)
  config.init_from = os.path.join(directory, "init")
  config.train.log_every_steps = 1
  workdir = tempfile.mkdtemp(dir=directory)
  finetune.finetune_and_evaluate(config, workdir)
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  timed = [r for r in records if r["split"] == "train"][-args.steps:]
  seconds = np.array([1.0 / r["steps_per_sec"] for r in timed])
  kept = seconds <= 5 * np.median(seconds)
  tokens = np.array([r["real_tokens_per_sec"] / r["steps_per_sec"] for r in timed])
  fill = np.array([r["fill_rate"] for r in timed])  # Real tokens / (rows x L) of each step.
  return {"side": "bert_jax" + ("" if pack else "_unpacked"),
          "pairs_per_sec": kept.sum() * args.batch / seconds[kept].sum(),
          "real_tokens_per_sec": tokens[kept].sum() / seconds[kept].sum(),
          "fill_rate": float(np.mean(fill)),
          "slots_per_sec": (tokens / fill)[kept].sum() / seconds[kept].sum(),
          "compiles_dropped": int((~kept).sum())}


def measure_torch(args, directory: str) -> dict:
  import warnings  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import sentence_transformers as st  # pylint: disable=import-outside-toplevel
    from sentence_transformers.sentence_transformer import losses  # pylint: disable=import-outside-toplevel
    model = st.SentenceTransformer(os.path.join(directory, "st"), device="cpu")
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(0)
  model.max_seq_length = args.length
  model.train()
  loss_fn = losses.MultipleNegativesRankingLoss(model, scale=20.0)
  optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
  records = [json.loads(line) for line in open(os.path.join(directory, "train.jsonl"))]
  total = args.warmup_steps + args.steps
  tokens, slots, start = 0, 0, None
  for step in range(total):
    if step == args.warmup_steps:
      tokens, slots, start = 0, 0, time.perf_counter()
    batch = [records[(step * args.batch + i) % len(records)] for i in range(args.batch)]
    features = [model.tokenize([r[k] for r in batch]) for k in ("query", "positive")]
    tokens += sum(int(f["attention_mask"].sum()) for f in features)
    slots += sum(f["attention_mask"].numel() for f in features)  # Padded to each side's longest.
    loss = loss_fn(features, None)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
  elapsed = time.perf_counter() - start
  return {"side": "sentence_transformers", "pairs_per_sec": args.steps * args.batch / elapsed,
          "real_tokens_per_sec": tokens / elapsed, "fill_rate": tokens / slots,
          "slots_per_sec": slots / elapsed}


def run_role(script: str, role: str, flags: list[str]) -> dict:
  """`script --role=ROLE FLAGS` in its own process (one CPU device, XLA's default flags) -> the
  JSON object of its last output line."""
  command = [sys.executable, os.path.abspath(script), f"--role={role}", *flags]
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "TOKENIZERS_PARALLELISM": "false"}
  done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"{role} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def _worker(args, directory: str, role: str) -> dict:
  return run_role(__file__, role, [
      f"--directory={directory}", f"--model={args.model}", f"--batch={args.batch}",
      f"--length={args.length}", f"--steps={args.steps}", f"--warmup_steps={args.warmup_steps}"])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="small", choices=sorted(MODELS))
  parser.add_argument("--batch", type=int, default=64, help="pairs per step")
  parser.add_argument("--length", type=int, default=128, help="max_seq_length of a text")
  parser.add_argument("--steps", type=int, default=20, help="timed steps")
  parser.add_argument("--warmup_steps", type=int, default=20,
                      help="steps before timing (compiles of the packed row buckets)")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--role", default="", help=argparse.SUPPRESS)
  parser.add_argument("--directory", default="", help=argparse.SUPPRESS)
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()
  if args.role:
    result = {"setup": lambda: setup(args, args.directory),
              "jax": lambda: measure_jax(args, args.directory, True),
              "jax_unpacked": lambda: measure_jax(args, args.directory, False),
              "torch": lambda: measure_torch(args, args.directory)}[args.role]()
    print(json.dumps(result))
    return
  with tempfile.TemporaryDirectory() as directory:
    pairs = _worker(args, directory, "setup")
    rows = []
    for repeat in range(args.repeats):
      for role in ("jax", "jax_unpacked", "torch"):
        row = {"benchmark": "embedding_speed", "commit": commit(), "machine": machine(),
               "model": args.model,
               "batch": args.batch, "seq_len": args.length, "repeat": repeat,
               **_worker(args, directory, role)}
        print(json.dumps(row), flush=True)
        rows.append(row)
  peer = [r for r in rows if r["side"] == "sentence_transformers"]
  summary = {"benchmark": "embedding_speed", "commit": commit(), "machine": machine(),
             "model": args.model,
             "batch": args.batch, "seq_len": args.length, "steps": args.steps, **pairs}
  for side in ("bert_jax", "bert_jax_unpacked"):
    ours = [r for r in rows if r["side"] == side]
    for unit in ("pairs_per_sec", "real_tokens_per_sec", "slots_per_sec", "fill_rate"):
      summary[f"{side}_over_st_{unit}"] = [round(a[unit] / b[unit], 3)
                                           for a, b in zip(ours, peer)]
  print(json.dumps(summary))
  with open(args.output, "a") as f:
    f.writelines(json.dumps(r) + "\n" for r in [*rows, summary])


if __name__ == "__main__":
  main()
