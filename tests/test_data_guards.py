"""Guards of data preparation, the input pipeline and storage: every expected failure is one
clear error naming the file or the flag, and an interrupted preparation leaves nothing behind.

Tiny corpora and vocabularies; `tests/test_pipeline.py` covers the normal paths."""

import glob
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from bert_jax.runtime import storage
from bert_jax.data import finetune as finetune_data
from bert_jax.data import corpus
from bert_jax.data import blocks
from bert_jax.data import pipeline
from bert_jax.data import prepare
from bert_jax.data import vocab as vocab_lib
from configs import tiny
from test_pipeline import ROOT, WORDS, write_corpus
from tests import forked_launch

LENGTH = 32


def _prepare(tmp_path, name: str, text: str, vocab, **settings) -> str:
  settings = {"max_seq_length": LENGTH, "dupe_factor": 1, "validation_fraction": 0.2,
              "num_workers": 0, "block_chars": 300, **settings}
  dataset_dir = str(tmp_path / name)
  prepare.prepare_dataset(dataset_dir, lambda: corpus.iter_bert_format(text), vocab, **settings)
  return dataset_dir


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """(root, corpus path, vocab, a prepared dataset of several shards per split)."""
  root = tmp_path_factory.mktemp("guards")
  text = write_corpus(str(root / "corpus.txt"), 40, seed=0)
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(text)), str(root / "sp"), 300, "bpe")
  return root, text, vocab, _prepare(root, "dataset", text, vocab)


def _prepared_config(dataset_dir: str, vocab):
  config = tiny.get_config()
  config.data.source = "prepared"
  config.data.dataset_dir = dataset_dir
  config.data.max_seq_length = LENGTH
  config.data.max_examples_per_row = blocks.ExampleSettings.max_examples_per_row
  config.model.vocab_size = vocab.size
  return config


def _one_line(error: pytest.ExceptionInfo) -> str:
  message = str(error.value)
  assert "\n" not in message
  return message


# ------------------------------------------------------------------------ prepared datasets


def test_check_dataset_is_cheap_and_resolve_dataset_runs_it(small):
  _, _, vocab, dataset_dir = small
  splits = json.load(open(os.path.join(dataset_dir, "dataset_info.json")))["splits"]
  assert all(len(s["shardLengths"]) > 1 for s in splits)  # Several shards in each split.
  start = time.perf_counter()
  pipeline.check_dataset(dataset_dir)
  assert time.perf_counter() - start < 1.0  # Milliseconds in fact: a few reads per shard.
  spec = pipeline.DataSpec.from_config(_prepared_config(dataset_dir, vocab))
  found, meta = pipeline.resolve_dataset(spec, workdir="")
  assert found == dataset_dir and meta["splits"]["validation"]["rows"] > 0


def test_damaged_shards_are_one_line_naming_the_file(small, tmp_path):
  _, _, vocab, dataset_dir = small
  copy = str(tmp_path / "copy")
  shutil.copytree(dataset_dir, copy)
  shard = sorted(glob.glob(os.path.join(copy, "*-validation.array_record-*")))[1]
  size = os.path.getsize(shard)
  with open(shard, "r+b") as f:
    f.truncate(size // 2)  # An interrupted copy.
  config = _prepared_config(copy, vocab)
  with pytest.raises(ValueError, match="cannot be read") as error:
    pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), workdir="")
  assert _one_line(error) == (
      f"Prepared dataset {copy}: shard {shard} cannot be read (truncated or corrupt: no valid "
      "ArrayRecord footer); copy the dataset again (an interrupted copy?) or prepare it again.")
  with open(shard, "wb") as f:
    f.write(b"\0" * 10)  # Not an ArrayRecord file at all.
  with pytest.raises(ValueError, match=f"shard {shard} cannot be (opened|read)"):
    pipeline.check_dataset(copy)
  os.remove(shard)
  with pytest.raises(ValueError, match=f"shard {shard} is missing"):
    pipeline.check_dataset(copy)
  shutil.copy(os.path.join(dataset_dir, os.path.basename(shard)), shard)
  pipeline.check_dataset(copy)  # Repaired.
  info = os.path.join(copy, "dataset_info.json")
  described = json.load(open(info))
  described["splits"][0]["shardLengths"][0] = "1000"
  json.dump(described, open(info, "w"))
  with pytest.raises(ValueError, match=r"holds \d+ records but dataset_info.json says 1000"):
    pipeline.check_dataset(copy)
  open(info, "w").write("{not json")
  with pytest.raises(ValueError, match="TFDS metadata .* cannot be read"):
    pipeline.check_dataset(copy)


def test_bert_meta_json_that_is_broken_or_names_a_vocabulary_elsewhere(small, tmp_path):
  """An invalid bert_meta.json is one line naming the file; one whose vocab_dir lies outside
  the dataset (another dataset's vocabulary) trained silently with it (#37)."""
  _, _, vocab, dataset_dir = small
  copy = str(tmp_path / "meta")
  shutil.copytree(dataset_dir, copy)
  meta_file = os.path.join(copy, "bert_meta.json")
  meta = json.load(open(meta_file))
  config = _prepared_config(copy, vocab)
  for vocab_dir in ("../other/vocab", os.path.join(dataset_dir, "vocab"), "gs://b/vocab"):
    json.dump({**meta, "vocab_dir": vocab_dir}, open(meta_file, "w"))
    with pytest.raises(ValueError) as error:
      pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), workdir="")
    assert _one_line(error).startswith(f"{meta_file}: vocab_dir {vocab_dir!r} lies outside the "
                                       "dataset"), _one_line(error)
  json.dump({**meta, "vocab_dir": "./vocab"}, open(meta_file, "w"))
  # Inside, however spelled.
  pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), workdir="")
  for content, message in (("{not json", "is not valid JSON"), ("[]", "is not a bert_jax "),
                           (json.dumps({k: v for k, v in meta.items() if k != "special_ids"}),
                            "lacks special_ids")):
    open(meta_file, "w").write(content)
    with pytest.raises(ValueError) as error:
      pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), workdir="")
    assert _one_line(error).startswith(f"{meta_file} {message}"), _one_line(error)


def test_a_shard_garbled_where_the_start_does_not_read_is_one_line_in_training(small, tmp_path):
  """The start's check reads each shard's first and last records; damage between them showed
  as riegeli's 55-line traceback from grain's threads, after compiling (#37)."""
  _, _, _, dataset_dir = small
  copy = str(tmp_path / "garbled")
  shutil.copytree(dataset_dir, copy)
  shards = sorted(glob.glob(os.path.join(copy, "*-train.array_record-*")))
  shard = max(shards, key=os.path.getsize)
  with open(shard, "r+b") as f:
    f.seek(os.path.getsize(shard) // 2)
    f.write(b"\xff" * 64)
  source = pipeline.split_source(copy, blocks.TRAIN)
  with pytest.raises(ValueError) as error:
    pipeline.read_rows(source, range(len(source)), copy, blocks.TRAIN)
  assert _one_line(error).startswith(f"Prepared dataset {copy}: shard {shard} (record "), (
      _one_line(error))
  assert "copy the dataset again" in _one_line(error)


def test_empty_validation_split_is_refused_before_training(small, tmp_path, caplog, monkeypatch):
  _, text, vocab, _ = small
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # TFDS left an empty directory there.
  with caplog.at_level(logging.WARNING):
    no_fraction = _prepare(tmp_path, "no_fraction", text, vocab, validation_fraction=0.0)
  assert any("validation split is empty (--validation_fraction=0)" in r.getMessage()
             for r in caplog.records)  # Said when preparing too.
  with pytest.raises(ValueError, match="validation split is empty") as error:
    pipeline.resolve_dataset(pipeline.DataSpec.from_config(_prepared_config(no_fraction, vocab)),
                             workdir="")
  assert _one_line(error) == (
      f"Prepared dataset {no_fraction}: the validation split is empty (it was prepared with "
      "validation_fraction=0), and pretraining evaluates on it (at least at its last step): "
      "prepare it again with --validation_fraction > 0 (e.g. 0.01) and enough text for it (more "
      "documents).")
  few = write_corpus(str(tmp_path / "few.txt"), 3, seed=4)  # No document hashes into 1%.
  few_dir = _prepare(tmp_path, "few", few, vocab, validation_fraction=0.01)
  with pytest.raises(ValueError, match=r"none of the corpus's 3 documents fell into "
                                       r"validation_fraction=0.01\)"):
    pipeline.check_dataset(few_dir)
  with pytest.raises(ValueError, match="--config.data.validation_fraction > 0"):
    pipeline.check_dataset(few_dir, fraction_flag="--config.data.validation_fraction")
  assert os.listdir(scratch) == []


# ------------------------------------------------------------------------------ preparation


def _long_line(num_bytes: int, seed: int = 0) -> str:
  """Text without a sentence break or a newline, about `num_bytes` long."""
  rng = random.Random(seed)
  words = []
  size = 0
  while size < num_bytes:
    words.append(rng.choice(WORDS))
    size += len(words[-1]) + 1
  return " ".join(words)


def test_pieces_within_sentencepiece_limit():
  assert list(vocab_lib._pieces_within("", 10)) == []
  assert list(vocab_lib._pieces_within("short one", 10)) == ["short one"]
  pieces = list(vocab_lib._pieces_within("aaa bbb ccc ddd", 8))
  assert pieces == ["aaa bbb", "ccc ddd"]
  wide = "\u00e9\u4e2d" * 20  # 2- and 3-byte characters, no space: cut between characters.
  pieces = list(vocab_lib._pieces_within(wide, 16))
  assert "".join(pieces) == wide and all(len(p.encode()) <= 16 for p in pieces)
  text = _long_line(50_000)
  pieces = list(vocab_lib._pieces_within(text, 8192))
  assert " ".join(pieces) == text and all(len(p.encode()) <= 8192 for p in pieces)


def test_one_long_line_corpus(tmp_path):
  """5 MB on one line: sentencepiece skipped it (max_sentence_length) and failed with
  `[!sentences_.empty()]`; now the vocabulary trains on all of it, and NSP says what it needs."""
  big = tmp_path / "one_line.txt"
  big.write_text(_long_line(5_000_000) + "\n")
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(str(big))), str(tmp_path / "sp"), 300, "bpe",
      source=f"--input={big}")
  assert vocab.size == 300 and vocab.encode("the model reads text")
  with pytest.raises(ValueError, match="no training examples: its 1 training document.* "
                                       "hold 1 sentence") as error:
    _prepare(tmp_path, "nsp", str(big), vocab, validation_fraction=0.0)
  assert "--objective=mlm" in _one_line(error)
  assert sorted(os.listdir(tmp_path)) == ["one_line.txt", "sp.model", "sp.vocab"]
  # NSP copes with such a document among others (one example per chunk, as the original).
  mixed = write_corpus(str(tmp_path / "mixed.txt"), 20, seed=1)
  with open(mixed, "a") as f:
    f.write(_long_line(300_000, seed=2) + "\n\n")
  mixed_dir = _prepare(tmp_path, "mixed", mixed, vocab, validation_fraction=0.0,
                       block_chars=100_000)
  assert prepare.load_meta(mixed_dir)["splits"]["train"]["rows"] > 20


def test_vocabulary_without_text_names_the_input(tmp_path):
  with pytest.raises(ValueError, match=r"No text to train the sentencepiece vocabulary on in "
                                       r"--input=x.txt: none of its 2 sentences"):
    vocab_lib.train_sentencepiece(iter(["\u200b", "\u200b\u200b"]), str(tmp_path / "a"), 300,
                                  source="--input=x.txt")
  with pytest.raises(ValueError, match="No sentences to train the sentencepiece vocabulary on in "
                                       "--input=y.txt"):
    vocab_lib.train_sentencepiece(iter([" ", ""]), str(tmp_path / "b"), 300,
                                  source="--input=y.txt")
  # U+2585 (sentencepiece's reserved mark) used to make it skip the whole sentence.
  sentences = [f"\u2585 {_long_line(200, seed)}" for seed in range(50)]
  vocab = vocab_lib.train_sentencepiece(iter(sentences), str(tmp_path / "c"), 300, "bpe",
                                        allow_smaller_vocab=True)
  assert vocab.piece_to_id("\u2581the") != vocab.unk_id  # Learned from those sentences.
  assert sorted(os.listdir(tmp_path)) == ["c.model", "c.vocab"]  # No temporary directory left.


def test_binary_input_is_refused_before_any_work(tmp_path):
  """Random bytes became a pretraining dataset with one UTF-8 warning (#37); a text file with
  a few Latin-1 bytes is still text (replaced and counted, tests/test_corpus_vocab.py)."""
  from bert_jax.data import sources  # pylint: disable=import-outside-toplevel
  text = tmp_path / "text.txt"
  text.write_bytes("Caf\u00e9 au lait.\nUne phrase.\n".encode("latin-1") * 2000)
  noise = tmp_path / "noise.bin"
  noise.write_bytes(random.Random(0).randbytes(200_000).replace(b"\x00", b"\x01"))
  image = tmp_path / "image.png"
  image.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"a" * 100)
  corpus.check_text_files([str(text)])
  for path, why in ((noise, r"\d+% of its first 65,533 bytes are not UTF-8"),
                    (image, "it holds NUL bytes")):
    output = str(tmp_path / f"out_{path.stem}")
    with pytest.raises(ValueError, match=rf"^Input file {path} is not text \({why}\): --input "
                                         "takes UTF-8 text files"):
      sources.prepare_corpus(output, sources.CorpusSource(input=[str(text), str(path)]),
                             sources.VocabSource(size=300), blocks.ExampleSettings())
    assert not os.path.exists(output)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_interrupted_preparation_leaves_nothing(small, tmp_path, monkeypatch, num_workers):
  _, text, vocab, _ = small
  parent = tmp_path / "out"
  parent.mkdir()
  output_dir = str(parent / "dataset")
  original = blocks.BlockStats.add
  calls = []

  def interrupted(self, other):  # Ctrl-C between two blocks, the pool's workers busy.
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt
    original(self, other)

  monkeypatch.setattr(blocks.BlockStats, "add", interrupted)
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare_dataset(output_dir, lambda: corpus.iter_bert_format(text), vocab,
                            max_seq_length=LENGTH, dupe_factor=1, block_chars=300,
                            num_workers=num_workers)
  assert len(calls) == 3 and os.listdir(parent) == []  # No output, no temporary directory.

  def reader(paths, stats=None):  # Ctrl-C while the corpus is read.
    for i, document in enumerate(corpus.iter_bert_format(paths, stats)):
      if i == 10:
        raise KeyboardInterrupt
      yield document

  monkeypatch.setattr(blocks.BlockStats, "add", original)
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare_dataset(output_dir, lambda: reader(text), vocab, max_seq_length=LENGTH,
                            dupe_factor=1, block_chars=300, num_workers=num_workers)
  assert os.listdir(parent) == []
  if num_workers:
    return
  with pytest.raises(KeyboardInterrupt):  # While training the vocabulary.
    vocab_lib.train_sentencepiece(corpus.iter_sentences(reader(text)),
                                  str(parent / "sp" / "m"), 300)
  assert os.listdir(parent / "sp") == []


def _workers(pid: int) -> int:
  """How many multiprocessing workers `pid` has started (from /proc)."""
  found = 0
  for stat in glob.glob("/proc/[0-9]*/stat"):
    try:
      parent = int(open(stat).read().rsplit(")", 1)[1].split()[1])
      command = open(stat[:-len("stat")] + "cmdline").read()
    except (OSError, IndexError, ValueError):
      continue  # Ended meanwhile.
    found += parent == pid and "spawn_main" in command
  return found


def _ignores_sigint(pid: int) -> bool:
  for line in open(f"/proc/{pid}/status"):
    if line.startswith("SigIgn:"):
      return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
  raise AssertionError("no SigIgn line")


def test_ctrl_c_stops_the_launcher_and_removes_its_files(small, tmp_path):
  """A real SIGINT to the process group (a terminal's Ctrl-C) while the preparation's worker
  processes start: the partial dataset and the temporary files go, no worker prints a
  traceback, and the launcher reports one line (bert_jax.runtime.cli: exit status 130)."""
  _, text, _, _ = small
  corpus_path = tmp_path / "corpus.txt"
  with open(corpus_path, "w") as f:
    for _ in range(20):
      f.write(open(text).read())
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  process = subprocess.Popen(
      [sys.executable, os.path.join(ROOT, "launch", "prepare_data.py"), f"--input={corpus_path}",
       f"--output_dir={tmp_path / 'out' / 'dataset'}", "--vocab_size=300",
       "--vocab_model_type=bpe", f"--max_seq_length={LENGTH}", "--num_workers=2"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
      env={**os.environ, "TMPDIR": str(scratch)})
  try:
    deadline = time.time() + 120
    # Until the workers have started (they import modules for a second more) and the parent
    # handles SIGINT again (it ignores it while it starts them).
    while _workers(process.pid) < 2 or _ignores_sigint(process.pid):
      assert process.poll() is None and time.time() < deadline, process.communicate()
      time.sleep(0.005)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
  assert process.returncode == 130, stderr[-3000:]
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: interrupted"), stderr[-3000:]
  assert os.listdir(tmp_path / "out") == [] and os.listdir(scratch) == []


# ---------------------------------------------------------------------------------- storage


def test_atomic_writes_follow_the_umask(tmp_path, monkeypatch):
  previous = os.umask(0o022)
  try:
    storage.write_text(str(tmp_path / "a.json"), "{}")
    os.umask(0o077)
    storage.write_text(str(tmp_path / "b.json"), "{}")
    storage.write_text(str(tmp_path / "a.json"), "{}")  # Replaced: the umask now.
  finally:
    os.umask(previous)
  assert oct(os.stat(tmp_path / "b.json").st_mode & 0o777) == oct(0o600)
  assert oct(os.stat(tmp_path / "a.json").st_mode & 0o777) == oct(0o600)
  previous = os.umask(0o022)
  try:
    storage.write_text(str(tmp_path / "c.json"), "{}")
  finally:
    os.umask(previous)
  assert oct(os.stat(tmp_path / "c.json").st_mode & 0o777) == oct(0o644)

  def interrupted(source, target):
    raise KeyboardInterrupt

  monkeypatch.setattr(storage.os, "replace", interrupted)
  with pytest.raises(KeyboardInterrupt):
    storage.write_text(str(tmp_path / "d.json"), "{}")
  assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "c.json"]  # No .tmp-* file.


# ------------------------------------------------------------------------ fine-tuning data



def test_safetensors_exports_follow_the_umask_and_replace_at_once(tmp_path):
  """safetensors creates its files 0600 whatever the umask (the red team: another user of a
  shared model directory could not read model.safetensors). The export writes beside the file,
  takes the umask's mode and renames; a failed write leaves the old file and no partial one."""
  from bert_jax.weights import hf  # pylint: disable=import-outside-toplevel
  state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
  path = str(tmp_path / "model.safetensors")
  previous = os.umask(0o022)
  try:
    hf.save_safetensors(path, state)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
    os.umask(0o007)
    hf.save_safetensors(path, state)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o660)
  finally:
    os.umask(previous)
  before = open(path, "rb").read()
  with pytest.raises(Exception):
    hf.save_safetensors(path, {"w": np.zeros(3, np.float32), "bad": object()})
  assert open(path, "rb").read() == before and os.listdir(tmp_path) == ["model.safetensors"]

def test_finetuning_files_without_records(tmp_path):
  for name, content in (("empty.jsonl", ""), ("blank.jsonl", "\n \n"),
                        ("header.csv", "text,label\n"), ("empty.csv", "")):
    path = str(tmp_path / name)
    open(path, "w").write(content)
    with pytest.raises(ValueError) as error:
      finetune_data.read_records(path)
    assert _one_line(error) == (f"Data file {path} holds no records (it is empty, or holds "
                                "blank lines or a CSV header only)")
  empty = finetune_data.TaskData("train.jsonl", {"input_ids": np.zeros((0, 8), np.int32)}, [])
  with pytest.raises(ValueError, match="train.jsonl: no training rows"):
    finetune_data.TrainBatches(empty, 8, seed=0)


def test_csv_texts_that_look_like_json_stay_texts(tmp_path):
  """A CSV text starting with [ or { was parsed as JSON and refused: such texts could not be
  given in CSV at all. Text fields are texts; a structured field (tags) is still JSON, and a
  broken one is named with its line."""
  path = tmp_path / "texts.csv"
  path.write_text('text,text_b,label\n"[citation needed] it rains","{x} y",pos\n'
                  '"{""a"": 1}",b,"[neg]"\n')
  records = finetune_data.read_records(str(path))
  assert [r[2] for r in records] == [
      {"text": "[citation needed] it rains", "text_b": "{x} y", "label": "pos"},
      {"text": '{"a": 1}', "text_b": "b", "label": "[neg]"}]
  latin = tmp_path / "latin1.jsonl"
  latin.write_bytes(b'{"text": "a", "label": "x"}\n' * 3 + b'{"text": "caf\xe9", "label": "x"}\n')
  with pytest.raises(ValueError, match=r"latin1.jsonl, line 4: not UTF-8 \(invalid continuation "
                                       r"byte at byte 13 of the line\); save the file as UTF-8$"):
    finetune_data.read_records(str(latin))
  tags = tmp_path / "tags.csv"
  tags.write_text('text,tags\n"a b","[""O"", ""B-X""]"\n"c","[broken"\n')
  with pytest.raises(ValueError, match=r"tags.csv, line 3: field 'tags' is not valid JSON"):
    finetune_data.read_records(str(tags))
  tags.write_text('text,tags\n"a b","[""O"", ""B-X""]"\n')
  assert finetune_data.read_records(str(tags))[0][2]["tags"] == ["O", "B-X"]


def test_empty_texts_and_labels_are_refused_with_file_and_line(tmp_path):
  """An empty label would be a class of its own, a file of empty texts would fine-tune on
  [CLS] [SEP] and exit 0 (#37): each is refused where it is. An empty text_b is no text_b."""
  cases = [
      ("texts.jsonl", '{"text": "a b", "label": "x"}\n{"text": " ", "label": "y"}\n',
       "line 2: field 'text' is empty"),
      ("labels.jsonl", '{"text": "a b", "label": "x"}\n\n{"text": "c", "label": ""}\n',
       "line 3: field 'label' is empty"),
      ("labels.csv", 'text,label\n"a b",x\n"c d"," "\n', "line 3: field 'label' is empty"),
      ("null.jsonl", '{"text": "a b", "label": "x"}\n{"text": "c", "label": null}\n',
       "line 2: field 'label' is null; give a value or leave the record out"),
  ]
  for name, content, message in cases:
    path = str(tmp_path / name)
    open(path, "w").write(content)
    with pytest.raises(ValueError) as error:
      finetune_data.read_records(path)
    assert _one_line(error) == f"{path}, {message}"
  pair = str(tmp_path / "pair.jsonl")
  open(pair, "w").write('{"text": "a", "text_b": "", "label": "x"}\n')
  assert finetune_data.text_b(finetune_data.read_records(pair)[0]) is None
  tags = [("tags.jsonl", 1, {"text": "Alice went", "tags": ["B-PER", "O"]}),
          ("tags.jsonl", 2, {"text": "Bob went", "tags": ["", "O"]})]
  with pytest.raises(ValueError, match=r"^tags\.jsonl, line 2: an empty label \(''\)$"):
    finetune_data.label_set(tags, (), lambda record: record[2]["tags"])


def test_eval_batch_larger_than_the_validation_set_is_padded():
  ids = np.arange(3 * 4, dtype=np.int32).reshape(3, 4)  # [3, L]: 3 rows.
  data = finetune_data.TaskData("validation.jsonl", {"input_ids": ids}, [{}, {}, {}])
  hosts = [list(finetune_data.eval_batches(data, 8, p, 2)) for p in range(2)]
  assert [len(batches) for batches in hosts] == [1, 1]
  first, second = hosts[0][0], hosts[1][0]
  assert first["input_ids"].shape == second["input_ids"].shape == (4, 4)  # The batch contract.
  np.testing.assert_array_equal(first["example_weight"], [1, 1, 1, 0])
  np.testing.assert_array_equal(second["example_weight"], [0, 0, 0, 0])
  np.testing.assert_array_equal(first["input_ids"][:3], ids)
  np.testing.assert_array_equal(second["input_ids"], np.repeat(ids[:1], 4, axis=0))
  train = finetune_data.TrainBatches(data, 8, seed=0)  # More rows a batch than the data holds.
  batch = next(train)
  assert batch["input_ids"].shape == (8, 4)
  assert sorted(map(tuple, batch["input_ids"][:3])) == sorted(map(tuple, ids))


def test_an_export_onto_a_full_disk_is_one_line_and_keeps_what_was_there(tmp_path):
  """The red team: an HF export onto a full disk ended in a 31-line safetensors traceback and
  left a half-written directory (config.json without weights). Exports are written beside the
  target and renamed: a failure leaves neither a partial directory nor a damaged old one."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from bert_jax import weights  # pylint: disable=import-outside-toplevel
  from bert_jax.models.model import BertConfig, BertModel  # pylint: disable=import-outside-toplevel
  (tmp_path / "vocab.txt").write_text("\n".join(
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]) + "\n")
  vocab = vocab_lib.Vocab.load(str(tmp_path / "vocab.txt"))
  config = BertConfig(vocab_size=vocab.size, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=128, max_position_embeddings=64)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = {"bert": nn.unbox(BertModel(config, add_pooling_layer=True).init(
      jax.random.key(0), ids, ids, jnp.ones_like(ids))["params"])}
  pretrained = weights.save_pretrained(str(tmp_path / "pretrained"), params, config, vocab)

  disk = str(tmp_path / "disk")
  os.makedirs(disk)
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", disk],
                    capture_output=True).returncode != 0:
    pytest.fail("this test needs `mount -t tmpfs` (root), as the CI machine has")
  try:
    old = os.path.join(disk, "export")
    weights.save_hf(old, params, config, vocab)  # ~0.5 MB of weights.
    before = {name: open(os.path.join(old, name), "rb").read() for name in os.listdir(old)}
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(os.path.join(disk, "filler"), "wb") as f:  # Room for config.json, not weights.
      f.write(b"\0" * (free - 64 * 1024))

    with pytest.raises(OSError, match=f"Could not write model.safetensors in {old}: .*No space"):
      weights.save_hf(old, params, config, vocab, overwrite=True)
    assert sorted(os.listdir(disk)) == ["export", "filler"]  # No staged directory stays.
    assert {name: open(os.path.join(old, name), "rb").read() for name in os.listdir(old)} == before
    target = os.path.join(disk, "pretrained")  # The bert_jax format (orbax) likewise.
    with pytest.raises(OSError, match=f"Could not write params in {target}: No space left on "
                                      r"device\. Nothing of it was kept\.$"):
      weights.save_pretrained(target, params, config, vocab)
    assert sorted(os.listdir(disk)) == ["export", "filler"]

    new = os.path.join(disk, "new")
    result = forked_launch.run(
        [sys.executable, os.path.join(ROOT, "launch", "convert.py"),
         f"--from_bert_jax={pretrained}", f"--to_hf={new}"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(
        f"error: Could not write model.safetensors in {new}: "), lines
    assert sorted(os.listdir(disk)) == ["export", "filler"]
  finally:
    subprocess.run(["umount", "-l", disk], check=False)


def test_an_unprepared_tfds_dataset_offline_is_one_line_at_once(tmp_path, monkeypatch):
  """GLUE offline retried its download (10 tries with backoff) for 209 s before its error (the
  red team). Each download host is tried once first; the suites' tests that answer TFDS's
  download step locally never reach it (tests/test_downstream.py)."""
  import socket  # pylint: disable=import-outside-toplevel

  def offline(address, *args, **kwargs):
    raise OSError(f"[Errno 101] Network is unreachable: {address[0]}")

  monkeypatch.setattr(socket, "create_connection", offline)
  start = time.time()
  with pytest.raises(ValueError) as error:
    finetune_data.read_tfds("glue/sst2", "train", str(tmp_path / "tfds"))
  assert time.time() - start < 60
  assert _one_line(error).startswith(
      f"TFDS dataset 'glue/sst2' is not prepared in {tmp_path / 'tfds'} and this machine cannot "
      "reach dl.fbaipublicfiles.com to download https://dl.fbaipublicfiles.com/glue/data/"
      "SST-2.zip ([Errno 101] Network is unreachable: dl.fbaipublicfiles.com): prepare it where "
      "there is internet"), _one_line(error)
