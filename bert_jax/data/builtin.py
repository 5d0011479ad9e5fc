"""The built-in docstring corpus as a prepared dataset: its settings, its cache key, and the one
function that prepares it (`prepare_builtin`).

Training prepares it once into a cache directory named by the key (`ensure_builtin`:
`<root>/data/builtin-<key>`, `bert_jax/train.py`), and a run keeps the one it started with
across restarts (`run_dataset`), then reads it like any prepared dataset
(`pipeline.resolve_dataset`, which only reads); `launch/prepare_data.py --builtin` prepares the
same dataset (same corpus, vocabulary, rows and fingerprint) into its --output_dir. The corpus is
the pinned selection of installed files `builtin_selection` names (the same bytes wherever its
pinned versions are installed; a warning names each component that differs).
"""

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import ml_collections
from absl import logging

from bert_jax.runtime import storage
from bert_jax.data import blocks
from bert_jax.data import builtin_selection
from bert_jax.data import corpus
from bert_jax.data import packing
from bert_jax.data import prepare
from bert_jax.data import vocab as vocab_lib


class SettingFlags(NamedTuple):
  """How the settings are spelled where they came from, for the fixes error messages name."""

  where: str
  vocab_size: str
  max_mb: str


TRAINING_FLAGS = SettingFlags("training", "--config.model.vocab_size",
                              "--config.data.builtin_max_mb")
LAUNCHER_FLAGS = SettingFlags("launch/prepare_data.py --builtin", "--vocab_size",
                              "--builtin_max_mb")


@dataclasses.dataclass(frozen=True)
class BuiltinSettings:
  """Everything that makes one built-in dataset differ from another, besides the selection's
  files (`builtin_selection.current().fingerprint`): the fields of its cache key."""

  vocab_size: int  # Of the sentencepiece vocabulary trained on the corpus.
  vocab_model_type: str  # "unigram" or "bpe".
  max_mb: float  # Cap on the corpus text in MB (0: all of it).
  max_seq_length: int
  short_seq_prob: float
  dupe_factor: int
  validation_fraction: float
  objective: str
  max_examples_per_row: int
  seed: int

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "BuiltinSettings":
    """The built-in dataset a pretraining config trains on."""
    data = config.data
    return cls(
        vocab_size=int(config.model.vocab_size), vocab_model_type=str(data.vocab_model_type),
        max_mb=float(data.builtin_max_mb), max_seq_length=int(data.max_seq_length),
        short_seq_prob=float(data.short_seq_prob), dupe_factor=int(data.dupe_factor),
        validation_fraction=float(data.validation_fraction), objective=packing.row_format(str(data.objective)),
        max_examples_per_row=int(data.max_examples_per_row), seed=int(config.seed))

  @property
  def examples(self) -> blocks.ExampleSettings:
    """How its rows are built (the default `block_chars`)."""
    return blocks.ExampleSettings(
        max_seq_length=self.max_seq_length, short_seq_prob=self.short_seq_prob,
        dupe_factor=self.dupe_factor, validation_fraction=self.validation_fraction,
        seed=self.seed, objective=self.objective,
        max_examples_per_row=self.max_examples_per_row)


def cache_key(settings: BuiltinSettings, fingerprint: str) -> str:
  """What makes a built-in dataset differ: corpus fingerprint, every setting, and the record
  format and preparation version (a dataset cached by an older preparation is not reused)."""
  key = {
      "format_version": prepare.FORMAT_VERSION,
      "preparation_version": prepare.PREPARATION_VERSION,
      "fingerprint": fingerprint,
      "vocab_size": int(settings.vocab_size),
      "vocab_model_type": str(settings.vocab_model_type),
      "builtin_max_mb": float(settings.max_mb),
      "max_seq_length": int(settings.max_seq_length),
      "short_seq_prob": float(settings.short_seq_prob),
      "dupe_factor": int(settings.dupe_factor),
      "validation_fraction": float(settings.validation_fraction),
      "objective": str(settings.objective),
      # K, not max_examples_per_row: "mlm" rows hold one sequence whatever it says.
      "examples_per_row": int(packing.examples_per_row(settings.objective,
                                                       settings.max_examples_per_row)),
      "seed": int(settings.seed),
  }
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def dataset_dir(root: str, settings: BuiltinSettings) -> str:
  """`<root>/data/builtin-<key>`: where training keeps the built-in dataset of `settings`."""
  key = cache_key(settings, builtin_selection.current().fingerprint)
  return storage.join(storage.absolute(root), "data", f"builtin-{key}")


def ensure_builtin(root: str, settings: BuiltinSettings, *,
                   num_workers: int | None = None) -> str:
  """`dataset_dir(root, settings)`, prepared there (`prepare_builtin`) unless it already is.

  A second call returns at once, and so does a concurrent one that lost the race to prepare
  the same dataset.
  """
  path = dataset_dir(root, settings)
  meta_file = storage.join(path, prepare.META_FILE)
  if storage.isfile(meta_file):
    return path
  try:
    prepare_builtin(path, settings, num_workers=num_workers)
  except (OSError, ValueError):
    if storage.isfile(meta_file):
      return path  # Another process prepared the same dataset first.
    raise
  return path


# In a training workdir: the built-in dataset the run trains on ({"dataset": "builtin-<key>",
# "settings": its BuiltinSettings, "corpus": `Selection.record()`: the selection's name, its
# fingerprint, whether it is the reference, the versions read and how they differ from the
# pins}), so that a restart keeps reading it (`run_dataset`).
RUN_RECORD = "builtin_dataset.json"


def run_dataset(root: str, settings: BuiltinSettings, workdir: str, *,
                record: bool = True) -> str:
  """The built-in dataset a run in `workdir` trains on: the one it started with, while
  `<root>/data` holds it and the settings are the same; else `ensure_builtin`'s, recorded in
  `workdir` (when `record`: process 0) for the next start.

  The corpus is the selection's installed files: one of its packages upgraded between two starts
  is another corpus, so another cache key, and its vocabulary (retrained) would not be the one
  in the run's checkpoints, which resume refuses. A run keeps its own dataset instead.
  """
  record_path = storage.join(workdir, RUN_RECORD)
  settings_json = json.loads(json.dumps(dataclasses.asdict(settings)))
  if storage.isfile(record_path):
    recorded = json.loads(storage.read_text(record_path))
    path = storage.join(storage.absolute(root), "data", recorded["dataset"])
    if (recorded["settings"] == settings_json
        and storage.isfile(storage.join(path, prepare.META_FILE))):
      if path != dataset_dir(root, settings):
        logging.warning(
            "The installed files of the built-in corpus (%s) changed since %s started; it goes "
            "on with the built-in dataset it started with, %s (a new workdir takes the new "
            "corpus)", builtin_selection.NAME, workdir, path)
      return path
  selection = builtin_selection.current()
  builtin_selection.warn_if_not_reference(selection)
  path = ensure_builtin(root, settings)
  if record:
    storage.write_text(record_path, json.dumps(
        {"dataset": os.path.basename(path), "settings": settings_json,
         "corpus": selection.record()}, indent=2))
  return path


def prepare_builtin(
    output_dir: str, settings: BuiltinSettings, *, num_workers: int | None = None,
    flags: SettingFlags = TRAINING_FLAGS,
) -> dict[str, Any]:
  """Prepares the built-in corpus with `settings` into `output_dir` (absent or empty, local or
  gs://); returns the metadata written.

  Parsing the docstrings of the selection's modules is the slow part: it is done once, into a
  spooled text file (next to a local `output_dir`, else in $TMPDIR) read twice, to train the
  sentencepiece vocabulary and to build the rows (`prepare.prepare_dataset`, `num_workers` as
  there). `flags` spell the fixes in the error messages.
  """
  prepare.check_output_dir(output_dir)  # Before any slow work.
  settings.examples.validate()
  selection = builtin_selection.current()
  builtin_selection.warn_if_not_reference(selection)
  fingerprint = selection.fingerprint
  work_parent = None
  if not storage.is_remote(output_dir):
    work_parent = os.path.dirname(storage.absolute(output_dir))
    os.makedirs(work_parent, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=work_parent, prefix=".builtin-work-") as work_dir:
    spool = os.path.join(work_dir, "corpus.txt")
    reader_stats = corpus.CorpusStats()
    _spool_documents(corpus.iter_builtin_docstrings(int(settings.max_mb * 1e6), reader_stats),
                     spool)
    try:
      vocab = vocab_lib.train_sentencepiece(
          corpus.iter_sentences(corpus.iter_bert_format(spool)),
          os.path.join(work_dir, "sentencepiece"), settings.vocab_size,
          settings.vocab_model_type, source="the built-in corpus")
    except ValueError as e:
      raise ValueError(f"Built-in corpus ({reader_stats.documents} documents): {e} For "
                       f"{flags.where}, this is {flags.vocab_size} (or give more text with "
                       f"{flags.max_mb}).") from e
    return prepare.prepare_dataset(
        output_dir, lambda: corpus.iter_bert_format(spool), vocab,
        **dataclasses.asdict(settings.examples), num_workers=num_workers,
        corpus_stats=reader_stats, corpus_fingerprint=fingerprint)


def _spool_documents(documents: Iterable[Sequence[str]], path: str) -> None:
  """Writes documents in google-research/bert's format (a sentence a line, blank line between)."""
  with open(path, "w", encoding="utf-8") as f:
    for document in documents:
      lines = [" ".join(s.split()) for s in document]
      lines = [line for line in lines if line]
      if lines:
        f.write("\n".join(lines) + "\n\n")
