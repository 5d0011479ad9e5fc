"""The embedding task (bert_jax/tasks/embedding.py) on the one trainer: the compiled step on any
mesh equals one device's (in-batch negatives from the whole global batch), GradCache equals the
one-pass step, pooling as sentence-transformers pools, the records' bad input in one line."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_checks
from bert_jax.models.model import BertConfig
from bert_jax.tasks.embedding import EmbeddingSettings, EmbeddingTask, pool_texts
from bert_jax.training import programs, sharding
from bert_jax.training.settings import TrainSettings
from configs import finetune_embedding

LENGTH, EXAMPLES, NEGATIVES, VOCAB = 16, 16, 1, 200
MODEL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, max_position_embeddings=LENGTH, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)


def _task(**embedding) -> EmbeddingTask:
  values = dict(pooling="mean", normalize=True, num_negatives=NEGATIVES, scale=20.0,
                symmetric=True, mask_false_negatives=True, matryoshka_dims=())
  values.update(embedding)
  settings = EmbeddingSettings(labels=(), max_seq_length=LENGTH, head_dropout_prob=0.0,
                               freeze_encoder=False, **values)
  return EmbeddingTask(BertConfig(**MODEL), settings)


def _batch(seed=0) -> dict[str, np.ndarray]:
  """EXAMPLES examples of query, positive, one negative; texts of varied length; the last
  example's negative absent."""
  rng = np.random.default_rng(seed)
  texts = 2 + NEGATIVES
  ids = np.zeros((EXAMPLES, texts, LENGTH), np.int32)
  mask = np.zeros_like(ids)
  for e in range(EXAMPLES):
    for t in range(texts):
      n = int(rng.integers(3, LENGTH + 1))
      ids[e, t, :n] = [2, *rng.integers(5, VOCAB, size=n - 2), 3]
      mask[e, t, :n] = 1
  weight = np.ones((EXAMPLES, texts), np.float32)
  weight[-1, 2] = 0
  hashes = rng.integers(0, 2**31 - 1, size=(EXAMPLES, texts)).astype(np.int32)
  return {"input_ids": ids, "attention_mask": mask, "text_weight": weight, "text_hash": hashes}


def _config(data=1, fsdp=1, accum=1):
  config = finetune_embedding.get_config()
  config.train.batch_size = EXAMPLES
  config.train.num_train_steps = 10
  config.train.grad_accum_steps = accum
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = data, fsdp, 1
  return config


def _steps(task, config, devices, steps=2):
  """Losses and final state of `steps` compiled train steps on a mesh over `devices`."""
  settings = TrainSettings.from_config(config)
  mesh = sharding.make_mesh(settings.mesh, devices)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(settings.mesh)):
    prog = programs.make_program(settings, task, mesh)
    state = prog.init(jax.random.key(0))
    losses = []
    for i in range(steps):
      batch = sharding.global_batch_from_local(_batch(i), mesh)
      state, metrics = prog.train_step(state, batch, jax.random.key(1))
      losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params)


def _close(params, reference, tol):
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(reference)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def one_device():
  return _steps(_task(), _config(), jax.devices()[:1])


@pytest.mark.parametrize("mesh", [dict(data=8), dict(data=2, fsdp=4)])
def test_a_mesh_gives_one_devices_loss_and_update(one_device, mesh):
  """8 devices: every query still ranks all EXAMPLES x 2 documents of the global batch (with
  negatives per device, 2 examples each, the loss would be far lower)."""
  losses, params = _steps(_task(), _config(**mesh), jax.devices())
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-6)
  _close(params, one_device[1], 1e-6)
  # At init the loss is near chance over the whole batch: log of ~31 documents forward, ~16
  # queries back (symmetric). Per-device negatives (2 examples per device, 4 documents and 2
  # queries) could not exceed (log 4 + log 2) / 2 = 1.04 at chance.
  assert losses[0] > 2.5


def test_grad_cache_equals_the_one_pass_step(one_device):
  losses, params = _steps(_task(), _config(accum=4), jax.devices()[:1])
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-6)
  _close(params, one_device[1], 1e-6)


def test_grad_cache_gradients_equal_one_pass_on_a_mesh():
  """The gradients themselves (f32), GradCache over 4 chunks vs one pass, data 2 x fsdp 4."""
  task = _task(matryoshka_dims=(32, 8))
  params = task.model.init(jax.random.key(0), *task.example_inputs())["params"]
  batch = {k: jnp.asarray(v) for k, v in _batch(3).items()}
  counts = task.loss_counts(batch)
  one = jax.jit(lambda p, b: task.gradients(p, b, jax.random.key(2), counts, 1))(params, batch)
  four = jax.jit(lambda p, b: task.gradients(p, b, jax.random.key(2), counts, 4))(params, batch)
  np.testing.assert_allclose(float(four[0]), float(one[0]), rtol=1e-6)
  for name in ("contrastive_loss_sum", "contrastive_correct_sum", "contrastive_count"):
    np.testing.assert_allclose(float(four[1][name]), float(one[1][name]), rtol=1e-6)
  # Summed in another order (chunk by chunk): equal to 1e-6 of the largest gradient entry (a
  # tensor whose gradient is 0 in exact arithmetic, the key bias, holds rounding noise only).
  largest = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(one[2]))
  assert largest > 1e-2
  for got, want in zip(jax.tree.leaves(four[2]), jax.tree.leaves(one[2])):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-6 * largest)


def test_pooling_is_sentence_transformers_pooling():
  torch = pytest.importorskip("torch")
  from sentence_transformers.sentence_transformer.modules import Pooling  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  sequence = rng.normal(size=(4, 7, 8)).astype(np.float32)
  mask = np.zeros((4, 7), np.int32)
  for row, n in enumerate((7, 3, 1, 5)):
    mask[row, :n] = 1
  for mode in ("mean", "cls", "max"):
    pooling = Pooling(8, pooling_mode=mode)
    expected = pooling({"token_embeddings": torch.tensor(sequence),
                        "attention_mask": torch.tensor(mask)})["sentence_embedding"].numpy()
    ours = np.asarray(pool_texts(sequence, mask, mode, normalize=False))
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-6)
  normalized = np.asarray(pool_texts(sequence, mask, "mean", normalize=True))
  np.testing.assert_allclose(np.linalg.norm(normalized, axis=-1), 1.0, rtol=1e-6)


def test_bad_settings_are_one_line_each():
  config = finetune_embedding.get_config()
  config.init_from, config.data.train_file = "somewhere", "pairs.jsonl"
  config_checks.check_finetuning(config)
  for field, value, message in (
      ("scale", 0.0, r"config.embedding.scale=0.0 must be > 0"),
      ("scale", -1.0, r"config.embedding.scale=-1.0 must be > 0"),
      ("pooling", "first", r"config.embedding.pooling='first' must be one of 'auto', 'mean'"),
      ("matryoshka_dims", (8, 8), r"matryoshka_dims=\(8, 8\) must be distinct integers >= 1"),
      ("num_negatives", -1, r"config.embedding.num_negatives=-1 must be an integer >= 0")):
    bad = config.copy_and_resolve_references()
    bad.embedding[field] = value
    with pytest.raises(ValueError, match=message):
      config_checks.check_finetuning(bad)
  bad = config.copy_and_resolve_references()
  bad.embedding.matryoshka_dims = (64, 16)
  with pytest.raises(ValueError, match=r"matryoshka_dims=\[64, 16\] has 64, wider than the "
                                       r"encoder's hidden_size=32"):
    EmbeddingSettings.from_config(bad, [], BertConfig(**MODEL))
