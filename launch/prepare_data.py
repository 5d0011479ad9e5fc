"""Prepares a corpus into a bert_jax dataset directory (TFDS ArrayRecord + vocab + bert_meta.json).

Run (one of --input, --tfds_name, --builtin):
  python launch/prepare_data.py --input='corpus/*.txt' --output_dir=data/wiki --vocab_size=30522
  python launch/prepare_data.py --input=books.txt --input_format=paragraphs \
      --output_dir=data/books --vocab=uncased_L-12_H-768_A-12/vocab.txt
  python launch/prepare_data.py --tfds_name=wikipedia/20230601.en --output_dir=data/wiki
  python launch/prepare_data.py --builtin --output_dir=data/builtin --vocab_size=8192
  python launch/prepare_data.py --input=books.txt --output_dir=data/books_mlm --objective=mlm
  python launch/prepare_data.py --input=books.txt --output_dir=gs://bucket/data/books

Then train with --config.data.source=prepared --config.data.dataset_dir=<output_dir> (and the
same --config.data.objective and, for mlm_nsp, --config.data.max_examples_per_row).

A gs:// --output_dir is prepared in a local temporary directory ($TMPDIR: it needs room for the
dataset) and uploaded when complete. Training reads it through a gcsfuse mount of the bucket
(ArrayRecord reads local files only): --config.data.dataset_dir=/mnt/bucket/data/books.
"""

import hashlib
import os
import sys
import tempfile

from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import cli  # noqa: E402
from bert_jax.data import corpus  # noqa: E402
from bert_jax.data import examples  # noqa: E402
from bert_jax.data import prepare  # noqa: E402
from bert_jax.data import vocab as vocab_lib  # noqa: E402
from configs import base  # noqa: E402

_DEFAULTS = base.get_config()

_INPUT = flags.DEFINE_list("input", [], "Corpus files or globs (comma-separated).")
_INPUT_FORMAT = flags.DEFINE_enum(
    "input_format", "bert", ["bert", "paragraphs"],
    "bert: one sentence per line, blank line between documents; paragraphs: plain text, "
    "blank-line-separated documents split into sentences here.")
_TFDS_NAME = flags.DEFINE_string("tfds_name", "", "TFDS text dataset instead of --input.")
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "train", "Split of --tfds_name.")
_TFDS_FIELD = flags.DEFINE_string("tfds_field", "text", "Text field of --tfds_name.")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir of --tfds_name.")
_BUILTIN = flags.DEFINE_bool("builtin", False, "Use the built-in docstring corpus.")
_BUILTIN_MAX_MB = flags.DEFINE_float("builtin_max_mb", _DEFAULTS.data.builtin_max_mb,
                                     "Cap on built-in corpus text in MB (0 = all).")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "New (or empty) dataset directory, local or gs://... (prepared locally, "
    "then uploaded).")
_VOCAB = flags.DEFINE_string(
    "vocab", "", "Existing vocabulary (sentencepiece .model, WordPiece vocab.txt, "
    "tokenizer.json or a saved vocab dir) instead of training one.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", _DEFAULTS.model.vocab_size,
                                   "Size of the sentencepiece vocabulary to train.")
_VOCAB_MODEL_TYPE = flags.DEFINE_enum("vocab_model_type", _DEFAULTS.data.vocab_model_type,
                                      ["unigram", "bpe"], "sentencepiece model type.")
_ALLOW_SMALLER_VOCAB = flags.DEFINE_bool(
    "allow_smaller_vocab", False,
    "If the corpus cannot support --vocab_size, train the largest vocabulary it supports.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", _DEFAULTS.data.max_seq_length,
                                       "Tokens per row, specials included.")
_OBJECTIVE = flags.DEFINE_enum(
    "objective", _DEFAULTS.data.objective, ["mlm_nsp", "mlm"],
    "mlm_nsp: BERT's next-sentence pairs, packed --max_examples_per_row to a row; mlm: "
    "RoBERTa's FULL-SENTENCES rows (contiguous text, [SEP] between documents, full rows), no NSP.")
_MAX_EXAMPLES_PER_ROW = flags.DEFINE_integer(
    "max_examples_per_row", _DEFAULTS.data.max_examples_per_row,
    "K: NSP examples packed per row (1: one example per row, unpacked). Ignored by "
    "--objective=mlm. Train with the same --config.data.max_examples_per_row.")
_SHORT_SEQ_PROB = flags.DEFINE_float("short_seq_prob", _DEFAULTS.data.short_seq_prob,
                                     "Probability of a shorter random target length.")
_DUPE_FACTOR = flags.DEFINE_integer("dupe_factor", _DEFAULTS.data.dupe_factor,
                                    "Passes over the corpus, each with its own seed.")
_VALIDATION_FRACTION = flags.DEFINE_float(
    "validation_fraction", _DEFAULTS.data.validation_fraction,
    "Fraction of documents held out for the validation split.")
_SEED = flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of example construction.")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", -1, "Worker processes (-1: one per core, 0: in this process).")


def _sources(work_dir: str):
  """(documents factory, stats getter, fingerprint, the flag that named it) of the selected
  corpus flag."""
  chosen = [name for name, given in (("--input", bool(_INPUT.value)),
                                     ("--tfds_name", bool(_TFDS_NAME.value)),
                                     ("--builtin", _BUILTIN.value)) if given]
  if len(chosen) != 1:
    raise ValueError("Give exactly one corpus source: --input, --tfds_name or --builtin "
                     f"(got {', '.join(chosen) or 'none'}).")
  holder = {"stats": corpus.CorpusStats()}

  def fresh_stats() -> corpus.CorpusStats:
    holder["stats"] = corpus.CorpusStats()
    return holder["stats"]

  if _TFDS_NAME.value:
    def documents():
      return corpus.iter_tfds_text(_TFDS_NAME.value, _TFDS_SPLIT.value, _TFDS_FIELD.value,
                                   data_dir=_TFDS_DATA_DIR.value, stats=fresh_stats())
    fingerprint = f"tfds:{_TFDS_NAME.value}/{_TFDS_SPLIT.value}/{_TFDS_FIELD.value}"
    return (documents, lambda: holder["stats"], fingerprint,
            f"--tfds_name={_TFDS_NAME.value} (split {_TFDS_SPLIT.value}, field "
            f"{_TFDS_FIELD.value})")

  if _BUILTIN.value:
    # Parsing every installed module is slow: spool the docstrings once, read the text twice.
    spool = os.path.join(work_dir, "builtin_corpus.txt")
    max_bytes = int(_BUILTIN_MAX_MB.value * 1e6)
    prepare.spool_documents(corpus.iter_builtin_docstrings(max_bytes, fresh_stats()), spool)
    builtin_stats = holder["stats"]
    paths = [spool]
    fingerprint = f"builtin:{corpus.builtin_corpus_fingerprint()}:{max_bytes}"
    reader = corpus.iter_bert_format
    stats_getter = lambda: builtin_stats  # noqa: E731
  else:
    paths = corpus.expand_paths(_INPUT.value)  # Fails now, naming a missing file or glob.
    reader = (corpus.iter_bert_format if _INPUT_FORMAT.value == "bert"
              else corpus.iter_paragraph_text)
    digest = hashlib.sha256()
    for path in paths:
      digest.update(f"{os.path.abspath(path)}\t{os.path.getsize(path)}\n".encode())
    fingerprint = f"files:{digest.hexdigest()[:16]}"
    stats_getter = lambda: holder["stats"]  # noqa: E731

  def documents():
    return reader(paths, fresh_stats())
  named = "--builtin" if _BUILTIN.value else f"--input={','.join(_INPUT.value)}"
  return documents, stats_getter, fingerprint, named


def _run(work_dir: str) -> None:
  if not _OUTPUT_DIR.value:
    raise ValueError("--output_dir is required.")
  prepare.check_output_dir(_OUTPUT_DIR.value)  # Before any slow work.
  examples.ExampleSettings(
      max_seq_length=_MAX_SEQ_LENGTH.value, short_seq_prob=_SHORT_SEQ_PROB.value,
      dupe_factor=_DUPE_FACTOR.value, validation_fraction=_VALIDATION_FRACTION.value,
      seed=_SEED.value, objective=_OBJECTIVE.value,
      max_examples_per_row=_MAX_EXAMPLES_PER_ROW.value).validate()
  documents, stats_getter, fingerprint, named = _sources(work_dir)
  if _VOCAB.value:
    vocab = vocab_lib.Vocab.load(_VOCAB.value)
    logging.info("Using vocabulary %s", vocab)
  else:
    logging.info("Training a %s sentencepiece vocabulary of %d", _VOCAB_MODEL_TYPE.value,
                 _VOCAB_SIZE.value)
    vocab = vocab_lib.train_sentencepiece(
        corpus.iter_sentences(documents()), os.path.join(work_dir, "sentencepiece"),
        _VOCAB_SIZE.value, _VOCAB_MODEL_TYPE.value,
        allow_smaller_vocab=_ALLOW_SMALLER_VOCAB.value, source=named)
  meta = prepare.prepare_dataset(
      _OUTPUT_DIR.value, documents, vocab, max_seq_length=_MAX_SEQ_LENGTH.value,
      short_seq_prob=_SHORT_SEQ_PROB.value, dupe_factor=_DUPE_FACTOR.value,
      validation_fraction=_VALIDATION_FRACTION.value, seed=_SEED.value,
      objective=_OBJECTIVE.value, max_examples_per_row=_MAX_EXAMPLES_PER_ROW.value,
      num_workers=None if _NUM_WORKERS.value < 0 else _NUM_WORKERS.value,
      corpus_stats=stats_getter, corpus_fingerprint=fingerprint)
  stats = meta["corpus_stats"] or {}
  if stats.get("invalid_bytes"):
    logging.warning("%d bytes of the corpus were not valid UTF-8 (replaced by U+FFFD).",
                    stats["invalid_bytes"])
  train, validation = meta["splits"]["train"], meta["splits"]["validation"]
  print(f"Prepared {_OUTPUT_DIR.value} ({meta['objective']}): {train['rows']} train rows "
        f"({train['examples']} examples, {train['fill_rate']:.1%} real tokens) / "
        f"{validation['rows']} validation rows, vocab {meta['vocab_size']} "
        f"({meta['vocab_kind']}), max_seq_length {meta['max_seq_length']}, up to "
        f"{meta['max_examples_per_row']} examples per row, {meta['prepare_seconds']:.1f} s.")


def main() -> None:
  with tempfile.TemporaryDirectory(prefix="bert_jax_prepare_") as work_dir:
    _run(work_dir)


if __name__ == "__main__":
  cli.run(main)
