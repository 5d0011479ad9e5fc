"""Attention implementations agree, and the padded vocabulary is invisible: to the outputs,
losses and gradients, to masking's random replacements, to HuggingFace import and export, to
the parameter count, and at every boundary where weights enter or leave a padded model."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax import tasks, train
from bert_jax.objectives import losses
from bert_jax.training import resume, sharding
from bert_jax.weights import hf_bert
from bert_jax.models.model import (BertConfig, BertForPreTraining, attention_mask_from_segments,
                            einsum_attention)
from bert_jax.weights.layout import num_params, pad_vocab, unpad_vocab
from configs import base

SMALL = dict(vocab_size=211, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)
PADDED = dict(SMALL, vocab_pad_multiple=128)  # 211 -> 256 rows.


def _segments() -> np.ndarray:
  """[3, 16]: two packed examples then padding; one full example; a row of padding only."""
  return np.array([[1] * 6 + [2] * 7 + [0] * 3, [1] * 16, [0] * 16], np.int32)


def _inputs(length: int = 16, seed: int = 0):
  """Token ids, types, segment ids [3, L] and masked positions [3, 4] of `_segments` rows."""
  rng = np.random.default_rng(seed)
  segments = _segments()
  ids = np.where(segments > 0, rng.integers(5, SMALL["vocab_size"], segments.shape), 0)
  types = (np.arange(length) % 5 > 2).astype(np.int32)[None].repeat(3, 0) * (segments > 0)
  positions = np.array([[1, 4, 8, 11], [0, 3, 9, 15], [0, 1, 2, 3]], np.int32)
  return ids.astype(np.int32), types.astype(np.int32), segments, positions


@pytest.fixture(scope="module")
def real_model():
  """(unpadded config, its params) of a small random BERT (random numbers in the shapes of its
  init: running the init itself costs seconds of compile here)."""
  config = BertConfig(**SMALL)
  shapes = jax.eval_shape(BertForPreTraining(config).init, jax.random.key(0), *_inputs())
  rng = np.random.default_rng(0)
  return config, jax.tree.map(lambda x: (0.3 * rng.normal(size=x.shape)).astype(x.dtype),
                              nn.meta.unbox(shapes["params"]))


@functools.lru_cache(maxsize=None)
def _forward(config: BertConfig):
  model = BertForPreTraining(config)
  return jax.jit(lambda params, *inputs: model.apply({"params": params}, *inputs))


def _apply(config, params, *inputs):
  return _forward(config)(params, *inputs)


# ------------------------------------------------------------------------------ attention


def test_xla_attention_equals_the_einsum_path_and_a_float64_reference():
  rng = np.random.default_rng(0)
  query, key, value = (rng.normal(size=(3, 16, 4, 8)).astype(np.float32) for _ in range(3))
  mask = attention_mask_from_segments(jnp.asarray(_segments()))  # [3, 1, 16, 16]
  fused = jax.nn.dot_product_attention(query, key, value, mask=mask, implementation="xla")
  explicit = einsum_attention(query, key, value, mask)
  # float64 reference: softmax over the allowed keys; a query with none (the padding-only row)
  # attends uniformly to every key, as the finite mask value gives.
  scores = np.einsum("bqnd,bknd->bnqk", query.astype(np.float64), key) / np.sqrt(8)
  allowed = np.asarray(mask)
  scores = np.where(allowed, scores, -np.inf)
  scores = np.where(allowed.any(-1, keepdims=True), scores, 0.0)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  reference = np.einsum("bnqk,bknd->bqnd", probs / probs.sum(-1, keepdims=True), value)
  assert np.abs(np.asarray(fused) - np.asarray(explicit)).max() <= 1e-6
  assert np.abs(np.asarray(fused) - reference).max() <= 1e-6
  assert np.abs(np.asarray(explicit) - reference).max() <= 1e-6


def test_model_outputs_equal_with_xla_and_einsum_attention(real_model):
  config, params = real_model
  inputs = _inputs()
  xla = _apply(dataclasses.replace(config, attention_impl="xla"), params, *inputs)
  einsum = _apply(dataclasses.replace(config, attention_impl="einsum"), params, *inputs)
  for name in ("mlm_logits", "nsp_logits"):
    assert np.abs(np.asarray(xla[name]) - np.asarray(einsum[name])).max() <= 1e-6, name
  with pytest.raises(ValueError, match="attention_impl='flash'"):
    BertConfig(attention_impl="flash")


# ------------------------------------------------------------------------------ padding


def test_padded_rows_are_never_predicted_and_never_learn(real_model):
  config, params = real_model
  padded_config = BertConfig(**PADDED)
  assert padded_config.padded_vocab_size == 256
  padded = pad_vocab(params, padded_config)
  table = padded["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert table.shape == (256, 32) and np.all(table[211:] == 0)
  assert padded["mlm"]["bias"].shape == (256,) and np.all(padded["mlm"]["bias"][211:] == 0)
  # Whatever the padded rows hold, outputs, loss and gradients are the unpadded model's.
  garbage = jax.tree.map(lambda x: x, padded)
  garbage["bert"]["embeddings"]["word_embeddings"]["embedding"] = np.concatenate(
      [table[:211], np.full((45, 32), 50.0, np.float32)])
  garbage["mlm"]["bias"] = np.concatenate([params["mlm"]["bias"], np.full(45, 1e4, np.float32)])
  inputs = _inputs()
  labels = np.asarray(inputs[0])[np.arange(3)[:, None], inputs[3]]  # [3, 4]
  weights = np.ones((3, 4), np.float32)

  def mlm_loss(tree, model_config):
    outputs = BertForPreTraining(model_config).apply({"params": tree}, *inputs)
    return losses.mlm_sums(outputs["mlm_logits"], labels, weights)["mlm_loss_sum"], outputs

  loss_and_grads = jax.jit(jax.value_and_grad(mlm_loss, has_aux=True), static_argnums=1)
  (real_loss, reference), real_grads = loss_and_grads(params, config)
  # Also with the 256 rows split over tensor 4 (fsdp 2): the logits cut to 211 are uneven there.
  mesh = sharding.make_mesh(_train_config(fsdp=2, tensor=4).mesh, jax.devices()[:8])
  rules = sharding.logical_rules(base.get_config().mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(BertForPreTraining(padded_config).init, jax.random.key(0), *inputs)
    split = jax.device_put(padded, sharding.logical_to_shardings(boxed["params"], mesh, rules))
  assert split["bert"]["embeddings"]["word_embeddings"]["embedding"].sharding.spec == (
      jax.sharding.PartitionSpec("tensor", "fsdp"))
  for tree in (padded, garbage, split):
    (loss, outputs), grads = loss_and_grads(tree, padded_config)
    assert outputs["mlm_logits"].shape == (3, 4, 211)  # [B, P, V]: the real vocabulary.
    np.testing.assert_allclose(outputs["mlm_logits"], reference["mlm_logits"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(outputs["nsp_logits"], reference["nsp_logits"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(loss, real_loss, rtol=1e-6)
    table_grad = np.asarray(grads["bert"]["embeddings"]["word_embeddings"]["embedding"])
    assert np.all(table_grad[211:] == 0) and np.all(np.asarray(grads["mlm"]["bias"])[211:] == 0)
    np.testing.assert_allclose(table_grad[:211], real_grads["bert"]["embeddings"][
        "word_embeddings"]["embedding"], atol=1e-6, rtol=1e-5)


def test_pad_and_unpad_are_inverse_and_keep_absent_heads_absent(real_model):
  config, params = real_model
  padded_config = BertConfig(**PADDED)
  real_config, back = unpad_vocab(padded_config, pad_vocab(params, padded_config))
  assert real_config == config
  jax.tree.map(np.testing.assert_array_equal, back, params)
  encoder_only = {"bert": params["bert"]}
  assert set(pad_vocab(encoder_only, padded_config)) == {"bert"}
  with pytest.raises(ValueError, match="word_embeddings/embedding has 211 rows, fewer than "
                                       "vocab_size=300"):
    pad_vocab(params, BertConfig(**{**PADDED, "vocab_size": 300}))
  # Every padding of BERT-Base counts HuggingFace's parameters.
  assert num_params(pad_vocab(params, padded_config), padded_config) == num_params(params, config)


def test_hf_weights_import_into_a_padded_model_and_export_unpadded():
  torch.manual_seed(0)
  hf = transformers.BertForPreTraining(transformers.BertConfig(
      **{k: v for k, v in SMALL.items() if "dropout" not in k})).eval()
  config = dataclasses.replace(hf_bert.config_from_hf(hf.config.to_dict()),
                               vocab_pad_multiple=128)
  state = {k: v.numpy() for k, v in hf.state_dict().items()}
  params = hf_bert.params_from_hf(state, config)
  assert params["mlm"]["bias"].shape == (256,)
  assert num_params(params, config) == sum(p.numel() for p in hf.parameters())
  ids, types, segments, positions = _inputs()
  with torch.no_grad():
    out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
             token_type_ids=torch.tensor(types, dtype=torch.long),
             attention_mask=torch.tensor(segments > 0, dtype=torch.long))
  hf_mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
  ours = _apply(config, params, ids, types, (segments > 0).astype(np.int32), positions)
  # Rows with real tokens (a row of padding only has no defined output; nothing reads it).
  np.testing.assert_allclose(ours["mlm_logits"][:2], hf_mlm[:2], atol=1e-5, rtol=0)
  exported = hf_bert.params_to_hf(params, config)
  for name, array in state.items():
    if not name.endswith(("position_ids", "token_type_ids")):
      np.testing.assert_array_equal(exported[name], array, err_msg=name)


def test_pretrained_weights_enter_a_padded_task_padded(real_model):
  config, params = real_model
  padded_config = BertConfig(**PADDED)
  pretraining = train.pretraining_task(_train_config(), padded_config, None)
  entered = pretraining.initial_params(params)
  assert entered["mlm"]["bias"].shape == (256,)
  jax.tree.map(np.testing.assert_array_equal, unpad_vocab(padded_config, entered)[1], params)
  settings = tasks.ClassificationTask.settings_class(
      labels=("a", "b"), max_seq_length=16, head_dropout_prob=0.1, freeze_encoder=False,
      regression=False)
  classification = tasks.ClassificationTask(padded_config, settings)
  encoder = classification.initial_params({"bert": params["bert"]})["bert"]
  assert encoder["embeddings"]["word_embeddings"]["embedding"].shape == (256, 32)


def _train_config(fsdp: int = 1, tensor: int = 1, **masking):
  config = base.get_config()
  config.model.update(**PADDED)
  config.mesh.update(data=1, fsdp=fsdp, tensor=tensor)
  config.data.max_seq_length = 16
  config.masking.update(max_predictions_per_seq=4, **masking)
  return config


def test_random_replacements_are_drawn_from_the_real_vocabulary_only():
  config = _train_config(mask_token_prob=0.0, random_token_prob=1.0, mask_prob=0.5)
  model_config = BertConfig.from_config(config.model)
  task = train.pretraining_task(config, model_config, None)
  assert (task.masking.vocab_size, model_config.padded_vocab_size) == (211, 256)
  rows = 512
  batch = {"input_ids": np.full((rows, 16), 7, np.int32),
           "word_starts": np.ones((rows, 16), np.int32)}
  masked = jax.jit(task.prepare)(batch, jax.random.key(0), jnp.int32(0))
  replaced = np.asarray(masked["input_ids"])[np.asarray(masked["input_ids"]) != 7]
  assert replaced.size > 500 and replaced.max() < 211 and replaced.max() >= 200


class _SavedCheckpoint:
  """What `resume.check_resumable` reads of a Checkpointer: one checkpoint and its meta."""
  directory = "workdir/checkpoints"
  workdir = "workdir"

  def __init__(self, model_config: dict):
    self.model_config = model_config

  def latest_step(self) -> int:
    return 7

  def read_meta(self, step: int) -> dict:
    del step
    return {"task": {"name": "pretraining"}, "model_config": self.model_config}


def test_resuming_with_another_vocabulary_padding_is_refused():
  config = _train_config()
  padded_config = BertConfig.from_config(config.model)
  task = train.pretraining_task(config, padded_config, None)
  meta = {"model_config": dataclasses.asdict(padded_config)}
  old = dataclasses.asdict(padded_config)
  del old["vocab_pad_multiple"]  # A checkpoint from before the field: unpadded.
  with pytest.raises(ValueError, match=r"workdir/checkpoints/7 was trained with "
                                       r"vocab_pad_multiple=1, this run's config.model."
                                       r"vocab_pad_multiple is 128; set it to 1 to resume"):
    resume.check_resumable(_SavedCheckpoint(old), task, meta, allow_vocab_change=False)
  resume.check_resumable(_SavedCheckpoint({**old, "vocab_pad_multiple": 64}), task, meta,
                         allow_vocab_change=False)  # 256 rows.


def test_layer_init_traced_with_xla_attention_whatever_the_run_uses(monkeypatch):
  """flax traces a param's init at every apply (its shape check); the stacked layers' init is a
  vmap over layers, under which jax 0.11's cuDNN attention cannot batch the [B, 1, L, L] mask
  (the H200 run's reshape TypeError). So the init always traces "xla", whatever the config's
  attention is; the layers themselves run the config's kernel."""
  from bert_jax.models import model as model_lib  # pylint: disable=import-outside-toplevel
  seen = []
  original = model_lib._stacked_layer_params  # pylint: disable=protected-access

  def spy(config, *args):
    seen.append(config.attention_impl)
    return original(config, *args)
  monkeypatch.setattr(model_lib, "_stacked_layer_params", spy)
  config = BertConfig(**dict(SMALL, attention_impl="einsum"))
  ids, types, segments, positions = _inputs()
  module = BertForPreTraining(config)
  variables = jax.eval_shape(module.init, jax.random.key(0), ids, types, segments, positions)
  jax.eval_shape(lambda v: module.apply(v, ids, types, segments, positions), variables)
  assert seen and set(seen) == {"xla"}


def test_embedding_gradient_scatters_in_float32_under_bfloat16():
  """The lookups' gradient is a scatter-add into the tables: in float32 (the params' dtype)
  when the model computes in bfloat16. A bf16 scatter-add there (nn.Embed in the compute dtype)
  made the small model's bf16 step 17x slower on an H200 (benchmarks/gpu_bf16_lookup.py)."""
  config = BertConfig(**dict(SMALL, dtype="bfloat16"))
  ids, types, segments, positions = _inputs()
  module = BertForPreTraining(config)
  params = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), ids, types,
                                        segments, positions)["params"])

  def loss(params):
    out = module.apply({"params": params}, ids, types, segments, positions)
    return jax.tree.reduce(lambda a, b: a + b.astype(jnp.float32).sum(), out, 0.0)
  jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
  scatters = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "scatter-add":
        scatters.append(eqn.outvars[0].aval)
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jaxpr.jaxpr)
  table_rows = {config.padded_vocab_size, config.type_vocab_size}
  tables = [aval for aval in scatters if aval.ndim == 2 and aval.shape[0] in table_rows]
  assert len(tables) == 2, scatters
  assert all(aval.dtype == jnp.float32 for aval in tables), tables
