"""Prepares a corpus into a bert_jax dataset directory (TFDS ArrayRecord + vocab + bert_meta.json).

Run (one of --input, --tfds_name, --builtin):
  python launch/prepare_data.py --input='corpus/*.txt' --output_dir=data/wiki --vocab_size=30522
  python launch/prepare_data.py --input=books.txt --input_format=paragraphs \
      --output_dir=data/books --vocab=uncased_L-12_H-768_A-12/vocab.txt
  python launch/prepare_data.py --tfds_name=wikipedia/20230601.en --output_dir=data/wiki
  python launch/prepare_data.py --input='dump/*.jsonl.gz' --text_field=text --output_dir=data/web
  python launch/prepare_data.py --input=fineweb/part-0.parquet --output_dir=data/fineweb
  python launch/prepare_data.py --builtin --output_dir=data/builtin --vocab_size=8192
  python launch/prepare_data.py --input=books.txt --output_dir=data/books_mlm --objective=mlm
  python launch/prepare_data.py --input=books.txt --output_dir=gs://bucket/data/books
  python launch/prepare_data.py --input='corpus/*.txt' --output_dir=data/wiki \
      --vocab=data/vocab --beam_runner=DirectRunner --beam_options='--direct_num_workers=4 \
      --direct_running_mode=multi_processing'

Then train with --config.data.source=prepared --config.data.dataset_dir=<output_dir> (and the
same --config.data.objective and, for mlm_nsp, --config.data.max_examples_per_row). --builtin
prepares the dataset that training on --config.data.source=builtin prepares for the same
settings (bert_jax.data.builtin: same corpus, vocabulary, rows and fingerprint).

A gs:// --output_dir is prepared in a local temporary directory ($TMPDIR: it needs room for the
dataset) and uploaded when complete; with --beam_runner (Apache Beam, requirements-beam.txt:
the same records on DirectRunner, Dataflow, Flink or Spark) the workers write it directly. Training reads it through a gcsfuse mount of the bucket
(ArrayRecord reads local files only): --config.data.dataset_dir=/mnt/bucket/data/books.
"""

import shlex

from absl import flags

from bert_jax.runtime import cli
from bert_jax.data import blocks
from bert_jax.data import inputs
from bert_jax.data import packing
from bert_jax.data import sources
from configs import base

_DEFAULTS = base.get_config()

_INPUT = flags.DEFINE_list(
    "input", [], "Corpus files or globs (comma-separated), or HuggingFace datasets directories "
    "(save_to_disk).")
_INPUT_FORMAT = flags.DEFINE_enum(
    "input_format", "auto", list(inputs.FORMATS),
    "auto: by each file's name (.jsonl/.ndjson/.json, also .gz or .zst: jsonl; .parquet/.pq: "
    "parquet; .arrow and datasets directories: arrow; anything else: bert). bert: one sentence "
    "per line, blank line between documents; paragraphs: plain text, blank-line-separated "
    "documents split into sentences here; jsonl, parquet, arrow: a document per record, from "
    "--text_field, split into sentences here.")
_TEXT_FIELD = flags.DEFINE_string("text_field", "text",
                                  "The text field (column) of JSONL, Parquet and Arrow input.")
_TFDS_NAME = flags.DEFINE_string("tfds_name", "", "TFDS text dataset instead of --input.")
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "train", "Split of --tfds_name.")
_TFDS_FIELD = flags.DEFINE_string("tfds_field", "text", "Text field of --tfds_name.")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir of --tfds_name.")
_BUILTIN = flags.DEFINE_bool(
    "builtin", False, "Use the built-in docstring corpus: the dataset training prepares for the "
    "same settings (its vocabulary trained on it: --vocab_size, --vocab_model_type).")
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
    "objective", _DEFAULTS.data.objective, list(packing.OBJECTIVES),
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
_SEED = flags.DEFINE_integer(
    "seed", _DEFAULTS.seed, "Seed of the corpus-wide document shuffle and of example "
    "construction (not of the validation split: that depends on each document's text).")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", -1, "Worker processes (-1: one per core, 0: in this process).")
_BEAM_RUNNER = flags.DEFINE_enum(
    "beam_runner", "", ["", "DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner"],
    "Build the rows with this Apache Beam runner (--input files; pip install -r "
    "requirements-beam.txt): the same records as without it. Empty: worker processes here.")
_BEAM_OPTIONS = flags.DEFINE_string(
    "beam_options", "", "Beam pipeline options, space-separated, passed through (e.g. "
    "'--direct_num_workers=4 --direct_running_mode=multi_processing', or Dataflow's "
    "'--project=P --region=R --temp_location=gs://B/tmp').")


def main() -> None:
  meta = sources.prepare_corpus(
      _OUTPUT_DIR.value,
      sources.CorpusSource(
          input=_INPUT.value, input_format=_INPUT_FORMAT.value, text_field=_TEXT_FIELD.value,
          tfds_name=_TFDS_NAME.value,
          tfds_split=_TFDS_SPLIT.value, tfds_field=_TFDS_FIELD.value,
          tfds_data_dir=_TFDS_DATA_DIR.value, builtin=_BUILTIN.value,
          builtin_max_mb=_BUILTIN_MAX_MB.value),
      sources.VocabSource(path=_VOCAB.value, size=_VOCAB_SIZE.value,
                          model_type=_VOCAB_MODEL_TYPE.value,
                          allow_smaller=_ALLOW_SMALLER_VOCAB.value),
      blocks.ExampleSettings(
          max_seq_length=_MAX_SEQ_LENGTH.value, short_seq_prob=_SHORT_SEQ_PROB.value,
          dupe_factor=_DUPE_FACTOR.value, validation_fraction=_VALIDATION_FRACTION.value,
          seed=_SEED.value, objective=_OBJECTIVE.value,
          max_examples_per_row=_MAX_EXAMPLES_PER_ROW.value),
      num_workers=None if _NUM_WORKERS.value < 0 else _NUM_WORKERS.value,
      beam_runner=_BEAM_RUNNER.value, beam_options=shlex.split(_BEAM_OPTIONS.value))
  print(sources.describe(_OUTPUT_DIR.value, meta))


if __name__ == "__main__":
  cli.run(main, after_interrupt="nothing of the dataset is kept; run the command again")
