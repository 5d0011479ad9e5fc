"""Preparation as an Apache Beam pipeline: the records `prepare` writes, on any Beam runner.

`launch/prepare_data.py --beam_runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner` runs
this instead of `prepare.prepare_dataset`'s worker processes, for corpora beyond one machine.
The same functions build the same blocks, so for one seed and settings both engines write the
same multiset of records (sorted, byte-identical) and the same statistics, whatever the number
of Beam workers or bundle sizes:

  files --Read--> (key, document) --+--> characters --Sum--> shard bits (side input)
                                    +--> (shard, (key, document)) --GroupByKey--> sorted shard
  sorted shard --`blocks.iter_document_blocks`--> blocks --Reshuffle--> WriteBlock (a file a
  block, `workers.write_block`) --ToList--> Finalize (TFDS layout, bert_meta.json last)

* The corpus-wide shuffle (`shuffle`) is a reshuffle by a seeded key: a document's key is a hash
  of its text and the seed, its shard the key's first bits; each shard is sorted by key and cut
  into blocks on one worker (about `shuffle.SHARD_CHARS` of text); blocks are the unit of the
  parallel work (tokenizing, examples, rows).
* Retries duplicate nothing: a block's file has a name of its own (`DocumentBlock.name`),
  written under a temporary name and renamed, so a retried or speculative bundle replaces it;
  Finalize's renames skip what a failed attempt already moved.
* A failed pipeline leaves no bert_meta.json (Finalize writes it last, after every block), so
  training refuses the directory in one line; the launcher also removes what it wrote.
* Output to gs:// goes directly from the workers: each block's file is written in the worker's
  temporary directory (ArrayRecord writes local files) and uploaded.

Needs `apache-beam` (requirements-beam.txt); nothing else in bert_jax imports this module.
"""

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import PipelineOptions

from bert_jax.runtime import storage
from bert_jax.data import blocks
from bert_jax.data import corpus
from bert_jax.data import inputs
from bert_jax.data import prepare
from bert_jax.data import shuffle
from bert_jax.data import workers

RUNNERS = ("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner")
_BLOCKS_DIR = ".beam_blocks"


class _ReadFile(beam.DoFn):
  """A file's documents as (key, sentences) (`shuffle.clean`ed, empty ones dropped), and its
  `corpus.CorpusStats` as a dict on the "stats" output."""

  def __init__(self, input_format: str, seed: int, text_field: str = "text"):
    self._input_format, self._seed, self._text_field = input_format, seed, text_field

  def process(self, path: str) -> Iterator[Any]:
    stats = corpus.CorpusStats()
    for document in inputs.file_documents(path, self._input_format, stats, self._text_field):
      sentences = shuffle.clean(document)
      if sentences:
        yield shuffle.document_key(self._seed, sentences), sentences
    yield beam.pvalue.TaggedOutput("stats", dataclasses.asdict(stats))


def _sum_dicts(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
  total: dict[str, int] = {}
  for d in dicts:
    for name, value in d.items():
      total[name] = total.get(name, 0) + value
  return total


def _shard_blocks(item: tuple[int, Iterable[tuple[bytes, list[str]]]],
                  settings: blocks.ExampleSettings) -> Iterator[Any]:
  """The blocks of one shard: its documents in key order, each text once, cut as the local
  path cuts them; the repeats dropped counted on the "stats" output."""
  shard, keyed = item
  tally: dict[str, int] = {}
  ordered = shuffle.distinct(sorted(keyed, key=lambda kd: kd[0]), tally)
  yield from blocks.iter_document_blocks(
      (sentences for _, sentences in ordered), validation_fraction=settings.validation_fraction,
      block_chars=settings.block_chars, shard=shard)
  yield beam.pvalue.TaggedOutput("stats", tally)


class _WriteBlock(beam.DoFn):
  """Builds a block's rows into `<blocks_dir>/<block.name>.array_record` (`workers.write_block`)
  and yields what Finalize needs: (split, shard, index, path, bytes, stats as a dict)."""

  def __init__(self, blocks_dir: str, vocab, settings: blocks.ExampleSettings):
    self._blocks_dir, self._vocab, self._settings = blocks_dir, vocab, settings

  def setup(self) -> None:
    storage.makedirs(self._blocks_dir)  # A local (or shared, mounted) output directory.

  def process(self, block: blocks.DocumentBlock) -> Iterator[tuple]:
    path = storage.join(self._blocks_dir, f"{block.name}.array_record")
    remote = storage.is_remote(path)
    local_dir = tempfile.mkdtemp(prefix="bert_jax_beam_") if remote else self._blocks_dir
    # A name of this attempt's own: a retried or speculative attempt never writes into it.
    local = os.path.join(local_dir, f".{block.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
      _, _, num_bytes, stats = workers.write_block(block, self._settings, local, self._vocab)
      if stats.rows:
        if remote:
          with open(local, "rb") as f:
            storage.write_bytes(path, f.read())
        else:
          os.replace(local, path)
    finally:
      if os.path.exists(local):
        os.remove(local)
      if remote:
        os.rmdir(local_dir)
    yield block.split, block.shard, block.index, path, num_bytes, dataclasses.asdict(stats)


def _finalize(results: list[tuple], corpus_stats: dict[str, int], *, output_dir: str, vocab,
              settings: blocks.ExampleSettings, corpus_fingerprint: str, start: float) -> None:
  """Every block is written: the TFDS layout of the block files, then bert_meta.json (last)."""
  from bert_jax.data import tfds_builder  # Deferred: TFDS is a slow import.

  split_stats = {split: blocks.BlockStats() for split in blocks.SPLITS}
  split_shards: dict[str, list[tuple[str, int, int]]] = {split: [] for split in blocks.SPLITS}
  for split, _, _, path, num_bytes, stats in sorted(results, key=lambda r: r[:3]):
    block_stats = blocks.BlockStats(**stats)
    split_stats[split].add(block_stats)
    if block_stats.rows:
      split_shards[split].append((path, block_stats.rows, num_bytes))
  # Raises when no training row came; its warnings are the launcher's (`_warn_of_splits`): a
  # worker process's console is not the operator's.
  prepare._check_splits(split_stats, settings, warn=False)  # pylint: disable=protected-access
  tfds_builder.write_tfds_layout(output_dir, settings.max_seq_length, settings.examples_per_row,
                                 split_shards)
  storage.remove_tree(storage.join(output_dir, _BLOCKS_DIR))
  meta = prepare._meta(vocab, settings, split_stats,  # pylint: disable=protected-access
                       corpus.CorpusStats(**corpus_stats), corpus_fingerprint,
                       time.time() - start)
  storage.write_text(storage.join(output_dir, prepare.META_FILE), json.dumps(meta, indent=2))


def build_pipeline(pipeline: beam.Pipeline, paths: Sequence[str], input_format: str, vocab,
                   settings: blocks.ExampleSettings, output_dir: str,
                   corpus_fingerprint: str = "", text_field: str = "text") -> None:
  """Adds preparation's transforms to `pipeline` (the vocabulary is already in `output_dir`)."""
  read = (pipeline
          | "Files" >> beam.Create(list(paths))
          | "SpreadFiles" >> beam.Reshuffle()
          | "Read" >> beam.ParDo(_ReadFile(input_format, settings.seed, text_field)).with_outputs(
              "stats", main="documents"))
  documents = read.documents
  chars = (documents
           | "Chars" >> beam.Map(lambda kd: sum(map(len, kd[1])))
           | "SumChars" >> beam.CombineGlobally(sum))
  sharded = (documents
             | "Shard" >> beam.Map(
                 lambda kd, total: (shuffle.shard_of(
                     kd[0], shuffle.shard_bits(total, settings.shard_chars)), kd),
                 total=beam.pvalue.AsSingleton(chars))
             | "GroupShards" >> beam.GroupByKey()
             | "Blocks" >> beam.FlatMap(_shard_blocks, settings).with_outputs(
                 "stats", main="blocks"))
  corpus_stats = ((read.stats, sharded.stats)
                  | "AllStats" >> beam.Flatten()
                  | "CorpusStats" >> beam.CombineGlobally(_sum_dicts))
  results = (sharded.blocks
             | "SpreadBlocks" >> beam.Reshuffle()
             | "WriteBlocks" >> beam.ParDo(_WriteBlock(
                 storage.join(output_dir, _BLOCKS_DIR), vocab, settings)))
  _ = (results
       | "AllBlocks" >> beam.combiners.ToList()
       | "Finalize" >> beam.Map(
           _finalize, beam.pvalue.AsSingleton(corpus_stats), output_dir=output_dir, vocab=vocab,
           settings=settings, corpus_fingerprint=corpus_fingerprint, start=time.time()))


@contextlib.contextmanager
def scratch_tempdir() -> Iterator[None]:
  """Beam's portable runner leaves an empty beam-temp* directory in $TMPDIR behind each pipeline
  (its job server's, never stopped): pipelines run inside this go into a directory of ours,
  removed afterwards."""
  previous = tempfile.tempdir
  with tempfile.TemporaryDirectory(prefix="bert_jax_beam_") as scratch:
    tempfile.tempdir = scratch
    try:
      yield
    finally:
      tempfile.tempdir = previous


@contextlib.contextmanager
def _quiet_transform_errors() -> Iterator[None]:
  """An error in a transform reaches the caller as the pipeline's exception (the launcher's one
  'error:' line; --debug: its traceback); Beam's in-process worker would log its traceback
  first."""
  logger = logging.getLogger("apache_beam.runners.common")
  level = logger.level
  logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def _descendants(pid: int) -> list[int]:
  """The ids of the processes under `pid` (children before grandchildren): /proc on Linux,
  pgrep elsewhere."""
  children_of = _proc_children() if os.path.isdir("/proc/self") else _pgrep_children
  found, frontier = [], [pid]
  while frontier:
    children = children_of(frontier.pop(0))
    found += children
    frontier += children
  return found


def _proc_children() -> Callable[[int], list[int]]:
  """Every process's children, from one read of /proc/<pid>/stat (its 4th field: the parent)."""
  table: dict[int, list[int]] = {}
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        parent = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue  # Not a process, or it ended.
    table.setdefault(parent, []).append(int(entry))
  return lambda parent: table.get(parent, [])


def _pgrep_children(parent: int) -> list[int]:
  listed = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True,
                          check=False).stdout.split()
  return [int(p) for p in listed]


_INTERRUPT_REPEAT_SECONDS = 10.0


@contextlib.contextmanager
def _interrupt_reaches_workers() -> Iterator[None]:
  """SIGINT sent to this process alone (`kill -INT`, a parent's send_signal) goes on to the
  worker processes the pipeline started, as a terminal's Ctrl-C does: Beam's DirectRunner
  otherwise may wait on its way out for workers that wait for work, forever (seen once here).
  While the interrupted pipeline is still unwinding, the signal is sent again every
  `_INTERRUPT_REPEAT_SECONDS` (to this process and its workers): a wait inside Beam's own
  cleanup then ends too (a Ctrl-C to the whole process group once outlived a test's 60 s).
  Once interrupted, the errors of Beam's threads watching those workers go to the log only."""
  previous = signal.getsignal(signal.SIGINT)
  if threading.current_thread() is not threading.main_thread() or previous == signal.SIG_IGN:
    yield
    return
  interrupted, previous_hook = threading.Event(), threading.excepthook

  unwound = threading.Event()

  def repeat() -> None:
    while not unwound.wait(_INTERRUPT_REPEAT_SECONDS):
      os.kill(os.getpid(), signal.SIGINT)

  def forward(signum, frame):
    if not interrupted.is_set():
      threading.Thread(target=repeat, daemon=True, name="repeat-sigint").start()
    interrupted.set()
    for pid in _descendants(os.getpid()):
      try:
        os.kill(pid, signal.SIGINT)
      except OSError:
        pass  # It ended meanwhile.
    (previous if callable(previous) else signal.default_int_handler)(signum, frame)

  def thread_error(args):
    if not interrupted.is_set():
      previous_hook(args)
      return
    logging.info("Beam thread %s after the interrupt: %r", args.thread and args.thread.name,
                 args.exc_value)

  signal.signal(signal.SIGINT, forward)
  threading.excepthook = thread_error
  try:
    yield
  finally:
    unwound.set()
    signal.signal(signal.SIGINT, previous)
    threading.excepthook = previous_hook


def _remove_failed(output_dir: str, existed: bool) -> None:
  """What a failed run wrote into `output_dir` (empty before) goes."""
  try:
    storage.remove_tree(output_dir)
    if existed:
      storage.makedirs(output_dir)  # As it was: empty.
  except Exception as e:  # pylint: disable=broad-except  (the pipeline's error matters more)
    logging.warning("prepare: could not remove the failed run's %s (%s); delete it before "
                    "preparing into it again.", output_dir, e)


# The last "SomeError: message" line of a worker's traceback, which Beam's runner hands back
# as the text of one RuntimeError.
_FINAL_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.M)


def _one_line_error(error: BaseException, output_dir: str) -> Exception | None:
  """A failed pipeline as one error line (None: `error` is one already, or a signal): Beam's
  runner wraps a worker's failure in a RuntimeError holding its whole traceback (120 lines
  for a full disk). A full disk is an OSError naming the output; other failures name the
  worker's exception."""
  if isinstance(error, OSError) and error.errno == errno.ENOSPC:
    return OSError(f"Could not write the dataset in {output_dir}: No space left on device. "
                   "Nothing of it was kept; free space (or give another --output_dir) and run "
                   "the command again")
  if not isinstance(error, Exception) or isinstance(error, (ValueError, OSError)):
    return None
  found = _FINAL_LINE.findall(str(error))
  kind, message = found[-1] if found else (type(error).__name__, " ".join(str(error).split()))
  message = " ".join(message.split())
  if "No space left on device" in message:
    return OSError(f"Could not write the dataset in {output_dir}: No space left on device "
                   f"({kind}: {message[:300]}). Nothing of it was kept; free space (or give "
                   "another --output_dir) and run the command again")
  return ValueError(f"The Beam pipeline failed: {kind}: {message[:500]}. Nothing of the "
                    "dataset was kept")


def _warn_of_splits(meta: dict[str, Any], settings: blocks.ExampleSettings) -> None:
  """The warnings of `prepare._check_splits` (an empty validation split, NSP chunks without a
  random next segment), in the launcher's process, from the metadata the pipeline wrote."""
  split_stats = {split: blocks.BlockStats(**meta["stats"][split]) for split in blocks.SPLITS}
  prepare._check_splits(split_stats, settings)  # pylint: disable=protected-access


class _NotWorkerRelays(logging.Filter):
  """Off this process's console: the local job service's copies of its workers' log lines
  ("Worker: severity: ... message: ..."), which the workers' own output has (see
  `_workers_output_to`)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.name.endswith("local_job_service")
                and str(record.msg).startswith("Worker:"))


@contextlib.contextmanager
def _workers_output_to(path: str | None) -> Iterator[None]:
  """DirectRunner's worker processes (direct_running_mode=multi_processing) log at INFO, and
  Beam's warnings about its own flags, to the stderr they inherit: 47 lines on the console of a
  run that went well. For the pipeline's run they inherit `path` instead (None: nothing
  changes); this process's log handlers keep the terminal, without the job service's copies
  of those lines."""
  if path is None:
    yield
    return
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  handlers = [h for h in (*logging.getLogger().handlers, absl_logging.get_absl_handler()
                          .python_handler)
              if isinstance(h, logging.StreamHandler) and h.stream is sys.stderr]
  sys.stderr.flush()
  terminal = os.dup(2)
  console = os.fdopen(os.dup(terminal), "w", buffering=1)
  relays = _NotWorkerRelays()
  with open(path, "ab") as log:
    os.dup2(log.fileno(), 2)
  saved = sys.stderr
  sys.stderr = console
  streams = [h.setStream(console) for h in handlers]
  for handler in logging.getLogger().handlers:
    handler.addFilter(relays)
  try:
    yield
  finally:
    for handler in logging.getLogger().handlers:
      handler.removeFilter(relays)
    for handler, stream in zip(handlers, streams):
      handler.setStream(stream)
    sys.stderr = saved
    console.close()
    os.dup2(terminal, 2)
    os.close(terminal)


def _drop_workers_log(path: str | None, keep_tail: bool) -> None:
  """Removes the workers' output file; after a failure its last lines go to the log (INFO:
  `-v 0` shows them) first (the error itself is reported in one line)."""
  if path is None or not os.path.exists(path):
    return
  if keep_tail:
    with open(path, errors="replace") as f:
      logging.info("prepare: the Beam workers' last output:\n%s", "".join(f.readlines()[-40:]))
  os.remove(path)


def _workers_log(options: PipelineOptions, runner: str) -> str | None:
  """Where DirectRunner's local worker processes write their output (a file in $TMPDIR, removed
  after the run), or None when it runs none (in-process modes, other runners: remote
  workers)."""
  if runner != "DirectRunner":
    return None
  if options.view_as(pipeline_options.DirectOptions).direct_running_mode != "multi_processing":
    return None
  return os.path.join(tempfile.gettempdir(), f"bert_jax_beam_workers_{os.getpid()}.log")


def check_options(beam_options: Sequence[str]) -> None:
  """Refuses Beam options Beam would not take, before any work: a value of the wrong type (Beam
  printed its 140-line usage page and exited) and an unknown option (Beam drops it with a log
  line and runs without it). Parsed as `PipelineOptions.get_all_options` parses them: every
  options class's arguments (runners' included) in one parser."""
  # pylint: disable-next=protected-access
  class Parser(pipeline_options._BeamArgumentParser):
    def error(self, message: str):  # argparse's: print the usage, exit 2.
      raise ValueError(f"--beam_options: {message}")

  parser = Parser(allow_abbrev=False)
  subset = {str(cls): cls for cls in PipelineOptions.__subclasses__()}
  for cls in subset.values():
    cls._add_argparse_args(parser)  # pylint: disable=protected-access
  _, unknown = parser.parse_known_args(list(beam_options))
  if unknown:
    raise ValueError(f"--beam_options: {' '.join(unknown)} is not an option of Beam's runners "
                     "(a typo? Beam would drop it and run without it); see `python -m "
                     "apache_beam.examples.wordcount --help` for the options it knows")


def prepare_dataset(output_dir: str, paths: Sequence[str], input_format: str, vocab,
                    settings: blocks.ExampleSettings, *, runner: str = "DirectRunner",
                    beam_options: Sequence[str] = (), corpus_fingerprint: str = "",
                    text_field: str = "text") -> dict[str, Any]:
  """`prepare.prepare_dataset` of the files `paths` on a Beam `runner` (options: Beam's flags,
  e.g. "--direct_num_workers=4", "--project=...", "--temp_location=gs://..."); returns the
  metadata written. On any failure what the run wrote into `output_dir` (empty before) is
  removed, and bert_meta.json was never written."""
  if runner not in RUNNERS:
    raise ValueError(f"--beam_runner={runner!r} is not one of {', '.join(RUNNERS)}")
  if runner == "DataflowRunner" and not storage.is_remote(output_dir):
    raise ValueError(f"--output_dir={output_dir} is on this machine: Dataflow's workers write "
                     "the dataset themselves, so give a bucket (gs://...)")
  settings.validate()
  settings = dataclasses.replace(settings, max_examples_per_row=settings.examples_per_row)
  output_dir = storage.absolute(output_dir)
  prepare.check_output_dir(output_dir)
  existed = storage.isdir(output_dir)
  workers_log = None
  try:
    vocab.save(storage.join(output_dir, prepare.VOCAB_DIR))
    options = PipelineOptions(list(beam_options), runner=runner, save_main_session=False)
    workers_log = _workers_log(options, runner)
    with (scratch_tempdir(), _quiet_transform_errors(), _interrupt_reaches_workers(),
          _workers_output_to(workers_log), beam.Pipeline(options=options) as pipeline):
      build_pipeline(pipeline, paths, input_format, vocab, settings, output_dir,
                     corpus_fingerprint, text_field)
  except BaseException as error:
    _drop_workers_log(workers_log, keep_tail=True)
    _remove_failed(output_dir, existed)
    reported = _one_line_error(error, output_dir)
    if reported is None:
      raise
    raise reported from error
  _drop_workers_log(workers_log, keep_tail=False)
  meta = prepare.load_meta(output_dir)
  _warn_of_splits(meta, settings)
  train = meta["splits"][blocks.TRAIN]
  logging.info("prepare (Beam %s): wrote %s (%d train rows holding %d examples) in %.1f s",
               runner, output_dir, train["rows"], train["examples"], meta["prepare_seconds"])
  return meta
