"""Training runs of the modern encoder's options, for tests/test_modern_encoder.py: each option
alone (on configs/tiny.py shrunk to test size), the full modern config, and a 1024-token row.
Each is trained straight through; those of RESUMED also once stopped by a SIGTERM (the trainer
saves the step under way) then resumed. One JSON line per run with its runs' per-step losses.

It runs as its own process on ONE CPU device (the test process forces 8 simulated devices):
these are a dozen different programs, and each compiles about twice as fast on one device.

  python tests/modern_runs.py WORKDIR [NAME ...]
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import train  # noqa: E402  (jax reads the device count at its first computation)
from configs import modern_tiny, tiny  # noqa: E402

# Each option of the modern recipe alone, as config overrides on configs/tiny.py.
OPTIONS = {
    "rotary": {"model.position_embedding": "rotary"},
    "glu": {"model.mlp": "glu"},
    "pre_norm": {"model.norm_placement": "pre"},
    "no_biases": {"model.attention_bias": False, "model.mlp_bias": False,
                  "model.norm_bias": False, "model.classifier_bias": False},
    "no_token_types": {"model.type_vocab_size": 0},
    "local_attention": {"model.local_attention": 8, "model.global_attn_every_n_layers": 2},
    "mean_pooling": {"model.classifier_pooling": "mean"},
    "mask_30": {"masking.mask_prob": 0.3, "masking.eval_mask_prob": 0.15},
    "wsd": {"train.schedule": "wsd", "train.decay_fraction": 0.5},
    "stable_adamw": {"train.optimizer": "stable_adamw", "train.b2": 0.98},
    "span_warmup": {"data.objective": "mlm", "data.span_warmup_steps": 4,
                    "data.span_warmup_start": 8},
}
STEPS = 6
# The runs that are also stopped by a SIGTERM and resumed: the options with state of their own
# beyond the params' tree (optimizer moments, the schedule, the data's example-length warmup),
# and the full modern config, where every architecture option is resumed together. An
# architecture option alone only changes the params' tree, which every resume restores alike:
# it is trained straight through, as is the 1024-token row (the modern config's state at
# another length: the suite's time, 2 trainings of its costliest program).
RESUMED = ("wsd", "stable_adamw", "span_warmup", "modern")


def set_fields(config, overrides: dict):
  for path, value in overrides.items():
    section, name = path.split(".")
    config[section][name] = value
  return config


_TEST_SIZE = {
    "model.vocab_size": 128, "model.hidden_size": 32, "model.intermediate_size": 48,
    "data.max_seq_length": 32, "data.source": "synthetic", "masking.max_predictions_per_seq": 10,
    "train.batch_size": 8, "train.num_train_steps": STEPS, "train.warmup_steps": 2,
    "train.log_every_steps": 1, "train.eval_every_steps": 0,
    "checkpoint.save_every_steps": 100, "checkpoint.async_save": False,
    "logging.tensorboard": False}


def tiny_config(overrides: dict):
  """configs/tiny.py shrunk to a few milliseconds a step, on synthetic data, plus `overrides`."""
  config = set_fields(tiny.get_config(), {
      **_TEST_SIZE, "model.num_hidden_layers": 2, "model.num_attention_heads": 2,
      "model.max_position_embeddings": 32, "data.max_examples_per_row": 2})
  return set_fields(config, overrides)


def modern_config(overrides: dict | None = None):
  """configs/modern_tiny.py at test size: every option together (3 layers: global, local,
  local; the example-length warmup on)."""
  config = set_fields(modern_tiny.get_config(), {
      **_TEST_SIZE, "model.local_attention": 8, "data.span_warmup_steps": 4,
      "data.span_warmup_start": 8})
  return set_fields(config, overrides or {})


# Every run: name -> config.
RUNS = {**{name: lambda o=o: tiny_config(o) for name, o in OPTIONS.items()},
        "modern": modern_config,
        "modern_1024": lambda: modern_config({
            "data.max_seq_length": 1024, "model.local_attention": 128,
            "masking.max_predictions_per_seq": 308, "data.span_warmup_steps": 0})}


def step_losses(workdir: str) -> dict[int, float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


class SigtermAt:
  """A train iterator that sends this process SIGTERM when its `at`-th batch is read."""

  def __init__(self, inner, at: int):
    self.inner, self.at, self.read = inner, at, 0

  def __next__(self):
    self.read += 1
    if self.read == self.at:
      os.kill(os.getpid(), signal.SIGTERM)
    return next(self.inner)

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


def straight_and_resumed(config, workdir: str, resume: bool = True) -> dict:
  """Trains `config` straight through, then (`resume`) again stopped by a SIGTERM at the third
  batch read and resumed: both runs' per-step losses, the step the stop saved and the
  checkpoints then."""
  from bert_jax import config_checks
  config_checks.check_pretraining(config)
  reference, stopped = os.path.join(workdir, "straight"), os.path.join(workdir, "stopped")
  result = train.train_and_evaluate(config, reference)
  layers = result["state"].params["bert"]["encoder"]["layers"]
  shapes = {"/".join(k.key for k in path): list(leaf.shape) for path, leaf in
            __import__("jax").tree_util.tree_flatten_with_path(layers)[0]}
  if not resume:
    return {"straight": step_losses(reference), "layer_params": shapes}
  original = train._train_iterator  # pylint: disable=protected-access
  train._train_iterator = lambda *args: SigtermAt(original(*args), at=3)
  try:
    preempted = train.train_and_evaluate(config, stopped)
  finally:
    train._train_iterator = original
  saved = sorted(int(n) for n in os.listdir(os.path.join(stopped, "checkpoints")) if n.isdigit())
  train.train_and_evaluate(config, stopped)
  return {"straight": step_losses(reference), "resumed": step_losses(stopped),
          "preempted_at": preempted.get("preempted_at"), "saved": saved, "layer_params": shapes}


def main(argv: list[str]) -> None:
  workdir, names = argv[1], argv[2:] or list(RUNS)
  from tests.suite_flags import xla_flags  # pylint: disable=import-outside-toplevel
  os.environ["XLA_FLAGS"] = xla_flags(1)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  for name in names:
    outcome = straight_and_resumed(RUNS[name](), os.path.join(workdir, name), name in RESUMED)
    print("RESULT " + json.dumps({"name": name, **outcome}), flush=True)


if __name__ == "__main__":
  main(sys.argv)
