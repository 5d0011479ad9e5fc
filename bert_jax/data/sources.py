"""The corpora `launch/prepare_data.py` prepares, from its flags to a prepared dataset: text files
(--input), a TFDS text dataset (--tfds_name) or the built-in docstring corpus (--builtin, by
`builtin.prepare_builtin`: the dataset training prepares for the same settings), each with its
fingerprint, and the vocabulary given (--vocab) or trained on the corpus.
"""

import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bert_jax.runtime import storage
from bert_jax.data import blocks
from bert_jax.data import builtin
from bert_jax.data import corpus
from bert_jax.data import inputs
from bert_jax.data import prepare
from bert_jax.data import vocab as vocab_lib


@dataclasses.dataclass(frozen=True)
class CorpusSource:
  """The corpus to prepare: exactly one of `input`, `tfds_name` and `builtin`."""

  input: Sequence[str] = ()  # Files, globs or HuggingFace datasets directories.
  # `inputs.FORMATS`: "auto" (by each file's name: .jsonl(.gz/.zst), .parquet, .arrow are
  # records, anything else "bert"); "bert": a sentence a line, blank line between documents;
  # "paragraphs": plain text, blank-line-separated documents split into sentences; "jsonl",
  # "parquet", "arrow": records, a document each from `text_field`.
  input_format: str = "auto"
  text_field: str = "text"  # The text field of record inputs.
  tfds_name: str = ""
  tfds_split: str = "train"
  tfds_field: str = "text"
  tfds_data_dir: str | None = None
  builtin: bool = False
  builtin_max_mb: float = 0.0  # Cap on the built-in corpus text in MB (0: all of it).


@dataclasses.dataclass(frozen=True)
class VocabSource:
  """The vocabulary: an existing one (`path`, anything `Vocab.load` reads), or a sentencepiece
  vocabulary of `size` trained on the corpus (`allow_smaller`: the largest the corpus supports
  when it cannot support `size`)."""

  path: str = ""
  size: int = 30522
  model_type: str = "unigram"
  allow_smaller: bool = False


# The most text (file bytes) the launcher reads to train a vocabulary for a Beam preparation: a
# corpus up to this size is read whole, in the local path's order (the same vocabulary); a larger
# one through whole files in a seeded order until this much is read (a bounded sample: the
# launcher never reads a corpus beyond one machine; sentencepiece then samples its own
# `input_sentence_size` sentences among them).
BEAM_VOCAB_SAMPLE_BYTES = 2 * 10**9


def prepare_corpus(
    output_dir: str, source: CorpusSource, vocab: VocabSource,
    settings: blocks.ExampleSettings, *, num_workers: int | None = None,
    beam_runner: str = "", beam_options: Sequence[str] = (),
) -> dict[str, Any]:
  """Prepares `source` into `output_dir` (new or empty, local or gs://); returns the metadata
  written. With a `beam_runner` (files only) the rows are built by the Apache Beam pipeline
  (`bert_jax.data.beam`, Beam's flags in `beam_options`), else by worker processes here.
  Every check that needs no corpus (output directory, settings, the choice of source, missing
  files) runs before any slow work."""
  if not output_dir:
    raise ValueError("--output_dir is required.")
  prepare.check_output_dir(output_dir)
  settings.validate()
  chosen = [name for name, given in (("--input", bool(source.input)),
                                     ("--tfds_name", bool(source.tfds_name)),
                                     ("--builtin", source.builtin)) if given]
  if len(chosen) != 1:
    raise ValueError("Give exactly one corpus source: --input, --tfds_name or --builtin "
                     f"(got {', '.join(chosen) or 'none'}).")
  if beam_options and not beam_runner:
    raise ValueError("--beam_options apply to a Beam preparation: give --beam_runner too.")
  if beam_runner:
    return _prepare_beam(output_dir, source, vocab, settings, beam_runner, beam_options)
  if source.builtin:
    meta = builtin.prepare_builtin(output_dir, _builtin_settings(source, vocab, settings),
                                   num_workers=num_workers, flags=builtin.LAUNCHER_FLAGS)
  else:
    documents, stats, fingerprint, named = _documents(source)
    with tempfile.TemporaryDirectory(prefix="bert_jax_prepare_") as work_dir:
      meta = prepare.prepare_dataset(
          output_dir, documents, _vocab(vocab, documents, work_dir, named),
          **dataclasses.asdict(settings), num_workers=num_workers, corpus_stats=stats,
          corpus_fingerprint=fingerprint)
  invalid_bytes = (meta["corpus_stats"] or {}).get("invalid_bytes")
  if invalid_bytes:
    logging.warning("%d bytes of the corpus were not valid UTF-8 (replaced by U+FFFD).",
                    invalid_bytes)
  return meta


@contextlib.contextmanager
def _without_gcp_extras_warning() -> Iterator[None]:
  """Importing Beam without its [gcp] extras warns "apitools not found, and bigquery client
  libraries are not available": bert_jax uses neither (Dataflow installs apache-beam[gcp])."""
  def not_it(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("apitools not found")
  root = logging.getLogger()
  filters = [(handler, not_it) for handler in root.handlers]
  for handler, found in filters:
    handler.addFilter(found)
  try:
    yield
  finally:
    for handler, found in filters:
      handler.removeFilter(found)


def _prepare_beam(output_dir: str, source: CorpusSource, vocab: VocabSource,
                  settings: blocks.ExampleSettings, runner: str,
                  options: Sequence[str]) -> dict[str, Any]:
  """`prepare_corpus` of files on Beam: the vocabulary given, or trained here on the corpus, a
  bounded sample of it when larger than `BEAM_VOCAB_SAMPLE_BYTES`, then the pipeline."""
  if not source.input:
    raise ValueError(f"--beam_runner reads --input files (got {chosen_source(source)}); prepare "
                     "a TFDS dataset or the built-in corpus without --beam_runner.")
  try:
    with _without_gcp_extras_warning():
      from bert_jax.data import beam  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(f"--beam_runner needs Apache Beam ({e}): pip install -r "
                     "requirements-beam.txt") from None
  if runner not in beam.RUNNERS:
    raise ValueError(f"--beam_runner={runner!r} is not one of {', '.join(beam.RUNNERS)}")
  beam.check_options(options)
  _, _, fingerprint, named = _documents(source)
  paths = inputs.expand(source.input)
  sample = _vocab_sample(paths, settings.seed)

  def documents() -> Iterator[corpus.Document]:
    stats = corpus.CorpusStats()
    for path in sample:
      yield from inputs.file_documents(path, source.input_format, stats, source.text_field)

  with tempfile.TemporaryDirectory(prefix="bert_jax_prepare_") as work_dir:
    trained = _vocab(vocab, documents, work_dir, named)
    meta = beam.prepare_dataset(output_dir, paths, source.input_format, trained, settings,
                                text_field=source.text_field, runner=runner, beam_options=options,
                                corpus_fingerprint=fingerprint)
  return meta


def _vocab_sample(paths: Sequence[str], seed: int) -> list[str]:
  """The files a Beam preparation trains its vocabulary on: all of them (in order) up to
  `BEAM_VOCAB_SAMPLE_BYTES`, else whole files in a seeded order until that much is reached."""
  sizes = {path: storage.size(path) for path in paths}
  if sum(sizes.values()) <= BEAM_VOCAB_SAMPLE_BYTES:
    return list(paths)
  order, sample, total = list(paths), [], 0
  random.Random(seed).shuffle(order)
  while total < BEAM_VOCAB_SAMPLE_BYTES:
    sample.append(order.pop())
    total += sizes[sample[-1]]
  logging.info("Vocabulary sample: %d of %d files (%.2f of %.2f GB)", len(sample), len(paths),
               total / 1e9, sum(sizes.values()) / 1e9)
  return sample


def chosen_source(source: CorpusSource) -> str:
  """The flag that names the corpus of `source`."""
  return "--tfds_name" if source.tfds_name else "--builtin" if source.builtin else "--input"


def describe(output_dir: str, meta: dict[str, Any]) -> str:
  """One line on a prepared dataset: rows, examples, fill rate, vocabulary, layout, time."""
  train, validation = meta["splits"]["train"], meta["splits"]["validation"]
  read = meta.get("corpus_stats") or {}
  dropped = [f"{read[name]:,} {what if read[name] == 1 else plural}"
             for name, what, plural in (
                 ("duplicate_documents", "document that repeats another's text",
                  "documents that repeat another's text"),
                 ("empty_records", "record without text", "records without text"))
             if read.get(name)]
  return (f"Prepared {output_dir} ({meta['objective']}): {train['rows']} train rows "
          f"({train['examples']} examples, {train['fill_rate']:.1%} real tokens) / "
          f"{validation['rows']} validation rows, vocab {meta['vocab_size']} "
          f"({meta['vocab_kind']}), max_seq_length {meta['max_seq_length']}, up to "
          f"{meta['max_examples_per_row']} examples per row, {meta['prepare_seconds']:.1f} s."
          + (f" Dropped {' and '.join(dropped)}." if dropped else ""))


def _builtin_settings(source: CorpusSource, vocab: VocabSource,
                      settings: blocks.ExampleSettings) -> builtin.BuiltinSettings:
  """The built-in dataset of these flags; it trains its vocabulary as training does."""
  if vocab.path or vocab.allow_smaller:
    raise ValueError("--builtin prepares the dataset training prepares for the same settings, "
                     "with a sentencepiece vocabulary trained on the corpus (--vocab_size, "
                     "--vocab_model_type): --vocab and --allow_smaller_vocab do not apply.")
  return builtin.BuiltinSettings(
      vocab_size=vocab.size, vocab_model_type=vocab.model_type, max_mb=source.builtin_max_mb,
      max_seq_length=settings.max_seq_length, short_seq_prob=settings.short_seq_prob,
      dupe_factor=settings.dupe_factor, validation_fraction=settings.validation_fraction,
      objective=settings.objective, max_examples_per_row=settings.max_examples_per_row,
      seed=settings.seed)


def _documents(source: CorpusSource) -> tuple[
    Callable[[], Iterator[corpus.Document]], Callable[[], corpus.CorpusStats], str, str]:
  """(documents factory, the stats of its latest pass, fingerprint, the flag that named it) of
  files or a TFDS dataset. Missing files fail here, naming the file or glob."""
  holder = {"stats": corpus.CorpusStats()}

  def fresh_stats() -> corpus.CorpusStats:
    holder["stats"] = corpus.CorpusStats()
    return holder["stats"]

  if source.tfds_name:
    def documents() -> Iterator[corpus.Document]:
      return corpus.iter_tfds_text(source.tfds_name, source.tfds_split, source.tfds_field,
                                   data_dir=source.tfds_data_dir, stats=fresh_stats())
    fingerprint = f"tfds:{source.tfds_name}/{source.tfds_split}/{source.tfds_field}"
    named = (f"--tfds_name={source.tfds_name} (split {source.tfds_split}, field "
             f"{source.tfds_field})")
    return documents, lambda: holder["stats"], fingerprint, named

  inputs.file_format("", source.input_format)  # A bad --input_format, before the files.
  paths = inputs.expand(source.input)
  inputs.check_files(paths, source.input_format)
  digest = hashlib.sha256()
  for path in paths:
    digest.update(f"{storage.absolute(path)}\t{storage.size(path)}\n".encode())
  if any(inputs.file_format(p, source.input_format) in inputs.RECORD_FORMATS for p in paths):
    digest.update(f"text_field\t{source.text_field}\n".encode())

  def documents() -> Iterator[corpus.Document]:
    return inputs.iter_documents(paths, source.input_format, fresh_stats(), source.text_field)
  return (documents, lambda: holder["stats"], f"files:{digest.hexdigest()[:16]}",
          f"--input={','.join(source.input)}")


def _vocab(vocab: VocabSource, documents: Callable[[], Iterator[corpus.Document]],
           work_dir: str, named: str) -> vocab_lib.Vocab:
  """The given vocabulary, or a sentencepiece one trained on a pass over `documents`."""
  if vocab.path:
    loaded = vocab_lib.Vocab.load(vocab.path)
    logging.info("Using vocabulary %s", loaded)
    return loaded
  logging.info("Training a %s sentencepiece vocabulary of %d", vocab.model_type, vocab.size)
  return vocab_lib.train_sentencepiece(
      corpus.iter_sentences(documents()), os.path.join(work_dir, "sentencepiece"), vocab.size,
      vocab.model_type, allow_smaller_vocab=vocab.allow_smaller, source=named)
