"""Embedding models and sentence-transformers, both ways: an exported run loads in
`SentenceTransformer` (no remote code) and encodes as `launch/predict.py --mode=embed` does, for
a BERT and a ModernBERT encoder; a sentence-transformers directory is an encoder to start from,
its Pooling and Normalize followed, its other modules refused by name."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from bert_jax import finetune, predict
from bert_jax.weights import hf_export
from tests.suite_flags import xla_flags
from tests.test_embedding import _pairs_config
from tests import forked_launch

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
  warnings.simplefilter("ignore")
  import sentence_transformers as st
  # Its modules (sentence_transformers.models is a deprecated alias that exists only once
  # something has imported it: tests run alone failed on it).
  from sentence_transformers.sentence_transformer import modules as st_modules
  import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["q3 the", "a d7 of and to", "q11 q2 and to in of the a d1", "d0"]
MODERN = {"position_embedding": "rotary", "mlp": "glu", "norm_placement": "pre",
          "attention_bias": False, "mlp_bias": False, "norm_bias": False,
          "classifier_bias": False, "type_vocab_size": 0, "layer_norm_eps": 1e-5,
          "local_attention": 4, "global_attn_every_n_layers": 2, "initializer": "modernbert"}


def _env():
  return {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}


def _trained(tmp_path, **model) -> str:
  config = _pairs_config(tmp_path, 4, **{f"model.{k}": v for k, v in model.items()})
  workdir = str(tmp_path / "run")
  finetune.finetune_and_evaluate(config, workdir)
  return workdir


def _load(directory):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    return st.SentenceTransformer(directory, device="cpu")


def test_a_bert_export_encodes_as_the_predict_launcher(tmp_path):
  workdir = _trained(tmp_path)
  out = tmp_path / "st"
  done = forked_launch.run([sys.executable, "launch/convert.py", f"--from_bert_jax={workdir}",
                         f"--to_sentence_transformers={out}"], cwd=ROOT, env=_env(),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "Wrote a sentence-transformers model (BertModel encoder, mean pooling, normalised)" in (
      done.stdout)
  modules = json.loads((out / "modules.json").read_text())
  assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
  inputs = tmp_path / "texts.jsonl"
  inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
  done = forked_launch.run([sys.executable, "launch/predict.py", "--mode=embed",
                         f"--checkpoint={workdir}", f"--input_file={inputs}"], cwd=ROOT,
                        env=_env(), capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  ours = np.array([json.loads(line)["embedding"] for line in done.stdout.splitlines()])
  assert ours.shape == (len(TEXTS), 32)  # One line per record, in input order.
  theirs = _load(str(out)).encode(TEXTS)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
  # A classifier's export path refuses an embedding run, naming the right flag.
  with pytest.raises(ValueError, match="has no HuggingFace task model"):
    hf_export.export(workdir, str(tmp_path / "hf"))


def test_a_modernbert_export_with_cls_pooling_encodes_as_predict(tmp_path):
  config = _pairs_config(tmp_path, 4, **{f"model.{k}": v for k, v in MODERN.items()},
                         **{"embedding.pooling": "cls", "embedding.normalize": False})
  workdir = str(tmp_path / "run")
  finetune.finetune_and_evaluate(config, workdir)
  written = hf_export.export_sentence_transformers(workdir, str(tmp_path / "st"))
  assert written == "a sentence-transformers model (ModernBertModel encoder, cls pooling)"
  assert not (tmp_path / "st" / "2_Normalize").exists()
  ours = np.array([p["embedding"] for p in predict.predict(workdir, [{"text": t} for t in TEXTS])])
  np.testing.assert_allclose(ours, _load(str(tmp_path / "st")).encode(TEXTS), atol=1e-5)


def _st_model(tmp_path, *modules, do_lower_case: bool = False) -> str:
  """A sentence-transformers directory built here from a BertConfig (random weights), its
  tokenizer cased."""
  vocab = [line for line in (tmp_path / "vocab.txt").read_text().splitlines()]
  encoder_dir = tmp_path / "hf_encoder"
  transformers.BertModel(transformers.BertConfig(
      vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=16)).save_pretrained(encoder_dir)
  transformers.BertTokenizerFast(str(tmp_path / "vocab.txt"), do_lower_case=False).save_pretrained(
      encoder_dir)
  model = st.SentenceTransformer(modules=[st_modules.Transformer(str(encoder_dir)), *modules],
                                 device="cpu")
  model.save(str(tmp_path / "st_source"))
  # do_lower_case as models on the Hub carry it, their tokenizer as it was (sentence-transformers
  # 6.3 would instead save a Lowercase step into tokenizer.json; it reads both).
  if do_lower_case:
    (tmp_path / "st_source" / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 16, "do_lower_case": True}))
  return str(tmp_path / "st_source")


def test_a_sentence_transformers_directory_is_an_encoder_to_start_from(tmp_path):
  config = _pairs_config(tmp_path, 2)
  source = _st_model(tmp_path, st_modules.Pooling(32, pooling_mode="max"))
  config.init_from, config.vocab = source, ""
  # Zero-shot, read as bert_jax reads it: the vectors sentence-transformers computes.
  theirs = _load(source).encode(TEXTS)
  ours = predict.embed(predict.load_embedding_model(source), TEXTS)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  result = finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
  saved = predict.load_finetuned(str(tmp_path / "run")).task.settings
  assert (saved.pooling, saved.normalize) == ("max", False)  # Its modules', not the config's.
  assert result["final"]["step"] == 2
  # Values given win over the directory's (the red team: an explicit normalize was overridden).
  from bert_jax import weights  # pylint: disable=import-outside-toplevel
  from bert_jax.tasks.embedding import EmbeddingSettings  # pylint: disable=import-outside-toplevel
  model_config = weights.load_pretrained(source, uses=())[0]
  for pooling, normalize, expected in (("auto", True, ("max", True)), ("cls", None, ("cls", False)),
                                       ("mean", False, ("mean", False))):
    explicit = config.copy_and_resolve_references()
    explicit.embedding.pooling, explicit.embedding.normalize = pooling, normalize
    settings = EmbeddingSettings.from_config(explicit, [], model_config)
    assert (settings.pooling, settings.normalize) == expected


def test_do_lower_case_is_followed_on_reading_fine_tuning_and_export(tmp_path):
  """The red team: a directory's do_lower_case was ignored, so "Q3 THE" and "q3 the" got other
  vectors in bert_jax and one in sentence-transformers. Its vocabulary is lowercase and its
  tokenizer cased: without the lowercasing, upper-case words are [UNK]."""
  config = _pairs_config(tmp_path, 2)
  source = _st_model(tmp_path, st_modules.Pooling(32, pooling_mode="mean"), do_lower_case=True)
  upper = [t.upper() for t in TEXTS]
  theirs = _load(source).encode(upper)
  np.testing.assert_allclose(theirs, _load(source).encode(TEXTS), atol=1e-6)
  model = predict.load_embedding_model(source)
  cased = model.vocab.with_lower_text(False)  # Without it, other inputs.
  assert cased.encode(upper[0]) == [cased.unk_id] * 2 != model.vocab.encode(upper[0])
  np.testing.assert_allclose(predict.embed(model, upper), theirs, atol=1e-5)

  config.init_from, config.vocab = source, ""  # Fine-tuned, the workdir's vocabulary keeps it.
  workdir = str(tmp_path / "run")
  finetune.finetune_and_evaluate(config, workdir)
  run = predict.load_finetuned(workdir)
  assert run.vocab.lower_text
  ours = predict.embed(run, upper)
  np.testing.assert_allclose(ours, predict.embed(run, TEXTS), atol=1e-6)
  hf_export.export_sentence_transformers(workdir, str(tmp_path / "st"))  # And its export.
  written = json.loads((tmp_path / "st" / "sentence_bert_config.json").read_text())
  assert written["do_lower_case"] is True
  np.testing.assert_allclose(_load(str(tmp_path / "st")).encode(upper), ours, atol=1e-5)


def test_modules_bert_jax_cannot_compute_are_refused_by_name(tmp_path):
  config = _pairs_config(tmp_path, 2)
  source = _st_model(tmp_path, st_modules.Pooling(32, pooling_mode="mean"),
                     st_modules.Dense(32, 8))
  config.init_from, config.vocab = source, ""
  with pytest.raises(ValueError, match=r"its modules are \['Transformer', 'Pooling', 'Dense'\]; "
                                       r"bert_jax computes .* \(not \['Dense'\]\)"):
    finetune.finetune_and_evaluate(config, str(tmp_path / "run"))
