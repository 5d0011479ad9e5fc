"""The real launcher as a subprocess: checkpoints, metrics, resume (bit-exact after SIGKILL and
SIGTERM), and clear errors on bad input before any device work."""

import concurrent.futures
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from tests.suite_flags import xla_flags
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A very small model on a small slice of the built-in corpus.
TINY = [
    "--config=configs/tiny.py",
    "--config.model.vocab_size=1000", "--config.model.hidden_size=32",
    "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=64",
    "--config.data.max_seq_length=64", "--config.data.builtin_max_mb=0.3",
    "--config.data.dupe_factor=1", "--config.data.validation_fraction=0.05",
    "--config.masking.max_predictions_per_seq=10",
    "--config.train.batch_size=16", "--config.train.eval_batch_size=32",
    "--config.train.warmup_steps=2", "--config.train.log_every_steps=1",
    "--config.train.eval_every_steps=0", "--config.checkpoint.save_every_steps=4",
    "--config.logging.tensorboard=false",
]


def _env(devices: int = 1):
  """One CPU device by default: what these launches pin (checkpoints, resume, errors) does not
  depend on the mesh (tests/test_train_step.py and the multi-process tests cover meshes), and a
  launch on 8 forced devices of 2 cores takes ~1.5x as long."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = xla_flags(devices)
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _launch(workdir, *flags, wait=True, timeout=300, devices=1):
  command = [sys.executable, os.path.join(ROOT, "launch/train.py"), f"--workdir={workdir}",
             *TINY, *flags]
  if not wait:
    return forked_launch.popen(command, cwd=ROOT, env=_env(devices))
  return forked_launch.run(command, cwd=ROOT, env=_env(devices), capture_output=True, text=True,
                        timeout=timeout)


def _train_losses(workdir) -> dict[int, float]:
  """step -> loss of the last record logged for that step (a resumed run overwrites)."""
  losses = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      if record["split"] == "train":
        losses[record["step"]] = record["loss"]
  return losses


def _checkpoint_steps(workdir) -> list[int]:
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isascii() and name.isdigit())


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """One uninterrupted 12-step reference run; its prepared data is reused by the others."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  result = _launch(workdir, "--config.train.num_train_steps=12",
                   "--config.train.eval_every_steps=12")
  assert result.returncode == 0, result.stdout + result.stderr
  return workdir, result.stdout + result.stderr


def _fresh_workdir(tmp_path, prepared_workdir):
  """A new workdir that shares the reference run's prepared data (prepared once per session)."""
  workdir = str(tmp_path / "run")
  shutil.copytree(os.path.join(prepared_workdir, "data"), os.path.join(workdir, "data"))
  return workdir


def test_launcher_trains_writes_checkpoints_and_metrics_then_resumes(prepared, tmp_path):
  workdir, output = prepared
  assert "Compiled train step, per device" in output and "GiB in all" in output and "FLOPs per step" in output
  assert _checkpoint_steps(workdir) == [4, 8, 12]
  records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train_records = [r for r in records if r["split"] == "train"]
  assert [r["step"] for r in train_records] == list(range(1, 13))
  for key in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "learning_rate",
              "grad_norm", "tokens_per_sec", "mfu"):
    assert key in train_records[0]
  validation = [r for r in records if r["split"] == "validation"]
  assert len(validation) == 1 and validation[0]["examples"] > 0

  # A second start in the same workdir resumes from step 12 and trains on to 14.
  again = _launch(workdir, "--config.train.num_train_steps=14")
  assert again.returncode == 0, again.stdout + again.stderr
  assert "Resumed from" in again.stdout
  assert _checkpoint_steps(workdir) == [8, 12, 14]  # max_to_keep=3


def _read_until(process, marker, timeout=240) -> str:
  """Reads the child's output until a line contains `marker`; returns what was read."""
  lines, deadline = [], time.time() + timeout
  for line in process.stdout:
    lines.append(line)
    if marker in line or time.time() > deadline:
      break
  return "".join(lines)


def test_resume_after_sigkill_is_bit_identical(prepared, tmp_path):
  reference = _train_losses(prepared[0])
  workdir = _fresh_workdir(tmp_path, prepared[0])
  # The same config as the reference, killed hard while logging step 10: after the step-4
  # checkpoint (complete once the step-8 save has begun) and before the end.
  process = _launch(workdir, "--config.train.num_train_steps=12", wait=False)
  output = _read_until(process, "step 10/12")
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert "step 10/12" in output, output
  assert _checkpoint_steps(workdir)[-1] in (4, 8), _checkpoint_steps(workdir)
  assert 12 not in _checkpoint_steps(workdir)
  result = _launch(workdir, "--config.train.num_train_steps=12")
  assert result.returncode == 0, result.stdout + result.stderr
  resumed_from = int(result.stdout.split("Resumed from ")[1].split()[0].rsplit("/", 1)[1])
  resumed = _train_losses(workdir)
  steps_after = list(range(resumed_from + 1, 13))
  assert [resumed[s] for s in steps_after] == [reference[s] for s in steps_after]


def test_sigterm_saves_exits_zero_and_resumes_identically(prepared, tmp_path):
  reference = _train_losses(prepared[0])
  workdir = _fresh_workdir(tmp_path, prepared[0])
  process = _launch(workdir, "--config.train.num_train_steps=12",
                    "--config.checkpoint.save_every_steps=100", wait=False)
  # SIGTERM as the loop starts: it must finish the step under way, save it and exit 0.
  output = _read_until(process, "Compiled the train step")
  process.send_signal(signal.SIGTERM)
  rest, _ = process.communicate(timeout=120)
  output += rest
  assert process.returncode == 0, output
  assert "Preempted: saved step" in output
  stopped_at = int(output.split("Preempted: saved step ")[1].split()[0])
  assert stopped_at < 12
  assert _checkpoint_steps(workdir) == [stopped_at]
  result = _launch(workdir, "--config.train.num_train_steps=12",
                   "--config.checkpoint.save_every_steps=100")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"Resumed from {workdir}/checkpoints/{stopped_at}" in result.stdout
  resumed = _train_losses(workdir)
  assert [resumed[s] for s in range(1, 13)] == [reference[s] for s in range(1, 13)]


def test_non_finite_loss_stops_without_writing_that_checkpoint(prepared, tmp_path):
  workdir = _fresh_workdir(tmp_path, prepared[0])
  result = _launch(workdir, "--config.train.num_train_steps=12", "--config.train.warmup_steps=0",
                   "--config.train.learning_rate=1e38", "--config.train.max_grad_norm=0")
  assert result.returncode == 1
  last = _stderr_lines(result)[-1]  # The message itself, no traceback.
  assert last.startswith("error: Non-finite loss") and "Traceback" not in result.stderr
  bad_step = int(last.split("at step ")[1].split(";")[0])
  assert all(step < bad_step for step in _checkpoint_steps(workdir))


def _prepared_dataset_dir(workdir):
  data = os.path.join(workdir, "data")
  (name,) = [n for n in os.listdir(data) if n.startswith("builtin-")]
  return os.path.join(data, name)


def test_checkpoint_of_another_model_shape_is_refused(prepared, tmp_path):
  workdir = prepared[0]
  result = _launch(workdir, "--config.train.num_train_steps=20",
                   "--config.model.intermediate_size=96")
  assert result.returncode != 0
  assert "intermediate_size: checkpoint 64 vs config 96" in result.stdout + result.stderr


def test_continued_pretraining_starts_from_given_weights(prepared, tmp_path):
  reference = _train_losses(prepared[0])
  workdir = _fresh_workdir(tmp_path, prepared[0])
  result = _launch(workdir, "--config.train.num_train_steps=2",
                   f"--config.init_from={prepared[0]}")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"Initialised from {prepared[0]}" in result.stdout
  # Same first batch and masks as the reference run, but trained weights: a lower loss.
  assert _train_losses(workdir)[1] < reference[1] - 0.05


def test_compile_only_reports_per_device_memory_without_data(tmp_path):
  command = [sys.executable, os.path.join(ROOT, "launch/train.py"), *TINY,
             "--config.data.source=synthetic", "--compile_only", f"--workdir={tmp_path}"]
  result = forked_launch.run(command, cwd=ROOT, env=_env(devices=8), capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout[result.stdout.index("{"):])
  assert report["devices"] == 8 and report["platform"] == "cpu" and report["fits"] is True
  assert report["per_device_gib"] > report["train_arguments_gib"] > 0
  assert report["collectives"]["all-reduce"]["count"] > 0  # Data-parallel gradients.
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


# ------------------------------------------------------------------ what an operator meets


def _stderr_lines(result) -> list[str]:
  return [line for line in result.stderr.splitlines() if line.strip()]


def _garble(step_dir, keep=()):
  """Overwrites the start of every file of a checkpoint's state (damage on disk), but `keep`."""
  for root, _, names in os.walk(os.path.join(step_dir, "state")):
    for name in names:
      if name not in keep:
        with open(os.path.join(root, name), "r+b") as f:
          f.write(b"\x00garbled\x00")


def _all_checkpoint_names(workdir) -> list[str]:
  return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


def test_a_resume_with_other_settings_is_refused_and_nothing_is_renamed(prepared, tmp_path):
  """Another optimizer (or clipping turned off) does not fit the checkpoint's optimizer state:
  one line naming the field before any compile, not "damaged" checkpoints set aside (#37). A
  run shorter than the checkpoint says so. Stray names in checkpoints/ are ignored with a
  warning, and the right settings resume from the newest checkpoint."""
  from bert_jax.checkpoints import integrity as checkpoint_integrity  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "run")
  shutil.copytree(prepared[0], workdir)
  newest = _checkpoint_steps(workdir)[-1]
  names = _all_checkpoint_names(workdir)
  more = f"--config.train.num_train_steps={newest + 2}"
  cases = [
      ((more, "--config.train.optimizer=adamw"),
       f"error: {workdir}/checkpoints/{newest} was trained with other optimizer settings "
       "(train.optimizer: checkpoint 'bert_adamw', this run 'adamw')"),
      ((more, "--config.train.max_grad_norm=0"), "train.max_grad_norm: checkpoint 1.0, this run "
       "0.0 (clipping on vs off)"),
      ((f"--config.train.num_train_steps={newest - 2}",),
       f"error: {workdir}/checkpoints/{newest} is at step {newest}, past "
       f"config.train.num_train_steps={newest - 2}"),
  ]
  for flags, text in cases:
    result = _launch(workdir, *flags)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert _stderr_lines(result)[-1].startswith("error: ") and text in _stderr_lines(result)[-1]
    assert "Compiled the train step" not in result.stdout
    assert _all_checkpoint_names(workdir) == names  # Nothing renamed, nothing lost.

  # A checkpoint whose meta does not name its optimizer (the check above cannot tell): the
  # restore itself fails on the tree, and the verified checkpoint is refused, not set aside.
  for step in _checkpoint_steps(workdir):
    step_dir = os.path.join(workdir, "checkpoints", str(step))
    meta_file = os.path.join(step_dir, "meta", "metadata")
    meta = json.load(open(meta_file))
    del meta["config"]["train"]["optimizer"]
    json.dump(meta, open(meta_file, "w"))
    checkpoint_integrity.write_manifest(step_dir)
  result = _launch(workdir, more, "--config.train.optimizer=lamb")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert _stderr_lines(result)[-1].startswith(
      f"error: Checkpoint {workdir}/checkpoints/{newest} is intact (it passed its integrity "
      "check) but does not restore into this run's state"), _stderr_lines(result)[-1]
  assert _all_checkpoint_names(workdir) == names

  os.makedirs(os.path.join(workdir, "checkpoints", "backup"))  # Stray names an operator left.
  os.makedirs(os.path.join(workdir, "checkpoints", "\u00b2"))  # "²": str.isdigit, not int().
  resumed = _launch(workdir, more)
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert f"Resumed from {workdir}/checkpoints/{newest}" in resumed.stdout
  assert f"Ignoring 'backup', '\u00b2' in {workdir}/checkpoints: not checkpoint steps" in (
      resumed.stderr)
  assert _checkpoint_steps(workdir)[-1] == newest + 2
  assert not [n for n in _all_checkpoint_names(workdir) if "damaged" in n]


def test_damaged_newest_checkpoint_falls_back_bit_identically(prepared, tmp_path):
  reference = _train_losses(prepared[0])
  workdir = str(tmp_path / "run")
  shutil.copytree(prepared[0], workdir)
  *older, newest = _checkpoint_steps(workdir)  # Trained on to 14 by the first test: [8, 12, 14].
  total = max(reference)
  _garble(os.path.join(workdir, "checkpoints", str(newest)))
  result = _launch(workdir, f"--config.train.num_train_steps={total}")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"Checkpoint {workdir}/checkpoints/{newest} is damaged" in result.stderr
  assert f"Resumed from {workdir}/checkpoints/{older[-1]}" in result.stdout
  assert "Traceback" not in result.stdout + result.stderr
  resumed = _train_losses(workdir)
  steps = range(older[-1] + 1, total + 1)
  assert [resumed[s] for s in steps] == [reference[s] for s in steps]
  assert os.path.isdir(os.path.join(workdir, "checkpoints", f"{newest}.damaged"))  # Kept aside.

  for step in _checkpoint_steps(workdir):  # Everything damaged: one clear line, no training.
    _garble(os.path.join(workdir, "checkpoints", str(step)))
  failed = _launch(workdir, f"--config.train.num_train_steps={total + 2}",
                   "--config.checkpoint.on_damaged=fail")
  assert failed.returncode == 1
  assert _stderr_lines(failed)[-1].startswith(
      f"error: Checkpoint {workdir}/checkpoints/{newest} is damaged")
  failed = _launch(workdir, f"--config.train.num_train_steps={total + 2}")
  assert failed.returncode == 1 and "Traceback" not in failed.stderr
  assert _stderr_lines(failed)[-1].startswith(f"error: Every checkpoint in {workdir}/checkpoints "
                                              "is damaged")


def _mount_tmpfs(directory, size: str) -> bool:
  os.makedirs(directory, exist_ok=True)
  return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", directory],
                        capture_output=True).returncode == 0


def test_a_full_disk_stops_with_one_line_and_the_next_start_resumes(prepared, tmp_path):
  """A workdir on a small disk that fills up after the first checkpoint: the second fails."""
  mount = str(tmp_path / "small_disk")
  if not _mount_tmpfs(mount, "16m"):
    pytest.fail("this test needs `mount -t tmpfs` (root), as the CI machine has")
  try:
    workdir = os.path.join(mount, "run")
    small = ["--config.checkpoint.max_to_keep=5", "--config.data.source=prepared",
             f"--config.data.dataset_dir={_prepared_dataset_dir(prepared[0])}"]
    assert _launch(workdir, "--config.train.num_train_steps=4", *small).returncode == 0
    # Leave 300 KiB free: room for the logs, not for a checkpoint (1.1-2.3 MB here; the size
    # of orbax's files varies from save to save).
    free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
    with open(os.path.join(mount, "filler"), "wb") as f:
      f.write(b"\0" * (free - 300 * 1024))
    result = _launch(workdir, "--config.train.num_train_steps=12", *small)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = _stderr_lines(result)
    assert len(lines) == 1 and "Traceback" not in result.stdout, result.stderr[-3000:]
    assert lines[0].startswith(f"error: Could not write checkpoint 8 in {workdir}/checkpoints: "
                               "No space left on device"), lines
    assert _checkpoint_steps(workdir) == [4]  # The half-written one is not a checkpoint.
    moved = str(tmp_path / "moved")  # The operator frees space: here, a bigger disk.
    shutil.copytree(workdir, moved)
  finally:
    subprocess.run(["umount", "-l", mount], check=False)
  again = _launch(moved, "--config.train.num_train_steps=12", *small)
  assert again.returncode == 0, again.stdout + again.stderr
  assert f"Resumed from {moved}/checkpoints/4" in again.stdout
  assert _checkpoint_steps(moved) == [4, 8, 12]


def test_console_is_quiet_profile_and_input_wait(prepared, tmp_path):
  """A 200-step run with a checkpoint every 50 steps: progress and eval lines, hardly anything
  else; the full log in train.log; a profile of steps 101-103; input_wait_fraction logged."""
  workdir = _fresh_workdir(tmp_path, prepared[0])
  result = _launch(workdir, "--config.train.num_train_steps=200",
                   "--config.train.log_every_steps=20", "--config.train.eval_every_steps=100",
                   "--config.checkpoint.save_every_steps=50",
                   "--config.logging.profile_steps=(100, 3)")
  assert result.returncode == 0, result.stdout + result.stderr
  lines = [l for l in (result.stdout + result.stderr).splitlines() if l.strip()]
  other = [l for l in lines if not l.startswith(("step ", "eval "))]
  assert len(lines) - len(other) == 10 + 2 and len(other) <= 15, other
  log = open(os.path.join(workdir, "train.log")).read()
  assert "step 200/200" in log and "orbax" in log  # Library INFO lines go to the file.
  traces = [f for root, _, names in os.walk(os.path.join(workdir, "profile")) for f in names
            if f.endswith((".xplane.pb", ".trace.json.gz"))]
  assert traces, os.listdir(workdir)
  records = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  waits = [r["input_wait_fraction"] for r in records if r["split"] == "train"]
  assert len(waits) == 10 and all(0.0 <= w < 1.0 for w in waits)


# ------------------------------------------------- nothing hangs, nothing is lost (#20)


def _bind_read_only(directory) -> bool:
  """`directory` made read-only by a read-only bind mount onto itself (root, as in CI): chmod
  does not stop root."""
  os.makedirs(directory, exist_ok=True)
  return (subprocess.run(["mount", "--bind", directory, directory],
                         capture_output=True).returncode == 0
          and subprocess.run(["mount", "-o", "remount,ro,bind", directory],
                             capture_output=True).returncode == 0)


def test_read_only_checkpoints_stop_in_one_line_within_seconds(prepared, tmp_path):
  """A save whose step directory cannot be created used to block for 20 minutes (orbax waited
  for a signal from the thread that failed), with SIGTERM ignored."""
  workdir = _fresh_workdir(tmp_path, prepared[0])
  checkpoints = os.path.join(workdir, "checkpoints")
  if not _bind_read_only(checkpoints):
    pytest.fail("this test needs `mount --bind` (root), as the CI machine has")
  try:
    process = _launch(workdir, "--config.train.num_train_steps=8", wait=False)
    output = _read_until(process, "step 4/8")
    at_save = time.time()
    rest, _ = process.communicate(timeout=120)
    after_save = time.time() - at_save
  finally:
    subprocess.run(["umount", "-l", checkpoints], check=False)
  output += rest
  assert process.returncode == 1, output
  assert after_save < 30, after_save
  lines = [l for l in output.splitlines() if l.strip() and not l.startswith(("step ", "eval "))]
  assert lines[-1].startswith(f"error: Could not write checkpoint 4 in {checkpoints}: Read-only "
                              "file system"), output[-2000:]
  assert "Traceback" not in output and "step 5/8" not in output
  assert not os.listdir(checkpoints)


def test_one_run_per_workdir_and_a_killed_runs_lock_is_taken_over(prepared, tmp_path):
  workdir = _fresh_workdir(tmp_path, prepared[0])
  first = _launch(workdir, "--config.train.num_train_steps=12", wait=False)
  output = _read_until(first, "step 2/12")
  first.send_signal(signal.SIGSTOP)  # Holds the lock (alive) until the second start is refused.
  try:
    second = _launch(workdir, "--config.train.num_train_steps=12")
  finally:
    first.send_signal(signal.SIGCONT)
  assert second.returncode == 1, second.stdout + second.stderr
  line = _stderr_lines(second)[-1]
  assert line.startswith(f"error: {workdir} is in use by another run (host ") and (
      f"pid {first.pid}, started " in line) and "Traceback" not in second.stderr
  rest, _ = first.communicate(timeout=240)
  assert first.returncode == 0, output + rest
  assert _checkpoint_steps(workdir) == [4, 8, 12]  # All of the first run's checkpoints.
  assert not os.path.exists(os.path.join(workdir, "bert_jax.lock"))  # Released at the end.
  steps = [json.loads(l)["step"] for l in open(os.path.join(workdir, "metrics.jsonl"))]
  assert steps == sorted(steps)  # One run's records, not two interleaved.

  # kill -9 leaves the lock behind; the next start takes it over and resumes.
  killed = _launch(workdir, "--config.train.num_train_steps=20", wait=False)
  _read_until(killed, "step 14/20")
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  assert os.path.exists(os.path.join(workdir, "bert_jax.lock"))
  again = _launch(workdir, "--config.train.num_train_steps=20")
  assert again.returncode == 0, again.stdout + again.stderr
  assert f"Taking over the lock of {workdir}: its process {killed.pid} is gone" in again.stderr
  assert f"Resumed from {workdir}/checkpoints/12" in again.stdout


def test_an_empty_or_unparsable_lock_is_taken_over_with_a_warning(tmp_path, caplog,
                                                                 monkeypatch):
  """Such a lock (a run killed while writing it, a file spoiled by hand) blocked the workdir
  for ever, blaming "another run" (#37). In process: what a launcher calls."""
  from bert_jax.runtime import workdir_lock  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(workdir_lock, "_UNREADABLE_SECONDS", 0.2)  # 2 s: a writer's moment.
  lock_file = tmp_path / "bert_jax.lock"
  for content in ("", "{not json", "[1, 2]", '{"host": "h", "heartbeat": "soon"}'):
    lock_file.write_text(content)
    caplog.clear()
    with workdir_lock.hold(str(tmp_path)):
      assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    assert f"Taking over the lock of {tmp_path}: {lock_file} is empty or not a lock record" in (
        caplog.text), content
    assert not lock_file.exists()
  alive = {"host": "elsewhere", "pid": 1, "started": "now", "heartbeat": time.time()}
  lock_file.write_text(json.dumps(alive))  # A live run's lock is still refused.
  with pytest.raises(workdir_lock.LockedError, match="is in use by another run"):
    with workdir_lock.hold(str(tmp_path)):
      pass


def test_another_vocabulary_of_the_same_size_is_refused(prepared, tmp_path):
  """A corpus capped at 0.25 MB trains another 1000-piece vocabulary: same shapes, other ids."""
  workdir = str(tmp_path / "other_vocab")
  other = ["--config.train.num_train_steps=2", "--config.data.builtin_max_mb=0.25"]
  started = _launch(workdir, *other, f"--config.init_from={prepared[0]}")
  assert started.returncode == 1 and "Traceback" not in started.stderr
  assert _stderr_lines(started)[-1].startswith(
      f"error: {prepared[0]} was trained with another vocabulary"), started.stderr
  assert "--config.checkpoint.allow_vocab_change=true" in _stderr_lines(started)[-1]
  shutil.copytree(os.path.join(prepared[0], "checkpoints"), os.path.join(workdir, "checkpoints"),
                  dirs_exist_ok=True)
  resumed = _launch(workdir, *other)
  assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
  assert _stderr_lines(resumed)[-1].startswith(
      f"error: {workdir}/checkpoints/{_checkpoint_steps(workdir)[-1]} was trained with another "
      "vocabulary"), resumed.stderr
  allowed = _launch(workdir, "--config.train.num_train_steps=15",
                    "--config.data.builtin_max_mb=0.25",
                    "--config.checkpoint.allow_vocab_change=true")  # Deliberate surgery.
  assert allowed.returncode == 0, allowed.stdout + allowed.stderr


def test_checkpoint_links_out_of_the_workdir_are_refused(prepared, tmp_path):
  workdir = _fresh_workdir(tmp_path, prepared[0])
  elsewhere = str(tmp_path / "elsewhere")
  shutil.copytree(os.path.join(prepared[0], "checkpoints", "12"), elsewhere)
  os.makedirs(os.path.join(workdir, "checkpoints"))
  os.symlink(elsewhere, os.path.join(workdir, "checkpoints", "12"))
  result = _launch(workdir, "--config.train.num_train_steps=14")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert _stderr_lines(result)[-1] == (
      f"error: {workdir}/checkpoints/12 is a link to {elsewhere}: checkpoints must be directories "
      f"inside {workdir}/checkpoints. Move that checkpoint into the workdir (or remove the link) "
      "and start again")


def test_unrecorded_damaged_checkpoint_falls_back_without_a_traceback(prepared, tmp_path):
  """Killed between orbax's commit and the verification record, then damaged: restoring fails,
  so it is set aside like any damaged checkpoint and the previous one resumed; that one has no
  record either, but is intact, so it is used (trusted on orbax's commit marker)."""
  reference = _train_losses(prepared[0])
  workdir = str(tmp_path / "run")
  shutil.copytree(prepared[0], workdir)
  *older, newest = _checkpoint_steps(workdir)
  newest_dir = os.path.join(workdir, "checkpoints", str(newest))
  os.remove(os.path.join(newest_dir, "bert_jax_manifest.json"))
  os.remove(os.path.join(workdir, "checkpoints", str(older[-1]), "bert_jax_manifest.json"))
  # Its tree (orbax's _METADATA) still reads as this run's, so the unreadable files are damage,
  # not a checkpoint of other settings (those are refused, not set aside).
  _garble(newest_dir, keep=("_METADATA",))
  total = max(reference)
  result = _launch(workdir, f"--config.train.num_train_steps={total}")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"Checkpoint {newest_dir} is damaged: it cannot be restored" in result.stderr
  assert f"Resumed from {workdir}/checkpoints/{older[-1]}" in result.stdout
  assert "Traceback" not in result.stdout + result.stderr
  resumed = _train_losses(workdir)
  steps = range(older[-1] + 1, total + 1)
  assert [resumed[s] for s in steps] == [reference[s] for s in steps]


def _launcher(script, *args, timeout=120):
  return forked_launch.run([sys.executable, os.path.join(ROOT, "launch", script), *args], cwd=ROOT,
                        env=_env(devices=8), capture_output=True, text=True, timeout=timeout)


def _foreign_inputs(tmp_path) -> dict[str, str]:
  """Inputs from elsewhere that are broken: a HF directory whose config.json has a null size, a
  TF checkpoint whose index claims a 100000 x 100000 tensor, a corpus on one line of 1 MB (no
  sentence break; tests/test_data_guards.py reads 5 MB in process)."""
  from tests import test_convert_predict_guards as guards  # pylint: disable=import-outside-toplevel
  from tests import test_data_guards, tf_bundle_writer  # pylint: disable=import-outside-toplevel
  null_config = guards._hf_dir(tmp_path, "null_config")  # pylint: disable=protected-access
  config_file = os.path.join(null_config, "config.json")
  values = json.load(open(config_file))
  json.dump({**values, "vocab_size": None}, open(config_file, "w"))
  absurd = guards._tf_dir(str(tmp_path / "absurd_tf"))  # pylint: disable=protected-access
  tf_bundle_writer.write_bundle(
      absurd, {"bert/embeddings/word_embeddings": np.ones((4, 2), np.float32)},
      tamper={"bert/embeddings/word_embeddings": {"shape": (100_000, 100_000)}})
  one_line = tmp_path / "one_line.txt"
  one_line.write_text(test_data_guards._long_line(1_000_000) + "\n")  # pylint: disable=protected-access
  binary = tmp_path / "random.bin"
  binary.write_bytes(np.random.default_rng(0).integers(0, 256, 100_000, np.uint8).tobytes())
  return {"null_config": null_config, "absurd_tf": absurd, "one_line": str(one_line),
          "binary": str(binary)}


def test_every_bad_input_is_one_line_before_any_compile(prepared, tmp_path):
  """Each bad value or file of the operator's list: the documented exit status, one `error:`
  line last on stderr, no traceback, nothing compiled, and (config values, checked before the
  workdir is touched) nothing written."""
  from tests import test_data_guards as guards  # pylint: disable=import-outside-toplevel
  from bert_jax.data import corpus, vocab as vocab_lib  # pylint: disable=import-outside-toplevel
  text = guards.write_corpus(str(tmp_path / "corpus.txt"), 20, seed=0)
  vocab = vocab_lib.train_sentencepiece(
      corpus.iter_sentences(corpus.iter_bert_format(text)), str(tmp_path / "sp"), 300, "bpe")
  no_validation = guards._prepare(tmp_path, "no_validation", text, vocab,  # pylint: disable=protected-access
                                  validation_fraction=0.0)
  truncated = str(tmp_path / "truncated")
  shutil.copytree(_prepared_dataset_dir(prepared[0]), truncated)
  shard = sorted(glob.glob(os.path.join(truncated, "**", "*train.array_record*"),
                           recursive=True))[0]
  os.truncate(shard, os.path.getsize(shard) // 2)
  foreign = _foreign_inputs(tmp_path)
  small_data = ["--config.data.source=prepared", f"--config.data.dataset_dir={no_validation}",
                f"--config.model.vocab_size={vocab.size}", "--config.data.max_seq_length=32"]
  workdir = str(tmp_path / "never_written")
  train = ["train.py", f"--workdir={workdir}", *TINY]
  # (launcher and flags, exit status, text of the error line). A config value takes one path
  # from flag to error line whatever its field: two stand for all (tests/test_config_checks.py
  # refuses every rule's bad value in process, message by message).
  cases = [
      (*train, "--config.model.num_hidden_layers=-1", 1, "num_hidden_layers=-1"),
      (*train, "--config.model.dtype=fp32", 1, "dtype='fp32'"),
      (*train, "--config.rtd.disc_weight=30", 1, "--config.rtd.disc_weight is not read by "
       "objective 'mlm_nsp'"),
      (*train, "--config.train.eval_batch_size=12", 1, "config.train.eval_batch_size=12 is not "
       "divisible"),
      (*train, "--config.train.lerning_rate=0.1", 2, "lerning_rate"),
      (*train, "--config.train.batch_size=12", 1,
       "batch_size=12 is not divisible by the data x fsdp"),
      (*train, "--config.model.vocab_size=999", "--config.data.source=prepared",
       f"--config.data.dataset_dir={_prepared_dataset_dir(prepared[0])}", 1,
       "vocabulary has 1000 tokens but config.model.vocab_size=999"),
      (*train, "--config.data.source=prepared", "--config.data.dataset_dir=/nonexistent/data", 1,
       "/nonexistent/data"),
      (*train, f"--config.checkpoint.init_from={prepared[0]}", 2,
       "--config.checkpoint.init_from is now --config.init_from"),
      (*train, *small_data, 1, "the validation split is empty"),
      (*train, "--config.data.source=prepared", f"--config.data.dataset_dir={truncated}", 1,
       f"shard {shard} cannot be read"),
      ("finetune.py", f"--workdir={workdir}", "--config=configs/finetune_classification.py",
       "--config.init_from=runs/none", "--config.data.train_file=train.jsonl",
       "--config.train.eval_batch_size=0", 1, "eval_batch_size=0"),
      ("predict.py", "--mode=fill_mask", f"--checkpoint={prepared[0]}", "--text=a [MASK] b",
       "--top_k=-3", 2, "top_k"),
      ("convert.py", f"--from_bert_jax={prepared[0]}", f"--to_hf={prepared[0]}/export",
       "--overwrite", 1, "lies inside"),
      ("convert.py", f"--from_hf={foreign['null_config']}", f"--output_dir={tmp_path}/out_hf",
       1, "config.json: vocab_size is null"),
      ("convert.py", f"--from_tf={foreign['absurd_tf']}", f"--output_dir={tmp_path}/out_tf", 1,
       "for shape (100000, 100000)"),
      # Refused before the workdir is made (#37): a kernel this machine lacks, binary input.
      (*train, "--config.model.attention_impl=cudnn", 1,
       "config.model.attention_impl='cudnn' needs an NVIDIA GPU"),
      ("prepare_data.py", f"--input={foreign['binary']}", f"--output_dir={tmp_path}/binary",
       1, f"Input file {foreign['binary']} is not text"),
      ("prepare_data.py", f"--input={foreign['one_line']}", "--input_format=bert",
       f"--output_dir={tmp_path}/one_line_data", "--vocab_size=300", "--max_seq_length=32",
       "--validation_fraction=0", 1, "no training examples"),
  ]

  def run(case):
    return case, _launcher(*case[:-2])

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for (*args, status, text_), result in pool.map(run, cases):
      lines = _stderr_lines(result)
      assert result.returncode == status, (args, result.stderr[-2000:])
      assert lines[-1].startswith("error: ") and text_ in lines[-1], (args, lines[-3:])
      assert "Traceback" not in result.stderr + result.stdout, args
      assert "Compiled the train step" not in result.stdout, args
  assert not os.path.exists(workdir)
  assert _checkpoint_steps(prepared[0])  # The converted-onto run is intact.

  # SIGINT (Ctrl-C) in training, a checkpoint saved after every step (so most likely while
  # one is written): one line, exit 130; a restart resumes. (tests/test_stop_signals.py: in a
  # compile.)
  run_dir = _fresh_workdir(tmp_path, prepared[0])
  process = _launch(run_dir, "--config.train.num_train_steps=12",
                    "--config.checkpoint.save_every_steps=1", wait=False)
  output = _read_until(process, "step 6/12")
  process.send_signal(signal.SIGINT)
  rest, _ = process.communicate(timeout=60)
  lines = [l for l in (output + rest).splitlines() if l.strip()]
  assert process.returncode == 130 and lines[-1].startswith("error: interrupted (SIGINT)"), lines[-5:]
  assert "Traceback" not in output + rest
  again = _launch(run_dir, "--config.train.num_train_steps=12")
  assert again.returncode == 0 and "Resumed from" in again.stdout, again.stderr[-2000:]
