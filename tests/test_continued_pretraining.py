"""Continued pretraining of a released model on a domain corpus (#56): a HuggingFace ModernBERT
directory with its byte-level BPE tokenizer.json prepares the corpus with that tokenizer
(`prepare_data --vocab=<hf dir>`), and `--config.init_from=<hf dir>` continues MLM with its own
head. No weights are downloaded: the "released" model is built from a config here (random
weights), saved by transformers as a release is."""

import dataclasses
import os
import pickle

import pytest

from bert_jax.data import vocab as vocab_lib
from tests import test_record_inputs as records

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def _bpe_tokenizer(texts):
  """A byte-level BPE tokenizer.json as ModernBERT's: no prefix space, BERT's special tokens
  added after the merges' vocabulary, a [CLS] A [SEP] post-processor."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizers.Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tokenizer.add_special_tokens(SPECIALS)
  tokenizer.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", special_tokens=[
          ("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))])
  return tokenizer


@pytest.fixture(scope="module")
def released(tmp_path_factory):
  """(HF ModernBERT directory with tokenizer.json, general texts, domain texts)."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("released")
  general, domain = records._texts(150, seed=11), records._texts(150, seed=12)  # pylint: disable=protected-access
  tokenizer = _bpe_tokenizer(general + domain)
  directory = str(root / "modernbert")
  os.makedirs(directory)
  tokenizer.save(os.path.join(directory, "tokenizer.json"))
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(
      vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=48,
      num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
      local_attention=8, global_attn_every_n_layers=2,
      pad_token_id=tokenizer.token_to_id("[PAD]"), cls_token_id=tokenizer.token_to_id("[CLS]"),
      sep_token_id=tokenizer.token_to_id("[SEP]"), bos_token_id=tokenizer.token_to_id("[CLS]"),
      eos_token_id=tokenizer.token_to_id("[SEP]"))
  transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
  return directory, general, domain, tokenizer.get_vocab_size()


def test_a_bpe_tokenizer_json_encodes_as_transformers_does(released, tmp_path):
  import transformers  # pylint: disable=import-outside-toplevel
  directory, general, _, size = released
  vocab = vocab_lib.Vocab.load(directory)
  assert vocab.kind == "bpe" and vocab.size == size
  theirs = transformers.PreTrainedTokenizerFast(
      tokenizer_file=os.path.join(directory, "tokenizer.json"))
  text = general[0] + " Ünïcödé, [MASK] and  spaces."
  ids = vocab.encode(text)
  assert ids == theirs(text, add_special_tokens=False)["input_ids"]
  assert vocab.mask_id in ids and vocab.mask_id not in vocab.encode(text, True)
  assert vocab.decode(ids) == theirs.decode(ids)
  # A word starts at its "Ġ" piece (the text's first word: at its first piece).
  starts = vocab.word_starts(ids)
  pieces = [vocab.id_to_piece(i) for i in ids]
  assert starts[0] == 1 and all(s == (p.startswith("\u0120") or i == 0)
                                for i, (s, p) in enumerate(zip(starts, pieces))
                                if ids[i] != vocab.mask_id)
  vocab.save(str(tmp_path / "saved"))
  for copy in (vocab_lib.Vocab.load(str(tmp_path / "saved")), pickle.loads(pickle.dumps(vocab))):
    assert copy.kind == "bpe" and copy.encode(text) == ids and copy.special_ids == vocab.special_ids


def test_continued_pretraining_raises_held_out_mlm_on_the_domain(released, tmp_path, one_device):
  """prepare_data with the model's own tokenizer, then MLM from its weights and heads: held-out
  MLM accuracy on the domain rises from the model's own (an lr-0 first step leaves the weights
  as loaded: its evaluation is the zero-step value)."""
  from bert_jax import train  # pylint: disable=import-outside-toplevel
  from bert_jax.data import sources  # pylint: disable=import-outside-toplevel
  from configs import modern_tiny  # pylint: disable=import-outside-toplevel
  from tests.modern_runs import set_fields  # pylint: disable=import-outside-toplevel
  directory, _, domain, size = released
  dataset = str(tmp_path / "domain")
  meta = sources.prepare_corpus(
      dataset, sources.CorpusSource(input=[records.write_jsonl(str(tmp_path / "d.jsonl"),
                                                               domain * 2)]),
      sources.VocabSource(path=directory),
      dataclasses.replace(records.SETTINGS, max_seq_length=64, dupe_factor=2, objective="mlm"),
      num_workers=0)
  assert meta["vocab_kind"] == "bpe" and meta["vocab_size"] == size

  def run(steps: int, name: str) -> dict:
    config = set_fields(modern_tiny.get_config(), {
        "model.vocab_size": size, "model.hidden_size": 32, "model.intermediate_size": 48,
        "model.num_hidden_layers": 2, "model.num_attention_heads": 2,
        "model.max_position_embeddings": 64, "model.local_attention": 8,
        "model.global_attn_every_n_layers": 2,
        "data.source": "prepared", "data.objective": "mlm", "data.max_seq_length": 64,
        "data.span_warmup_steps": 0, "masking.max_predictions_per_seq": 20,
        "train.batch_size": 8, "train.eval_batch_size": 16, "train.num_train_steps": steps,
        "train.warmup_steps": 1, "train.learning_rate": 3e-3, "train.log_every_steps": steps,
        "train.eval_every_steps": steps, "checkpoint.save_every_steps": 1000,
        "checkpoint.async_save": False, "logging.tensorboard": False})
    config.data.dataset_dir = dataset
    config.init_from = directory
    return train.train_and_evaluate(config, str(tmp_path / name))["validation"]

  import warnings  # pylint: disable=import-outside-toplevel
  with warnings.catch_warnings():  # An MLM run reads neither pooler nor NSP head: no warning.
    warnings.simplefilter("error", UserWarning)
    before, after = run(1, "zero"), run(40, "continued")
  assert after["mlm_accuracy"] > before["mlm_accuracy"] + 0.05, (before, after)
