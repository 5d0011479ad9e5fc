"""The original's two-phase recipe at test size (configs/base_phase2.py at full size): phase 1 at
L=32, then phase 2 at L=64 from phase 1's parameters through `config.init_from`, starting at step
0 with a fresh optimizer and warmup, as `run_pretraining.py --init_checkpoint` does; a phase 1
whose position table is shorter than phase 2's rows is refused in one line.

Both phases run in one process on ONE CPU device (`python tests/test_two_phase.py DIR`): two
programs compile about twice as fast there as on the test process's 8 simulated devices.
"""

import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from bert_jax.objectives.masking import max_targets_per_row  # noqa: E402
from tests.suite_flags import xla_flags  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the model reads text and learns which sentence comes next while masked words are "
         "predicted from their context in every layer of the network on each step").split()
PEAK = 3e-3


PHASE1_STEPS, PHASE2_STEPS = 8, 30


def _prepare(root: str) -> dict[int, str]:
  """{length: dataset dir} of one small corpus prepared at 32 and at 64 tokens, with one
  vocabulary (phase 2 must read phase 1's pieces)."""
  from bert_jax.data import corpus, prepare
  from bert_jax.data import vocab as vocab_lib
  rng = random.Random(0)
  lines = []
  for _ in range(150):
    lines += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 3))).capitalize() + "."
              for _ in range(rng.randint(2, 4))] + [""]  # Short: many rows pack 2 examples.
  text = os.path.join(root, "corpus.txt")
  with open(text, "w") as f:
    f.write("\n".join(lines) + "\n")
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(text)), os.path.join(root, "sp"), 300, "bpe")
  out = {}
  for length in (32, 64):
    out[length] = os.path.join(root, f"data_{length}")
    prepare.prepare_dataset(out[length], lambda: corpus.iter_bert_format(text), vocab,
                            max_seq_length=length, dupe_factor=2, validation_fraction=0.1,
                            seed=0, max_examples_per_row=2, num_workers=0)
  return out


def _config(dataset_dir: str, length: int, steps: int, init_from: str = ""):
  from configs import tiny
  config = tiny.get_config()
  config.init_from = init_from
  config.model.update(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  config.data.update(source="prepared", dataset_dir=dataset_dir, max_seq_length=length,
                     max_examples_per_row=2)
  config.masking.max_predictions_per_seq = max_targets_per_row(0.15, length, 2, 3, 5)
  config.train.update(batch_size=16, eval_batch_size=16, eval_max_batches=1,
                      num_train_steps=steps, warmup_steps=3, learning_rate=PEAK,
                      log_every_steps=1, eval_every_steps=0)
  config.checkpoint.update(save_every_steps=0, async_save=False)
  config.logging.tensorboard = False
  return config


def _records(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f) if r["split"] == "train"}


def _run(root: str) -> None:
  """Both phases and the refused third one; their records into <root>/result.json."""
  from bert_jax import train
  data = _prepare(root)
  phase1, phase2 = os.path.join(root, "phase1"), os.path.join(root, "phase2")
  train.train_and_evaluate(_config(data[32], 32, PHASE1_STEPS), phase1)
  state = train.train_and_evaluate(_config(data[64], 64, PHASE2_STEPS, init_from=phase1),
                                   phase2)["state"]
  # A phase 1 with fewer position rows than the next phase's length.
  config = _config(data[64], 128, 1, init_from=phase1)
  config.data.source = "synthetic"
  config.model.max_position_embeddings = 128
  config.masking.max_predictions_per_seq = max_targets_per_row(0.15, 128, 2, 3, 5)
  try:
    train.train_and_evaluate(config, os.path.join(root, "too_long"))
    refused = ""
  except ValueError as error:
    refused = str(error)
  with open(os.path.join(root, "result.json"), "w") as f:
    json.dump({"phase1": phase1, "first": _records(phase1), "second": _records(phase2),
               "step": int(state.step), "refused": refused}, f)


def test_phase_2_continues_from_phase_1_at_step_0_and_learns(tmp_path):
  env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path)], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  with open(tmp_path / "result.json") as f:
    result = json.load(f)
  first = {int(k): v for k, v in result["first"].items()}
  second = {int(k): v for k, v in result["second"].items()}
  # Step, warmup and optimizer start again: steps 1..30, the learning rate rising from 0.
  assert result["step"] == PHASE2_STEPS and sorted(second) == list(range(1, PHASE2_STEPS + 1))
  assert second[1]["learning_rate"] == 0.0
  assert second[2]["learning_rate"] == pytest.approx(PEAK / 3)
  assert f"Initialised from {result['phase1']}" in done.stdout
  assert done.stdout.count("Resumed") == 0
  # The parameters carried over: phase 2 starts far below a fresh model (phase 1's step 1)...
  assert second[1]["loss"] < first[1]["loss"] - 1.0, (first[1]["loss"], second[1]["loss"])
  # ...and learns at its new length.
  start = sum(second[s]["mlm_loss"] for s in range(1, 6)) / 5
  end = sum(second[s]["mlm_loss"] for s in range(PHASE2_STEPS - 4, PHASE2_STEPS + 1)) / 5
  assert end < start - 0.3, (start, end)
  # Packed rows: more examples than rows per step, and about 15% of each example as targets.
  examples = [r["examples_per_step"] for r in second.values()]
  assert min(examples) >= 16 and sum(examples) / len(examples) > 17, examples
  assert 1.0 < second[PHASE2_STEPS]["targets_per_example"] < 0.2 * 64
  assert result["refused"].endswith(
      "has max_position_embeddings=64, fewer than config.data.max_seq_length=128: its position "
      "table cannot grow. Pretrain the first phase with "
      "--config.model.max_position_embeddings>=128 (the original has 512 rows from the start: "
      "trained at 128 tokens, then at 512)"), result["refused"]


if __name__ == "__main__":
  _run(sys.argv[1])
