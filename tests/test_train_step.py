"""The sharded train step: mesh equivalence, shardings from the rules, one compile, gradient
accumulation, the optimizer's decay mask and schedule. Uses 8 forced CPU devices."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.training import optimizer as optimizer_lib, programs, sharding
from bert_jax.training.settings import TrainSettings
from bert_jax.objectives.masking import MaskingConfig
from bert_jax.models.model import BertConfig
from bert_jax.tasks import PretrainingTask
from configs import tiny

SEQ_LEN = 32
BATCH = 16
K = 2  # Examples per row.


def _config(**mesh):
  config = tiny.get_config()
  config.model.vocab_size = 300
  config.model.hidden_size = 64
  config.model.num_hidden_layers = 1
  config.model.num_attention_heads = 4
  config.model.intermediate_size = 128
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_probs_dropout_prob = 0.0
  config.data.max_seq_length = SEQ_LEN
  config.masking.max_predictions_per_seq = 6
  config.train.batch_size = BATCH
  config.train.warmup_steps = 2
  config.train.num_train_steps = 10
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh.get("data", -1), mesh.get(
      "fsdp", 1), mesh.get("tensor", 1)
  return config


def _batch(seed=0):
  """Packed rows: two examples [CLS] A [SEP] B [SEP] (positions 0-12 and 13-27) on even rows,
  one example and padding on odd rows."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 300, size=(BATCH, SEQ_LEN)).astype(np.int32)
  segments = np.zeros_like(ids)
  segments[:, :13] = 1
  segments[::2, 13:28] = 2
  ids[segments == 0] = 0
  ids[:, [0, 5, 12]] = [2, 3, 3]
  ids[::2, 13], ids[::2, 20], ids[::2, 27] = 2, 3, 3
  types = np.zeros_like(ids)
  types[:, 6:13] = 1
  types[::2, 21:28] = 1
  positions = np.where(segments == 2, np.arange(SEQ_LEN) - 13, np.arange(SEQ_LEN))
  positions = np.where(segments == 0, 0, positions).astype(np.int32)
  nsp_weights = np.ones((BATCH, K), np.float32)
  nsp_weights[1::2, 1] = 0.0
  return {"input_ids": ids, "token_type_ids": types, "segment_ids": segments,
          "position_ids": positions, "word_starts": np.ones_like(ids),
          "cls_positions": np.tile(np.int32([0, 13]), (BATCH, 1)) * (nsp_weights > 0),
          "next_sentence_label": rng.integers(0, 2, (BATCH, K)).astype(np.int32),
          "nsp_weights": nsp_weights}


def _run(config, devices, num_steps=3):
  """Losses and final state of `num_steps` steps on a mesh over `devices`."""
  mesh = sharding.make_mesh(config.mesh, devices)
  masking = MaskingConfig.from_config(config.masking, vocab_size=300, mask_token_id=4,
                                      special_token_ids=(0, 1, 2, 3, 4), unk_token_id=1)
  task = PretrainingTask(BertConfig.from_config(config.model), masking, SEQ_LEN, K)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    prog = programs.make_program(TrainSettings.from_config(config), task, mesh)
    state = prog.init(jax.random.key(0))
    losses = []
    for i in range(num_steps):
      batch = sharding.global_batch_from_local(_batch(i), mesh)
      state, metrics = prog.train_step(state, batch, jax.random.key(1))
      losses.append(float(metrics["loss"]))
  return losses, state, prog.train_step


@pytest.fixture(scope="module")
def single_device_run():
  return _run(_config(data=1), jax.devices()[:1])


@pytest.mark.parametrize("mesh", [dict(data=8), dict(data=2, fsdp=4), dict(data=4, tensor=2)])
def test_meshes_give_the_losses_of_one_device(single_device_run, mesh):
  reference, ref_state, _ = single_device_run
  losses, state, _ = _run(_config(**mesh), jax.devices())
  np.testing.assert_allclose(losses, reference, rtol=1e-5)
  # Real updates happened (the MLM bias starts at zero), so the comparison covers them.
  assert np.abs(np.asarray(ref_state.params["mlm"]["bias"])).max() > 1e-4
  layers, ref_layers = (s.params["bert"]["encoder"]["layers"] for s in (state, ref_state))
  np.testing.assert_allclose(layers["mlp"]["intermediate"]["kernel"],
                             ref_layers["mlp"]["intermediate"]["kernel"], rtol=1e-4, atol=1e-6)


def test_parameters_carry_the_shardings_of_the_rules():
  _, state, _ = _run(_config(data=2, fsdp=2, tensor=2), jax.devices(), num_steps=1)
  params = state.params
  P = jax.sharding.PartitionSpec
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].sharding.spec == P(
      "tensor", "fsdp")
  # The stacked layer dimension [S] first, never split; then the rules' axes.
  layers = params["bert"]["encoder"]["layers"]
  assert layers["attention"]["query"]["kernel"].sharding.spec == P(None, "fsdp", "tensor", None)
  assert layers["mlp"]["intermediate"]["kernel"].sharding.spec == P(None, "fsdp", "tensor")
  assert layers["mlp"]["output"]["kernel"].sharding.spec == P(None, "tensor", "fsdp")
  # Adam's moments are sharded like their parameters.
  mu = state.opt_state[1][0].mu
  assert mu["bert"]["encoder"]["layers"]["mlp"]["output"]["kernel"].sharding.spec == P(
      None, "tensor", "fsdp")
  # Each device holds 1/4 of every layer's MLP kernel (fsdp=2 x tensor=2).
  kernel = layers["mlp"]["intermediate"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == (1, 32, 64)


def test_train_step_compiles_once(single_device_run):
  _, _, step = single_device_run
  assert step._cache_size() == 1  # Three steps, one executable.


def test_a_training_compiles_its_train_step_once(tmp_path, caplog):
  """The trainer compiles its step ahead of time (for the memory and FLOPs lines) and then
  calls that executable: the first step does not compile the same program again (it did, up to
  e902ee2: two compiles of each run's step, ~2 s on a tiny CPU model, minutes for a large one on
  a TPU). The persistent cache is off here, so that every compile is a real one."""
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  from bert_jax.training import aot  # pylint: disable=import-outside-toplevel
  from tests import modern_runs  # pylint: disable=import-outside-toplevel
  # A learning rate no other test uses: a program of its own, not in this process's caches.
  config = modern_runs.tiny_config({"train.learning_rate": 7.31e-4, "train.num_train_steps": 3})
  previous = jax.config.jax_log_compiles
  jax.config.update("jax_log_compiles", True)
  try:
    with aot._without_persistent_cache(), caplog.at_level("WARNING"):  # pylint: disable=protected-access
      result = train.train_and_evaluate(config, str(tmp_path))
  finally:
    jax.config.update("jax_log_compiles", previous)
  compiles = [r.getMessage() for r in caplog.records
              if "Finished XLA compilation of jit(train_step)" in r.getMessage()]
  assert result["step"] == 3 and np.isfinite(result["train"]["loss"])
  assert len(compiles) == 1, compiles


def test_gradient_accumulation_equals_the_full_batch():
  full, full_state, _ = _run(_config(data=2), jax.devices()[:2], num_steps=2)
  config = _config(data=2)
  config.train.grad_accum_steps = 4
  accumulated, acc_state, _ = _run(config, jax.devices()[:2], num_steps=2)
  np.testing.assert_allclose(accumulated, full, rtol=1e-5)
  np.testing.assert_allclose(acc_state.params["mlm"]["bias"], full_state.params["mlm"]["bias"],
                             rtol=1e-4, atol=1e-6)


def test_weight_decay_skips_layer_norm_and_biases():
  params = {"layer": {"kernel": 1.0, "bias": 1.0}, "LayerNorm": {"scale": 1.0, "bias": 1.0},
            "word_embeddings": {"embedding": 1.0}}
  mask = optimizer_lib.decay_mask(params)
  assert mask == {"layer": {"kernel": True, "bias": False},
                  "LayerNorm": {"scale": False, "bias": False},
                  "word_embeddings": {"embedding": True}}


def test_lamb_and_bf16_compute_train(single_device_run):
  config = _config(data=1)
  config.train.optimizer = "lamb"
  config.model.dtype = "bfloat16"
  losses, state, _ = _run(config, jax.devices()[:1])
  assert all(np.isfinite(losses))
  assert state.params["mlm"]["bias"].dtype == jnp.float32
  assert abs(losses[0] - single_device_run[0][0]) < 0.05  # Same init, bf16 compute.


def test_bad_mesh_and_batch_give_clear_errors():
  config = _config(data=3)
  with pytest.raises(ValueError, match="config.mesh"):
    sharding.make_mesh(config.mesh)
  mesh = sharding.make_mesh(_config(data=8).mesh)
  with pytest.raises(ValueError, match="batch_size=12 is not divisible by the data x fsdp"):
    sharding.batch_size_per_shard(12, mesh)
  config = _config()
  config.train.optimizer = "sgd"
  with pytest.raises(ValueError, match="config.train.optimizer='sgd'"):
    optimizer_lib.make_optimizer(config.train)
