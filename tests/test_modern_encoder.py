"""The modern encoder's options (ModernBERT-class: rotary positions, GeGLU, pre-LN without
biases, local attention with a global layer every n, 30% masking evaluated at 15%, WSD,
StableAdamW, example-length warmup): local attention equals its dense reference, packed rows
equal each example alone with local and global layers, each option alone and all together
train and resume bit-identically, and mismatched options fail in one line naming the field."""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_checks, model as model_lib, train
from bert_jax.masking import MaskingConfig
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks import pretraining
from configs import modern_base, modern_tiny, tiny

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


def _set(config, overrides: dict):
  for path, value in overrides.items():
    section, name = path.split(".")
    config[section][name] = value
  return config


def _tiny_config(overrides: dict, steps: int = 6):
  """configs/tiny.py shrunk to a few milliseconds a step, on synthetic data."""
  config = tiny.get_config()
  _set(config, {
      "model.vocab_size": 128, "model.hidden_size": 32, "model.num_hidden_layers": 2,
      "model.num_attention_heads": 2, "model.intermediate_size": 48,
      "model.max_position_embeddings": 32, "data.max_seq_length": 32, "data.source": "synthetic",
      "data.max_examples_per_row": 2, "masking.max_predictions_per_seq": 10,
      "train.batch_size": 8, "train.num_train_steps": steps, "train.warmup_steps": 2,
      "train.log_every_steps": 1, "train.eval_every_steps": 0,
      "checkpoint.save_every_steps": 100, "checkpoint.async_save": False,
      "logging.tensorboard": False})
  return _set(config, overrides)


def _modern_tiny_config(steps: int = 6):
  """configs/modern_tiny.py at test size: every option together."""
  config = modern_tiny.get_config()
  return _set(config, {
      "model.vocab_size": 128, "model.hidden_size": 32, "model.intermediate_size": 48,
      "model.local_attention": 8, "data.max_seq_length": 32, "data.source": "synthetic",
      "data.span_warmup_steps": 4, "data.span_warmup_start": 8,
      "masking.max_predictions_per_seq": 10, "train.batch_size": 8, "train.num_train_steps": steps,
      "train.warmup_steps": 2, "train.log_every_steps": 1, "train.eval_every_steps": 0,
      "checkpoint.save_every_steps": 100, "checkpoint.async_save": False,
      "logging.tensorboard": False})


def _step_losses(workdir) -> dict[int, float]:
  losses = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      if record["split"] == "train":
        losses[record["step"]] = record["loss"]
  return losses


class _SigtermAt:
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


def _train_preempt_resume(config, tmp_path, monkeypatch):
  """(reference losses, resumed losses, the step the preemption saved)."""
  reference = str(tmp_path / "reference")
  train.train_and_evaluate(config, reference)
  workdir = str(tmp_path / "preempted")
  original = train._train_iterator
  monkeypatch.setattr(train, "_train_iterator",
                      lambda *args: _SigtermAt(original(*args), at=3))
  stopped = train.train_and_evaluate(config, workdir)
  monkeypatch.setattr(train, "_train_iterator", original)
  saved = [int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
  train.train_and_evaluate(config, workdir)
  return _step_losses(reference), _step_losses(workdir), (stopped.get("preempted_at"), saved)


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_option_alone_trains_and_resumes_bit_identically(option, tmp_path, monkeypatch):
  config = _tiny_config(OPTIONS[option])
  config_checks.check_pretraining(config)
  expected, resumed, (at, saved) = _train_preempt_resume(config, tmp_path, monkeypatch)
  assert at is not None and 1 <= at < 6 and saved == [at], (at, saved)
  assert [resumed[s] for s in range(1, 7)] == [expected[s] for s in range(1, 7)]
  assert all(np.isfinite(v) for v in expected.values())


def test_the_full_modern_config_trains_and_resumes_bit_identically(tmp_path, monkeypatch):
  config = _modern_tiny_config(steps=8)
  config_checks.check_pretraining(config)
  expected, resumed, (at, saved) = _train_preempt_resume(config, tmp_path, monkeypatch)
  assert at is not None and saved == [at]
  assert [resumed[s] for s in range(1, 9)] == [expected[s] for s in range(1, 9)]


# ------------------------------------------------------------------------- local attention


def _segments(batch: int, length: int, rng) -> np.ndarray:
  """Packed segment ids: 1..k runs of random lengths, then padding (0) on some rows."""
  rows = []
  for _ in range(batch):
    cuts = np.sort(rng.choice(np.arange(1, length), size=3, replace=False))
    row = np.zeros(length, np.int32)
    for k, (a, b) in enumerate(zip([0, *cuts[:-1]], cuts)):
      row[a:b] = k + 1
    if rng.random() < 0.5:
      row[cuts[-1]:] = 4  # A last segment instead of padding.
    rows.append(row)
  return np.stack(rows)


@pytest.mark.parametrize("length,half", [(37, 4), (64, 8), (130, 16), (96, 64), (200, 32)])
def test_local_attention_equals_the_dense_window_reference(length, half):
  rng = np.random.default_rng(length)
  q, k, v = (jnp.asarray(rng.standard_normal((3, length, 2, 8)), jnp.float32) for _ in range(3))
  segments = jnp.asarray(_segments(3, length, rng))
  local = model_lib.local_attention(q, k, v, segments, half)
  dense = model_lib.einsum_attention(q, k, v, model_lib.window_mask(segments, half))
  real = np.asarray(segments) > 0  # Padding queries' outputs are never read.
  np.testing.assert_allclose(np.asarray(local)[real], np.asarray(dense)[real], atol=1e-6)
  # The window matters where a segment is longer than it: global attention differs there.
  longest = max(np.sum(np.asarray(segments) == k, axis=1).max() for k in range(1, 5))
  full = model_lib.einsum_attention(q, k, v, model_lib.attention_mask_from_segments(segments))
  assert (np.abs(np.asarray(full)[real] - np.asarray(dense)[real]).max() > 1e-3) == (
      longest > half + 1)


def test_local_attention_never_builds_length_by_length_scores():
  length, half = 1024, 64
  q = jnp.zeros((1, length, 2, 8), jnp.float32)
  jaxpr = jax.make_jaxpr(lambda q, s: model_lib.local_attention(q, q, q, s, half))(
      q, jnp.ones((1, length), jnp.int32))
  biggest = max(np.prod(v.aval.shape) for eqn in jaxpr.eqns for v in eqn.outvars)
  # Scores [B, N, L/C, C, 3C] = 2 x 1024 x 192 elements, against 2 x 1024 x 1024 dense.
  assert biggest <= 2 * length * 3 * half, biggest


# ------------------------------------------------------------------------- packed rows


def _modern_model_config(**overrides) -> BertConfig:
  return BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                    intermediate_size=40, max_position_embeddings=64, type_vocab_size=0,
                    layer_norm_eps=1e-5, position_embedding="rotary", mlp="glu",
                    norm_placement="pre", attention_bias=False, mlp_bias=False, norm_bias=False,
                    classifier_bias=False, local_attention=6, global_attn_every_n_layers=3,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)


def test_packed_modern_rows_equal_each_example_alone():
  """Three examples in one row, each longer than the window (local layers cut inside them),
  against each alone at positions 0..n-1: MLM logits at every token equal to 1e-5."""
  config = _modern_model_config()
  model = BertForPreTraining(config)
  length, sizes = 48, (14, 17, 12)
  rng = np.random.default_rng(0)
  examples = [rng.integers(5, 97, n).astype(np.int32) for n in sizes]
  ids = np.zeros((1, length), np.int32)
  segments, positions = np.zeros_like(ids), np.zeros_like(ids)
  start = 0
  for k, example in enumerate(examples):
    ids[0, start:start + len(example)] = example
    segments[0, start:start + len(example)] = k + 1
    positions[0, start:start + len(example)] = np.arange(len(example))
    start += len(example)
  every = np.arange(length)[None].astype(np.int32)
  params = model.init(jax.random.key(0), ids, ids, segments, every)["params"]
  packed = model.apply({"params": params}, ids, np.zeros_like(ids), segments, every,
                       position_ids=positions, cls_positions=np.int32([[0, 14, 31]]))
  start = 0
  for k, example in enumerate(examples):
    alone = np.zeros((1, length), np.int32)
    alone[0, :len(example)] = example
    mask = (np.arange(length) < len(example)).astype(np.int32)[None]
    out = model.apply({"params": params}, alone, np.zeros_like(alone), mask, every)
    np.testing.assert_allclose(
        np.asarray(packed["mlm_logits"])[0, start:start + len(example)],
        np.asarray(out["mlm_logits"])[0, :len(example)], atol=1e-5)
    start += len(example)


def test_mean_pooling_reads_each_packed_example():
  config = _modern_model_config(classifier_pooling="mean")
  sequence = jnp.arange(2 * 6 * 1, dtype=jnp.float32).reshape(2, 6, 1)
  segments = jnp.asarray([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  pooled = model_lib.pool(sequence, segments, jnp.asarray([[0, 2], [0, 0]]), config.classifier_pooling)
  np.testing.assert_allclose(np.asarray(pooled)[..., 0], [[0.5, 3.0], [8.5, 0.0]])


# ------------------------------------------------------------------- recipe: masking, spans


def test_training_masks_at_its_rate_and_evaluation_at_its_own():
  config = _tiny_config(OPTIONS["mask_30"])
  task = train.pretraining_task(config, BertConfig.from_config(config.model), None)
  ids = np.full((64, 32), 7, np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  batch = {"input_ids": ids, "segment_ids": np.ones_like(ids), "position_ids": ids * 0,
           "word_starts": np.ones_like(ids)}
  trained = task.prepare(batch, jax.random.key(0), jnp.int32(0))
  evaluated = task.prepare_eval(batch, jax.random.key(0))
  # 30 eligible tokens a row: round(0.3 x 30) = 9 targets in training, round(0.15 x 30) = 4.
  assert np.asarray(trained["masked_lm_weights"]).sum(axis=1).tolist() == [9] * 64
  assert np.asarray(evaluated["masked_lm_weights"]).sum(axis=1).tolist() == [4] * 64


def test_example_length_warmup_cuts_rows_into_growing_spans():
  lengths = [int(pretraining.span_length(jnp.int32(s), 16, 100, 128)) for s in (0, 50, 99, 100,
                                                                                 500)]
  assert lengths == [16, 72, 126, 128, 128]
  segments = np.ones((2, 10), np.int32)
  segments[1, 7:] = 0  # Padding.
  batch = {"segment_ids": segments, "position_ids": np.tile(np.arange(10, dtype=np.int32),
                                                            (2, 1)), "input_ids": segments}
  cut = pretraining.cut_into_spans(batch, jnp.int32(4))
  assert np.asarray(cut["segment_ids"]).tolist() == [[1, 1, 1, 1, 2, 2, 2, 2, 3, 3],
                                                     [1, 1, 1, 1, 2, 2, 2, 0, 0, 0]]
  assert np.asarray(cut["position_ids"]).tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1],
                                                      [0, 1, 2, 3, 0, 1, 2, 0, 0, 0]]
  whole = pretraining.cut_into_spans(batch, jnp.int32(10))
  assert np.asarray(whole["segment_ids"]).tolist() == (segments > 0).astype(int).tolist()


def test_a_modern_tiny_row_of_1024_tokens_trains(tmp_path):
  config = _modern_tiny_config(steps=2)
  _set(config, {"data.max_seq_length": 1024, "model.local_attention": 128,
                "masking.max_predictions_per_seq": 308, "train.batch_size": 8,
                "data.span_warmup_steps": 0})
  config_checks.check_pretraining(config)
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = _step_losses(str(tmp_path / "run"))
  assert sorted(losses) == [1, 2] and all(np.isfinite(v) for v in losses.values())
  assert result["state"].params["bert"]["encoder"]["layers"]["mlp"]["wi_0"]["kernel"].shape[0] == 3


# ------------------------------------------------------------------------- bad options


@pytest.mark.parametrize("overrides,names", [
    ({"model.local_attention": 7, "model.global_attn_every_n_layers": 3},
     "config.model.local_attention=7"),
    ({"model.local_attention": 256, "model.global_attn_every_n_layers": 3},
     "config.model.local_attention=256"),
    ({"model.local_attention": 8}, "config.model.global_attn_every_n_layers"),
    ({"model.type_vocab_size": 1}, "config.model.type_vocab_size=1"),
    ({"model.classifier_pooling": "max"}, "config.model.classifier_pooling='max'"),
    ({"model.global_rope_theta": 0.0}, "config.model.global_rope_theta=0.0"),
    ({"masking.eval_mask_prob": 0.9}, "config.masking.max_predictions_per_seq"),
    ({"data.span_warmup_steps": 10}, "config.data.span_warmup_steps=10"),
    ({"data.objective": "mlm", "data.span_warmup_steps": 10, "data.span_warmup_start": 500},
     "config.data.span_warmup_start=500"),
    ({"train.decay_fraction": 1.5}, "config.train.decay_fraction=1.5"),
    ({"train.decay_shape": "cosine"}, "config.train.decay_shape='cosine'"),
])
def test_mismatched_options_fail_in_one_line_naming_the_field(overrides, names):
  config = _set(tiny.get_config(), overrides)
  with pytest.raises(ValueError) as error:
    config_checks.check_pretraining(config)
  assert names in str(error.value) and "\n" not in str(error.value)


def test_the_modern_configs_pass_their_checks():
  for module in (modern_base, modern_tiny):
    config_checks.check_pretraining(module.get_config())
  config = modern_base.get_config()
  assert (config.model.num_hidden_layers, config.model.hidden_size,
          config.model.intermediate_size, config.model.local_attention) == (22, 768, 1152, 128)
  model_config = BertConfig.from_config(config.model)
  assert [model_config.is_global_layer(i) for i in range(6)] == [True, False, False] * 2
  assert model_config.padded_vocab_size % 64 == 0
