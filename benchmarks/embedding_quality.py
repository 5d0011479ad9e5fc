r"""Embedding quality: bert_jax's embedding task against sentence-transformers' training, from the
same weights with the same hyperparameters, scored by the same retrieval metrics on held-out
queries; several seeds each.

Data: the offline retrieval suite (`bert_jax/data/local_retrieval.py`: numpy's and scipy's
function summaries as queries, their parameter descriptions as documents; split by source file).
Its train pairs train; its held-out split in BEIR's layout scores (every held-out document is a
candidate for every held-out query, exact search, nDCG@10 / MRR@10 / recall@100 / MAP by
`bert_jax/downstream/retrieval.py`, trec_eval's definitions).

The encoder: a bert_jax run of one step with the encoder frozen, so its random init itself
(--model's size, a 4000-piece sentencepiece vocabulary trained on the train pairs), exported with
`launch/convert.py --to_sentence_transformers`; both sides start from it (a from-scratch
encoder: what the comparison tests is the training, not a pretrained model's head start).

  - bert_jax: `finetune.finetune_and_evaluate` of the embedding task, init_from that run;
    optimizer "adamw" (bias-corrected, weight decay 0.01, as torch's AdamW), linear warmup over
    10% of the steps then linear decay to 0, clipping at 1.0, dropout 0.1, InfoNCE with scale 20
    (MNRL), mean pooling, normalised; --epochs over the train pairs at --batch.
  - sentence-transformers: `SentenceTransformer(export)`, `MultipleNegativesRankingLoss`
    (scale 20), torch AdamW (weight decay 0.01), `get_linear_schedule_with_warmup` (10%),
    clipping at 1.0, the same batches per epoch count, shuffled per seed; `model.encode` to score.
  - zero-shot: the starting encoder, scored by bert_jax.

  .venv/bin/python benchmarks/embedding_quality.py --seeds=0,1,2     # ~7 min on 2 cores

One JSON line per run (side, seed, metrics), then a summary (mean and standard deviation per
side), appended to benchmarks/results/embedding_quality.jsonl with the commit.
"""

import argparse
import json
import os
import random
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from embedding_speed import MODELS, run_role  # noqa: E402  (benchmarks/, on sys.path above)
from provenance import commit  # noqa: E402

RESULTS = os.path.join(REPO, "benchmarks", "results", "embedding_quality.jsonl")
WEIGHT_DECAY, WARMUP_FRACTION, MAX_GRAD_NORM = 0.01, 0.1, 1.0


def _steps(args, pairs: int) -> int:
  return args.epochs * (pairs // args.batch)


def _config(args, directory: str, steps: int, seed: int):
  from configs import finetune_embedding  # pylint: disable=import-outside-toplevel
  layers, width, heads, intermediate = MODELS[args.model]
  config = finetune_embedding.get_config()
  config.seed = seed
  config.vocab = os.path.join(directory, "sp.model")
  config.data.train_file = os.path.join(directory, "train.jsonl")
  config.data.validation_file = ""
  config.data.max_seq_length = args.length
  config.model.update(num_hidden_layers=layers, hidden_size=width, num_attention_heads=heads,
                      intermediate_size=intermediate, max_position_embeddings=512, vocab_size=0)
  config.embedding.update(num_negatives=0, pooling="mean", normalize=True, scale=20.0,
                          pack=args.pack)
  config.train.update(batch_size=args.batch, num_train_steps=steps, learning_rate=args.lr,
                      warmup_steps=int(WARMUP_FRACTION * steps), optimizer="adamw",
                      weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM,
                      log_every_steps=max(1, steps // 4), eval_every_steps=0)
  config.checkpoint.save_every_steps = 0
  config.logging.tensorboard = False
  config.mesh.data = -1
  return config


def _held_out(directory: str):
  from bert_jax.downstream import beir  # pylint: disable=import-outside-toplevel
  (task_dir,) = beir.find_tasks(os.path.join(directory, "suite", "beir"))
  return beir.read_task(task_dir)


def _scores(task, queries: np.ndarray, documents: np.ndarray) -> dict[str, float]:
  from bert_jax.downstream import retrieval  # pylint: disable=import-outside-toplevel
  scores, indices = retrieval.search(queries, documents, 100)
  run = retrieval.run_from_search(list(task.queries), list(task.corpus), scores, indices)
  return retrieval.evaluate(task.qrels, run)[0]


def setup(args, directory: str) -> dict:
  from bert_jax import finetune  # pylint: disable=import-outside-toplevel
  from bert_jax.data import local_retrieval, vocab  # pylint: disable=import-outside-toplevel
  from bert_jax.weights import hf_export  # pylint: disable=import-outside-toplevel
  files = local_retrieval.build(os.path.join(directory, "suite"))
  records = [json.loads(line) for line in open(files["train_file"])]
  with open(os.path.join(directory, "train.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  texts = [r[k] for r in records for k in ("query", "positive")]
  vocab.train_sentencepiece(iter(texts), os.path.join(directory, "sp"), args.vocab_size, "bpe")
  run = os.path.join(directory, "init")
  config = _config(args, directory, 1, 0)
  config.train.freeze_encoder = True  # The random init itself (the task has no head).
  finetune.finetune_and_evaluate(config, run)
  hf_export.export_sentence_transformers(run, os.path.join(directory, "st"))
  return {"pairs": len(records)}


def bert_jax_run(args, directory: str, seed: int) -> dict:
  from bert_jax import finetune, predict  # pylint: disable=import-outside-toplevel
  pairs = sum(1 for _ in open(os.path.join(directory, "train.jsonl")))
  task = _held_out(directory)
  if seed < 0:  # The zero-shot encoder.
    workdir = os.path.join(directory, "init")
  else:
    config = _config(args, directory, _steps(args, pairs), seed)
    config.init_from = os.path.join(directory, "init")
    workdir = tempfile.mkdtemp(dir=directory)
    finetune.finetune_and_evaluate(config, workdir)
  model = predict.load_embedding_model(workdir)
  documents = predict.embed(model, list(task.corpus.values()), 64)
  queries = predict.embed(model, list(task.queries.values()), 64)
  return {"side": "bert_jax" if seed >= 0 else "zero_shot", "seed": seed,
          **_scores(task, queries, documents)}


def torch_run(args, directory: str, seed: int) -> dict:
  import warnings  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import sentence_transformers as st  # pylint: disable=import-outside-toplevel
    from sentence_transformers.sentence_transformer import losses  # pylint: disable=import-outside-toplevel
    model = st.SentenceTransformer(os.path.join(directory, "st"), device="cpu")
  torch.set_num_threads(os.cpu_count())
  torch.manual_seed(seed)
  model.max_seq_length = args.length
  records = [json.loads(line) for line in open(os.path.join(directory, "train.jsonl"))]
  steps = _steps(args, len(records))
  loss_fn = losses.MultipleNegativesRankingLoss(model, scale=20.0)
  optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=WEIGHT_DECAY)
  schedule = transformers.get_linear_schedule_with_warmup(
      optimizer, int(WARMUP_FRACTION * steps), steps)
  order, rng = [], random.Random(seed)
  while len(order) < steps * args.batch:  # Epochs of shuffled pairs, batches across epoch ends.
    epoch = list(range(len(records)))
    rng.shuffle(epoch)
    order += epoch
  model.train()
  for step in range(steps):
    batch = [records[i] for i in order[step * args.batch:(step + 1) * args.batch]]
    features = [model.tokenize([r[k] for r in batch]) for k in ("query", "positive")]
    loss = loss_fn(features, None)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    schedule.step()
  model.eval()
  task = _held_out(directory)
  documents = model.encode(list(task.corpus.values()), batch_size=64, convert_to_numpy=True)
  queries = model.encode(list(task.queries.values()), batch_size=64, convert_to_numpy=True)
  return {"side": "sentence_transformers", "seed": seed,
          **_scores(task, np.asarray(queries), np.asarray(documents))}


def _worker(args, directory: str, role: str, seed: int = 0) -> dict:
  return run_role(__file__, role, [
      f"--seed={seed}", f"--directory={directory}", f"--model={args.model}",
      f"--batch={args.batch}", f"--length={args.length}", f"--epochs={args.epochs}",
      f"--lr={args.lr}", f"--vocab_size={args.vocab_size}", f"--pack={args.pack}"])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="small", choices=sorted(MODELS))
  parser.add_argument("--batch", type=int, default=32, help="pairs per step")
  parser.add_argument("--length", type=int, default=128, help="max_seq_length of a text")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--vocab_size", type=int, default=4000)
  parser.add_argument("--pack", type=lambda v: v.lower() == "true", default=True,
                      help="bert_jax packs its train batches (config.embedding.pack)")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--role", default="", help=argparse.SUPPRESS)
  parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--directory", default="", help=argparse.SUPPRESS)
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()
  if args.role:
    result = {"setup": lambda: setup(args, args.directory),
              "jax": lambda: bert_jax_run(args, args.directory, args.seed),
              "torch": lambda: torch_run(args, args.directory, args.seed)}[args.role]()
    print(json.dumps(result))
    return
  settings = {"benchmark": "embedding_quality", "commit": commit(), "model": args.model,
              "batch": args.batch, "seq_len": args.length, "epochs": args.epochs, "lr": args.lr,
              "pack": args.pack}
  rows = []
  with tempfile.TemporaryDirectory() as directory:
    sizes = _worker(args, directory, "setup")
    for role, seed in [("jax", -1)] + [(r, int(s)) for s in args.seeds.split(",")
                                       for r in ("jax", "torch")]:
      row = {**settings, **_worker(args, directory, role, seed)}
      print(json.dumps(row), flush=True)
      rows.append(row)
  summary = {**settings, **sizes, "steps": _steps(args, sizes["pairs"])}
  for side in ("zero_shot", "bert_jax", "sentence_transformers"):
    values = [r["ndcg@10"] for r in rows if r["side"] == side]
    summary[f"{side}_ndcg@10"] = [round(v, 4) for v in values]
    summary[f"{side}_ndcg@10_mean"] = round(float(np.mean(values)), 4)
    summary[f"{side}_ndcg@10_std"] = round(float(np.std(values, ddof=1)), 4) if len(values) > 1 else 0.0
  print(json.dumps(summary))
  with open(args.output, "a") as f:
    f.writelines(json.dumps(r) + "\n" for r in [*rows, summary])


if __name__ == "__main__":
  main()
