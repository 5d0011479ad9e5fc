"""The modern encoder's options (ModernBERT-class: rotary positions, GeGLU, pre-LN without
biases, local attention with a global layer every n, 30% masking evaluated at 15%, WSD,
StableAdamW, example-length warmup): local attention equals its dense reference, packed rows
equal each example alone with local and global layers, each option alone and all together
train and resume bit-identically, and mismatched options fail in one line naming the field."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_checks, train
from bert_jax.models import model as model_lib
from bert_jax.objectives.masking import MaskingConfig
from bert_jax.models.model import BertConfig, BertForPreTraining
from bert_jax.tasks import pretraining
from configs import modern_base, modern_tiny, tiny
from tests import modern_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
  """tests/modern_runs.py once for every run (its own process, one CPU device): name -> the
  straight and the stopped-then-resumed runs' per-step losses."""
  workdir = tmp_path_factory.mktemp("modern_runs")
  done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "modern_runs.py"),
                         str(workdir)], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
             if line.startswith("RESULT ")]
  return {result["name"]: result for result in results}


def _assert_resumed_bit_identically(run: dict) -> None:
  steps = sorted(int(s) for s in run["straight"])
  assert steps == list(range(1, modern_runs.STEPS + 1))
  assert run["preempted_at"] is not None and run["saved"] == [run["preempted_at"]], run
  assert 1 <= run["preempted_at"] < steps[-1]
  assert [run["resumed"][str(s)] for s in steps] == [run["straight"][str(s)] for s in steps]
  assert all(np.isfinite(v) for v in run["straight"].values())


@pytest.mark.parametrize("option", sorted(modern_runs.OPTIONS))
def test_each_option_alone_trains_and_its_state_resumes_bit_identically(option, runs):
  """Every option trains alone; those with state of their own also resume bit-identically (the
  architecture options resume together in the full modern config, below)."""
  run = runs[option]
  if option in modern_runs.RESUMED:
    _assert_resumed_bit_identically(run)
  else:
    assert sorted(int(s) for s in run["straight"]) == list(range(1, modern_runs.STEPS + 1))
    assert all(np.isfinite(v) for v in run["straight"].values())
  if option == "glu":  # The option is the one that trained: GeGLU's two input halves.
    assert run["layer_params"]["mlp/wi_0/kernel"] == [2, 32, 48]


def test_the_full_modern_config_trains_and_resumes_bit_identically(runs):
  run = runs["modern"]
  _assert_resumed_bit_identically(run)
  # The modern blocks are the ones that trained: GeGLU halves, no biases, 3 stacked layers.
  assert run["layer_params"]["mlp/wi_0/kernel"] == [3, 32, 48]
  assert not any(name.endswith("bias") for name in run["layer_params"])


def test_a_modern_tiny_row_of_1024_tokens_trains(runs):
  straight = runs["modern_1024"]["straight"]
  assert sorted(int(s) for s in straight) == list(range(1, modern_runs.STEPS + 1))
  assert all(np.isfinite(v) for v in straight.values())


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
  local = jax.jit(model_lib.local_attention, static_argnums=4)(q, k, v, segments, half)
  dense = jax.jit(lambda q, k, v, s: model_lib.einsum_attention(
      q, k, v, model_lib.window_mask(s, half)))(q, k, v, segments)
  real = np.asarray(segments) > 0  # Padding queries' outputs are never read.
  np.testing.assert_allclose(np.asarray(local)[real], np.asarray(dense)[real], atol=1e-6)
  # The window matters where a segment is longer than it: global attention differs there.
  longest = max(np.sum(np.asarray(segments) == k, axis=1).max() for k in range(1, 5))
  full = jax.jit(lambda q, k, v, s: model_lib.einsum_attention(
      q, k, v, model_lib.attention_mask_from_segments(s)))(q, k, v, segments)
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
  params = jax.jit(model.init)(jax.random.key(0), ids, ids, segments, every)["params"]
  apply = jax.jit(model.apply)
  packed = apply({"params": params}, ids, np.zeros_like(ids), segments, every,
                 position_ids=positions, cls_positions=np.int32([[0, 14, 31]]))
  start = 0
  for k, example in enumerate(examples):
    alone = np.zeros((1, length), np.int32)
    alone[0, :len(example)] = example
    mask = (np.arange(length) < len(example)).astype(np.int32)[None]
    out = apply({"params": params}, alone, np.zeros_like(alone), mask, every)
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
  config = modern_runs.tiny_config(modern_runs.OPTIONS["mask_30"])
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
  config = modern_runs.set_fields(tiny.get_config(), overrides)
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
