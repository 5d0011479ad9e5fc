"""Pretrained vs from-scratch fine-tuning on the synthetic transfer tasks of tests/test_finetune.py.

A tiny BERT (2 layers, width 64) is pretrained by the real loop on sentences "the <animal>
<verb> on the <object> ."; fine-tuning then sees half of the animals / objects and is validated
on the other half, so only an encoder that learned the word classes in pretraining transfers.
Same data, steps and learning rate for both starting points; several data seeds. Rows:
  - classification (animal vs object sentence), accuracy, chance 0.5;
  - tagging (the animal / object word tagged by class, BIO), entity F1: full fine-tuning from
    the pretrained encoder, head-only on the frozen pretrained encoder, full from scratch.

Run:
  .venv/bin/python benchmarks/finetune_tasks.py [--seeds 5] [--pretrain_steps 150]
"""

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import finetune  # noqa: E402
from configs import finetune_tagging  # noqa: E402
from tests import test_finetune as tasks  # noqa: E402  (the synthetic task builders)


# Head-only training takes a larger step. (Full fine-tuning at 5e-4, the classification rate of
# tests.category_config, reached entity F1 0.50-0.64 from the pretrained encoder in 60 steps.)
TAGGING_LR = {False: 3e-3, True: 1e-2}


def _tagging_config(directory, init_from, vocab_file, seed, freeze):
  words = tasks.ANIMALS[:6] + tasks.OBJECTS[:6]
  held_out = tasks.ANIMALS[6:] + tasks.OBJECTS[6:]
  config = tasks.finetune_config(
      finetune_tagging, directory, tasks.category_tags(words), 60, init_from=init_from,
      vocab=None if init_from else vocab_file, model=tasks.PRETRAIN_MODEL, seq_len=16,
      learning_rate=TAGGING_LR[freeze], n_train=256, seed=seed)
  tasks.write_jsonl(config.data.validation_file,
                    tasks.category_tags(held_out)(128, random.Random(seed + 1)))
  config.train.update(freeze_encoder=freeze, eval_every_steps=0, log_every_steps=1000)
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--pretrain_steps", type=int, default=150)
  args = parser.parse_args()
  start = time.time()
  with tempfile.TemporaryDirectory() as tmp:
    root = pathlib.Path(tmp)
    workdir, vocab_file = tasks.pretrain_tiny(root / "pretrain", args.pretrain_steps)
    rows = {name: [] for name in ("classification pretrained", "classification scratch",
                                  "tagging pretrained", "tagging pretrained frozen",
                                  "tagging scratch")}
    for seed in range(args.seeds):
      for name, init_from in (("pretrained", workdir), ("scratch", "")):
        directory = root / f"cls-{name}-{seed}"
        config = tasks.category_config(directory, init_from, vocab_file, seed=seed,
                                       eval_every_steps=0, log_every_steps=1000)
        result = finetune.finetune_and_evaluate(config, str(directory / "run"))
        rows[f"classification {name}"].append(result["final"]["accuracy"])
      for name, init_from, freeze in (("pretrained", workdir, False),
                                      ("pretrained frozen", workdir, True),
                                      ("scratch", "", False)):
        directory = root / f"tag-{name}-{seed}"
        config = _tagging_config(directory, init_from, vocab_file, seed, freeze)
        result = finetune.finetune_and_evaluate(config, str(directory / "run"))
        rows[f"tagging {name}"].append(result["final"]["entity_f1"])
  print(f"\nHeld-out words, {args.seeds} data seeds, pretraining {args.pretrain_steps} steps, "
        f"60 fine-tuning steps ({time.time() - start:.0f} s in all)")
  print(f"{'run':30s} {'metric':12s} {'mean':>6s} {'min':>6s} {'max':>6s}")
  summary = {}
  for name, values in rows.items():
    metric = "accuracy" if name.startswith("classification") else "entity_f1"
    summary[name] = round(statistics.mean(values), 4)
    print(f"{name:30s} {metric:12s} {statistics.mean(values):6.3f} {min(values):6.3f} "
          f"{max(values):6.3f}")
  print(json.dumps({"benchmark": "finetune_tasks", "seeds": args.seeds,
                    "pretrain_steps": args.pretrain_steps, **summary}))


if __name__ == "__main__":
  main()
