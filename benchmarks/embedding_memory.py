r"""Per-device memory of the embedding task's compiled train step at BERT-Base size: the one-pass
step against GradCache (`bert_jax/tasks/embedding.py`, config.train.grad_accum_steps chunks), at
global batches the one-pass step cannot hold. Compile-only (XLA's memory analysis against
abstract shapes: nothing allocated), so it runs on a CPU.

  python benchmarks/embedding_memory.py --batches=256,1024,4096 --chunks=1,16,64 \
      --output=benchmarks/results/embedding_memory.jsonl

Each row: examples per global batch (each a query and a positive of L=128 pieces, f32, one
device), chunks (1: one pass), XLA's per-device total (arguments + temporaries + code, GiB) and
the compile seconds. A pair whose chunks do not divide the batch is skipped.
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from provenance import commit  # noqa: E402  (benchmarks/ is this script's directory)


def report(batch: int, chunks: int, length: int, negatives: int) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax import config_checks  # pylint: disable=import-outside-toplevel
  from bert_jax.models.model import BertConfig  # pylint: disable=import-outside-toplevel
  from bert_jax.tasks.embedding import EmbeddingSettings, EmbeddingTask  # pylint: disable=import-outside-toplevel
  from bert_jax.training import aot, programs  # pylint: disable=import-outside-toplevel
  from bert_jax.training.settings import TrainSettings  # pylint: disable=import-outside-toplevel
  from configs import base, finetune_embedding  # pylint: disable=import-outside-toplevel
  config = finetune_embedding.get_config()
  config.init_from, config.data.train_file = "bert-base", "pairs.jsonl"  # Checks only.
  config.train.update(batch_size=batch, eval_batch_size=batch, grad_accum_steps=chunks,
                      num_train_steps=1000)
  config.mesh.data = 1
  config_checks.check_finetuning(config)
  model = BertConfig.from_config({**base.get_config().model, "attention_impl": "xla"})
  settings = EmbeddingSettings(labels=(), max_seq_length=length, head_dropout_prob=0.0,
                               freeze_encoder=False, pooling="mean", normalize=True,
                               num_negatives=negatives, scale=20.0, symmetric=False,
                               mask_false_negatives=False, matryoshka_dims=())
  start = time.time()
  result = aot.report(TrainSettings.from_config(config), EmbeddingTask(model, settings),
                      aot.host_target())
  programs.program.cache_clear()
  jax.clear_caches()
  return {"benchmark": "embedding_memory", "commit": commit(), "model": "bert-base",
          "examples": batch, "texts_per_example": 2 + negatives, "seq_len": length,
          "chunks": chunks, "total_gib": result.get("train_total_gib"),
          "temporaries_gib": result.get("train_temporaries_gib"),
          "compile_s": round(time.time() - start, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="256,1024,4096")
  parser.add_argument("--chunks", default="1,16,64")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--negatives", type=int, default=0)
  parser.add_argument("--output", default="")
  args = parser.parse_args()
  rows = []
  for batch in map(int, args.batches.split(",")):
    for chunks in map(int, args.chunks.split(",")):
      if batch % chunks or batch // chunks < 1:
        continue
      rows.append(report(batch, chunks, args.seq_len, args.negatives))
      print(json.dumps(rows[-1]), flush=True)
      if args.output:
        with open(args.output, "a") as f:
          f.write(json.dumps(rows[-1]) + "\n")
  print("\n| examples (x 2 texts of 128) | chunks | per-device GiB | compile s |")
  print("|---|---|---|---|")
  for r in rows:
    print(f"| {r['examples']} | {r['chunks']} | {r['total_gib']:.2f} | {r['compile_s']} |")


if __name__ == "__main__":
  main()
