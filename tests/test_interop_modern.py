"""The modern encoder (ModernBERT) and HuggingFace: parity with `ModernBertForMaskedLM`, export
that transformers loads without remote code, import, the round trip, configs bert_jax cannot
represent, tokenizers in every export (AutoTokenizer gives bert_jax's ids), and prediction and
fine-tuning from a modern encoder.

Every reference is a randomly initialised `transformers` ModernBERT built from a config (no
downloads), its weights scaled up and its norms perturbed so that attention is far from uniform
and every norm really is compared; batches are longer than the local window (local layers
matter: the test checks that they do) and padded at the end (compared on real rows only: HF
and bert_jax differ only in what padding rows attend to, which nothing reads).
"""

import dataclasses
import functools
import json
import os
import random
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import safetensors.numpy
import torch
import transformers

from bert_jax import finetune, predict, weights
from bert_jax.weights import hf_export
from bert_jax.models import model as model_lib
from bert_jax.training import programs, steps
from bert_jax.tasks import classification
from bert_jax.data.encoding import encode_pair
from bert_jax.data.vocab import Vocab, train_sentencepiece
from bert_jax.models.model import BertConfig, BertForPreTraining, param_shapes
from bert_jax.weights import hf, hf_heads, hf_modernbert, hf_tokenizer, params as params_lib
from configs import finetune_classification, finetune_qa, finetune_tagging
from tests import test_finetune as ft, test_hf_heads as heads_test
from tests.suite_flags import xla_flags
from tests import forked_launch

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 1e-4  # Max abs MLM logit difference, float32.
# A tiny ModernBERT: 4 layers, global at 0 and 3, local (window 8: +-4 rows) at 1 and 2.
HF_SIZES = dict(vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, max_position_embeddings=128, local_attention=8,
                layer_types=["full_attention", "sliding_attention", "sliding_attention",
                             "full_attention"],
                rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e3},
                                 "sliding_attention": {"rope_type": "default",
                                                       "rope_theta": 1e2}},
                pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
# Texts for the tokenizers: accents, CJK, emoji (byte fallback), runs of spaces, tabs,
# newlines, leading/trailing blanks, a literal "▁", full-width forms, NBSP, zero-width space.
SENTENCES = ["Hello, world! The cat sat on the mat.", "The café's naïve façade: really?",
             "日本語の文章です。中文也可以！", "Unknownword zzqx Привет 🙂 don't stop-believing...",
             "  multiple   spaces\tand\ttabs\nÉCOLE École ecole ", "", " ",
             "\u2581starts with the marker", "ｆｕｌｌｗｉｄｔｈ ①② x\u00a0y z\u200bw",
             "def encode(self, text: str) -> list[int]:", "x = {'a': 1, \"b\": [2, 3]}  # why?"]


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
  """A launcher on one CPU device."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env["XLA_FLAGS"] = xla_flags(1)
  return forked_launch.run([sys.executable, os.path.join(ROOT, "launch", script), *args],
                        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def _hf_modernbert(seed: int = 0, **overrides) -> transformers.ModernBertForMaskedLM:
  """Random init, matrices x8 (peaked attention), every norm and bias perturbed."""
  config = transformers.ModernBertConfig(**{**HF_SIZES, **overrides},
                                         attn_implementation="sdpa")
  torch.manual_seed(seed)
  model = transformers.ModernBertForMaskedLM(config).eval()
  with torch.no_grad():
    for name, param in model.named_parameters():
      if param.ndim == 2 and "embeddings" not in name:
        param.mul_(8.0)
      else:
        param.add_(0.2 * torch.randn_like(param))
  return model


def _padded_batch(vocab_size: int, length: int = 40) -> tuple[np.ndarray, np.ndarray]:
  """(input_ids, attention_mask) [3, length]: one full row, two padded at the end (one shorter
  than the window)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, vocab_size, (3, length))
  mask = np.ones((3, length), np.int64)
  mask[1, 29:] = 0
  mask[2, 7:] = 0
  return ids * mask, mask


def _hf_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


@functools.lru_cache(maxsize=None)
def _forward(config: BertConfig):
  """BertForPreTraining's MLM logits, jitted once per config."""
  return jax.jit(lambda params, *inputs: BertForPreTraining(config).apply(
      {"params": params}, *inputs)["mlm_logits"])


def _our_logits(config: BertConfig, params: dict, ids: np.ndarray, mask: np.ndarray):
  """MLM logits [B, L, V] at every row (masked positions 0..L-1)."""
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
  # A HF ModernBERT has no pooler or NSP head: zeros (the MLM logits never read them).
  zeros = {path: np.zeros(shape, np.float32) for path, shape in param_shapes(config).items()}
  params = params_lib.fill_missing_heads(params, params_lib.unflatten(zeros))
  return np.asarray(_forward(config)(params, ids.astype(np.int32), np.zeros_like(ids, np.int32),
                                     mask.astype(np.int32), positions))


def _max_error(ours: np.ndarray, theirs: np.ndarray, mask: np.ndarray) -> float:
  return float(np.abs(ours - theirs)[mask.astype(bool)].max())


@pytest.fixture(scope="module")
def reference():
  """(HF model, its config.json dict, bert_jax config, params) of the tiny ModernBERT."""
  model = _hf_modernbert()
  hf_config = model.config.to_dict()
  config = hf_modernbert.config_from_hf(hf_config)
  return model, hf_config, config, hf_modernbert.params_from_hf(model.state_dict(), config)


# ------------------------------------------------------------------------------- parity


def test_logits_equal_hf_modernbert_on_padded_batches_with_local_layers(reference):
  model, _, config, params = reference
  assert (config.local_attention, config.global_attn_every_n_layers) == (8, 3)
  assert [config.is_global_layer(i) for i in range(4)] == [True, False, False, True]
  ids, mask = _padded_batch(config.vocab_size)
  theirs = _hf_logits(model, ids, mask)
  error = _max_error(_our_logits(config, params, ids, mask), theirs, mask)
  print(f"\nModernBERT parity: max abs MLM logit error {error:.2e} (logits up to "
        f"{np.abs(theirs).max():.1f})")
  assert error <= TOLERANCE
  # The comparison sees the local window: every layer global, the logits move.
  every_layer_global = dataclasses.replace(config, local_attention=0,
                                           global_attn_every_n_layers=1)
  assert _max_error(_our_logits(every_layer_global, params, ids, mask), theirs, mask) > 0.1


def test_biases_and_another_layer_pattern_keep_parity():
  """Biases everywhere (attention, MLP, norms, head), gelu_new, global every 2nd of 3 layers."""
  model = _hf_modernbert(seed=1, attention_bias=True, mlp_bias=True, norm_bias=True,
                         classifier_bias=True, hidden_activation="gelu_new",
                         classifier_activation="gelu_new", num_hidden_layers=3,
                         layer_types=["full_attention", "sliding_attention", "full_attention"])
  config = hf_modernbert.config_from_hf(model.config.to_dict())
  assert (config.global_attn_every_n_layers, config.norm_bias) == (2, True)
  params = hf_modernbert.params_from_hf(model.state_dict(), config)
  ids, mask = _padded_batch(config.vocab_size)
  error = _max_error(_our_logits(config, params, ids, mask), _hf_logits(model, ids, mask), mask)
  assert error <= TOLERANCE


def test_mean_pooling_averages_each_example_rows():
  rng = np.random.default_rng(0)
  sequence = rng.normal(size=(2, 6, 3)).astype(np.float32)
  segments = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 2, 2, 2, 0]])
  pooled = np.asarray(model_lib.pool(sequence, segments, None, "mean"))  # [B, H]
  np.testing.assert_allclose(pooled, [sequence[0, :3].mean(0), sequence[1, :2].mean(0)],
                             rtol=1e-6)
  packed = np.asarray(model_lib.pool(sequence, segments, np.array([[0, 0], [0, 2]]), "mean"))
  np.testing.assert_allclose(packed[1], [sequence[1, :2].mean(0), sequence[1, 2:5].mean(0)],
                             rtol=1e-6)


# ------------------------------------------------------------------ export and import


def _state(directory: str) -> dict[str, np.ndarray]:
  return safetensors.numpy.load_file(os.path.join(directory, "model.safetensors"))


def test_export_loads_in_transformers_and_import_round_trips(reference, tmp_path):
  model, _, config, params = reference
  vocab = Vocab.load(ft._write_vocab(tmp_path / "vocab.txt", ft.FILLER))
  pretrained = weights.save_pretrained(str(tmp_path / "pretrained"), params, config, vocab)
  exported = str(tmp_path / "exported")
  result = _run("convert.py", f"--from_bert_jax={pretrained}", f"--to_hf={exported}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "ModernBertForMaskedLM" in result.stdout
  config_json = json.load(open(os.path.join(exported, "config.json")))
  assert config_json["model_type"] == "modernbert" and config_json["pad_token_id"] == vocab.pad_id
  reloaded, loading = transformers.ModernBertForMaskedLM.from_pretrained(
      exported, output_loading_info=True)
  assert not any(loading.values()), loading  # No missing, unexpected or mismatched keys.
  ids, mask = _padded_batch(config.vocab_size)
  ours = _our_logits(config, params, ids, mask)
  error = _max_error(_hf_logits(reloaded.eval(), ids, mask), ours, mask)
  print(f"\nexport -> transformers: max abs MLM logit error {error:.2e}")
  assert error <= TOLERANCE
  assert reloaded.config.layer_types == model.config.layer_types

  # --from_hf, then export again: the same params, the same state dict.
  imported = str(tmp_path / "imported")
  result = _run("convert.py", f"--from_hf={exported}", f"--output_dir={imported}")
  assert result.returncode == 0, result.stderr[-3000:]
  config_back, params_back, vocab_back = weights.load_pretrained(imported)
  assert config_back == config and vocab_back.size == vocab.size
  flat, flat_back = params_lib.flatten(params), params_lib.flatten(params_back)
  assert flat.keys() == flat_back.keys()
  assert all(np.array_equal(flat[k], flat_back[k]) for k in flat)
  again = str(tmp_path / "again")
  weights.save_hf(again, params_back, config_back, vocab_back)
  first, second = _state(exported), _state(again)
  assert first.keys() == second.keys() and "decoder.weight" not in first
  assert all(np.array_equal(first[k], second[k]) for k in first)
  # HF's own save_pretrained writes what the import reads too.
  model.save_pretrained(str(tmp_path / "hf_saved"))
  shutil.copy(os.path.join(exported, "vocab.txt"), tmp_path / "hf_saved")
  _, from_hf, _ = hf.load_hf(str(tmp_path / "hf_saved"))
  assert all(np.array_equal(v, params_lib.flatten(from_hf)[k]) for k, v in flat.items())


def test_an_encoder_without_mlm_head_exports_as_modernbert_model(reference, tmp_path):
  _, _, config, params = reference
  encoder = {"bert": params["bert"]}
  assert weights.save_hf(str(tmp_path / "enc"), encoder, config, None) == "ModernBertModel"
  reloaded, loading = transformers.ModernBertModel.from_pretrained(
      str(tmp_path / "enc"), output_loading_info=True)
  assert not any(loading.values()), loading
  state = hf.read_weights(str(tmp_path / "enc"))[0]
  back = hf_modernbert.params_from_hf(state, config)
  assert weights.heads_present(back) == {"pooler": False, "mlm": False, "nsp": False}


_UNREPRESENTABLE = [
    ({"layer_types": ["full_attention", "sliding_attention", "full_attention",
                      "sliding_attention"][::-1]}, "layer_types"),
    ({"layer_types": ["full_attention", "sliding_attention", "full_attention",
                      "full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": 1e3}}},
     r"rope_parameters\.full_attention\.rope_type"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"decoder_bias": False}, "decoder_bias"),
    ({"head_dim": 32}, "head_dim"),
    ({"local_attention": 7}, "local_attention"),
    ({"hidden_activation": "silu"}, "hidden_activation"),
    ({"classifier_activation": "relu"}, "classifier_activation"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"norm_bias": "no"}, "norm_bias"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"norm_eps": "1e-5"}, "norm_eps"),
    ({"layer_types": None, "global_attn_every_n_layers": 0}, "global_attn_every_n_layers"),
]


@pytest.mark.parametrize("change,field", _UNREPRESENTABLE,
                         ids=[f"{i}-{next(iter(c))}" for i, (c, _) in enumerate(_UNREPRESENTABLE)])
def test_unrepresentable_configs_are_refused_naming_the_field(reference, change, field):
  hf_config = {**reference[1], **change}
  with pytest.raises(ValueError, match=field):
    hf_modernbert.config_from_hf(hf_config)


def test_configs_without_layer_types_and_exports_hf_cannot_compute(reference, tmp_path):
  # Configs from before layer_types: global_attn_every_n_layers and the θ fields.
  legacy = {k: v for k, v in reference[1].items() if k not in ("layer_types", "rope_parameters")}
  config = hf_modernbert.config_from_hf({**legacy, "global_attn_every_n_layers": 3,
                                         "global_rope_theta": 1e3, "local_rope_theta": 1e2})
  assert config == reference[2]
  assert hf_modernbert.config_from_hf({**legacy, "global_attn_every_n_layers": 9}) == (
      dataclasses.replace(reference[2], global_attn_every_n_layers=9, global_rope_theta=160000.0,
                          local_rope_theta=10000.0))
  # Neither BERT nor ModernBERT (rotary positions with BERT's MLP): refused naming the fields.
  hybrid = dataclasses.replace(reference[2], mlp="dense")
  with pytest.raises(ValueError, match=r"'mlp': 'dense'.*nor can ModernBERT"):
    weights.save_hf(str(tmp_path / "out"), _random_params(hybrid), hybrid, None)
  assert not os.path.exists(tmp_path / "out")


def test_the_launcher_refuses_an_unrepresentable_config_in_one_line(reference, tmp_path):
  source = tmp_path / "hf"
  reference[0].save_pretrained(str(source))
  ft._write_vocab(source / "vocab.txt", ["cat"])
  config_json = json.load(open(source / "config.json"))
  config_json["layer_types"][2] = "full_attention"
  json.dump(config_json, open(source / "config.json", "w"))
  with pytest.raises(ValueError, match=r"config\.json: layer_types puts global"):
    weights.load_pretrained(str(source))
  result = _run("convert.py", f"--from_hf={source}", f"--output_dir={tmp_path / 'out'}")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "layer_types" in last and "config.json" in last
  assert not os.path.exists(tmp_path / "out")


# --------------------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def sentencepiece_vocabs(tmp_path_factory):
  """bert_jax-trained sentencepiece vocabularies (as prepare_data trains them: nmt_nfkc,
  byte fallback), unigram and BPE, on lines of bert_jax's own sources."""
  directory = tmp_path_factory.mktemp("spm")
  lines = []
  for name in ("models/model.py", "data/vocab.py", "data/corpus.py"):
    with open(os.path.join(ROOT, "bert_jax", name), encoding="utf-8") as f:
      lines += [line.strip() for line in f if line.strip()]
  lines += SENTENCES * 3
  return {kind: train_sentencepiece(iter(lines), str(directory / kind), 800, kind,
                                    allow_smaller_vocab=True)
          for kind in ("unigram", "bpe")}


def _tiny_config(vocab: Vocab, modern: bool) -> BertConfig:
  values = dict(vocab_size=vocab.size, hidden_size=16, num_hidden_layers=1,
                num_attention_heads=2, intermediate_size=16, max_position_embeddings=64)
  if modern:
    values.update(type_vocab_size=0, position_embedding="rotary", mlp="glu",
                  norm_placement="pre", attention_bias=False, mlp_bias=False, norm_bias=False,
                  classifier_bias=False)
  return BertConfig(**values)


def _random_params(config: BertConfig, seed: int = 0) -> dict:
  """Every parameter of `config` drawn from N(0, 0.1), norm scales about 1 (nothing compiled)."""
  rng = np.random.default_rng(seed)
  draw = lambda path, shape: (float(path[-1] == "scale") + rng.normal(0.0, 0.1, shape)).astype(
      np.float32)
  return params_lib.unflatten({path: draw(path, shape)
                               for path, shape in param_shapes(config).items()})


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_sentencepiece_model_is_decoded_as_sentencepiece_reads_it(sentencepiece_vocabs, kind):
  """The export decodes the ModelProto itself (sentencepiece's generated protobuf module needs
  the protobuf runtime it was built with): pieces, scores and types as the processor has them."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel

  _, model_proto = sentencepiece_vocabs[kind].model_file()
  processor = spm.SentencePieceProcessor(model_proto=model_proto)
  model = hf_tokenizer._parse_model(model_proto)  # pylint: disable=protected-access
  assert len(model.pieces) == processor.get_piece_size() > 500
  assert [(p.piece, p.score) for p in model.pieces] == [
      (processor.id_to_piece(i), processor.get_score(i)) for i in range(len(model.pieces))]
  types = {1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 6: "byte"}
  for i, piece in enumerate(model.pieces):
    kind_of = types[piece.type]
    assert processor.is_unknown(i) == (kind_of == "unknown")
    assert processor.is_control(i) == (kind_of == "control")
    assert processor.is_byte(i) == (kind_of == "byte"), (i, piece)
  assert model.trainer_spec.model_type == {"unigram": 1, "bpe": 2}[kind]
  assert model.trainer_spec.byte_fallback and model.trainer_spec.unk_id == processor.unk_id()
  assert model.normalizer_spec.precompiled_charsmap  # nmt_nfkc's.


@pytest.mark.parametrize("kind,modern", [("unigram", True), ("bpe", True), ("unigram", False),
                                         ("bpe", False), ("wordpiece", True)])
def test_autotokenizer_of_an_export_gives_bert_jax_ids(sentencepiece_vocabs, tmp_path, kind,
                                                       modern):
  if kind == "wordpiece":
    vocab = Vocab.load(ft._task_vocab(tmp_path))
  else:
    vocab = sentencepiece_vocabs[kind]
    assert vocab.special_ids == (0, 1, 2, 3, 4)
  config = _tiny_config(vocab, modern)
  exported = str(tmp_path / "exported")
  weights.save_hf(exported, _random_params(config), config, vocab)
  tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
  names = ("pad", "unk", "cls", "sep", "mask")
  assert [getattr(tokenizer, f"{n}_token_id") for n in names] == list(vocab.special_ids)
  texts = SENTENCES + [" ".join(ft.FILLER), "Alice Smith paid 4096 red."]
  for text in texts:
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == vocab.encode(text), text
  for text_a, text_b in zip(texts, texts[1:]):
    ours = encode_pair(vocab, text_a, text_b or None, max_length=200)
    theirs = tokenizer(text_a, text_b or None)
    length = int(ours["attention_mask"].sum())
    assert theirs["input_ids"] == ours["input_ids"][:length].tolist(), (text_a, text_b)
    assert ("token_type_ids" in theirs) is not modern  # ModernBERT's forward takes none.
    if not modern:
      assert theirs["token_type_ids"] == ours["token_type_ids"][:length].tolist()
  # bert_jax reads the export's vocabulary back: the same pieces, the same ids.
  back = hf.read_vocab(exported)
  assert (back.kind, back.size, back.special_ids) == (vocab.kind, vocab.size, vocab.special_ids)
  assert [back.id_to_piece(i) for i in range(back.size)] == [
      vocab.id_to_piece(i) for i in range(vocab.size)]
  assert all(back.encode(text) == vocab.encode(text) for text in texts)
  # Known difference: a unigram text whose segmentations tie exactly (a run of one character)
  # may come out as the same pieces in another order; the text is the same.
  run = "# " + "-" * 79 + " end"
  pieces = lambda ids: "".join(vocab.id_to_piece(i) for i in ids)
  assert pieces(tokenizer(run, add_special_tokens=False)["input_ids"]) == pieces(
      vocab.encode(run))


def test_bert_export_with_a_sentencepiece_vocabulary_reads_back_by_from_hf(
    sentencepiece_vocabs, tmp_path):
  vocab = sentencepiece_vocabs["bpe"]
  config = _tiny_config(vocab, modern=False)
  params = _random_params(config)
  exported = str(tmp_path / "exported")
  assert weights.save_hf(exported, params, config, vocab) == "BertForPreTraining"
  imported = str(tmp_path / "imported")
  result = _run("convert.py", f"--from_hf={exported}", f"--output_dir={imported}")
  assert result.returncode == 0, result.stderr[-3000:]
  config_back, params_back, vocab_back = weights.load_pretrained(imported)
  assert config_back == config and vocab_back.kind == "sentencepiece"
  assert [vocab_back.id_to_piece(i) for i in range(vocab.size)] == [
      vocab.id_to_piece(i) for i in range(vocab.size)]
  flat = params_lib.flatten(params_back)
  assert all(np.array_equal(v, flat[k]) for k, v in params_lib.flatten(params).items())


# ----------------------------------------------------------- prediction and fine-tuning


@pytest.fixture(scope="module")
def modern_hf_dir(tmp_path_factory):
  """A tiny modern encoder (3 layers: global, local, local; window 8) with the fine-tuning
  tests' WordPiece vocabulary, exported as a HF ModernBERT directory."""
  directory = tmp_path_factory.mktemp("modern")
  vocab = Vocab.load(ft._task_vocab(directory))
  config = dataclasses.replace(_tiny_config(vocab, modern=True), hidden_size=32,
                               num_hidden_layers=3, num_attention_heads=4,
                               intermediate_size=48, local_attention=8,
                               global_attn_every_n_layers=3)
  exported = str(directory / "hf")
  weights.save_hf(exported, _random_params(config), config, vocab)
  return exported


def test_fill_mask_launcher_from_a_modern_encoder(modern_hf_dir):
  result = _run("predict.py", "--mode=fill_mask", f"--checkpoint={modern_hf_dir}",
                "--text=we saw [MASK] there today and then [MASK] went home", "--top_k=2")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert [line for line in lines if line.startswith("[MASK]")] == ["[MASK] 1:", "[MASK] 2:"]
  assert len(lines) == 6 and not any("[" in line for line in lines[1:3] + lines[4:])


_TASKS = {  # name -> (config, records, pooling, config.data overrides, HF's class)
    "classification-cls": (finetune_classification, ft._keyword_rows, "cls", {},
                           "ModernBertForSequenceClassification"),
    "classification-mean": (finetune_classification, ft._keyword_rows, "mean", {},
                            "ModernBertForSequenceClassification"),
    "regression": (finetune_classification, heads_test.BERT_TASKS["regression"][1], "mean",
                   {"regression": True}, "ModernBertForSequenceClassification"),
    "tagging": (finetune_tagging, ft._tagging_rows, "cls", {}, "ModernBertForTokenClassification"),
    "qa": (finetune_qa, lambda n, rng: ft._qa_rows(n, rng, max_filler=14), "cls", {},
           "ModernBertForQuestionAnswering"),
}


@pytest.mark.parametrize("name", list(_TASKS))
def test_each_task_fine_tunes_predicts_and_exports_from_a_modern_encoder(modern_hf_dir,
                                                                         tmp_path, name):
  """Fine-tuning with ModernBERT's heads, prediction, and the export as HF's ModernBertFor*
  task model: AutoModelFor... loads it with logits equal to bert_jax's and the label names."""
  module, rows, pooling, data, architecture = _TASKS[name]
  config = ft.finetune_config(module, tmp_path, rows, 2, init_from=modern_hf_dir,
                              model={"classifier_pooling": pooling, "remat": "none",
                                     "hidden_dropout_prob": 0.0,
                                     "attention_probs_dropout_prob": 0.0},
                              seq_len=32, n_train=16, n_validation=8)
  config.data.update(data)
  config.train.update(batch_size=8, eval_batch_size=8, eval_every_steps=2, log_every_steps=2)
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  assert result["final"] and all(np.isfinite(v) for v in result["final"].values()
                                 if isinstance(v, float))
  finetuned = predict.load_finetuned(str(tmp_path / "run"))
  assert finetuned.meta["init_from"] == modern_hf_dir
  assert finetuned.task.model_config.classifier_pooling == pooling
  assert finetuned.task.model_config.local_attention == 8
  assert finetuned.task.settings.head == "modernbert"
  assert finetuned.task.settings.head_dropout_prob == 0.0  # HF's classifier_dropout.
  records = [{k: v for k, v in record.items() if k in ("text", "text_b")}
             for record in rows(6, random.Random(5))]
  (prediction, *_) = predict.predict(finetuned, records, batch_size=8)
  assert set(prediction) & {"label", "tags", "answer", "score"}, prediction
  exported = str(tmp_path / "hf")
  assert hf_export.export(str(tmp_path / "run"), exported) == architecture
  error = heads_test.check_export(str(tmp_path / "run"), exported, records)
  print(f"\n{name}: max abs logit error of the export {error:.1e}")
  assert error <= heads_test.TOLERANCE


# ------------------------------------------------- HF's initialisation and fine-tuning heads

# HF parameter name -> the bert_jax path of the same kind of weight, for the init statistics.
_INIT_KINDS = {
    "model.embeddings.tok_embeddings.weight": ("bert", "embeddings", "word_embeddings",
                                               "embedding"),
    "model.layers.1.attn.Wqkv.weight": ("bert", "encoder", "layers", "attention", "query",
                                        "kernel"),
    "model.layers.1.attn.Wo.weight": ("bert", "encoder", "layers", "attention", "output",
                                      "kernel"),
    "model.layers.1.mlp.Wi.weight": ("bert", "encoder", "layers", "mlp", "wi_0", "kernel"),
    "model.layers.1.mlp.Wo.weight": ("bert", "encoder", "layers", "mlp", "wo", "kernel"),
    "head.dense.weight": ("mlm", "transform", "kernel"),
    "decoder.bias": ("mlm", "bias"),
}
_TASK_KINDS = {"head.dense.weight": ("head", "dense", "kernel"),
               "classifier.weight": ("classifier", "kernel"),
               "classifier.bias": ("classifier", "bias")}


def _stats(array) -> tuple[float, float]:
  array = np.asarray(array, np.float64)
  return float(array.std()), float(np.abs(array).max())


def test_init_matches_hf_modernbert_per_parameter_kind():
  """The σ and the cut of every weight kind of HF's ModernBertForMaskedLM and
  ModernBertForSequenceClassification built from a config (4 layers, width 256: 0.02 in,
  0.00707 = 0.02 / sqrt(8) out, 0.0625 = 256^-0.5 for the classifier, cut at 2 σ) against
  bert_jax's init of the same model; exact BERT keeps 0.02 everywhere."""
  sizes = dict(HF_SIZES, vocab_size=2048, hidden_size=256, intermediate_size=384,
               num_hidden_layers=4, layer_types=None, global_attn_every_n_layers=3,
               num_labels=64)
  hf_config = transformers.ModernBertConfig(**sizes)
  torch.manual_seed(0)
  theirs = dict(transformers.ModernBertForMaskedLM(hf_config).named_parameters())
  theirs_task = dict(transformers.ModernBertForSequenceClassification(
      hf_config).named_parameters())
  config = hf_modernbert.config_from_hf(hf_config.to_dict())
  assert config.init_scheme == "modernbert" and config.initializer == "auto"
  ids = np.zeros((1, 8), np.int32)
  ours = _init_params(BertForPreTraining(config), ids, ids, ids, ids)
  task = classification.ClassificationTask(config, classification.ClassificationSettings(
      labels=tuple(map(str, range(64))), max_seq_length=8, head_dropout_prob=0.0,
      freeze_encoder=False, regression=False, head="modernbert"))
  ours_task = _init_params(task.model, *task.example_inputs())
  rows = [(name, theirs[name], ours[path]) for name, path in _INIT_KINDS.items()]
  rows += [(name, theirs_task[name], ours_task[path]) for name, path in _TASK_KINDS.items()]
  for name, their, our in rows:
    (their_std, their_max), (our_std, our_max) = _stats(their.detach()), _stats(our)
    print(f"{name:40s} HF std {their_std:.5f} max {their_max:.5f}   "
          f"bert_jax std {our_std:.5f} max {our_max:.5f}")
    if their_std == 0.0:  # Biases: zeros in both.
      assert our_std == 0.0 and our_max == 0.0, name
      continue
    tolerance = 0.05 if "classifier" in name else 0.02  # 16k samples vs >= 65k.
    assert abs(our_std / their_std - 1.0) < tolerance, name
    assert our_max <= their_max * 1.001 and our_max > 0.95 * their_max, name  # The 2 σ cut.
  bert = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4)
  assert {kind: model_lib.init_std(bert, kind) for kind in model_lib.INIT_STDS["bert"]} == \
      dict.fromkeys(model_lib.INIT_STDS["bert"], 0.02)
  assert model_lib.init_std(config, "out") == pytest.approx(0.02 / 8 ** 0.5)
  assert model_lib.init_std(config, "classifier") == pytest.approx(0.0625)



def _init_params(module: nn.Module, *inputs) -> dict:
  """Flat float64 params of a fresh init (key 0), compiled (op by op it takes minutes)."""
  params = nn.meta.unbox(jax.jit(module.init)(jax.random.key(0), *inputs)["params"])
  return params_lib.flatten(jax.tree.map(lambda x: np.asarray(x, np.float64), params))


def _hf_classifier(pooling: str, num_labels: int = 3, seed: int = 0):
  """A ModernBertForSequenceClassification built from a config: HF's init, matrices x2 and norms
  perturbed (attention far from uniform, every norm compared), dropout 0 everywhere."""
  config = transformers.ModernBertConfig(**HF_SIZES, num_labels=num_labels,
                                         classifier_pooling=pooling, attn_implementation="sdpa")
  torch.manual_seed(seed)
  model = transformers.ModernBertForSequenceClassification(config)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if param.ndim == 2 and "embeddings" not in name:
        param.mul_(2.0)
      elif param.ndim == 1:
        param.add_(0.2 * torch.randn_like(param))
  return model


def _from_hf_task_model(model) -> tuple[BertConfig, dict, params_lib.TaskHead]:
  """(config, params with the task head, the head) of a HF ModernBERT task model, as
  `weights.load_with_head` reads its directory."""
  hf_config = {**model.config.to_dict(), "architectures": [type(model).__name__]}
  config = hf_modernbert.config_from_hf(hf_config)
  encoder, head = hf_heads.split_state(model.state_dict(), hf_config, "modernbert", "test")
  return config, {**hf_modernbert.params_from_hf(encoder, config), **head.params}, head


def _grads_as_hf(grads: dict, config: BertConfig) -> dict[str, np.ndarray]:
  """A gradient tree of the classification model under HF's parameter names."""
  zeros = {path: np.zeros(shape, np.float32) for path, shape in param_shapes(config).items()}
  encoder = params_lib.fill_missing_heads({"bert": grads["bert"]}, params_lib.unflatten(zeros))
  state = {k: v for k, v in hf_modernbert.params_to_hf(encoder, config).items()
           if k.startswith("model.")}
  return {**state, **hf_heads.state_from_params(
      {k: v for k, v in grads.items() if k != "bert"})}


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_first_fine_tuning_step_equals_hf_modernbert_for_sequence_classification(pooling):
  """bert_jax's train step (SGD at lr 1: the update is the gradient) against
  ModernBertForSequenceClassification's loss.backward() from the same weights, dropout 0, on
  a padded batch (mean pooling over the attention mask): the same loss to 1e-5, and the same
  gradient of every parameter to 1e-5 (relative where that parameter's largest gradient is
  above 1: float32 sums over 240 tokens)."""
  model = _hf_classifier(pooling)
  config, params, _ = _from_hf_task_model(model)
  assert config.classifier_pooling == pooling
  task = classification.ClassificationTask(config, classification.ClassificationSettings(
      labels=("a", "b", "c"), max_seq_length=40, head_dropout_prob=0.0, freeze_encoder=False,
      regression=False, head="modernbert"))
  ids, mask = _padded_batch(config.vocab_size)
  ids, mask = np.concatenate([ids, ids[::-1]]), np.concatenate([mask, mask[::-1]])  # [6, 40]
  labels = np.array([0, 1, 2, 2, 0, 1])
  batch = {"input_ids": ids.astype(np.int32), "token_type_ids": np.zeros_like(ids, np.int32),
           "attention_mask": mask.astype(np.int32), "labels": labels.astype(np.int32)}
  optimizer = optax.sgd(1.0)
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=optimizer.init(params))
  step = jax.jit(functools.partial(steps.train_step, task=task, optimizer=optimizer,
                                   schedule=lambda _: 1.0))
  new_state, metrics = step(state, batch, jax.random.key(0))
  grads = _grads_as_hf(jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params,
                                    jax.device_get(new_state.params)), config)

  model.train()
  output = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                 labels=torch.tensor(labels))
  output.loss.backward()
  theirs = {name: p.grad.numpy() for name, p in model.named_parameters()}
  assert float(metrics["loss"]) == pytest.approx(float(output.loss.detach()), abs=1e-5)
  assert set(grads) == set(theirs)
  errors = {name: float(np.abs(grads[name] - theirs[name]).max()
                        / max(1.0, np.abs(theirs[name]).max())) for name in theirs}
  worst = max(errors, key=errors.get)
  print(f"\n{pooling}: loss {float(output.loss.detach()):.6f}, worst gradient error "
        f"{errors[worst]:.1e} ({worst}; gradients up to {max(np.abs(g).max() for g in theirs.values()):.2f})")
  assert errors[worst] <= 1e-5


def test_classifier_pooling_follows_the_checkpoint_unless_the_config_sets_it(modern_hf_dir,
                                                                            tmp_path):
  """A ModernBERT fine-tune's classifier_pooling "mean" stays "mean" under the fine-tuning
  config's default ("auto": the checkpoint's); "cls" set explicitly wins; from scratch "auto"
  is "cls"."""
  mean_dir = str(tmp_path / "mean")
  shutil.copytree(modern_hf_dir, mean_dir)
  with open(os.path.join(mean_dir, "config.json")) as f:
    hf_config = json.load(f)
  with open(os.path.join(mean_dir, "config.json"), "w") as f:
    json.dump({**hf_config, "classifier_pooling": "mean"}, f)
  config = finetune_classification.get_config()
  assert config.model.classifier_pooling == finetune.POOLING_OF_CHECKPOINT == "auto"
  config.init_from = mean_dir
  assert finetune.load_encoder(config).config.classifier_pooling == "mean"
  config.model.classifier_pooling = "cls"
  assert finetune.load_encoder(config).config.classifier_pooling == "cls"
  config.init_from, config.model.classifier_pooling = modern_hf_dir, "mean"
  assert finetune.load_encoder(config).config.classifier_pooling == "mean"
  scratch = finetune_classification.get_config()
  scratch.vocab = os.path.join(modern_hf_dir, "vocab.txt")
  assert finetune.load_encoder(scratch).config.classifier_pooling == "cls"
