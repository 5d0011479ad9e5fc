"""Pretrained BERTs in and out: HuggingFace and TF imports, HF export, the bert_jax pretrained
directory, training workdirs, WordPiece encoding, and errors that name the file.

Every reference model is a randomly initialised `transformers` BERT built from a BertConfig
(no downloads), with all parameters perturbed so biases and LayerNorms are not at their
defaults and the heads really are compared. TF checkpoints are written by
`tests/tf_bundle_writer.py`, using the google-research/bert variable names produced here by a
mapping written independently of the importer's.

Training workdirs come from two steps of the real `launch/train.py` on synthetic data (no
vocabulary), and from `bert_jax.checkpoints.checkpointing.Checkpointer` directly with the real
TrainState structure and a vocabulary (as a prepared dataset's run has); a fine-tuning workdir's
best
export from `bert_jax.checkpoints.checkpointing.BestExport` with a classifier head.
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import bert_jax
from bert_jax import weights
from bert_jax.data.encoding import encode_pair
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig, BertForPreTraining, BertModel
from bert_jax.weights.layout import unpad_vocab
from bert_jax.weights import tf_bundle
from tests import tf_bundle_writer
from tests.suite_flags import xla_flags
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERT = os.path.join(ROOT, "launch", "convert.py")
TRAIN = os.path.join(ROOT, "launch", "train.py")

# A WordPiece vocabulary (uncased): specials at BERT's usual places, words, pieces, CJK.
_WORDS = ["the", "cat", "dog", "sat", "on", "mat", "cafe", "naive", "hello", "world", "don",
          "stop", "believe", "##ing", "##ed", "really", "ecole", "facade", "un", "##known"]
_PUNCT = [",", ".", "!", "?", "'", "-", "(", ")", "。", "！", ":"]
_CJK = ["中", "文", "日", "本", "語", "章", "也", "可", "以"]
_LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
_SPECIALS = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_UNCASED = (_SPECIALS + _WORDS + _PUNCT + _CJK + _LETTERS + ["##" + c for c in _LETTERS])
_CASED = _UNCASED + ["Hello", "The", "Cafe", "café", "Café", "naïve", "École", "É", "C", "H",
                     "T"]
assert len(set(_CASED)) == len(_CASED)  # Ids are line numbers: no duplicates.

SENTENCES = [
    "Hello, world! The cat sat on the mat.",
    "The café's naïve façade: really?",
    "日本語の文章です。中文也可以！",
    "Unknownword zzqx Привет 🙂 don't stop-believing...",
    "  multiple   spaces\tand\ttabs\nÉCOLE École ecole ",
    "",
]


def _write_vocab(directory, tokens) -> str:
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in tokens))
  return path


def _hf_config(**overrides) -> transformers.BertConfig:
  values = dict(vocab_size=len(_UNCASED), hidden_size=32, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=64, max_position_embeddings=40)
  return transformers.BertConfig(**{**values, **overrides})


def _hf_model(cls=transformers.BertForPreTraining, seed=0, **overrides):
  """Random init, then every parameter perturbed (LayerNorm and biases are 1/0 at init)."""
  torch.manual_seed(seed)
  model = cls(_hf_config(**overrides)).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.05 * torch.randn_like(param))
  return model


def _hf_dir(tmp_path, name, cls=transformers.BertForPreTraining, seed=0) -> tuple[str, object]:
  directory = str(tmp_path / name)
  model = _hf_model(cls, seed)
  model.save_pretrained(directory)
  _write_vocab(directory, _UNCASED)
  return directory, model


def _batch():
  """Two [CLS] A [SEP] B [SEP] rows, the second padded; four MLM positions each."""
  rng = np.random.default_rng(0)
  ids = rng.integers(8, len(_UNCASED), size=(2, 16)).astype(np.int32)
  ids[:, 0] = 5  # [CLS]
  ids[0, [7, 15]] = 6  # [SEP]
  ids[1, [5, 11]] = 6
  ids[1, 12:] = 0
  types = np.zeros_like(ids)
  types[0, 8:] = 1
  types[1, 6:12] = 1
  mask = np.ones_like(ids)
  mask[1, 12:] = 0
  positions = np.array([[1, 3, 9, 14], [2, 4, 7, 10]], np.int32)
  return ids, types, mask, positions


def _hf_outputs(model, ids, types, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids, dtype=torch.long),
                 token_type_ids=torch.tensor(types, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long))


def _hf_logits(model, batch) -> dict[str, np.ndarray]:
  ids, types, mask, positions = batch
  out = _hf_outputs(model, ids, types, mask)
  mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
  return {"mlm_logits": mlm, "nsp_logits": out.seq_relationship_logits.numpy()}


def _our_logits(config, params, batch) -> dict[str, np.ndarray]:
  out = BertForPreTraining(config).apply({"params": params}, *batch, deterministic=True)
  return {k: np.asarray(v) for k, v in out.items()}


def _max_error(a: dict, b: dict) -> float:
  errors = [float(np.max(np.abs(a[k] - b[k]))) for k in a]
  assert all(np.isfinite(errors))
  return max(errors)


def _run(script, *args) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env["XLA_FLAGS"] = xla_flags(1)  # One device is plenty (and compiles faster).
  return forked_launch.run([sys.executable, script, *args], capture_output=True, text=True,
                        env=env, timeout=240, cwd=ROOT)


def _run_convert(*args) -> subprocess.CompletedProcess:
  return _run(CONVERT, *args)


# ----------------------------------------------------------------------------- HuggingFace


def test_hf_round_trip_through_the_launcher_keeps_logits_and_heads(tmp_path):
  source, hf = _hf_dir(tmp_path, "hf")
  imported = str(tmp_path / "imported")
  result = _run_convert(f"--from_hf={source}", f"--output_dir={imported}")
  assert result.returncode == 0, result.stderr[-3000:]
  info = json.load(open(os.path.join(imported, weights.FORMAT_FILE)))
  assert info["heads"] == {"pooler": True, "mlm": True, "nsp": True}
  assert source in info["source"]

  config, params, vocab = bert_jax.load_pretrained(imported)
  assert weights.heads_present(params) == {"pooler": True, "mlm": True, "nsp": True}
  assert vocab.kind == "wordpiece" and vocab.size == len(_UNCASED) and vocab.cls_id == 5
  batch = _batch()
  reference = _hf_logits(hf, batch)
  ours_error = _max_error(_our_logits(config, params, batch), reference)
  assert ours_error <= 1e-5

  exported = str(tmp_path / "exported")
  result = _run_convert(f"--from_bert_jax={imported}", f"--to_hf={exported}")
  assert result.returncode == 0, result.stderr[-3000:]
  config_json = json.load(open(os.path.join(exported, "config.json")))
  assert config_json["architectures"] == ["BertForPreTraining"]
  assert config_json["model_type"] == "bert"
  reloaded, loading = transformers.BertForPreTraining.from_pretrained(
      exported, output_loading_info=True)
  assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
  assert not loading["mismatched_keys"] and not loading["error_msgs"], loading
  round_trip_error = _max_error(_hf_logits(reloaded.eval(), batch), reference)
  assert round_trip_error <= 1e-5
  assert open(os.path.join(exported, "vocab.txt")).read().split("\n")[:-1] == _UNCASED
  tokenizer = transformers.BertTokenizerFast.from_pretrained(exported)
  assert tokenizer("Hello world")["input_ids"] == [5, *vocab.encode("Hello world"), 6]
  print(f"\nHF round trip: bert_jax vs HF max abs error {ours_error:.2e}; "
        f"HF -> bert_jax -> HF {round_trip_error:.2e}")

  # The launcher fails with one line naming the problem, exit status 1.
  result = _run_convert(f"--from_hf={tmp_path / 'absent'}", f"--output_dir={tmp_path / 'x'}")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "absent does not exist" in last


def test_a_head_nobody_reads_is_no_news(tmp_path):
  """The red team's noise: "has no pooler, MLM head, NSP head ... initialise them before use"
  printed on successful embedding and zero-shot runs, which read none of them. A loader names
  the missing heads its caller reads (`uses`); fine-tuning reads its task's."""
  from bert_jax import finetune  # pylint: disable=import-outside-toplevel
  from configs import finetune_embedding  # pylint: disable=import-outside-toplevel
  source, _ = _hf_dir(tmp_path, "encoder", transformers.BertModel, seed=1)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    weights.load_pretrained(source, uses=())
    weights.load_pretrained(source, uses=("pooler",))
    config = finetune_embedding.get_config()
    config.init_from = source
    finetune.load_encoder(config)  # Embedding: the encoder alone.
  with pytest.warns(UserWarning, match=r"encoder has no MLM head: those parameters are absent"):
    weights.load_pretrained(source, uses=("pooler", "mlm"))
  config.task = "diffusion_sft"  # It fine-tunes the MLM head.
  with pytest.warns(UserWarning, match=r"encoder has no MLM head: "):
    finetune.load_encoder(config)


def test_bert_model_without_heads_imports_with_a_note(tmp_path):
  source, hf = _hf_dir(tmp_path, "encoder", transformers.BertModel, seed=1)
  with pytest.warns(UserWarning, match="has no MLM head, NSP head"):
    config, params, _ = weights.load_pretrained(source)
  assert weights.heads_present(params) == {"pooler": True, "mlm": False, "nsp": False}
  assert set(params) == {"bert"}
  ids, types, mask, _ = _batch()
  sequence, pooled = BertModel(config).apply({"params": params["bert"]}, ids, types, mask)
  out = _hf_outputs(hf, ids, types, mask)
  error = max(float(np.abs(np.asarray(sequence) - out.last_hidden_state.numpy()).max()),
              float(np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max()))
  assert error <= 1e-4
  print(f"\nBertModel import: hidden states max abs error {error:.2e}")

  # Saved and exported, the heads stay absent: HF gets a BertModel, with nothing missing.
  saved = weights.save_pretrained(tmp_path / "saved", params, config, source + "/vocab.txt",
                                  note="encoder only")
  info = json.load(open(os.path.join(saved, weights.FORMAT_FILE)))
  assert info["heads"] == {"pooler": True, "mlm": False, "nsp": False}
  with pytest.warns(UserWarning, match="no MLM head, NSP head"):
    _, reloaded_params, _ = weights.load_pretrained(saved)
  assert weights.heads_present(reloaded_params)["mlm"] is False
  assert weights.save_hf(tmp_path / "hf_out", reloaded_params, config, None) == "BertModel"
  # Continued pretraining initialises the heads explicitly; the encoder stays as imported.
  fresh = BertForPreTraining(config).init(jax.random.key(0), *_batch())["params"]
  full = weights.fill_missing_heads(reloaded_params, fresh)
  assert weights.heads_present(full) == {"pooler": True, "mlm": True, "nsp": True}
  np.testing.assert_array_equal(full["bert"]["encoder"]["layers"]["mlp"]["output"]["kernel"],
                                reloaded_params["bert"]["encoder"]["layers"]["mlp"]["output"]["kernel"])
  assert np.isfinite(_our_logits(config, full, _batch())["mlm_logits"]).all()
  reloaded, loading = transformers.BertModel.from_pretrained(
      tmp_path / "hf_out", output_loading_info=True)
  assert not loading["missing_keys"] and not loading["unexpected_keys"], loading


# ------------------------------------------------------------------------------ TensorFlow


def _google_bert_variables(hf_state: dict) -> dict[str, np.ndarray]:
  """HF names -> google-research/bert names and layouts (written independently of the importer:
  dense kernels are [in, out], output_weights of the NSP head stays [2, H])."""
  out = {}
  for key, value in hf_state.items():
    value = value.detach().numpy() if hasattr(value, "detach") else value
    if key.startswith("cls.predictions.decoder") or key.endswith("_ids"):
      continue
    name = re.sub(r"layer/(\d+)", r"layer_\1", key.replace(".", "/"))
    if key == "cls.predictions.bias":
      name = "cls/predictions/output_bias"
    elif key.startswith("cls.seq_relationship."):
      name = "cls/seq_relationship/" + ("output_weights" if key.endswith("weight") else
                                        "output_bias")
    elif "LayerNorm" in key:
      name = name.replace("/weight", "/gamma").replace("/bias", "/beta")
    elif key.endswith("_embeddings.weight"):
      name = name[:-len("/weight")]
    elif key.endswith(".weight"):
      name, value = name[:-len("weight")] + "kernel", value.T
    out[name] = np.ascontiguousarray(value, dtype=np.float32)
  return out


@pytest.fixture(scope="module")
def tf_checkpoint_dir(tmp_path_factory):
  """A random google-research/bert checkpoint with Adam slots, and the HF model it came from."""
  directory = tmp_path_factory.mktemp("tf")
  hf = _hf_model(seed=2)
  variables = _google_bert_variables(hf.state_dict())
  for name in ("bert/encoder/layer_1/attention/self/query/kernel",
               "bert/encoder/layer_0/attention/output/LayerNorm/gamma",
               "bert/embeddings/word_embeddings", "bert/pooler/dense/kernel",
               "cls/predictions/transform/dense/kernel", "cls/predictions/output_bias",
               "cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias"):
    assert name in variables, name
  assert variables["cls/seq_relationship/output_weights"].shape == (2, 32)
  assert variables["bert/encoder/layer_0/intermediate/dense/kernel"].shape == (32, 64)
  rng = np.random.default_rng(0)
  slots = {f"{n}/{s}": rng.normal(size=v.shape).astype(np.float32)
           for n, v in variables.items() for s in ("adam_m", "adam_v")}
  tensors = {**variables, **slots, "global_step": np.array(1000, np.int64)}
  # Small blocks: the index spans several data blocks, as large checkpoints' do.
  tf_bundle_writer.write_bundle(str(directory / "bert_model.ckpt"), tensors, block_size=1024)
  with open(directory / "bert_config.json", "w") as f:
    json.dump({k: v for k, v in hf.config.to_dict().items()
               if k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "hidden_act", "hidden_dropout_prob",
                        "attention_probs_dropout_prob", "max_position_embeddings",
                        "type_vocab_size", "initializer_range")}, f)
  _write_vocab(directory, _UNCASED)
  return directory, hf


def test_tf_checkpoint_imports_with_hf_logits(tf_checkpoint_dir, tmp_path):
  directory, hf = tf_checkpoint_dir
  reader = tf_bundle.BundleReader(str(directory / "bert_model.ckpt"))
  assert len(reader.names()) == 3 * 46 + 1  # 46 variables, 2 Adam slots each, global_step.
  assert reader.read("global_step") == 1000

  config, params, vocab = weights.load_tf(str(directory / "bert_model.ckpt"))
  assert weights.heads_present(params) == {"pooler": True, "mlm": True, "nsp": True}
  batch = _batch()
  error = _max_error(_our_logits(config, params, batch), _hf_logits(hf, batch))
  assert error <= 1e-5
  print(f"\nTF import: bert_jax vs HF max abs error {error:.2e}")

  # Through a saved bert_jax directory (load_pretrained also takes the TF directory itself).
  saved = weights.save_pretrained(tmp_path / "from_tf", params, config, vocab)
  for path in (saved, str(directory)):
    config2, params2, vocab2 = weights.load_pretrained(path)
    assert config2 == config and vocab2.size == vocab.size
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_tf_format_details_and_damage(tf_checkpoint_dir, tmp_path):
  # CRC-32C check value (google_crc32c's; the test writer checksums with tf_bundle.crc32c too).
  assert tf_bundle.crc32c(b"123456789") == 0xE3069283
  # A snappy-compressed block decodes (literal "abc", then a 9-byte copy at offset 3); a damaged
  # one (copy before the start, wrong length header, a header claiming 4 GB) is a ValueError,
  # which the reader reports naming the index.
  assert tf_bundle._snappy_decompress(b"\x0c\x08abc\x15\x03") == b"abcabcabcabc"
  for bad in (b"\x0c\x08abc\x15\x09", b"\x0d\x08abc\x15\x03", b"\xff\xff\xff\xff\x0f\x08abc"):
    with pytest.raises(ValueError, match="snappy block"):
      tf_bundle._snappy_decompress(bad)

  directory, _ = tf_checkpoint_dir
  damaged = tmp_path / "damaged"
  shutil.copytree(directory, damaged)
  data_file = damaged / "bert_model.ckpt.data-00000-of-00001"
  raw = bytearray(data_file.read_bytes())
  raw[100] ^= 0xFF
  data_file.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=r"bert_model\.ckpt\.data-00000-of-00001 is corrupted"):
    weights.load_tf(str(damaged / "bert_model.ckpt"))
  raw[100] ^= 0xFF
  data_file.write_bytes(bytes(raw[:len(raw) // 2]))
  with pytest.raises(ValueError, match="is truncated"):
    weights.load_tf(str(damaged / "bert_model.ckpt"))
  index = bytearray((damaged / "bert_model.ckpt.index").read_bytes())
  index[10] ^= 0xFF  # In the first data block: its crc32c no longer matches.
  (damaged / "bert_model.ckpt.index").write_bytes(bytes(index))
  with pytest.raises(ValueError, match=r"bert_model\.ckpt\.index is not a readable TensorFlow "
                     r"tensor-bundle index \(checksum mismatch in the block at offset 0\)"):
    weights.load_tf(str(damaged / "bert_model.ckpt"))
  (damaged / "bert_model.ckpt.index").write_bytes(b"not a checkpoint index" * 4)
  with pytest.raises(ValueError, match=r"bert_model\.ckpt\.index is not a readable TensorFlow"):
    weights.load_tf(str(damaged / "bert_model.ckpt"))
  os.remove(damaged / "bert_model.ckpt.index")
  with pytest.raises(ValueError, match=r"index .*damaged/bert_model\.ckpt\.index does not exist"):
    weights.load_tf(str(damaged / "bert_model.ckpt"))


# ---------------------------------------------------------------------------- tokenization


@pytest.mark.parametrize("tokens,lowercase", [(_UNCASED, True), (_CASED, False)],
                         ids=["uncased", "cased"])
def test_wordpiece_ids_and_pairs_match_bert_tokenizer_fast(tmp_path, tokens, lowercase):
  vocab_file = _write_vocab(tmp_path, tokens)
  vocab = Vocab.load(vocab_file)
  assert vocab.lowercase is lowercase  # Detected from the vocabulary's casing.
  reference = transformers.BertTokenizerFast(vocab_file, do_lower_case=lowercase)
  for sentence in SENTENCES:
    assert vocab.encode(sentence) == reference(sentence, add_special_tokens=False)["input_ids"], \
        sentence
  assert vocab.unk_id in vocab.encode(SENTENCES[3])

  for max_length in (3, 5, 8, 13, 24, 64):
    for text_a, text_b in zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1]):
      ours = encode_pair(vocab, text_a, text_b, max_length=max_length)
      theirs = reference(text_a, text_b or None, truncation=True, max_length=max_length,
                         padding="max_length")
      for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert ours[key].dtype == np.int32 and ours[key].shape == (max_length,)
        assert ours[key].tolist() == theirs[key], (key, max_length, text_a, text_b)
    single = encode_pair(vocab, SENTENCES[0], max_length=max_length)
    assert single["input_ids"].tolist() == reference(
        SENTENCES[0], truncation=True, max_length=max_length, padding="max_length")["input_ids"]

  # A HF directory's tokenizer_config.json decides the casing, as it does for transformers.
  hf_dir = tmp_path / "hf"
  _write_vocab(hf_dir, tokens)
  with open(hf_dir / "tokenizer_config.json", "w") as f:
    json.dump({"do_lower_case": not lowercase}, f)
  flipped = weights.hf.read_vocab(str(hf_dir))
  reference = transformers.BertTokenizerFast(vocab_file, do_lower_case=not lowercase)
  assert flipped.encode(SENTENCES[1]) == reference(
      SENTENCES[1], add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------- errors


def test_bad_inputs_raise_errors_naming_the_file(tmp_path):
  source, hf = _hf_dir(tmp_path, "good")

  broken = tmp_path / "truncated"
  shutil.copytree(source, broken)
  weights_file = broken / "model.safetensors"
  weights_file.write_bytes(weights_file.read_bytes()[:weights_file.stat().st_size // 2])
  with pytest.raises(ValueError, match=r"truncated/model\.safetensors is not a readable"):
    weights.load_pretrained(str(broken))

  torch_dir = tmp_path / "torch"
  shutil.copytree(source, torch_dir)
  os.remove(torch_dir / "model.safetensors")
  torch.save(hf.state_dict(), torch_dir / "pytorch_model.bin")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    config, params, _ = weights.load_pretrained(str(torch_dir))  # A good .bin loads.
  error = _max_error(_our_logits(config, params, _batch()), _hf_logits(hf, _batch()))
  assert error <= 1e-5
  raw = (torch_dir / "pytorch_model.bin").read_bytes()
  (torch_dir / "pytorch_model.bin").write_bytes(raw[:-200] + b"\0" * 200)
  with pytest.raises(ValueError, match=r"torch/pytorch_model\.bin is not a readable PyTorch"):
    weights.load_pretrained(str(torch_dir))

  wrong = tmp_path / "wrong_config"
  shutil.copytree(source, wrong)
  config_json = json.load(open(wrong / "config.json"))
  json.dump({**config_json, "hidden_size": 48}, open(wrong / "config.json", "w"))
  with pytest.raises(ValueError, match=r"wrong_config/model\.safetensors \(with .*wrong_config/"
                     r"config\.json\): Shape mismatch for bert\.embeddings\.word_embeddings"):
    weights.load_pretrained(str(wrong))

  not_finite = tmp_path / "nan"
  shutil.copytree(source, not_finite)
  import safetensors.numpy
  state = safetensors.numpy.load_file(str(not_finite / "model.safetensors"))
  state["cls.predictions.bias"][3] = np.nan
  safetensors.numpy.save_file(state, str(not_finite / "model.safetensors"))
  with pytest.raises(ValueError, match=r"nan/model\.safetensors.*mlm/bias holds NaN"):
    weights.load_pretrained(str(not_finite))

  no_vocab = tmp_path / "no_vocab"
  shutil.copytree(source, no_vocab)
  os.remove(no_vocab / "vocab.txt")
  with pytest.raises(ValueError, match=r"no_vocab: no vocabulary \(expected tokenizer\.json or "
                     r"vocab\.txt\)"):
    weights.load_pretrained(str(no_vocab))

  no_config = tmp_path / "no_config"
  shutil.copytree(source, no_config)
  os.remove(no_config / "config.json")
  with pytest.raises(ValueError, match=r"no_config: no config\.json"):
    weights.load_pretrained(str(no_config))
  os.remove(no_config / "model.safetensors")
  with pytest.raises(ValueError, match=r"no_config: not a pretrained BERT"):
    weights.load_pretrained(str(no_config))

  with pytest.raises(ValueError, match=r"missing\.ckpt\.index does not exist"):
    weights.load_tf(str(tmp_path / "missing.ckpt"))


# ------------------------------------------------------------------------ training workdirs


def test_load_pretrained_from_a_real_training_run(tmp_path):
  """Two steps of launch/train.py on synthetic data, then load, export to HF and compare."""
  workdir = str(tmp_path / "run")
  overrides = dict(
      **{f"model.{k}": v for k, v in dict(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64).items()},
      **{"data.source": "synthetic", "data.max_seq_length": 32, "train.num_train_steps": 2,
         "train.batch_size": 8, "train.eval_every_steps": 0, "logging.tensorboard": False,
         "masking.max_predictions_per_seq": 5})
  result = _run(TRAIN, f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}",
                *[f"--config.{k}={v}" for k, v in overrides.items()], f"--workdir={workdir}")
  assert result.returncode == 0, result.stderr[-3000:]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # Every head is there: no warning.
    config, params, vocab = bert_jax.load_pretrained(workdir)
  assert vocab is None  # Synthetic data has no vocabulary.
  assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (64, 32, 1)
  assert weights.heads_present(params) == {"pooler": True, "mlm": True, "nsp": True}

  assert weights.save_hf(tmp_path / "hf", params, config, None) == "BertForPreTraining"
  hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
  ids, types, mask, positions = _batch()
  batch = (ids % 64, types, mask, positions)
  error = _max_error(_our_logits(config, params, batch), _hf_logits(hf, batch))
  assert error <= 1e-5


def test_load_pretrained_from_a_checkpointer_workdir_with_a_vocabulary(tmp_path):
  from bert_jax.checkpoints import checkpointing
  from bert_jax.training import optimizer as optimizer_lib, steps
  from configs import tiny

  config = tiny.get_config()
  config.model.update(vocab_size=len(_UNCASED), hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                      dtype="bfloat16")
  model_config = BertConfig.from_config(config.model)
  optimizer = optimizer_lib.make_optimizer(config.train)

  def init(rng):
    ids = jnp.zeros((1, 16), jnp.int32)
    params = BertForPreTraining(model_config).init(rng, ids, ids, ids, ids[:, :4])["params"]
    return steps.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                            opt_state=optimizer.init(params))

  # The real TrainState structure (AdamW state included), filled with random numbers: running
  # the init itself costs ~10 s of op-by-op dispatch here.
  rng = np.random.default_rng(0)
  shapes = nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))
  state = jax.device_put(
      jax.tree.map(lambda x: (0.1 * rng.normal(size=x.shape)).astype(x.dtype), shapes))
  saved_vocab = Vocab.load(_write_vocab(tmp_path / "raw_vocab", _UNCASED))
  config.checkpoint.save_every_steps = 1
  checkpointer = checkpointing.Checkpointer(str(tmp_path / "run"), config.checkpoint)
  meta = {"config": checkpointing.to_json(config.to_dict()),
          "model_config": checkpointing.to_json(dataclasses.asdict(model_config))}
  older = state.replace(params=jax.tree.map(lambda x: x + 1, state.params))
  checkpointer.save(1, older, b"{}", meta, saved_vocab)
  checkpointer.save(2, state.replace(step=state.step + 2), b"{}", meta, saved_vocab)
  checkpointer.close()

  loaded_config, params, vocab = weights.load_pretrained(str(tmp_path / "run"))
  # The run's padded vocabulary (config.model.vocab_pad_multiple) leaves with the checkpoint:
  # the real rows, as every weight format holds them.
  assert model_config.padded_vocab_size > model_config.vocab_size
  real_config, real_params = unpad_vocab(model_config, jax.device_get(state.params))
  assert loaded_config == dataclasses.replace(real_config, dtype=np.float32)  # f32 compute.
  jax.tree.map(np.testing.assert_array_equal, params, real_params)  # Latest.
  assert vocab.size == len(_UNCASED) and vocab.mask_id == 7
  _, older_params, _ = weights.load_pretrained(str(tmp_path / "run" / "checkpoints" / "1"))
  jax.tree.map(np.testing.assert_array_equal, older_params,
               unpad_vocab(model_config, jax.device_get(older.params))[1])

  # A workdir exports to HF like a pretrained directory does.
  export = str(tmp_path / "hf")
  assert weights.save_hf(export, params, loaded_config, vocab) == "BertForPreTraining"
  hf = transformers.BertForPreTraining.from_pretrained(export).eval()
  batch = _batch()
  error = _max_error(_our_logits(loaded_config, params, batch), _hf_logits(hf, batch))
  assert error <= 1e-5


def test_a_fine_tuned_workdir_loads_and_exports_its_encoder_without_the_task_head(tmp_path,
                                                                                  caplog):
  """A fine-tuning run's best export holds {"bert", "classifier"}: loading keeps the encoder
  (pooler included) and leaves the classifier out; convert exports it as a BertModel."""
  from bert_jax.checkpoints import checkpointing

  source, hf = _hf_dir(tmp_path, "encoder", transformers.BertModel, seed=3)
  with pytest.warns(UserWarning, match="has no MLM head, NSP head"):
    config, encoder, vocab = weights.load_pretrained(source)
  rng = np.random.default_rng(0)
  classifier = {"kernel": rng.normal(size=(config.hidden_size, 3)).astype(np.float32),
                "bias": rng.normal(size=(3,)).astype(np.float32)}
  workdir = str(tmp_path / "finetuned")
  export = checkpointing.BestExport(workdir)
  export.save(7, {**encoder, "classifier": classifier},
              {"model_config": checkpointing.to_json(dataclasses.asdict(config))}, vocab)
  export.close()

  with caplog.at_level(logging.INFO, logger="bert_jax.weights"), \
      pytest.warns(UserWarning, match="has no MLM head, NSP head"):
    loaded_config, params, loaded_vocab = weights.load_pretrained(workdir)
  assert "left out the fine-tuning head classifier" in caplog.text
  assert loaded_config == config and loaded_vocab.size == vocab.size
  assert set(params) == {"bert"}
  jax.tree.map(np.testing.assert_array_equal, params, encoder)

  exported = str(tmp_path / "hf_out")
  result = _run_convert(f"--from_bert_jax={workdir}", f"--to_hf={exported}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Wrote BertModel" in result.stdout
  assert "left out the fine-tuning head classifier" in result.stderr
  reloaded, loading = transformers.BertModel.from_pretrained(exported, output_loading_info=True)
  assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
  ids, types, mask, _ = _batch()
  ours, theirs = _hf_outputs(reloaded.eval(), ids, types, mask), _hf_outputs(hf, ids, types, mask)
  error = max(float((ours.last_hidden_state - theirs.last_hidden_state).abs().max()),
              float((ours.pooler_output - theirs.pooler_output).abs().max()))
  assert error <= 1e-5
