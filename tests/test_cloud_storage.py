"""Vocabularies, pretrained weights (bert_jax, HuggingFace, TensorFlow), prepared datasets and
fine-tuning records in a bucket (gs://, a local GCS emulator): each loads equal to its local
copy, and what is written to a bucket loads back equal. A prepared dataset in a bucket is
refused for reading with how to mount it (ArrayRecord reads local files only); the same dataset
copied to a local directory reads."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from bert_jax import weights
from bert_jax.runtime import storage
from bert_jax.data import finetune as finetune_data
from bert_jax.data import corpus, pipeline, prepare
from bert_jax.data import vocab as vocab_lib
from bert_jax.weights import params as params_lib
from bert_jax.weights import tf_bundle
from configs import tiny
from tests import gcs_emulator
from tests.test_interop import (_UNCASED, SENTENCES, _hf_dir, _write_vocab,  # noqa: F401
                                tf_checkpoint_dir)
from tests.test_pipeline import write_corpus
from tests.suite_flags import xla_flags
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bucket():
  """gs://<bucket>/cloud_storage on a fresh emulator; the environment as it was afterwards."""
  saved = dict(os.environ)
  server, env = gcs_emulator.start()
  yield f"gs://{gcs_emulator.BUCKET}/cloud_storage", env
  server.stop()
  os.environ.clear()
  os.environ.update(saved)


def _launch(script: str, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
  environment = dict(os.environ, **env, JAX_PLATFORMS="cpu")
  environment["XLA_FLAGS"] = xla_flags(1)  # One device is plenty (and starts faster).
  return forked_launch.run([sys.executable, os.path.join(ROOT, "launch", script), *flags],
                        capture_output=True, text=True, env=environment, timeout=240, cwd=ROOT)


def _download(source: str, target: str) -> None:
  """Copies a bucket directory to a local one (what a gcsfuse mount or `gsutil cp -r` gives)."""
  os.makedirs(target, exist_ok=True)
  for name in storage.listdir(source):
    path = storage.join(source, name)
    if storage.isdir(path):
      _download(path, os.path.join(target, name))
    else:
      with open(os.path.join(target, name), "wb") as f:
        f.write(storage.read_bytes(path))


def _assert_same_weights(a, b) -> None:
  """Two (config, params, vocab) loads hold the same model, params and vocabulary."""
  (config_a, params_a, vocab_a), (config_b, params_b, vocab_b) = a, b
  assert config_a == config_b
  flat_a, flat_b = params_lib.flatten(params_a), params_lib.flatten(params_b)
  assert set(flat_a) == set(flat_b)
  for path, value in flat_a.items():
    np.testing.assert_array_equal(value, flat_b[path], err_msg="/".join(path))
  _assert_same_vocab(vocab_a, vocab_b)


def _assert_same_vocab(a: vocab_lib.Vocab, b: vocab_lib.Vocab) -> None:
  assert (a.kind, a.size, a.lowercase, a.special_ids) == (b.kind, b.size, b.lowercase,
                                                          b.special_ids)
  for text in SENTENCES:
    assert a.encode_with_word_starts(text) == b.encode_with_word_starts(text)


# ------------------------------------------------------------------------------ vocabularies


def test_vocab_save_and_load_on_gs(bucket, tmp_path):
  root, _ = bucket
  text = write_corpus(str(tmp_path / "corpus.txt"), 60, seed=0)
  sentencepiece = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(text)), str(tmp_path / "sp"), 300, "bpe")
  wordpiece = vocab_lib.Vocab.load(_write_vocab(str(tmp_path / "wp"), _UNCASED))
  for name, vocab in (("sentencepiece", sentencepiece), ("wordpiece", wordpiece)):
    directory = f"{root}/vocab/{name}"
    vocab.save(directory)
    assert storage.isfile(f"{directory}/{vocab_lib.CONFIG_FILE}")
    loaded = vocab_lib.Vocab.load(directory)
    _assert_same_vocab(loaded, vocab)
    assert loaded.path.startswith("gs://")
    local = str(tmp_path / f"saved_{name}")
    vocab.save(local)
    assert sorted(os.listdir(local)) == storage.listdir(directory)
  # Single files in a bucket, named by their kind or not.
  model = f"{root}/vocab/files/sp.model"
  storage.write_bytes(model, storage.read_bytes(str(tmp_path / "sp.model")))
  _assert_same_vocab(vocab_lib.Vocab.load(model), sentencepiece)
  plain = f"{root}/vocab/files/wordpieces"  # No extension: sniffed as a vocab.txt.
  storage.write_text(plain, "".join(t + "\n" for t in _UNCASED))
  _assert_same_vocab(vocab_lib.Vocab.load(plain), wordpiece)
  with pytest.raises(ValueError, match="does not exist"):
    vocab_lib.Vocab.load(f"{root}/vocab/absent.model")


# ---------------------------------------------------------------------------- weights


@pytest.fixture(scope="module")
def hf_dirs(bucket, tmp_path_factory):
  """(local, gs://) copies of a HuggingFace BertForPreTraining directory (model.safetensors),
  and of the same model as pytorch_model.bin."""
  root, _ = bucket
  local, model = _hf_dir(tmp_path_factory.mktemp("hf"), "hf")
  remote = f"{root}/hf"
  storage.copy_tree(local, remote)
  torch_local = str(tmp_path_factory.mktemp("hf_bin"))
  for name in ("config.json", "vocab.txt"):
    shutil.copyfile(os.path.join(local, name), os.path.join(torch_local, name))
  torch.save(model.state_dict(), os.path.join(torch_local, "pytorch_model.bin"))
  storage.copy_tree(torch_local, f"{root}/hf_bin")
  return local, remote, f"{root}/hf_bin"


def test_hf_dir_on_gs_loads_as_the_local_one(hf_dirs):
  local, remote, remote_bin = hf_dirs
  expected = weights.load_hf(local)
  assert weights.detect_format(remote) == "huggingface"
  _assert_same_weights(weights.load_hf(remote), expected)
  _assert_same_weights(weights.load_pretrained(remote), expected)
  _assert_same_weights(weights.load_hf(remote_bin), expected)  # torch .bin through BytesIO.


def test_save_pretrained_and_save_hf_to_gs_load_back_equal(bucket, hf_dirs):
  root, _ = bucket
  expected = weights.load_hf(hf_dirs[0])
  config, params, vocab = expected
  pretrained = f"{root}/out/pretrained"
  assert weights.save_pretrained(pretrained, params, config, vocab, note="test") == pretrained
  assert weights.detect_format(pretrained) == "bert_jax"
  _assert_same_weights(weights.load_pretrained(pretrained), expected)

  exported = f"{root}/out/hf"
  assert weights.save_hf(exported, params, config, vocab) == "BertForPreTraining"
  assert {"config.json", "model.safetensors", "vocab.txt",
          "tokenizer_config.json"} <= set(storage.listdir(exported))
  _assert_same_weights(weights.load_pretrained(exported), expected)
  # A non-empty output directory in a bucket is replaced only when asked.
  with pytest.raises(ValueError, match="exists and is not empty"):
    weights.save_hf(exported, params, config, vocab)
  headless = {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"}}
  assert weights.save_hf(exported, headless, config, vocab, overwrite=True) == "BertModel"
  assert weights.heads_present(weights.load_hf(exported)[1]) == {
      "pooler": False, "mlm": False, "nsp": False}


def test_tf_checkpoint_on_gs_loads_as_the_local_one(bucket, tf_checkpoint_dir):
  root, _ = bucket
  local, _ = tf_checkpoint_dir
  remote = f"{root}/tf"
  storage.copy_tree(str(local), remote)
  expected = weights.load_tf(str(local / "bert_model.ckpt"))
  assert weights.detect_format(remote) == "tensorflow"
  _assert_same_weights(weights.load_tf(f"{remote}/bert_model.ckpt"), expected)
  _assert_same_weights(weights.load_pretrained(remote), expected)  # The directory.
  with tf_bundle.BundleReader(f"{remote}/bert_model.ckpt") as reader:
    assert reader.read("global_step") == 1000
    name = "bert/embeddings/word_embeddings"
    np.testing.assert_array_equal(
        reader.read(name), tf_bundle.BundleReader(str(local / "bert_model.ckpt")).read(name))


def test_convert_launcher_from_gs_to_gs(bucket, hf_dirs):
  root, env = bucket
  local, remote, _ = hf_dirs
  output = f"{root}/converted"
  result = _launch("convert.py", env, f"--from_hf={remote}", f"--output_dir={output}")
  assert result.returncode == 0, result.stderr[-3000:]
  info = json.loads(storage.read_text(f"{output}/{weights.FORMAT_FILE}"))
  assert info["source"] == f"HuggingFace {remote}"
  _assert_same_weights(weights.load_pretrained(output), weights.load_hf(local))


# ------------------------------------------------------------------------- prepared datasets


def test_prepared_dataset_uploads_and_reads_through_a_local_copy(bucket, tmp_path, monkeypatch):
  root, env = bucket
  text = write_corpus(str(tmp_path / "corpus.txt"), 60, seed=1)
  output = f"{root}/dataset"
  result = _launch("prepare_data.py", env, f"--input={text}", f"--output_dir={output}",
                   "--vocab_size=300", "--vocab_model_type=bpe", "--max_seq_length=32",
                   "--dupe_factor=1", "--max_examples_per_row=2", "--num_workers=0")
  assert result.returncode == 0, result.stderr[-3000:]
  meta = prepare.load_meta(output)
  assert (meta["vocab_size"], meta["max_seq_length"], meta["max_examples_per_row"]) == (300, 32, 2)
  assert meta["splits"]["train"]["rows"] > 10
  assert prepare.load_vocab(output).size == 300
  with pytest.raises(ValueError, match="already exists and is not empty"):
    prepare.check_output_dir(output)

  # Read from the bucket: refused before any work, saying how to mount it.
  config = tiny.get_config()
  config.data.source, config.data.dataset_dir = "prepared", output
  config.model.vocab_size, config.data.max_seq_length = 300, 32
  config.data.objective, config.data.max_examples_per_row = "mlm_nsp", 2
  mount = f"/mnt/{gcs_emulator.BUCKET}/cloud_storage/dataset"
  with pytest.raises(ValueError, match=rf"(?s)--config.data.dataset_dir.*gcsfuse.*{mount}"):
    pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), str(tmp_path / "workdir"))
  with pytest.raises(ValueError, match=f"gcsfuse --implicit-dirs {gcs_emulator.BUCKET} "):
    pipeline.make_train_iterator(output, global_batch_size=8, seed=0, process_index=0,
                                 process_count=1)

  # The same files in a local directory (as a mount shows them) read.
  local = str(tmp_path / "mounted")
  _download(output, local)
  config.data.dataset_dir = local
  assert pipeline.resolve_dataset(pipeline.DataSpec.from_config(config),
                                  str(tmp_path / "workdir")) == (local, meta)
  batch = next(pipeline.make_train_iterator(local, global_batch_size=8, seed=0, process_index=0,
                                            process_count=1))
  assert batch["input_ids"].shape == (8, 32) and batch["cls_positions"].shape == (8, 2)
  assert len(pipeline.make_eval_batches(local, global_batch_size=8, process_index=0,
                                        process_count=1)) > 0

  # An upload that fails before bert_meta.json removes what it wrote: never half a dataset.
  staged = str(tmp_path / "staged")
  _download(output, staged)
  failed = f"{root}/failed_upload"

  def refuse(path, data):
    raise OSError(f"upload of {path} refused")

  monkeypatch.setattr(storage, "write_bytes", refuse)
  with pytest.raises(OSError, match="bert_meta.json refused"):
    prepare._upload(staged, failed)  # pylint: disable=protected-access
  assert not storage.exists(failed)


# ------------------------------------------------------------------------------ fine-tuning


def test_read_records_from_gs(bucket, tmp_path):
  root, _ = bucket
  files = {
      "train.jsonl": '{"text": "a b", "label": "x"}\n\n{"text": "c", "text_b": "d", '
                     '"label": "y"}\n',
      "dev.csv": 'text,tags\r\n"two\r\nlines",B-X O\r\nplain,"[""O""]"\r\n',
  }
  for name, content in files.items():
    (tmp_path / name).write_bytes(content.encode())
    storage.write_text(f"{root}/records/{name}", content)
    remote = finetune_data.read_records(f"{root}/records/{name}")
    local = finetune_data.read_records(str(tmp_path / name))
    assert [r[1:] for r in remote] == [r[1:] for r in local] and len(remote) == 2
    assert remote[0][0] == f"{root}/records/{name}"
  # A plain cell stays text (the tagging task splits space-separated tags), a JSON one is parsed.
  assert [r[2] for r in finetune_data.read_records(f"{root}/records/dev.csv")] == [
      {"text": "two\r\nlines", "tags": "B-X O"}, {"text": "plain", "tags": ["O"]}]
  with pytest.raises(ValueError, match="does not exist"):
    finetune_data.read_records(f"{root}/records/absent.jsonl")
