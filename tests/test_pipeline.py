"""Preparation into TFDS, grain pipelines (train / eval / synthetic), launcher and bad inputs."""

import collections
import dataclasses
import importlib.metadata
import json
import os
import random
import subprocess
import sys

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.data import corpus
from bert_jax.data import blocks
from bert_jax.data import builtin
from bert_jax.data import builtin_selection
from bert_jax.data import packing
from bert_jax.data import pipeline
from bert_jax.data import prepare
from bert_jax.data import tfds_builder
from bert_jax.data import vocab as vocab_lib
from configs import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the model reads text and learns which sentence comes next while masked words are "
         "predicted from their context in every layer of the network on each step").split()
LENGTH = 64
SLOTS = 3  # K of the prepared dataset.


def write_corpus(path: str, num_docs: int, seed: int) -> str:
  """A small English-like corpus in BERT format (a sentence a line, blank line between docs)."""
  rng = random.Random(seed)
  with open(path, "w") as f:
    for _ in range(num_docs):
      for _ in range(rng.randint(2, 8)):
        f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize()
                + ".\n")
      f.write("\n")
  return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """(dataset_dir, corpus path, vocab) of a tiny prepared dataset."""
  root = tmp_path_factory.mktemp("prepared")
  text = write_corpus(str(root / "corpus.txt"), 150, seed=0)
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(text)), str(root / "sp"), 300, "bpe")
  dataset_dir = str(root / "dataset")
  stats = corpus.CorpusStats()
  meta = prepare.prepare_dataset(
      dataset_dir, lambda: corpus.iter_bert_format(text, stats), vocab, max_seq_length=LENGTH,
      dupe_factor=2, validation_fraction=0.2, seed=0, max_examples_per_row=SLOTS, num_workers=0,
      corpus_stats=stats, corpus_fingerprint="test")
  assert meta["splits"]["train"]["rows"] > 200 and meta["splits"]["validation"]["rows"] > 30
  return dataset_dir, text, vocab


def rows(batch):
  """Hashable identity of each row of a batch."""
  return [tuple(batch["input_ids"][i]) + tuple(batch["token_type_ids"][i]) +
          tuple(batch["segment_ids"][i]) + tuple(batch["next_sentence_label"][i])
          for i in range(len(batch["input_ids"]))]


def check_nsp_rows(batch, cls_id, sep_id, pad_id):
  """The layout of packed NSP rows, from the batch alone."""
  for i in range(len(batch["input_ids"])):
    ids, segments = batch["input_ids"][i], batch["segment_ids"][i]
    positions, types = batch["position_ids"][i], batch["token_type_ids"][i]
    weights = batch["nsp_weights"][i]
    num_examples = int(weights.sum())
    assert num_examples >= 1 and (weights == (np.arange(len(weights)) < num_examples)).all()
    assert (ids[segments == 0] == pad_id).all() and (positions[segments == 0] == 0).all()
    assert (types[segments == 0] == 0).all() and (batch["word_starts"][i][segments == 0] == 0).all()
    assert (batch["cls_positions"][i][num_examples:] == 0).all()
    assert (batch["next_sentence_label"][i][num_examples:] == 0).all()
    for k in range(1, num_examples + 1):
      span = np.flatnonzero(segments == k)
      start = batch["cls_positions"][i][k - 1]
      assert span[0] == start and (np.diff(span) == 1).all()  # Contiguous, from its [CLS].
      assert (positions[span] == np.arange(len(span))).all()
      example = ids[span]
      seps = np.flatnonzero(example == sep_id)
      assert example[0] == cls_id and len(seps) == 2 and seps[1] == len(span) - 1
      assert (types[span] == (np.arange(len(span)) > seps[0])).all()
      assert batch["word_starts"][i][span][[0, seps[0], seps[1]]].sum() == 0
    real = int((segments > 0).sum())
    assert (segments[:real] > 0).all() and (segments[real:] == 0).all()  # Padding at the end.


def all_rows(dataset_dir, split):
  source = tfds_builder.data_source(dataset_dir, split)  # TFDS's own decoding.
  return rows(pipeline.stack_examples([source[i] for i in range(len(source))]))


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def train_iterator(dataset_dir, **kwargs):
  args = dict(global_batch_size=8, seed=0, process_index=0, process_count=1)
  return pipeline.make_train_iterator(dataset_dir, **{**args, **kwargs})


def test_meta_vocab_and_batch_contract(prepared):
  dataset_dir, _, vocab = prepared
  meta = prepare.load_meta(dataset_dir)
  assert meta["vocab_size"] == vocab.size == 300 and meta["max_seq_length"] == LENGTH
  assert (meta["pad_id"], meta["cls_id"], meta["sep_id"], meta["mask_id"]) == (0, 2, 3, 4)
  assert meta["settings"]["dupe_factor"] == 2 and meta["corpus_stats"]["documents"] == 150
  assert meta["format_version"] == prepare.FORMAT_VERSION == 3
  assert (meta["objective"], meta["max_examples_per_row"]) == ("mlm_nsp", SLOTS)
  train = meta["splits"]["train"]
  # >=: nearly every example of this corpus of short documents fills its row (a random B runs
  # to the target length), so rows rarely have room for a second one.
  assert train["examples"] == meta["stats"]["train"]["examples"] >= train["rows"]
  assert train["fill_rate"] == pytest.approx(train["real_tokens"] / (train["rows"] * LENGTH),
                                             abs=1e-6)
  assert train["fill_rate"] > 0.9
  assert prepare.load_vocab(dataset_dir).size == 300
  batch = next(train_iterator(dataset_dir))
  assert set(batch) == {*packing.TOKEN_FEATURES, *packing.SLOT_FEATURES}  # No attention_mask.
  for name in packing.TOKEN_FEATURES:
    assert batch[name].shape == (8, LENGTH) and batch[name].dtype == np.int32
  for name in packing.SLOT_FEATURES:
    assert batch[name].shape == (8, SLOTS)
    assert batch[name].dtype == (np.float32 if name == "nsp_weights" else np.int32)
  check_nsp_rows(batch, vocab.cls_id, vocab.sep_id, vocab.pad_id)
  # Our batch decoder agrees with TFDS's per-example decoding.
  source = tfds_builder.data_source(dataset_dir, blocks.TRAIN)
  raw = tfds_builder.data_source(dataset_dir, blocks.TRAIN, raw=True)
  assert_batches_equal([pipeline.decode_records([raw[i] for i in range(5)])],
                       [pipeline.stack_examples([source[i] for i in range(5)])])


def test_block_tokenization_matches_vocab(prepared):
  _, text, vocab = prepared
  docs = list(corpus.iter_bert_format(text))[:20] + [["", "Plain words.", " "]]
  expected = [[vocab.encode_with_word_starts(s) for s in doc] for doc in docs]
  expected = [[(ids, starts) for ids, starts in doc if ids] for doc in expected]
  assert blocks.tokenize_documents(docs, vocab) == expected


def test_same_seed_same_batches(prepared):
  dataset_dir = prepared[0]
  first = take(train_iterator(dataset_dir), 5)
  assert_batches_equal(first, take(train_iterator(dataset_dir), 5))
  other = take(train_iterator(dataset_dir, seed=1), 5)
  assert rows(first[0]) != rows(other[0])


def test_hosts_disjoint_cover_and_match_one_host(prepared):
  dataset_dir = prepared[0]
  everything = all_rows(dataset_dir, blocks.TRAIN)
  n = len(everything)
  num_batches = n // 8 + 2
  single = take(train_iterator(dataset_dir), num_batches)
  hosts = [take(train_iterator(dataset_dir, process_index=p, process_count=2), num_batches)
           for p in range(2)]
  for k in range(num_batches):  # Host p holds rows [4p, 4p + 4) of each global batch of 8.
    assert rows(hosts[0][k]) == rows(single[k])[:4]
    assert rows(hosts[1][k]) == rows(single[k])[4:]
  # The first len(train) global positions are one epoch: each example exactly once.
  stream = [r for batch in single for r in rows(batch)]
  assert collections.Counter(stream[:n]) == collections.Counter(everything)
  stitched = [r for k in range(num_batches) for h in hosts for r in rows(h[k])]
  assert stitched == stream
  # The second epoch is shuffled differently.
  assert stream[n:2 * n - 8] != stream[:n - 8]


def test_restore_state_gives_same_next_batches(prepared, tmp_path):
  dataset_dir = prepared[0]
  iterator = train_iterator(dataset_dir, process_index=1, process_count=2)
  take(iterator, 3)
  state = iterator.get_state()
  with ocp.CheckpointManager(str(tmp_path / "ckpt"),
                             options=ocp.CheckpointManagerOptions(create=True)) as manager:
    manager.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(iterator)))
    manager.wait_until_finished()
  expected = take(iterator, 4)

  restored = train_iterator(dataset_dir, process_index=1, process_count=2)
  restored.set_state(json.loads(json.dumps(state)))
  assert_batches_equal(take(restored, 4), expected)

  fresh = train_iterator(dataset_dir, process_index=1, process_count=2)
  with ocp.CheckpointManager(str(tmp_path / "ckpt")) as manager:
    manager.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  assert_batches_equal(take(fresh, 4), expected)


def test_grain_worker_processes_same_batches_and_resume(prepared):
  dataset_dir = prepared[0]
  expected = take(train_iterator(dataset_dir), 6)
  iterator = train_iterator(dataset_dir, num_workers=2)
  assert_batches_equal(take(iterator, 3), expected[:3])
  state = iterator.get_state()
  resumed = train_iterator(dataset_dir, num_workers=2)
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 3), expected[3:])


def test_eval_covers_validation_once(prepared):
  dataset_dir = prepared[0]
  everything = all_rows(dataset_dir, blocks.VALIDATION)
  shards = [pipeline.make_eval_batches(dataset_dir, global_batch_size=12, process_index=p,
                                       process_count=3) for p in range(3)]
  assert len({len(s) for s in shards}) == 1  # Every host runs the same number of batches.
  weighted = []
  for shard in shards:
    batches = list(shard)
    assert len(batches) == len(shard)
    weights = np.concatenate([b["example_weight"] for b in batches])
    assert weights.dtype == np.float32 and set(weights) <= {0.0, 1.0}
    assert (np.diff(weights) <= 0).all()  # Padding only at the end.
    weighted += [r for b in batches for r, w in zip(rows(b), b["example_weight"]) if w]
    assert all(b["input_ids"].shape == (4, LENGTH) for b in batches)
  assert collections.Counter(weighted) == collections.Counter(everything)
  assert list(shards[0]) and len(list(shards[0])) == len(list(shards[0]))  # Re-iterable.
  capped = pipeline.make_eval_batches(dataset_dir, global_batch_size=12, process_index=0,
                                      process_count=3, max_batches=2)
  assert len(list(capped)) == 2


def test_tfds_generator_path_matches_streamed_writer(prepared, tmp_path):
  """TFDS's own download_and_prepare of the builder gives the same examples as our writer."""
  dataset_dir, text, vocab = prepared
  settings = blocks.ExampleSettings(max_seq_length=LENGTH, dupe_factor=2,
                                    validation_fraction=0.2, seed=0, max_examples_per_row=SLOTS)
  builder = tfds_builder.BertPretraining(
      max_seq_length=LENGTH, max_examples_per_row=SLOTS, data_dir=str(tmp_path / "tfds"),
      examples_fn=lambda split: blocks.iter_rows(corpus.iter_bert_format(text), vocab,
                                                 settings, split))
  builder.download_and_prepare()
  for split in blocks.SPLITS:
    source = builder.as_data_source(split=split)
    reference = rows(pipeline.stack_examples([source[i] for i in range(len(source))]))
    assert collections.Counter(reference) == collections.Counter(all_rows(dataset_dir, split))


@pytest.mark.parametrize("slots", [1, 3])
def test_synthetic_iterator(slots):
  def make(**kwargs):
    args = dict(global_batch_size=8, seq_len=24, vocab_size=50, pad_id=0, cls_id=2, sep_id=3,
                special_ids=(0, 1, 2, 3, 4), seed=0, process_index=0, process_count=2,
                max_examples_per_row=slots)
    return pipeline.make_synthetic_iterator(**{**args, **kwargs})

  iterator = make()
  batch = next(iterator)
  assert set(batch) == {*packing.TOKEN_FEATURES, *packing.SLOT_FEATURES}
  assert batch["input_ids"].shape == (4, 24) and batch["next_sentence_label"].shape == (4, slots)
  assert batch["nsp_weights"].dtype == np.float32
  check_nsp_rows(batch, cls_id=2, sep_id=3, pad_id=0)
  real = batch["segment_ids"] > 0
  assert not np.isin(batch["input_ids"][real], [0, 1, 4]).any()
  many = [next(iterator) for _ in range(10)]
  examples_per_row = np.concatenate([b["nsp_weights"].sum(1) for b in many])
  assert examples_per_row.max() == slots and examples_per_row.min() == 1
  state = iterator.get_state()
  expected = take(iterator, 2)
  restored = make()
  restored.set_state(state)
  assert_batches_equal(take(restored, 2), expected)
  other_host = next(make(process_index=1))
  assert rows(other_host) != rows(batch)
  whole = next(make(process_count=1))  # Hosts' rows stitched = the one-host global batch.
  for name in batch:
    np.testing.assert_array_equal(np.concatenate([batch[name], other_host[name]]), whole[name])


def test_mlm_objective_rows(prepared, tmp_path):
  """FULL-SENTENCES rows: one segment, positions over the row, no NSP, full."""
  _, text, vocab = prepared
  dataset_dir = str(tmp_path / "mlm")
  meta = prepare.prepare_dataset(
      dataset_dir, lambda: corpus.iter_bert_format(text), vocab, max_seq_length=LENGTH,
      dupe_factor=2, validation_fraction=0.2, seed=0, objective="mlm", max_examples_per_row=4,
      num_workers=0)
  assert (meta["objective"], meta["max_examples_per_row"]) == ("mlm", 1)
  assert meta["settings"]["max_examples_per_row"] == 1
  train = meta["splits"]["train"]
  # Contiguous text cut into full rows: only each block pass's last row is short.
  assert train["rows"] == train["examples"] and train["fill_rate"] > 0.9
  pipeline.check_dataset_matches(meta, 300, LENGTH, "mlm", 4)
  batch = next(train_iterator(dataset_dir))
  assert batch["cls_positions"].shape == (8, 1)
  segments, positions = batch["segment_ids"], batch["position_ids"]
  lengths = segments.sum(1)
  assert set(np.unique(segments)) <= {0, 1}
  assert ((positions == np.arange(LENGTH)) | (segments == 0)).all()
  assert (batch["input_ids"][:, 0] == vocab.cls_id).all()
  assert (batch["input_ids"][np.arange(8), lengths - 1] == vocab.sep_id).all()
  assert (batch["token_type_ids"] == 0).all()
  assert (batch["nsp_weights"] == 0).all() and (batch["next_sentence_label"] == 0).all()
  assert (batch["cls_positions"] == 0).all()
  everything = all_rows(dataset_dir, blocks.VALIDATION)
  evaluated = [r for b in pipeline.make_eval_batches(dataset_dir, global_batch_size=8,
                                                     process_index=0, process_count=1)
               for r, w in zip(rows(b), b["example_weight"]) if w]
  assert collections.Counter(evaluated) == collections.Counter(everything)


def test_dataset_mismatch_and_batch_errors(prepared):
  dataset_dir = prepared[0]
  meta = prepare.load_meta(dataset_dir)
  pipeline.check_dataset_matches(meta, 300, LENGTH, "mlm_nsp", SLOTS)
  with pytest.raises(ValueError, match=r"300.*config.model.vocab_size=512.*--config.model"):
    pipeline.check_dataset_matches(meta, 512, LENGTH, "mlm_nsp", SLOTS)
  with pytest.raises(ValueError, match=r"64.*config.data.max_seq_length=128.*--config.data"):
    pipeline.check_dataset_matches(meta, 300, 128, "mlm_nsp", SLOTS)
  with pytest.raises(ValueError, match=r"packs up to 3 examples per row but "
                     r"config.data.max_examples_per_row=4: set "
                     r"--config.data.max_examples_per_row=3 .*--max_examples_per_row=4"):
    pipeline.check_dataset_matches(meta, 300, LENGTH, "mlm_nsp", 4)
  with pytest.raises(ValueError, match=r"prepared as 'mlm_nsp' rows but config.data.objective "
                     r"reads 'mlm' rows: prepare the data again with --objective=mlm \(or train "
                     r"an objective that reads these rows: mlm_nsp, rtd_nsp\)"):
    pipeline.check_dataset_matches(meta, 300, LENGTH, "mlm", SLOTS)
  mlm_meta = {**meta, "objective": "mlm", "max_examples_per_row": 1}
  pipeline.check_dataset_matches(mlm_meta, 300, LENGTH, "mlm", 4)  # K plays no part in "mlm".
  with pytest.raises(ValueError, match="multiple of the number of processes"):
    train_iterator(dataset_dir, global_batch_size=9, process_count=2)


def test_bad_inputs(prepared, tmp_path):
  _, text, vocab = prepared
  with pytest.raises(ValueError, match="does not exist"):
    prepare.load_meta(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="no bert_meta.json"):
    train_iterator(str(tmp_path))
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("x")
  with pytest.raises(ValueError, match="--output_dir=.*full already exists"):
    prepare.prepare_dataset(str(tmp_path / "full"), lambda: [], vocab)
  blank = tmp_path / "blank.txt"
  blank.write_text("\n  \n\n")
  with pytest.raises(ValueError, match="blank.txt"):
    prepare.prepare_dataset(str(tmp_path / "out"), lambda: corpus.iter_bert_format(str(blank)),
                            vocab, num_workers=0)
  with pytest.raises(ValueError, match="no training examples"):
    prepare.prepare_dataset(str(tmp_path / "out"), lambda: [["   "], []], vocab, num_workers=0)
  with pytest.raises(ValueError, match="max_seq_length"):
    prepare.prepare_dataset(str(tmp_path / "out"), lambda: [], vocab, max_seq_length=4)
  with pytest.raises(ValueError, match="max_examples_per_row=0 must be >= 1"):
    prepare.prepare_dataset(str(tmp_path / "out"), lambda: [], vocab, max_examples_per_row=0)
  with pytest.raises(ValueError, match="objective='nsp' is not one of"):
    prepare.prepare_dataset(str(tmp_path / "out"), lambda: [], vocab, objective="nsp")
  old = tmp_path / "old"  # A dataset of an earlier format (unpacked records).
  old.mkdir()
  (old / prepare.META_FILE).write_text(json.dumps({"format_version": 1, "vocab_size": 300}))
  with pytest.raises(ValueError, match="format_version 1 .* reads 3 .*prepare the dataset again"):
    train_iterator(str(old))
  (old / prepare.META_FILE).unlink()
  old.rmdir()

  def interrupted():
    yield from corpus.iter_bert_format(text)
    raise KeyboardInterrupt  # E.g. Ctrl-C after the whole corpus was read.

  with pytest.raises(KeyboardInterrupt):
    prepare.prepare_dataset(str(tmp_path / "out"), interrupted, vocab, num_workers=0)
  assert sorted(os.listdir(tmp_path)) == ["blank.txt", "full"]  # No half dataset, no temp dir.


def test_builtin_is_prepared_once_then_read(tmp_path, monkeypatch):
  config = tiny.get_config()
  config.model.vocab_size = 400
  config.data.vocab_model_type = "bpe"
  config.data.builtin_max_mb = 0.15
  config.data.dupe_factor = 1
  config.data.validation_fraction = 0.05
  settings = builtin.BuiltinSettings.from_config(config)
  # The reader only reads: nothing prepared yet is an error, and nothing is written.
  with pytest.raises(ValueError, match="built-in corpus is not prepared .*ensure_builtin"):
    pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), str(tmp_path))
  assert os.listdir(tmp_path) == []
  dataset_dir = builtin.ensure_builtin(str(tmp_path), settings, num_workers=0)
  assert dataset_dir == builtin.dataset_dir(str(tmp_path), settings)
  assert os.path.dirname(dataset_dir) == str(tmp_path / "data")  # <workdir>/data/builtin-<key>.
  assert os.listdir(tmp_path / "data") == [os.path.basename(dataset_dir)]  # No work dir left.
  meta = prepare.load_meta(dataset_dir)
  assert meta["vocab_size"] == 400 and meta["corpus_fingerprint"]
  assert (meta["objective"], meta["max_examples_per_row"]) == (
      "mlm_nsp", config.data.max_examples_per_row)
  assert meta["splits"]["train"]["rows"] > 100
  stamp = os.path.getmtime(os.path.join(dataset_dir, prepare.META_FILE))
  assert builtin.ensure_builtin(str(tmp_path), settings, num_workers=0) == dataset_dir  # Cached.
  found, meta_again = pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), str(tmp_path))
  assert found == dataset_dir and meta_again == meta
  assert os.path.getmtime(os.path.join(dataset_dir, prepare.META_FILE)) == stamp
  # A package installed between preparing and reading changes the corpus key: the reader takes
  # the directory ensure_builtin returned (bert_jax/train.py), not a second look at the corpus.
  another_corpus = dataclasses.replace(builtin_selection.current(), fingerprint="another")
  monkeypatch.setattr(builtin_selection, "current", lambda: another_corpus)
  with pytest.raises(ValueError, match="not prepared"):
    pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), str(tmp_path))
  assert pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), str(tmp_path),
                                  dataset_dir) == (dataset_dir, meta)
  monkeypatch.undo()

  # A training run keeps the dataset it started with (builtin.run_dataset, recorded in its
  # workdir): after a package install its checkpoints' vocabulary is still the data's.
  run = str(tmp_path / "run")
  assert builtin.run_dataset(str(tmp_path), settings, run) == dataset_dir
  with open(os.path.join(run, builtin.RUN_RECORD)) as f:
    record = json.load(f)
  assert record["dataset"] == os.path.basename(dataset_dir)
  # It names the selection its corpus was read from, and its fingerprint (that of the data).
  assert record["corpus"]["selection"] == builtin_selection.NAME
  assert record["corpus"]["fingerprint"] == meta["corpus_fingerprint"]
  assert record["corpus"]["versions"]["jax"] == importlib.metadata.version("jax")
  monkeypatch.setattr(builtin_selection, "current", lambda: another_corpus)
  assert builtin.dataset_dir(str(tmp_path), settings) != dataset_dir  # A new run's dataset.
  assert builtin.run_dataset(str(tmp_path), settings, run) == dataset_dir  # The run's own.
  assert os.listdir(tmp_path / "data") == [os.path.basename(dataset_dir)]  # Nothing prepared.
  prepared_for = []
  monkeypatch.setattr(builtin, "ensure_builtin",
                      lambda root, s: prepared_for.append(s) or "new dataset")
  other = dataclasses.replace(settings, dupe_factor=2)  # Other settings: another dataset.
  assert builtin.run_dataset(str(tmp_path), other, run, record=False) == "new dataset"
  assert builtin.run_dataset(str(tmp_path), settings, str(tmp_path / "new_run")) == (
      "new dataset")  # A new workdir: the installed corpus.
  assert prepared_for == [other, settings]
  with open(os.path.join(run, builtin.RUN_RECORD)) as f:  # record=False (processes but 0).
    assert json.load(f)["dataset"] == os.path.basename(dataset_dir)
  monkeypatch.undo()

  # The same dataset prepared into a directory of one's own (launch/prepare_data.py --builtin).
  own = str(tmp_path / "own")
  own_meta = builtin.prepare_builtin(own, settings, num_workers=1, flags=builtin.LAUNCHER_FLAGS)
  assert own_meta["corpus_fingerprint"] == meta["corpus_fingerprint"]
  assert own_meta["splits"] == meta["splits"] and own_meta["settings"] == meta["settings"]
  assert _train_records(own) == _train_records(dataset_dir)

  def key(**data):
    other = tiny.get_config()
    other.data.update(data)
    return builtin.cache_key(builtin.BuiltinSettings.from_config(other), "x")

  assert key() != key(dupe_factor=7)  # Another setting: another directory.
  assert len({key(), key(max_examples_per_row=2), key(objective="mlm")}) == 3
  # "mlm" rows hold one sequence whatever max_examples_per_row says: the same dataset.
  assert key(objective="mlm", max_examples_per_row=2) == key(objective="mlm")
  config.model.vocab_size = 100_000
  with pytest.raises(ValueError, match="--config.model.vocab_size"):
    builtin.ensure_builtin(str(tmp_path), builtin.BuiltinSettings.from_config(config),
                           num_workers=0)
  with pytest.raises(ValueError, match="For launch/prepare_data.py --builtin, this is "
                                       "--vocab_size .*--builtin_max_mb"):
    builtin.prepare_builtin(str(tmp_path / "other"), builtin.BuiltinSettings.from_config(config),
                            num_workers=0, flags=builtin.LAUNCHER_FLAGS)
  assert sorted(os.listdir(tmp_path)) == ["data", "new_run", "own", "run"]


def _train_records(dataset_dir):
  source = tfds_builder.data_source(dataset_dir, blocks.TRAIN, raw=True)
  return [source[i] for i in range(len(source))]


def test_launcher_subprocess(tmp_path):
  text = write_corpus(str(tmp_path / "corpus.txt"), 60, seed=1)
  with open(text, "ab") as f:
    f.write(b"Bad bytes \xff\xfe in a sentence.\nAnd one more sentence here.\n")
  script = os.path.join(ROOT, "launch", "prepare_data.py")

  def launch(*flags):
    return subprocess.run([sys.executable, script, *flags], capture_output=True, text=True,
                          timeout=120)

  output_dir = str(tmp_path / "dataset")
  done = launch(f"--input={text}", f"--output_dir={output_dir}", "--vocab_size=300",
                "--vocab_model_type=bpe", "--max_seq_length=32", "--dupe_factor=1",
                "--max_examples_per_row=2", "--num_workers=1")
  assert done.returncode == 0, done.stderr[-3000:]
  assert "not valid UTF-8" in done.stderr  # Counted and warned, not fatal.
  assert "train rows" in done.stdout and "real tokens" in done.stdout
  meta = prepare.load_meta(output_dir)
  assert meta["vocab_size"] == 300 and meta["splits"]["train"]["rows"] > 30
  assert (meta["objective"], meta["max_examples_per_row"]) == ("mlm_nsp", 2)
  assert meta["corpus_stats"]["invalid_bytes"] == 2
  assert next(train_iterator(output_dir))["input_ids"].shape == (8, 32)

  other = str(tmp_path / "other")
  missing = launch(f"--input={tmp_path / 'nope.txt'}", f"--output_dir={other}")
  assert missing.returncode == 1 and "nope.txt" in missing.stderr
  too_large = launch(f"--input={text}", f"--output_dir={other}", "--vocab_size=50000")
  assert too_large.returncode == 1 and "--vocab_size" in too_large.stderr
  no_rows = launch(f"--input={text}", f"--output_dir={other}", "--max_examples_per_row=0")
  assert no_rows.returncode == 1 and "--max_examples_per_row" in no_rows.stderr
  exists = launch(f"--input={text}", f"--output_dir={output_dir}")
  assert exists.returncode == 1 and "--output_dir" in exists.stderr
  no_source = launch(f"--output_dir={other}")
  assert no_source.returncode == 1 and "--input, --tfds_name or --builtin" in no_source.stderr
  # --builtin prepares what training would: its vocabulary is trained on it.
  builtin_vocab = launch("--builtin", f"--output_dir={other}", f"--vocab={tmp_path / 'v.model'}")
  assert builtin_vocab.returncode == 1 and "--vocab and --allow_smaller_vocab do not apply" in (
      builtin_vocab.stderr)
  for failed in (missing, too_large, no_rows, exists, no_source, builtin_vocab):  # One line each.
    assert failed.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in failed.stderr
  assert not os.path.exists(other)
