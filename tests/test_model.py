"""The model against HuggingFace's PyTorch BERT, and behaviour the BERT paper defines."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.objectives import losses
from bert_jax.objectives.masking import MaskingConfig
from bert_jax.tasks import PretrainingTask
from bert_jax.weights import hf_bert
from bert_jax.models.model import BertConfig, BertForPreTraining, BertModel
from bert_jax.weights.layout import num_params

SMALL = dict(vocab_size=211, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=32, type_vocab_size=2)
CLS, SEP, MASK, PAD = 2, 3, 4, 0


def _hf_model(cls=transformers.BertForPreTraining, seed=0, **overrides):
  torch.manual_seed(seed)
  model = cls(transformers.BertConfig(**{**SMALL, **overrides}))
  return model.eval()


def _batch():
  """Two sequences [CLS] A [SEP] B [SEP] with padding; the second is shorter."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, SMALL["vocab_size"], size=(2, 16)).astype(np.int32)
  ids[:, 0] = CLS
  ids[0, 7], ids[0, 15] = SEP, SEP  # A = 1..6, B = 8..14, full length.
  ids[1, 5], ids[1, 11] = SEP, SEP  # A = 1..4, B = 6..10, padded from 12.
  ids[1, 12:] = PAD
  types = np.zeros_like(ids)
  types[0, 8:16] = 1
  types[1, 6:12] = 1
  mask = (ids != PAD).astype(np.int32)
  mask[0] = 1
  positions = np.array([[1, 3, 9, 14], [2, 4, 7, 10]], np.int32)
  return ids, types, mask, positions


def _ours(params, ids, types, mask, positions, config):
  return BertForPreTraining(config).apply({"params": params}, ids, types, mask, positions,
                                          deterministic=True)


def test_parameter_count_matches_huggingface_bert_base():
  hf = transformers.BertForPreTraining(transformers.BertConfig())
  # Tied decoder weights appear once in .parameters().
  hf_count = sum(p.numel() for p in hf.parameters())
  assert hf_count == 110_106_428
  from configs import base
  config = BertConfig.from_config(base.get_config().model)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: BertForPreTraining(config).init(
      jax.random.key(0), ids, ids, ids, ids[:, :2]))
  params = nn.meta.unbox(shapes["params"])
  # The table is padded to 30,592 rows (config.model.vocab_pad_multiple); the count is the real
  # vocabulary's, as HuggingFace's.
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape == (30592, 768)
  assert num_params(params, config) == hf_count
  assert sum(x.size for x in jax.tree.leaves(params)) == hf_count + 70 * (768 + 1)


def test_same_weights_same_logits_as_huggingface_and_round_trip():
  hf = _hf_model()
  config = hf_bert.config_from_hf(hf.config.to_dict())
  params = hf_bert.params_from_hf(hf.state_dict(), config)
  ids, types, mask, positions = _batch()
  ours = _ours(params, ids, types, mask, positions, config)
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
             token_type_ids=torch.tensor(types, dtype=torch.long),
             attention_mask=torch.tensor(mask, dtype=torch.long))
  hf_mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
  np.testing.assert_allclose(ours["mlm_logits"], hf_mlm, atol=1e-5, rtol=0)
  np.testing.assert_allclose(ours["nsp_logits"], out.seq_relationship_logits.numpy(),
                             atol=1e-5, rtol=0)

  # Round trip: a fresh HF model loads our export strictly and gives the same logits.
  exported = hf_bert.params_to_hf(params, config)
  hf2 = _hf_model(seed=1)
  hf2.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
  with torch.no_grad():
    out2 = hf2(input_ids=torch.tensor(ids, dtype=torch.long),
               token_type_ids=torch.tensor(types, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long))
  np.testing.assert_allclose(out2.prediction_logits.numpy(), out.prediction_logits.numpy(),
                             atol=1e-5, rtol=0)
  np.testing.assert_allclose(out2.seq_relationship_logits.numpy(),
                             out.seq_relationship_logits.numpy(), atol=1e-5, rtol=0)


def test_encoder_only_checkpoint_converts_with_a_clear_note():
  hf = _hf_model(transformers.BertModel)
  config = hf_bert.config_from_hf(hf.config.to_dict())
  with pytest.warns(UserWarning, match="no MLM head, NSP head"):
    params = hf_bert.params_from_hf(hf.state_dict(), config)
  assert set(params) == {"bert"}
  ids, types, mask, _ = _batch()
  sequence, pooled = BertModel(config).apply({"params": params["bert"]}, ids, types, mask)
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
             token_type_ids=torch.tensor(types, dtype=torch.long),
             attention_mask=torch.tensor(mask, dtype=torch.long))
  np.testing.assert_allclose(sequence, out.last_hidden_state.numpy(), atol=1e-5, rtol=0)
  np.testing.assert_allclose(pooled, out.pooler_output.numpy(), atol=1e-5, rtol=0)

  masked_lm = _hf_model(transformers.BertForMaskedLM)
  with pytest.warns(UserWarning, match="no pooler, NSP head"):
    params = hf_bert.params_from_hf(masked_lm.state_dict(), config)
  assert "mlm" in params and "nsp" not in params and "pooler" not in params["bert"]


def test_bad_checkpoints_name_the_key():
  hf = _hf_model()
  config = hf_bert.config_from_hf(hf.config.to_dict())
  state = {k: v.numpy() for k, v in hf.state_dict().items()}
  with pytest.raises(ValueError, match="Unknown keys.*bert.extra.weight"):
    hf_bert.params_from_hf({**state, "bert.extra.weight": np.zeros(3)}, config)
  broken = dict(state)
  del broken["bert.encoder.layer.1.output.dense.bias"]
  with pytest.raises(ValueError, match="bert.encoder.layer.1.output.dense.bias"):
    hf_bert.params_from_hf(broken, config)
  broken = dict(state)
  del broken["cls.seq_relationship.bias"]
  with pytest.raises(ValueError, match="cls.seq_relationship.bias"):
    hf_bert.params_from_hf(broken, config)
  wrong = BertConfig(**{**SMALL, "intermediate_size": 96})
  with pytest.raises(ValueError, match="Shape mismatch for bert.encoder.layer.0.intermediate"):
    hf_bert.params_from_hf(state, wrong)
  with pytest.raises(ValueError, match="model_type"):
    hf_bert.config_from_hf({"model_type": "roberta"})


@pytest.fixture(scope="module")
def random_model():
  config = BertConfig(**SMALL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  ids, types, mask, positions = _batch()
  params = BertForPreTraining(config).init(jax.random.key(0), ids, types, mask, positions)
  return config, nn.meta.unbox(params["params"])


def test_encoder_is_bidirectional_and_ignores_padding(random_model):
  config, params = random_model
  ids, types, mask, positions = _batch()
  ids[0, 3] = MASK
  base = _ours(params, ids, types, mask, positions, config)["mlm_logits"]
  right = ids.copy()
  right[0, 5] = (right[0, 5] + 1 - 5) % (SMALL["vocab_size"] - 5) + 5  # A token right of pos 3.
  changed = _ours(params, right, types, mask, positions, config)["mlm_logits"]
  assert np.abs(np.asarray(changed[0, 1] - base[0, 1])).max() > 1e-4  # Slot 1 is position 3.

  padded = ids.copy()
  padded[1, 13] = 77  # Sequence 1 is padding from position 12 on (mask 0 there).
  types_padded = types.copy()
  types_padded[1, 14] = 1
  out = _ours(params, padded, types_padded, mask, positions, config)
  ref = _ours(params, ids, types, mask, positions, config)
  np.testing.assert_array_equal(out["mlm_logits"], ref["mlm_logits"])
  np.testing.assert_array_equal(out["nsp_logits"], ref["nsp_logits"])


def test_segment_ids_change_the_outputs(random_model):
  config, params = random_model
  ids, types, mask, positions = _batch()
  ref = _ours(params, ids, types, mask, positions, config)
  flipped = _ours(params, ids, np.zeros_like(types), mask, positions, config)
  assert np.abs(np.asarray(ref["nsp_logits"] - flipped["nsp_logits"])).max() > 1e-4
  assert np.abs(np.asarray(ref["mlm_logits"] - flipped["mlm_logits"])).max() > 1e-4


def test_loss_counts_exactly_the_selected_positions(random_model):
  """Selected targets count whether or not their token was replaced; nothing else counts."""
  config, params = random_model
  ids, types, mask, positions = _batch()
  corrupted = ids.copy()
  corrupted[0, 1] = MASK  # Slot 0: replaced by [MASK].
  # Slot 1 (position 3) is selected but keeps its token; slots 2-3 of row 0 are unused.
  labels = np.take_along_axis(ids, positions, axis=1)
  weights = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], np.float32)
  batch = dict(masked_lm_ids=labels, masked_lm_weights=weights,
               next_sentence_label=np.array([0, 1], np.int32),
               nsp_weights=np.ones((2,), np.float32))

  def loss_of(labels_):
    out = _ours(params, corrupted, types, mask, positions, config)
    batch_ = {**batch, "masked_lm_ids": labels_}
    sums = losses.pretraining_sums(out, batch_)
    task = PretrainingTask(config, MaskingConfig(config.vocab_size, MASK, (0, MASK)), ids.shape[1],
                           examples_per_row=1)
    return task.loss(sums, task.loss_counts(batch_)), sums

  loss, sums = loss_of(labels)
  assert float(sums["mlm_count"]) == 5.0
  out = _ours(params, corrupted, types, mask, positions, config)
  log_probs = jax.nn.log_softmax(out["mlm_logits"], axis=-1)
  nll = -np.take_along_axis(np.asarray(log_probs), labels[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(sums["mlm_loss_sum"], (nll * weights).sum(), rtol=1e-6)
  # The unchanged-but-selected target contributes: a different label changes the loss.
  other = labels.copy()
  other[0, 1] = (other[0, 1] + 1) % SMALL["vocab_size"]
  assert float(loss_of(other)[0]) != float(loss)
  # An unused slot never contributes.
  other = labels.copy()
  other[0, 2] = (other[0, 2] + 1) % SMALL["vocab_size"]
  assert float(loss_of(other)[0]) == float(loss)
  expected = (nll * weights).sum() / 5.0 + float(sums["nsp_loss_sum"]) / 2.0
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_jitted_forward_compiles_once_per_shape(random_model):
  config, params = random_model
  traces = []

  @jax.jit
  def forward(params, ids, types, mask, positions):
    traces.append(ids.shape)
    return _ours(params, ids, types, mask, positions, config)

  ids, types, mask, positions = _batch()
  for shift in range(3):
    forward(params, (ids + shift) % SMALL["vocab_size"], types, mask, positions)
  assert traces == [(2, 16)]
  forward(params, ids[:, :8], types[:, :8], mask[:, :8], positions)
  assert traces == [(2, 16), (2, 8)]


def test_dropout_is_active_only_when_not_deterministic(random_model):
  _, params = random_model
  config = BertConfig(**SMALL)
  ids, types, mask, positions = _batch()
  model = BertForPreTraining(config)
  eval_a = model.apply({"params": params}, ids, types, mask, positions, deterministic=True)
  eval_b = model.apply({"params": params}, ids, types, mask, positions, deterministic=True)
  np.testing.assert_array_equal(eval_a["mlm_logits"], eval_b["mlm_logits"])
  train = model.apply({"params": params}, ids, types, mask, positions, deterministic=False,
                      rngs={"dropout": jax.random.key(1)})
  assert np.abs(np.asarray(train["mlm_logits"] - eval_a["mlm_logits"])).max() > 1e-3


def test_bfloat16_compute_keeps_f32_params_and_logits(random_model):
  _, params = random_model
  config = BertConfig(**SMALL, dtype="bfloat16")
  ids, types, mask, positions = _batch()
  out = BertForPreTraining(config).apply({"params": params}, ids, types, mask, positions)
  assert out["mlm_logits"].dtype == jnp.float32
  ref = BertForPreTraining(BertConfig(**SMALL)).apply({"params": params}, ids, types, mask,
                                                      positions)
  # bf16 has ~3 significant digits: close, not equal.
  assert np.abs(np.asarray(out["nsp_logits"] - ref["nsp_logits"])).max() < 0.1
  assert config.param_dtype == jnp.float32


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_all_padding_row_is_finite_and_padding_is_invisible(random_model, dtype, deterministic):
  """A row whose attention_mask is all 0 (packing and fine-tuning batches have them) gives
  finite outputs in bf16 too, on the fused (deterministic) and the dropout attention paths;
  what sits in padded positions never changes the outputs of real ones."""
  _, params = random_model
  config = BertConfig(**SMALL, dtype=dtype)
  model = BertForPreTraining(config)
  ids, types, mask, positions = _batch()
  mask[1] = 0  # Row 1: every key is padding.
  rngs = None if deterministic else {"dropout": jax.random.key(3)}
  out = model.apply({"params": params}, ids, types, mask, positions,
                    deterministic=deterministic, rngs=rngs)
  assert np.isfinite(np.asarray(out["mlm_logits"])).all()
  assert np.isfinite(np.asarray(out["nsp_logits"])).all()

  ids, types, mask, positions = _batch()  # Row 1 padded from position 12 on.
  padded = ids.copy()
  padded[1, 12:] = 77
  other = model.apply({"params": params}, padded, types, mask, positions,
                      deterministic=deterministic, rngs=rngs)
  ref = model.apply({"params": params}, ids, types, mask, positions,
                    deterministic=deterministic, rngs=rngs)
  np.testing.assert_array_equal(other["mlm_logits"], ref["mlm_logits"])
  np.testing.assert_array_equal(other["nsp_logits"], ref["nsp_logits"])


def _packed_row(examples, length):
  """[(ids, types)] -> one packed row: input ids, token types, segment ids, positions
  restarting per example, [CLS] positions, each example's start."""
  row = {name: np.zeros((1, length), np.int32) for name in ("ids", "types", "segments",
                                                            "positions")}
  starts, cursor = [], 0
  for k, (ids, types) in enumerate(examples, start=1):
    n = len(ids)
    row["ids"][0, cursor:cursor + n] = ids
    row["types"][0, cursor:cursor + n] = types
    row["segments"][0, cursor:cursor + n] = k
    row["positions"][0, cursor:cursor + n] = np.arange(n)
    starts.append(cursor)
    cursor += n
  return row, starts


def test_packed_examples_equal_each_example_alone_and_never_see_each_other(random_model):
  """No cross-contamination: a packed row's per-example MLM and NSP logits equal each example
  run alone with the same masked positions; changing one example changes no other's outputs."""
  config, params = random_model
  model = BertForPreTraining(config)
  rng = np.random.default_rng(7)
  examples, targets = [], []
  for n_a, n_b in ((3, 4), (5, 5), (2, 2)):
    ids = np.concatenate([[CLS], rng.integers(5, SMALL["vocab_size"], n_a), [SEP],
                          rng.integers(5, SMALL["vocab_size"], n_b), [SEP]]).astype(np.int32)
    ids[[1, n_a + 2]] = MASK
    examples.append((ids, np.asarray([0] * (n_a + 2) + [1] * (n_b + 1), np.int32)))
    targets.append([1, n_a + 2])  # Two masked positions per example.
  length = 32
  row, starts = _packed_row(examples, length)
  masked = np.asarray([[s + t for s, ts in zip(starts, targets) for t in ts]], np.int32)
  packed = model.apply({"params": params}, row["ids"], row["types"], row["segments"], masked,
                       position_ids=row["positions"], cls_positions=np.asarray([starts]))
  assert packed["nsp_logits"].shape == (1, 3, 2)
  for k, (example, example_targets) in enumerate(zip(examples, targets)):
    alone, _ = _packed_row([example], length)
    out = model.apply({"params": params}, alone["ids"], alone["types"], alone["segments"],
                      np.asarray([example_targets], np.int32))
    np.testing.assert_allclose(packed["mlm_logits"][0, 2 * k:2 * k + 2], out["mlm_logits"][0],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed["nsp_logits"][0, k], out["nsp_logits"][0], atol=1e-5, rtol=0)

  changed = row["ids"].copy()
  changed[0, starts[1] + 3:starts[2] - 1] = 7  # Example 2's tokens (not its [CLS]/[SEP]).
  other = model.apply({"params": params}, changed, row["types"], row["segments"], masked,
                      position_ids=row["positions"], cls_positions=np.asarray([starts]))
  np.testing.assert_array_equal(other["mlm_logits"][0, [0, 1, 4, 5]],
                                packed["mlm_logits"][0, [0, 1, 4, 5]])
  np.testing.assert_array_equal(other["nsp_logits"][0, [0, 2]], packed["nsp_logits"][0, [0, 2]])
  assert np.abs(np.asarray(other["nsp_logits"][0, 1] - packed["nsp_logits"][0, 1])).max() > 1e-4
