"""Preparation on Apache Beam (`bert_jax/data/beam.py`, DirectRunner): the same records and
statistics as the local path whatever the number of Beam workers, for both objectives and K > 1;
a failed pipeline leaves no bert_meta.json (training refuses the directory in one line); a
retried block or finalize step duplicates nothing; training reads the same first batch.

Needs apache-beam (requirements-beam.txt, which requirements-test.txt includes); skipped without
it, except under CI (CI=true), where a missing Beam fails.
"""

import dataclasses
import glob
import json
import os
import random
import shutil
import tempfile

import pytest

if not os.environ.get("CI"):
  pytest.importorskip("apache_beam")

from bert_jax.data import beam  # noqa: E402
from bert_jax.data import blocks  # noqa: E402
from bert_jax.data import corpus  # noqa: E402
from bert_jax.data import prepare  # noqa: E402
from bert_jax.data import vocab as vocab_lib  # noqa: E402
from bert_jax.data import workers  # noqa: E402
from tests.test_record_inputs import split_records  # noqa: E402

WORDS = [f"w{i}" for i in range(200)]
SETTINGS = blocks.ExampleSettings(
    max_seq_length=48, dupe_factor=2, validation_fraction=0.1, block_chars=3000,
    max_examples_per_row=3, shard_chars=12_000)  # ~50 k characters: 8 shards, ~20 blocks.
ONE_WORKER = ("--direct_num_workers=1",)
THREE_WORKERS = ("--direct_num_workers=3", "--direct_running_mode=multi_processing")


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
  """(files of a corpus in 3 files, a vocabulary trained on it)."""
  root = tmp_path_factory.mktemp("beam_corpus")
  rng = random.Random(0)
  paths = []
  for f in range(3):
    paths.append(str(root / f"part{f}.txt"))
    with open(paths[-1], "w") as out:
      for _ in range(45):
        for _ in range(rng.randint(1, 8)):
          out.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "\n")
        out.write("\n")
  vocab = vocab_lib.train_sentencepiece(corpus.iter_sentences(corpus.iter_bert_format(paths)),
                                        str(root / "sp"), 300, "bpe")
  return paths, vocab


def _local(paths, vocab, settings, output_dir):
  stats = corpus.CorpusStats()
  return prepare.prepare_dataset(
      output_dir, lambda: corpus.iter_bert_format(paths, stats), vocab,
      **dataclasses.asdict(settings), num_workers=0, corpus_stats=lambda: stats,
      corpus_fingerprint="fingerprint")


def _records(dataset_dir: str) -> dict[str, list[bytes]]:
  return split_records(dataset_dir)


def _without_time(meta: dict) -> dict:
  return {k: v for k, v in meta.items() if k != "prepare_seconds"}


@pytest.mark.parametrize("objective,options", [
    ("mlm_nsp", ONE_WORKER), ("mlm_nsp", THREE_WORKERS), ("mlm", THREE_WORKERS)])
def test_beam_writes_the_local_paths_records(corpus_files, tmp_path, objective, options, capfd):
  paths, vocab = corpus_files
  settings = dataclasses.replace(SETTINGS, objective=objective)
  local_meta = _local(paths, vocab, settings, str(tmp_path / "local"))
  beam_meta = beam.prepare_dataset(str(tmp_path / "beam"), paths, "bert", vocab, settings,
                                   beam_options=options, corpus_fingerprint="fingerprint")
  local, from_beam = _records(str(tmp_path / "local")), _records(str(tmp_path / "beam"))
  for split in blocks.SPLITS:
    assert local[split], split
    assert sorted(from_beam[split]) == sorted(local[split])  # The same multiset, byte for byte,
    assert from_beam[split] == local[split]  # in the same order (the same shards).
  # The same statistics (corpus, examples, random-next fallbacks), settings and vocabulary.
  assert _without_time(beam_meta) == _without_time(local_meta)
  assert beam_meta["corpus_stats"]["files"] == 3 and local_meta["settings"]["objective"] == (
      objective)
  assert beam_meta == json.load(open(tmp_path / "beam" / prepare.META_FILE))
  assert len({b.shard for b in blocks.iter_prepared_blocks(
      corpus.iter_bert_format(paths), settings, str(tmp_path / "work"))}) > 1  # Several shards.
  # Nothing left behind: no temporary block files, no TFDS scratch directory.
  assert sorted(os.listdir(tmp_path / "beam")) == sorted(os.listdir(tmp_path / "local"))
  # A run that went well says nothing of Beam's workers (47 lines of their INFO logs and of
  # Beam's warnings about its own flags, with multi_processing, #37).
  console = capfd.readouterr().err
  assert "sdk_worker" not in console and "Worker:" not in console, console[-3000:]
  assert not glob.glob(os.path.join(tempfile.gettempdir(), f"bert_jax_beam_workers_{os.getpid()}*"))


def test_a_full_disk_is_one_line_and_keeps_nothing(corpus_files, tmp_path):
  """A Beam run that filled the disk ended in a 120-line traceback from Beam's runner (#37)."""
  import subprocess
  paths, vocab = corpus_files
  disk = tmp_path / "small_disk"
  disk.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12M", "tmpfs", str(disk)],
                    capture_output=True).returncode != 0:
    pytest.fail("this test needs `mount -t tmpfs` (root), as the CI machine has")
  try:
    vocab.save(str(disk / "vocab"))  # Room for the vocabulary, not for the blocks: the workers
    room = sum(os.path.getsize(disk / "vocab" / n) for n in os.listdir(disk / "vocab"))
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(disk / "filler", "wb") as f:  # fill it (Beam's runner: their traceback).
      f.write(b"\0" * (free - room - 64 * 1024))
    output = str(disk / "out")
    for holds in ("vocab", None):
      if holds is None:  # No room for the vocabulary either: the launcher's own write fails.
        with open(disk / "filler", "ab") as f:
          f.write(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize))
      with pytest.raises(OSError) as error:
        beam.prepare_dataset(output, paths, "bert", vocab, SETTINGS, beam_options=THREE_WORKERS)
      message = str(error.value)
      assert "\n" not in message and message.startswith(
          f"Could not write the dataset in {output}: No space left on device"), message
      assert "Nothing of it was kept" in message and not os.path.exists(output)
      assert ("[while running 'WriteBlocks']" in message) == (holds is not None), message
      assert not glob.glob(os.path.join(tempfile.gettempdir(),
                                        f"bert_jax_beam_workers_{os.getpid()}*"))
      shutil.rmtree(disk / "vocab", ignore_errors=True)
  finally:
    subprocess.run(["umount", "-l", str(disk)], check=False)


class _FailingWrite:
  """`workers.write_block` that fails on one block (a transform that fails)."""

  def __init__(self, original):
    self.original = original

  def __call__(self, block, settings, path, tokenizer=None):
    if block.index == 1:
      raise RuntimeError(f"made to fail on block {block.name}")
    return self.original(block, settings, path, tokenizer)


def test_a_failed_pipeline_leaves_no_meta_and_training_refuses(corpus_files, tmp_path,
                                                               monkeypatch):
  import apache_beam as apache_beam_lib
  from bert_jax import train
  from configs import tiny

  paths, vocab = corpus_files
  monkeypatch.setattr(workers, "write_block", _FailingWrite(workers.write_block))
  # As a killed launcher leaves it: the pipeline's files, and no bert_meta.json.
  killed = str(tmp_path / "killed")
  vocab.save(os.path.join(killed, prepare.VOCAB_DIR))
  with pytest.raises(Exception, match="made to fail"):
    with beam.scratch_tempdir(), apache_beam_lib.Pipeline(
        options=beam.PipelineOptions(list(ONE_WORKER))) as pipeline:
      beam.build_pipeline(pipeline, paths, "bert", vocab, SETTINGS, killed)
  assert os.path.isdir(killed) and not os.path.exists(os.path.join(killed, prepare.META_FILE))
  config = tiny.get_config()
  config.data.update(source="prepared", dataset_dir=killed)
  with pytest.raises(ValueError) as refused:
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert "no bert_meta.json" in str(refused.value) and "\n" not in str(refused.value)
  # Through the launcher's function: what it wrote into the (empty) directory is removed.
  output = tmp_path / "output"
  output.mkdir()
  with pytest.raises(Exception, match="made to fail"):
    beam.prepare_dataset(str(output), paths, "bert", vocab, SETTINGS, beam_options=ONE_WORKER)
  assert os.listdir(output) == []


def test_retried_block_and_finalize_duplicate_nothing(corpus_files, tmp_path):
  paths, vocab = corpus_files
  settings = dataclasses.replace(SETTINGS, max_examples_per_row=SETTINGS.examples_per_row)
  output = str(tmp_path / "dataset")
  blocks_dir = os.path.join(output, beam._BLOCKS_DIR)  # pylint: disable=protected-access
  os.makedirs(blocks_dir)
  vocab.save(os.path.join(output, prepare.VOCAB_DIR))
  found = list(blocks.iter_prepared_blocks(corpus.iter_bert_format(paths), settings,
                                           str(tmp_path / "work")))
  write = beam._WriteBlock(blocks_dir, vocab, settings)  # pylint: disable=protected-access
  results = [r for block in found for r in write.process(block)]
  retried = [r for r in write.process(found[0])]  # A retried (or speculative) attempt.
  assert retried == [r for r in results if r[:3] == retried[0][:3]]
  assert sorted(os.listdir(blocks_dir)) == sorted(f"{b.name}.array_record" for b in found)
  stats = {"files": 3}
  finalize = lambda: beam._finalize(  # pylint: disable=protected-access
      results, stats, output_dir=output, vocab=vocab, settings=settings,
      corpus_fingerprint="", start=0.0)
  finalize()
  first = _records(output)
  os.remove(os.path.join(output, prepare.META_FILE))
  finalize()  # Again, as a retried finalize after its renames: nothing to move, same dataset.
  assert _records(output) == first and sum(map(len, first.values())) == sum(r[5]["rows"]
                                                                             for r in results)


def test_training_reads_the_same_first_batch(corpus_files, tmp_path):
  from bert_jax import train
  from bert_jax.objectives.masking import max_targets_per_row
  from configs import tiny

  paths, vocab = corpus_files
  _local(paths, vocab, SETTINGS, str(tmp_path / "local"))
  beam.prepare_dataset(str(tmp_path / "beam"), paths, "bert", vocab, SETTINGS,
                       beam_options=ONE_WORKER)
  losses = {}
  for name in ("local", "beam"):
    config = tiny.get_config()
    config.model.update(vocab_size=vocab.size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=48)
    config.data.update(source="prepared", dataset_dir=str(tmp_path / name), max_seq_length=48,
                       max_examples_per_row=3)
    config.masking.max_predictions_per_seq = max_targets_per_row(0.15, 48, 3, 3, 5)
    config.train.update(batch_size=8, eval_batch_size=8, eval_max_batches=1, num_train_steps=1,
                        log_every_steps=1, eval_every_steps=0)
    config.checkpoint.update(save_every_steps=0, async_save=False)
    config.logging.tensorboard = False
    train.train_and_evaluate(config, str(tmp_path / f"run_{name}"))
    with open(tmp_path / f"run_{name}" / "metrics.jsonl") as f:
      losses[name] = [r["loss"] for r in map(json.loads, f) if r["split"] == "train"]
  assert len(losses["local"]) == 1 and losses["beam"] == losses["local"]


def test_bucket_input_and_output_go_through_the_workers(corpus_files, tmp_path):
  """gs:// files in, gs:// dataset out (a local GCS emulator): the workers read the bucket's
  files and write each block's file to the bucket; the dataset equals the local path's."""
  from bert_jax.runtime import storage
  from tests import gcs_emulator
  from tests.test_cloud_storage import _download

  paths, vocab = corpus_files
  saved = dict(os.environ)
  server, _ = gcs_emulator.start()
  try:
    root = f"gs://{gcs_emulator.BUCKET}/beam"
    for path in paths:
      with open(path, "rb") as f:
        storage.write_bytes(f"{root}/corpus/{os.path.basename(path)}", f.read())
    meta = beam.prepare_dataset(f"{root}/dataset", [f"{root}/corpus/{os.path.basename(p)}"
                                                    for p in paths],
                                "bert", vocab, SETTINGS, beam_options=ONE_WORKER)
    _download(f"{root}/dataset", str(tmp_path / "downloaded"))
  finally:
    server.stop()
    os.environ.clear()
    os.environ.update(saved)
  local_meta = _local(paths, vocab, SETTINGS, str(tmp_path / "local"))
  assert _records(str(tmp_path / "downloaded")) == _records(str(tmp_path / "local"))
  assert _without_time(meta)["splits"] == local_meta["splits"]
  assert sorted(os.listdir(tmp_path / "downloaded")) == sorted(os.listdir(tmp_path / "local"))


def test_beam_flags_are_checked_before_any_work(corpus_files, tmp_path):
  from bert_jax.data import sources

  paths, _ = corpus_files
  vocab = sources.VocabSource(size=300, model_type="bpe")

  def prepare_with(source, **kwargs):
    with pytest.raises(ValueError) as error:
      sources.prepare_corpus(str(tmp_path / "out"), source, vocab, SETTINGS, **kwargs)
    assert "\n" not in str(error.value)
    return str(error.value)

  assert "--beam_runner reads --input files" in prepare_with(
      sources.CorpusSource(builtin=True), beam_runner="DirectRunner")
  assert "give --beam_runner too" in prepare_with(
      sources.CorpusSource(input=paths), beam_options=["--direct_num_workers=2"])
  assert "is not one of" in prepare_with(sources.CorpusSource(input=paths),
                                         beam_runner="LocalRunner")
  # Beam dropped an unknown option and ran without it; a bad value printed its 140-line usage.
  for options, message in (
      (["--direct_num_workers=2", "--direct_runing_mode=multi_processing"],
       "--beam_options: --direct_runing_mode=multi_processing is not an option of Beam's "
       "runners (a typo? Beam would drop it and run without it)"),
      (["--direct_num_workers=abc"],
       "--beam_options: argument --direct_num_workers: invalid int value: 'abc'"),
      (["stray"], "--beam_options: stray is not an option")):
    assert prepare_with(sources.CorpusSource(input=paths), beam_runner="DirectRunner",
                        beam_options=options).startswith(message)
  beam.check_options(["--direct_num_workers=2", "--direct_running_mode=multi_processing",
                      "--project=p", "--region=r", "--temp_location=gs://b/t"])
  with pytest.raises(ValueError, match="give a bucket"):  # Workers have disks of their own.
    beam.prepare_dataset(str(tmp_path / "out"), paths, "bert", corpus_files[1], SETTINGS,
                         runner="DataflowRunner")
  assert not os.path.exists(tmp_path / "out")


def test_the_launchers_function_trains_the_vocabulary_on_a_bounded_sample(corpus_files,
                                                                        tmp_path, monkeypatch):
  from bert_jax.data import sources

  paths, _ = corpus_files
  # A corpus over the bound: the vocabulary is trained on whole files in a seeded order until
  # the bound is read (here 2 of the 3 files), then the pipeline runs.
  monkeypatch.setattr(sources, "BEAM_VOCAB_SAMPLE_BYTES", os.path.getsize(paths[0]) + 1)
  read = []
  original = corpus.file_documents
  monkeypatch.setattr(corpus, "file_documents",
                      lambda path, *args: read.append(path) or original(path, *args))
  meta = sources.prepare_corpus(
      str(tmp_path / "out"), sources.CorpusSource(input=paths),
      sources.VocabSource(size=280, model_type="bpe"), SETTINGS, beam_runner="DirectRunner",
      beam_options=list(ONE_WORKER))
  sampled = read[:len(read) - len(paths)]  # Then the pipeline reads every file.
  assert len(sampled) == 2 and len(set(sampled)) == 2 and sorted(read[len(sampled):]) == paths
  assert meta["vocab_size"] == 280 and meta["corpus_stats"]["files"] == 3


def test_the_launcher_reports_a_failed_pipeline_in_one_line(corpus_files, tmp_path):
  import subprocess
  import sys

  _, vocab = corpus_files
  vocab.save(str(tmp_path / "vocab"))
  (tmp_path / "one.txt").write_text("one lonely sentence\n")  # No NSP example: Finalize fails.
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(
      [sys.executable, os.path.join(root, "launch", "prepare_data.py"),
       f"--input={tmp_path / 'one.txt'}", f"--output_dir={tmp_path / 'out'}",
       f"--vocab={tmp_path / 'vocab'}", "--beam_runner=DirectRunner"],
      capture_output=True, text=True, timeout=240, cwd=root)
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert done.returncode != 0 and len(errors) == 1 and "Traceback" not in done.stderr
  assert "no training examples" in errors[0]
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl_c", "kill_int"])
def test_sigint_stops_every_beam_worker_and_keeps_nothing(corpus_files, tmp_path, to_group):
  """Ctrl-C in a terminal signals every process of the job; `kill -INT` the launcher alone
  (Beam's DirectRunner then waited forever for its workers)."""
  import signal
  import subprocess
  import sys
  import time

  _, vocab = corpus_files
  vocab.save(str(tmp_path / "vocab"))
  rng = random.Random(1)
  for f in range(4):  # ~4 MB: the pipeline runs for tens of seconds.
    with open(tmp_path / f"big{f}.txt", "w") as out:
      for _ in range(4000):
        for _ in range(rng.randint(2, 8)):
          out.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "\n")
        out.write("\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  output = tmp_path / "out"
  process = subprocess.Popen(
      [sys.executable, os.path.join(root, "launch", "prepare_data.py"),
       f"--input={tmp_path / 'big*.txt'}", f"--output_dir={output}",
       f"--vocab={tmp_path / 'vocab'}", "--dupe_factor=5", "--beam_runner=DirectRunner",
       "--beam_options=--direct_num_workers=2 --direct_running_mode=multi_processing"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
      start_new_session=True)  # Its own process group, as a terminal's foreground job.

  def descendants() -> set[int]:
    found, frontier = set(), [process.pid]
    while frontier:
      listed = subprocess.run(["pgrep", "-P", str(frontier.pop())], capture_output=True,
                              text=True).stdout.split()
      frontier += [int(p) for p in listed]
      found.update(int(p) for p in listed)
    return found

  deadline = time.time() + 120
  while len(descendants()) < 2 and process.poll() is None and time.time() < deadline:
    time.sleep(0.5)  # Until Beam's worker processes run.
  workers_seen = descendants()
  assert len(workers_seen) >= 2 and process.poll() is None, process.communicate()
  time.sleep(3)
  if to_group:
    os.killpg(process.pid, signal.SIGINT)
  else:
    process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=60)
  assert process.returncode == 128 + signal.SIGINT, stderr[-2000:]
  assert stderr.strip().splitlines()[-1] == (
      "error: interrupted (SIGINT); what was being written is not kept (nothing of the dataset "
      "is kept; run the command again)")
  assert "launch/prepare_data.py" not in stderr  # Beam's workers may log their interruption.
  assert not output.exists()
  deadline = time.time() + 30
  while any(os.path.exists(f"/proc/{pid}") for pid in workers_seen) and time.time() < deadline:
    time.sleep(0.5)
  left = [pid for pid in workers_seen if os.path.exists(f"/proc/{pid}")]
  assert not left, f"Beam worker processes still running after Ctrl-C: {left}"
