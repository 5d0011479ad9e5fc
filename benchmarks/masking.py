"""Masking throughput: jitted `bert_jax.objectives.masking.mask_tokens` vs transformers' PyTorch collator.

Both get the same [B, L] = [256, 128] batch ([CLS] A [SEP] B [SEP] + padding, ids from a generated
30522-piece WordPiece vocabulary, no download). Rows, in sequences per second (median over
repetitions, JAX and PyTorch alternating so machine noise hits both):
  - bert_jax mask_tokens (jitted with the per-step `fold_in` as in the train step, compile
    excluded, block_until_ready), token and whole-word masking;
  - DataCollatorForLanguageModeling(mlm_probability=0.15) called on the batch as a list of tensors
    (what a training loop does; it derives the special-token mask row by row in Python);
  - its core `torch_mask_tokens` with a precomputed special-token mask (the tensor ops alone).
The ratio reported is bert_jax (token masking) over the full collator call.

Run:
  .venv/bin/python benchmarks/masking.py [--batch 256] [--length 128] [--reps 30]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # The tokenizer is built from local files only.

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bert_jax.objectives.masking import MaskingConfig, mask_tokens  # noqa: E402

VOCAB_SIZE = 30522
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4


def build_tokenizer(directory: str) -> transformers.BertTokenizerFast:
  """A BertTokenizerFast over a generated vocab.txt (special tokens first), built offline."""
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w") as f:
    f.write("\n".join(SPECIAL_TOKENS + [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS))]))
  return transformers.BertTokenizerFast.from_pretrained(directory)  # Local files only.


def make_batch(seed: int, batch: int, length: int, pad_id: int, cls_id: int, sep_id: int,
               first_word_id: int) -> tuple[np.ndarray, np.ndarray]:
  """ids [B, L] int32 and word_starts [B, L] int32 (60% of pieces start a word) of a batch."""
  rng = np.random.default_rng(seed)
  ids = np.full((batch, length), pad_id, np.int32)
  word_starts = np.zeros((batch, length), np.int32)
  for row in range(batch):
    n_real = int(rng.integers(length // 2, length - 2))
    split = int(rng.integers(1, n_real))
    tokens = rng.integers(first_word_id, VOCAB_SIZE, n_real)
    ids[row, :n_real + 3] = np.concatenate([[cls_id], tokens[:split], [sep_id], tokens[split:],
                                            [sep_id]])
    real = np.flatnonzero((ids[row] != pad_id) & (ids[row] != cls_id) & (ids[row] != sep_id))
    word_starts[row, real] = rng.random(real.size) < 0.6
  return ids, word_starts


def timed(fn, calls: int) -> float:
  """Seconds per call, averaged over `calls` back-to-back calls."""
  start = time.perf_counter()
  for _ in range(calls):
    fn()
  return (time.perf_counter() - start) / calls


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--reps", type=int, default=30, help="alternating repetitions per method")
  parser.add_argument("--calls", type=int, default=5, help="calls averaged in one repetition")
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as directory:
    tokenizer = build_tokenizer(directory)
  assert len(tokenizer) == VOCAB_SIZE
  special_ids = tuple(sorted(tokenizer.all_special_ids))
  ids, word_starts = make_batch(0, args.batch, args.length, tokenizer.pad_token_id,
                                tokenizer.cls_token_id, tokenizer.sep_token_id,
                                len(SPECIAL_TOKENS))

  # bert_jax: the batch already on the device, as inside the train step.
  config = MaskingConfig(vocab_size=VOCAB_SIZE, mask_token_id=tokenizer.mask_token_id,
                         special_token_ids=special_ids)
  wwm_config = MaskingConfig(vocab_size=VOCAB_SIZE, mask_token_id=tokenizer.mask_token_id,
                             special_token_ids=special_ids, whole_word_masking=True)
  ids_device, starts_device = jnp.asarray(ids), jnp.asarray(word_starts)
  seed_key = jax.random.key(0)

  def masking_step(step: jax.Array, ids: jax.Array, starts: jax.Array,
                   cfg: MaskingConfig) -> dict[str, jax.Array]:
    """As inside the train step: a per-step key from fold_in, then the masking."""
    return mask_tokens(jax.random.fold_in(seed_key, step), ids, cfg, starts)

  jitted_step = jax.jit(masking_step, static_argnames="cfg")
  step = [0]

  def run_jax(cfg: MaskingConfig) -> None:
    step[0] += 1
    jax.block_until_ready(jitted_step(np.int32(step[0]), ids_device, starts_device, cfg))

  compile_start = time.perf_counter()
  run_jax(config)
  run_jax(wwm_config)
  compile_s = time.perf_counter() - compile_start

  # transformers: the same batch as tensors.
  collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True,
                                                          mlm_probability=0.15)
  examples = [torch.tensor(row, dtype=torch.long) for row in ids]
  inputs = torch.tensor(ids, dtype=torch.long)  # [B, L]
  special_mask = torch.isin(inputs, torch.tensor(special_ids))  # [B, L]

  def run_collator() -> None:
    collator(examples)

  def run_core() -> None:
    collator.torch_mask_tokens(inputs.clone(), special_tokens_mask=special_mask)

  # Sanity: the collator's targets are the non-special tokens it selected, ~15% of them.
  labels = collator(examples)["labels"]
  selected_fraction = float((labels != -100).sum()) / float((~special_mask).sum())

  methods = {
      "bert_jax mask_tokens (jit)": lambda: run_jax(config),
      "bert_jax mask_tokens, whole words (jit)": lambda: run_jax(wwm_config),
      "transformers collator(examples)": run_collator,
      "transformers torch_mask_tokens (core)": run_core,
  }
  for fn in methods.values():  # Warm-up outside the measurement.
    fn()
  times = {name: [] for name in methods}
  for _ in range(args.reps):
    for name, fn in methods.items():
      times[name].append(timed(fn, args.calls))

  medians = {name: statistics.median(values) for name, values in times.items()}
  rates = {name: args.batch / seconds for name, seconds in medians.items()}
  print(f"B={args.batch} L={args.length} V={VOCAB_SIZE}; jax {jax.__version__} "
        f"({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}; "
        f"jax compile (both variants) {compile_s:.2f} s; collator selected "
        f"{100 * selected_fraction:.1f}% of eligible tokens")
  print(f"{'method':42s} {'median ms':>10s} {'sequences/s':>12s}")
  for name in methods:
    print(f"{name:42s} {1e3 * medians[name]:10.3f} {rates[name]:12.0f}")
  jax_name, collator_name = "bert_jax mask_tokens (jit)", "transformers collator(examples)"
  core_name = "transformers torch_mask_tokens (core)"
  print(json.dumps({
      "benchmark": "masking", "batch": args.batch, "length": args.length, "reps": args.reps,
      "calls_per_rep": args.calls,
      "jax_seq_per_s": round(rates[jax_name], 1),
      "jax_wwm_seq_per_s": round(rates["bert_jax mask_tokens, whole words (jit)"], 1),
      "collator_seq_per_s": round(rates[collator_name], 1),
      "torch_core_seq_per_s": round(rates[core_name], 1),
      "ratio_jax_over_collator": round(rates[jax_name] / rates[collator_name], 2),
      "ratio_jax_over_torch_core": round(rates[jax_name] / rates[core_name], 2),
  }))


if __name__ == "__main__":
  main()
