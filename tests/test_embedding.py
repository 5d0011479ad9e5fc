"""The embedding task (bert_jax/tasks/embedding.py) on the one trainer: the compiled step on any
mesh equals one device's (in-batch negatives from the whole global batch), GradCache equals the
one-pass step, pooling as sentence-transformers pools, the records' bad input in one line."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_checks
from bert_jax.models.model import BertConfig
from bert_jax.tasks.embedding import EmbeddingSettings, EmbeddingTask, packed_rows, pool_texts
from bert_jax.training import programs, sharding
from bert_jax.training.settings import TrainSettings
from configs import finetune_embedding

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

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
  weight[-1, 2] = 0  # As `encode` leaves an absent text: no pieces at all (its vector is 0).
  ids[-1, 2] = mask[-1, 2] = 0
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
  """Losses and final state of `steps` compiled train steps on a mesh over `devices` (packed
  as the run packs them when the task packs)."""
  settings = TrainSettings.from_config(config)
  mesh = sharding.make_mesh(settings.mesh, devices)
  pack = task.batch_packer(programs.row_multiple(mesh, settings.step.grad_accum_steps))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(settings.mesh)):
    prog = programs.make_program(settings, task, mesh)
    state = prog.init(jax.random.key(0))
    losses = []
    for i in range(steps):
      local = _batch(i) if pack is None else {k: v for part in pack(_batch(i)) for k, v in
                                               part.items()}
      batch = sharding.global_batch_from_local(local, mesh)
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


def test_packed_rows_hold_every_text_once_and_train_as_one_text_per_row(one_device):
  """config.embedding.pack: the batch's 47 texts best fit decreasing, K = 2 to a row of 16,
  each its own segment with positions from 0 ([CLS] at its start), R a multiple of data x fsdp
  x chunks; trained on data 2 x fsdp 4 with GradCache over 2 chunks, the losses and update
  equal one device's one text per row."""
  task = _task(pack=True)
  batch = _batch(0)
  examples, rows = task.pack_batch(batch, 16)
  assert rows["input_ids"].shape[0] % 16 == 0 and rows["starts"].shape[1] == 2
  assert rows["input_ids"].shape[0] < EXAMPLES * 3  # Fewer rows than texts.
  lengths = batch["attention_mask"].sum(-1)
  flat = examples["text_index"].reshape(-1)
  present = batch["text_weight"].reshape(-1) > 0
  assert len(set(flat[present].tolist())) == present.sum()  # Each text its own slot.
  for text in np.flatnonzero(present):
    row, slot = divmod(int(flat[text]), 2)
    start, n = rows["starts"][row, slot], lengths.reshape(-1)[text]
    np.testing.assert_array_equal(rows["input_ids"][row, start:start + n],
                                  batch["input_ids"].reshape(-1, LENGTH)[text, :n])
    np.testing.assert_array_equal(rows["position_ids"][row, start:start + n], np.arange(n))
    assert (rows["segment_ids"][row, start:start + n] == slot + 1).all()
  assert (rows["segment_ids"] > 0).sum() == lengths.sum()  # Nothing else in the rows.

  losses, params = _steps(task, _config(data=2, fsdp=4, accum=2), jax.devices())
  np.testing.assert_allclose(losses, one_device[0], rtol=1e-6)
  _close(params, one_device[1], 1e-6)


def test_packed_row_buckets_waste_at_most_a_sixteenth_and_divide_the_mesh():
  """R rows -> a bucket >= R, a multiple of the row multiple (powers of two here), at most R / 16
  rows more (or the next multiple, when larger); a few shapes per octave of R."""
  for multiple in (1, 2, 8, 16):
    for rows in range(1, 600):
      bucket = packed_rows(rows, multiple)
      assert bucket >= rows and bucket % multiple == 0
      assert bucket - rows < max(2 ** (rows.bit_length() - 1) // 16, multiple)
  assert sorted({packed_rows(r, 1) for r in range(27, 33)}) == [27, 28, 29, 30, 31, 32]
  assert sorted({packed_rows(r, 1) for r in range(65, 129)}) == list(range(68, 129, 4))


def test_a_checkpoint_from_before_pack_reads_as_unpacked():
  """Task meta written before `pack` was a setting (no such key) restores with pack off; a
  meta with it round-trips."""
  meta = _task(pack=True).meta()
  assert EmbeddingSettings.from_meta(meta).pack is True
  del meta["pack"]
  assert EmbeddingSettings.from_meta(meta) == _task().settings


def test_packed_batches_split_over_processes_as_one_process_reads_them():
  """Two processes take their halves of the examples and of the packed rows of the same
  global batch; their text_index points into the global rows."""
  from bert_jax.data.finetune import TaskData, TrainBatches  # pylint: disable=import-outside-toplevel
  task = _task(pack=True)
  arrays = {k: np.concatenate([v, v]) for k, v in _batch(0).items()}  # 32 examples.
  data = TaskData("t", arrays, [{}] * (2 * EXAMPLES))
  pack = task.batch_packer(4)
  one = TrainBatches(data, EXAMPLES, 0, 0, 1, pack)
  two = [TrainBatches(data, EXAMPLES, 0, p, 2, pack) for p in range(2)]
  for _ in range(3):
    whole, halves = next(one), [next(t) for t in two]
    for name, value in whole.items():
      np.testing.assert_array_equal(np.concatenate([h[name] for h in halves]), value)


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
  # Summed in another order (chunk by chunk): equal to 4e-6 of the largest gradient entry, ~35
  # f32 ulps of it (1e-6 failed once by 10 ulps on that entry itself; a tensor whose gradient
  # is 0 in exact arithmetic, the key bias, holds rounding noise only).
  largest = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(one[2]))
  assert largest > 1e-2
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(one[2]))
  for got, want in zip(jax.tree.leaves(four[2]), jax.tree.leaves(one[2])):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=4e-6 * largest)


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


def test_training_records_need_two_distinct_positives(tmp_path):
  """One record (or many with one positive): every in-batch negative would be the positive
  itself. Refused for training, in one line naming the file; evaluation reads any number."""
  from bert_jax.data.vocab import Vocab  # pylint: disable=import-outside-toplevel
  (tmp_path / "vocab.txt").write_text("\n".join(
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat", "dog", "mat"]) + "\n")
  vocab = Vocab.from_wordpiece(str(tmp_path / "vocab.txt"))
  task = _task()
  one = [("pairs.jsonl", 1, {"query": "cat", "positive": "mat"})]
  same = one + [("pairs.jsonl", 2, {"query": "dog", "positive": "mat"})]
  for records, count in ((one, 1), (same, 2)):
    with pytest.raises(ValueError, match=rf"^pairs.jsonl: {count} training record\(s\) with 1 "
                                         "distinct positive: in-batch negatives"):
      task.encode(records, vocab, is_training=True)
    assert task.encode(records, vocab).arrays["input_ids"].shape[0] == count  # Evaluation.
  two = same + [("pairs.jsonl", 3, {"query": "cat", "positive": "dog"})]
  assert task.encode(two, vocab, is_training=True).arrays["input_ids"].shape[0] == 3


# ------------------------------------------------------------------ through the fine-tuning driver
QUERY_WORDS = [f"q{i}" for i in range(24)]
DOC_WORDS = [f"d{i}" for i in range(24)]
FILLER = ["the", "a", "of", "and", "to", "in"]


def _pairs_config(tmp_path, steps: int, **overrides):
  """A from-scratch encoder on 24 (query, positive, negative) records whose query and positive
  share no piece: only training can relate them (validation: the same records)."""
  tmp_path.mkdir(parents=True, exist_ok=True)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *QUERY_WORDS,
                              *DOC_WORDS, *FILLER]) + "\n")
  rng = np.random.default_rng(0)
  rows = [{"query": f"{q} {FILLER[i % 6]}",
           "positive": f"{FILLER[(i + 1) % 6]} {d} {FILLER[(i + 2) % 6]}",
           "negatives": [f"{DOC_WORDS[(i + 5) % 24]} {FILLER[(i + 3) % 6]}"]}
          for i, (q, d) in enumerate(zip(QUERY_WORDS, DOC_WORDS))]
  rng.shuffle(rows)
  path = tmp_path / "pairs.jsonl"
  path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
  config = finetune_embedding.get_config()
  config.vocab, config.data.train_file, config.data.validation_file = str(vocab), str(path), str(
      path)
  config.model.update(MODEL)
  config.model.vocab_size = 0
  config.data.max_seq_length = 8
  config.train.update(batch_size=8, num_train_steps=steps, learning_rate=3e-3, warmup_steps=2,
                      eval_every_steps=0, log_every_steps=5)
  config.checkpoint.save_every_steps = 100
  config.logging.tensorboard = False
  config.mesh.data = -1
  for path_, value in overrides.items():
    section, name = path_.split(".")
    config[section][name] = value
  return config


def test_fine_tuning_raises_retrieval_over_the_zero_shot_encoder(tmp_path):
  from bert_jax import finetune  # pylint: disable=import-outside-toplevel
  zero_shot = finetune.finetune_and_evaluate(
      _pairs_config(tmp_path / "zero", 1, **{"train.freeze_encoder": True}),
      str(tmp_path / "zero" / "run"))
  trained = finetune.finetune_and_evaluate(_pairs_config(tmp_path / "trained", 60),
                                           str(tmp_path / "trained" / "run"))
  before, after = zero_shot["final"]["ndcg@10"], trained["final"]["ndcg@10"]
  print(f"nDCG@10 over 48 documents: zero-shot {before:.3f}, fine-tuned {after:.3f}")
  assert trained["final"]["documents"] == 48 and trained["best_metric"] == "ndcg@10"
  assert after >= 0.8 and after - before >= 0.4


def test_sigterm_saves_and_the_resumed_run_is_bit_identical(tmp_path, monkeypatch):
  """Packed batches and GradCache from the driver down: a SIGTERM saves the step under way and
  the resumed run's losses are the straight run's, bit for bit."""
  from bert_jax import finetune  # pylint: disable=import-outside-toplevel
  from bert_jax.data import finetune as finetune_data  # pylint: disable=import-outside-toplevel
  from tests.test_finetune import _step_losses  # pylint: disable=import-outside-toplevel
  from tests.sigterm_at import SigtermAt  # pylint: disable=import-outside-toplevel
  config = _pairs_config(tmp_path, 8, **{"train.log_every_steps": 1, "train.grad_accum_steps": 2,
                                         "train.batch_size": 16,  # GradCache, 2 chunks,
                                         "embedding.pack": True,  # of packed rows,
                                         "data.max_seq_length": 16})  # 2 texts to a row.
  reference = str(tmp_path / "reference")
  finetune.finetune_and_evaluate(config, reference)
  workdir = str(tmp_path / "preempted")
  original = finetune_data.TrainBatches
  monkeypatch.setattr(finetune_data, "TrainBatches",
                      lambda *args: SigtermAt(original(*args), at=3))
  stopped = finetune.finetune_and_evaluate(config, workdir)
  monkeypatch.setattr(finetune_data, "TrainBatches", original)
  assert 1 <= stopped["preempted_at"] < 8
  # Another pooling or normalisation would train another function of the same params.
  for field, value, flag in (("pooling", "cls", "--config.embedding.pooling=mean"),
                             ("normalize", False, "--config.embedding.normalize=true")):
    other = config.copy_and_resolve_references()
    other.embedding[field] = value
    with pytest.raises(ValueError, match=rf"was trained with config.embedding.{field}=.*: set "
                                         rf"{flag} to resume it, or use another --workdir$"):
      finetune.finetune_and_evaluate(other, workdir)
  finetune.finetune_and_evaluate(config, workdir)
  losses, expected = _step_losses(workdir), _step_losses(reference)
  assert [losses[s] for s in range(1, 9)] == [expected[s] for s in range(1, 9)]
  records = [json.loads(l) for l in open(os.path.join(reference, "metrics.jsonl"))]
  fill = [r["fill_rate"] for r in records if r["split"] == "train"]
  # Texts of 3-5 pieces: about a quarter of a 16-slot row alone, half of it two to a row.
  assert min(fill) > 0.4, fill


@pytest.mark.parametrize("architecture", ["bert", "modern"])
@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_packed_embeddings_equal_one_text_per_row(architecture, pooling, tmp_path):
  """Texts packed several to a row (their own segments and positions) embed as each alone."""
  from bert_jax import predict  # pylint: disable=import-outside-toplevel
  from bert_jax.data.vocab import Vocab  # pylint: disable=import-outside-toplevel
  from tests.test_sentence_transformers import MODERN  # pylint: disable=import-outside-toplevel
  model = {**MODEL, "max_position_embeddings": 32}
  if architecture == "modern":
    model.update(MODERN)
  task = EmbeddingTask(BertConfig(**model), EmbeddingSettings(
      labels=(), max_seq_length=32, head_dropout_prob=0.0, freeze_encoder=False,
      pooling=pooling, normalize=pooling != "max", num_negatives=0, scale=20.0, symmetric=False,
      mask_false_negatives=False, matryoshka_dims=()))
  params = task.model.init(jax.random.key(0), *task.example_inputs())["params"]
  words = [f"w{i}" for i in range(40)]
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                 *words]) + "\n")
  vocab = Vocab.from_wordpiece(str(tmp_path / "vocab.txt"))
  rng = np.random.default_rng(0)
  records = [("t", i + 1, {"text": " ".join(rng.choice(words, size=rng.integers(1, 12)))})
             for i in range(23)]
  finetuned = predict.Finetuned(task, params, vocab, {}, 0)

  def embeddings(texts_per_row):
    data = task.encode_texts(records, vocab, texts_per_row)
    outputs = predict._outputs(finetuned, data, 4)  # pylint: disable=protected-access
    return data, np.array([p["embedding"] for p in task.predictions(outputs, data)])

  packed_data, packed = embeddings(None)
  alone_data, alone = embeddings(1)
  assert len(packed_data) < len(alone_data) / 2  # Rows: several texts in each.
  np.testing.assert_allclose(packed, alone, atol=1e-5)
