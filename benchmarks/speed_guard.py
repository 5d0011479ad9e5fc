r"""Speed guard: bert_jax against transformers' PyTorch BERT, side by side in one run. Run it before
and after any change to the model, the masking or the train step, and compare the ratios.

Three measurements, each against a PyTorch peer in a worker process (measured alternately, so the
machine's load hits both alike; 2 threads each):
  1. step rate per slot (`benchmarks/train_step.py`'s workers, synthetic full rows,
     V=30522): "small" 4L/256/4H/1024 at B=8 L=128 and "tiny" 2L/128/2H/512 at B=32 L=128;
     HF `BertForPreTraining` with MLM + NSP losses, clipping and AdamW.
  2. time to accuracy on real text: configs/tiny.py (2L/128/2H/512, B=32, L=128, its built-in
     corpus and vocabulary, packed rows; or its "small" model at B=8, the issue #42 setting)
     trained for the seconds --races gives, against a
     run_mlm-style peer: HF `BertForMaskedLM` of the same size and vocabulary on the same
     training text, grouped into full 128-token blocks ([CLS] 126 tokens [SEP], no padding),
     with run_mlm's dynamic masking (15% of non-special tokens; 80/10/10), bias-corrected AdamW
     (weight decay 0.01), the config's learning rate, warmup and linear decay, clipping at 1.0.
     The two train in alternating slices of --slice_seconds; each is then scored **by
     transformers** on the same held-out examples (the validation split's examples unpacked,
     one per row) with the same masks (15% of non-special positions, 80/10/10, seed 0): bert_jax
     is exported with `bert_jax.weights.hf.save_hf` and loaded as `BertForMaskedLM`.
  3. real (non-padding) tokens per second in that race: bert_jax's packed rows hold padding
     (counted out), the peer's blocks none.
Ratios are bert_jax / peer: step rate (1), held-out MLM accuracy at equal wall time (2), real
tokens per second (3). Each run appends one JSON line with the commit and machine to
benchmarks/results/speed_guard.jsonl. Ratios depend on the CPU (XLA's and PyTorch's kernels
differ per instruction set): compare runs on one machine.

Run:
  .venv/bin/python benchmarks/speed_guard.py                      # ~15 min on 2 cores
  .venv/bin/python benchmarks/speed_guard.py --races=tiny:120 --skip_steps
"""

import argparse
import datetime
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from provenance import commit, machine  # noqa: E402  (benchmarks/, put on sys.path above)

RESULTS = os.path.join(REPO, "benchmarks", "results", "speed_guard.jsonl")
STEP_SHAPES = ("small:8:128", "tiny:32:128")
EVAL_MASK_SEED = 0


# ------------------------------------------------------------------------------ held-out rows
def unpack_rows(batch: dict, length: int, pad_id: int) -> dict:
  """Packed rows (segment ids 1..K) -> one example per row, left-aligned, padded with `pad_id`:
  input_ids, token_type_ids, attention_mask [N, length] int64."""
  import numpy as np
  ids, types, segments = (batch[k] for k in ("input_ids", "token_type_ids", "segment_ids"))
  out_ids, out_types = [], []
  for row in range(ids.shape[0]):
    for segment in np.unique(segments[row]):
      if segment == 0:
        continue
      where = segments[row] == segment
      out_ids.append(ids[row][where])
      out_types.append(types[row][where])
  n = len(out_ids)
  result = {"input_ids": np.full((n, length), pad_id, np.int64),
            "token_type_ids": np.zeros((n, length), np.int64),
            "attention_mask": np.zeros((n, length), np.int64)}
  for i, (row_ids, row_types) in enumerate(zip(out_ids, out_types)):
    result["input_ids"][i, :len(row_ids)] = row_ids
    result["token_type_ids"][i, :len(row_ids)] = row_types
    result["attention_mask"][i, :len(row_ids)] = 1
  return result


def mlm_masks(ids, special_ids, vocab_size: int, mask_id: int, seed: int, rate: float = 0.15):
  """run_mlm's / BERT's masking of `ids` [N, L] with numpy: each non-special position selected
  with probability `rate`; of those 80% -> [MASK], 10% -> a random token, 10% unchanged.
  Returns (masked ids, labels with -100 where not selected)."""
  import numpy as np
  rng = np.random.default_rng(seed)
  eligible = ~np.isin(ids, np.asarray(special_ids))
  selected = eligible & (rng.random(ids.shape) < rate)
  labels = np.where(selected, ids, -100)
  draw = rng.random(ids.shape)
  masked = np.where(selected & (draw < 0.8), mask_id, ids)
  random_ids = rng.integers(0, vocab_size, size=ids.shape)
  masked = np.where(selected & (draw >= 0.8) & (draw < 0.9), random_ids, masked)
  return masked, labels


def read_split(dataset_dir: str, split: str) -> dict:
  """Every row of a prepared dataset split, decoded ([N, L] and [N, K] arrays)."""
  import numpy as np
  from bert_jax.data import pipeline, tfds_builder
  source = tfds_builder.data_source(dataset_dir, split, raw=True)
  parts = [pipeline.decode_records(source.__getitems__(list(range(s, min(s + 1024, len(source))))))
           for s in range(0, len(source), 1024)]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def training_blocks(dataset_dir: str, length: int, cls_id: int, sep_id: int, special_ids):
  """run_mlm's group_texts on the training split: every example's non-special tokens in order,
  concatenated and cut into [CLS] + (length - 2) tokens + [SEP] blocks [N, length] int32."""
  import numpy as np
  rows = read_split(dataset_dir, "train")
  ids, segments = rows["input_ids"], rows["segment_ids"]
  keep = (segments > 0) & ~np.isin(ids, np.asarray(special_ids))
  stream = ids[keep]  # Row-major: the examples in their stored order.
  body = length - 2
  n = len(stream) // body
  blocks = np.empty((n, length), np.int32)
  blocks[:, 0], blocks[:, -1] = cls_id, sep_id
  blocks[:, 1:-1] = stream[:n * body].reshape(n, body)
  return blocks


# ------------------------------------------------------------------------------ the torch peer
class TorchPeer:
  """run_mlm-style `BertForMaskedLM` training and transformers' scoring of held-out rows."""

  def setup(self, files: str, model: dict, batch: int, learning_rate: float, warmup: int,
            total_steps: int, seed: int) -> dict:
    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    self.torch, self.np = torch, np
    meta = json.load(open(os.path.join(files, "meta.json")))
    self.special_ids, self.mask_id = meta["special_ids"], meta["mask_id"]
    self.blocks = np.load(os.path.join(files, "blocks.npy"))  # [N, L]
    self.rng = np.random.default_rng(seed)
    self.order, self.cursor, self.batch = self.rng.permutation(len(self.blocks)), 0, batch
    self.model = transformers.BertForMaskedLM(transformers.BertConfig(**model))
    self.model.train()
    decay = [p for n, p in self.model.named_parameters()
             if not n.endswith("bias") and "LayerNorm" not in n]
    no_decay = [p for n, p in self.model.named_parameters()
                if n.endswith("bias") or "LayerNorm" in n]
    self.optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)
    self.schedule = transformers.get_linear_schedule_with_warmup(self.optimizer, warmup,
                                                                 total_steps)
    self.vocab_size, self.steps, self.seconds = model["vocab_size"], 0, 0.0
    return {"blocks": len(self.blocks), "versions": f"torch {torch.__version__}, transformers "
                                                    f"{transformers.__version__}"}

  def _next_batch(self):
    if self.cursor + self.batch > len(self.order):
      self.order, self.cursor = self.rng.permutation(len(self.blocks)), 0
    ids = self.blocks[self.order[self.cursor:self.cursor + self.batch]]  # [B, L]
    self.cursor += self.batch
    masked, labels = mlm_masks(ids, self.special_ids, self.vocab_size, self.mask_id,
                               int(self.rng.integers(2**31)))
    return self.torch.tensor(masked, dtype=self.torch.long), \
        self.torch.tensor(labels, dtype=self.torch.long)

  def train(self, seconds: float) -> dict:
    """Steps for about `seconds` (at least one); the batch masking is counted."""
    start, steps = time.perf_counter(), 0
    while steps == 0 or time.perf_counter() - start < seconds:
      inputs, labels = self._next_batch()
      loss = self.model(input_ids=inputs, labels=labels).loss
      loss.backward()
      self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.optimizer.step()
      self.schedule.step()
      self.optimizer.zero_grad(set_to_none=True)
      steps += 1
    elapsed = time.perf_counter() - start
    self.steps += steps
    self.seconds += elapsed
    return {"steps": steps, "seconds": elapsed, "loss": loss.item(),
            "real_tokens": steps * self.batch * self.blocks.shape[1]}

  def score(self, files: str, hf_dir: str = "", token_types: bool = True) -> dict:
    """Held-out MLM accuracy and loss of the peer itself (no `hf_dir`) or of an HF directory,
    over the selected positions of the held-out rows (files/eval.npz)."""
    import transformers
    torch = self.torch
    model = (transformers.BertForMaskedLM.from_pretrained(hf_dir) if hf_dir else self.model)
    model.eval()
    rows = self.np.load(os.path.join(files, "eval.npz"))
    correct = total = 0
    loss_sum = 0.0
    with torch.no_grad():
      for start in range(0, len(rows["masked"]), 64):
        part = slice(start, start + 64)
        labels = torch.tensor(rows["labels"][part])
        logits = model(input_ids=torch.tensor(rows["masked"][part]),
                       attention_mask=torch.tensor(rows["attention_mask"][part]),
                       token_type_ids=torch.tensor(rows["token_type_ids"][part]
                                                   * int(token_types))).logits
        selected = labels != -100
        correct += int((logits.argmax(-1)[selected] == labels[selected]).sum())
        total += int(selected.sum())
        loss_sum += float(torch.nn.functional.cross_entropy(logits[selected], labels[selected],
                                                            reduction="sum"))
    if not hf_dir:
      model.train()
    return {"mlm_accuracy": correct / total, "mlm_loss": loss_sum / total, "targets": total}


def serve() -> None:
  """Worker loop: one JSON command per stdin line, one JSON reply per line."""
  reply_to = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
  sys.stdout = sys.stderr
  peer = TorchPeer()
  for line in sys.stdin:
    command = json.loads(line)
    op = command.pop("op")
    if op == "exit":
      return
    try:
      result = getattr(peer, op)(**command)
    except Exception as error:  # Reported to the controller, which stops.
      result = {"error": f"{type(error).__name__}: {error}"}
    reply_to.write(json.dumps(result) + "\n")


# ------------------------------------------------------------------------------ measurements
def step_ratios(reps: int, seconds_per_rep: float) -> list[dict]:
  """Measurement 1: train_step.py's bert_jax and hf_torch workers on STEP_SHAPES."""
  import train_step
  rows = []
  for shape in STEP_SHAPES:
    measured = train_step.measure(shape, ["bert_jax", "hf_torch"],
                                  {"bert_jax": sys.executable, "hf_torch": sys.executable},
                                  reps, seconds_per_rep, {}, train_step.COMMON["vocab_size"])
    by_impl = {r["impl"]: r for r in measured}
    rows.append({"shape": shape, "bert_jax_tok_s": by_impl["bert_jax"]["tokens_per_s"],
                 "hf_torch_tok_s": by_impl["hf_torch"]["tokens_per_s"],
                 "ratio": round(by_impl["bert_jax"]["tokens_per_s"]
                                / by_impl["hf_torch"]["tokens_per_s"], 2),
                 "bert_jax_step_s_all": by_impl["bert_jax"]["step_s_all"],
                 "hf_torch_step_s_all": by_impl["hf_torch"]["step_s_all"]})
    print(f"step {shape}: bert_jax {rows[-1]['bert_jax_tok_s']:.0f} tok/s, hf_torch "
          f"{rows[-1]['hf_torch_tok_s']:.0f} tok/s: {rows[-1]['ratio']:.2f}x", flush=True)
  return rows


# Race sizes: configs/tiny.py as it is, or with the "small" model (4L/256/4H/1024) at B=8.
RACE_SIZES = {
    "tiny": {},
    "small": {"model.hidden_size": 256, "model.num_hidden_layers": 4,
              "model.num_attention_heads": 4, "model.intermediate_size": 1024,
              "train.batch_size": 8},
}


def accuracy_race(size: str, work_dir: str, seconds: float, slice_seconds: float,
                  eval_examples: int) -> dict:
  """Measurements 2 and 3: configs/tiny.py (with RACE_SIZES[size]) against the run_mlm-style
  peer."""
  import numpy as np
  import race
  from bert_jax.weights import hf
  from bert_jax.weights.layout import unpad_vocab
  from bert_jax.data.vocab import Vocab
  from configs import tiny
  import jax
  config = tiny.get_config()
  config.mesh.data = 1
  for path, value in RACE_SIZES[size].items():
    section, field = path.split(".")
    config[section][field] = value
  ours = race.Variant("bert_jax", config, work_dir)
  vocab = Vocab.load(os.path.join(ours.dataset_dir, "vocab"))
  files = os.path.join(work_dir, "peer_files")
  os.makedirs(files, exist_ok=True)
  length = config.data.max_seq_length
  blocks = training_blocks(ours.dataset_dir, length, vocab.cls_id, vocab.sep_id,
                           vocab.special_ids)
  np.save(os.path.join(files, "blocks.npy"), blocks)
  held_out = unpack_rows(read_split(ours.dataset_dir, "validation"), length, vocab.pad_id)
  held_out = {k: v[:eval_examples] for k, v in held_out.items()}
  masked, labels = mlm_masks(held_out["input_ids"], vocab.special_ids, len(vocab),
                             vocab.mask_id, EVAL_MASK_SEED)
  np.savez(os.path.join(files, "eval.npz"), masked=masked, labels=labels,
           attention_mask=held_out["attention_mask"],
           token_type_ids=held_out["token_type_ids"])
  with open(os.path.join(files, "meta.json"), "w") as f:
    json.dump({"special_ids": list(vocab.special_ids), "mask_id": vocab.mask_id}, f)
  m = config.model
  peer_model = dict(vocab_size=len(vocab), hidden_size=m.hidden_size,
                    num_hidden_layers=m.num_hidden_layers,
                    num_attention_heads=m.num_attention_heads,
                    intermediate_size=m.intermediate_size,
                    max_position_embeddings=m.max_position_embeddings, type_vocab_size=2,
                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                    pad_token_id=vocab.pad_id)
  import train_step
  peer = train_step.Worker("torch_peer", sys.executable, script=__file__)
  try:
    setup = peer.call("setup", files=files, model=peer_model, batch=config.train.batch_size,
                      learning_rate=config.train.learning_rate,
                      warmup=config.train.warmup_steps,
                      total_steps=config.train.num_train_steps, seed=config.seed)
    ours.run(1.0, max_steps=1)  # Compiled and warm before the clock; then a fresh start.
    ours.reset()
    peer_steps = peer_seconds = peer_real = 0
    our_real = 0
    while ours.train_seconds < seconds or peer_seconds < seconds:
      if ours.train_seconds < seconds:
        _, real, _ = ours.run(min(slice_seconds, seconds - ours.train_seconds))
        our_real += real
      if peer_seconds < seconds:
        done = peer.call("train", seconds=min(slice_seconds, seconds - peer_seconds))
        peer_steps += done["steps"]
        peer_seconds += done["seconds"]
        peer_real += done["real_tokens"]
      print(f"race: bert_jax {ours.steps} steps in {ours.train_seconds:.0f} s, peer "
            f"{peer_steps} steps in {peer_seconds:.0f} s", flush=True)
    export = os.path.join(work_dir, "bert_jax_hf")
    model_config, params = unpad_vocab(ours.task.model_config,
                                       jax.tree.map(np.asarray, ours.state.params))
    hf.save_hf(export, params, model_config, vocab, overwrite=True)
    our_score = peer.call("score", files=files, hf_dir=export)
    peer_score = peer.call("score", files=files, token_types=False)
  finally:
    peer.close()
  result = {
      "size": size, "batch": config.train.batch_size, "seconds": seconds,
      "examples_scored": int(len(masked)),
      "targets_scored": our_score["targets"], "versions": setup["versions"],
      "bert_jax": {"steps": ours.steps, "train_s": round(ours.train_seconds, 1),
                   "real_tok_s": round(our_real / ours.train_seconds, 1),
                   "mlm_accuracy": round(our_score["mlm_accuracy"], 4),
                   "mlm_loss": round(our_score["mlm_loss"], 3)},
      "peer": {"steps": peer_steps, "train_s": round(peer_seconds, 1),
               "real_tok_s": round(peer_real / peer_seconds, 1),
               "mlm_accuracy": round(peer_score["mlm_accuracy"], 4),
               "mlm_loss": round(peer_score["mlm_loss"], 3)},
  }
  result["accuracy_ratio"] = ratio(result["bert_jax"]["mlm_accuracy"],
                                   result["peer"]["mlm_accuracy"])
  result["real_tokens_ratio"] = ratio(result["bert_jax"]["real_tok_s"],
                                      result["peer"]["real_tok_s"])
  print(f"race {size} {seconds:.0f} s: bert_jax {ours.steps} steps, held-out MLM "
        f"{our_score['mlm_accuracy']:.2%}; peer {peer_steps} steps, "
        f"{peer_score['mlm_accuracy']:.2%}: {shown(result['accuracy_ratio'])} accuracy, "
        f"{shown(result['real_tokens_ratio'])} real tokens/s", flush=True)
  return result


def ratio(ours: float, peer: float) -> float | None:
  """ours / peer, or None when the peer has 0 (e.g. no correct prediction yet)."""
  return round(ours / peer, 2) if peer > 0 else None


def shown(value: float | None) -> str:
  return "-" if value is None else f"{value:.2f}x"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--worker", choices=("torch_peer",), help=argparse.SUPPRESS)
  parser.add_argument("--reps", type=int, default=3, help="step timing: alternating repetitions")
  parser.add_argument("--seconds_per_rep", type=float, default=3.0,
                      help="step timing: seconds of steps per repetition")
  parser.add_argument("--races", default="tiny:240,small:60",
                      help="time to accuracy: size:seconds,... (sizes: tiny = configs/tiny.py, "
                           "small = its 4L/256/4H/1024 model at B=8); wall seconds of training "
                           "for each side")
  parser.add_argument("--slice_seconds", type=float, default=20.0,
                      help="time to accuracy: the two train alternately in slices this long")
  parser.add_argument("--eval_examples", type=int, default=1024,
                      help="held-out examples scored (the validation split's first)")
  parser.add_argument("--work_dir", default="/tmp/bert_jax_speed_guard",
                      help="the built-in corpus is prepared (and cached) here")
  parser.add_argument("--skip_steps", action="store_true", help="only the race")
  parser.add_argument("--skip_race", action="store_true", help="only the step timing")
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()
  if args.worker:
    serve()
    return
  import train_step
  record = {"benchmark": "speed_guard", "commit": commit(),
            "date": datetime.date.today().isoformat(), "machine": machine(),
            "load_avg_1min_start": round(os.getloadavg()[0], 2)}
  print(f"{record['machine']}; load {record['load_avg_1min_start']}", flush=True)
  if not args.skip_steps:
    record["steps"] = step_ratios(args.reps, args.seconds_per_rep)
  if not args.skip_race:
    record["races"] = []
    for item in filter(None, args.races.split(",")):
      size, _, seconds = item.partition(":")
      if size not in RACE_SIZES or not seconds:
        raise SystemExit(f"--races: {item!r} is not size:seconds with a size in "
                         f"{sorted(RACE_SIZES)}")
      record["races"].append(accuracy_race(size, args.work_dir, float(seconds),
                                           args.slice_seconds, args.eval_examples))
  record["load_avg_1min_end"] = round(os.getloadavg()[0], 2)
  print("\nratios (bert_jax / PyTorch peer):")
  for row in record.get("steps", []):
    print(f"  step rate per slot, {row['shape']:12s} {row['ratio']:.2f}x")
  for race_result in record.get("races", []):
    label = f"{race_result['size']} B={race_result['batch']}, {race_result['seconds']:.0f} s"
    print(f"  held-out MLM accuracy, {label:22s} {shown(race_result['accuracy_ratio'])}")
    print(f"  real tokens/s on text, {label:22s} {shown(race_result['real_tokens_ratio'])}")
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "a") as f:
    f.write(json.dumps(record) + "\n")
  print(f"appended to {os.path.relpath(args.output, REPO)}")


if __name__ == "__main__":
  main()
