"""Several processes on 127.0.0.1 (CPU collectives: gloo) run as one JAX multi-host job:
same losses as one process, cooperative checkpoints, agreed preemption, resume with another
process count, and a clear bounded-time failure when a peer dies."""

import json
import os
import shutil
import signal
import socket
import sys
import time

import pytest

from bert_jax import train
from bert_jax.data import builtin, packing, pipeline
from configs import tiny
from test_train_e2e import ROOT, TINY, _checkpoint_steps, _launch, _train_losses
from tests import forked_launch
from tests.suite_flags import xla_flags

STEPS = 9


def _port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_processes(workdir, dataset_dir, *flags, num_processes=2, heartbeat=100, steps=STEPS):
  """Starts the processes of one job (4 forced CPU devices each); returns the Popen list."""
  port = _port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=xla_flags(8 // num_processes))
  processes = []
  for index in range(num_processes):
    command = [sys.executable, os.path.join(ROOT, "launch/train.py"), f"--workdir={workdir}",
               *TINY, "--config.data.source=prepared", f"--config.data.dataset_dir={dataset_dir}",
               f"--config.train.num_train_steps={steps}", "--config.checkpoint.save_every_steps=3",
               f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num_processes}",
               f"--process_id={index}", f"--heartbeat_timeout={heartbeat}", *flags]
    processes.append(forked_launch.popen(command, cwd=ROOT, env=env))
  return processes


def _finish(processes, timeout=300):
  outputs = [p.communicate(timeout=timeout)[0] for p in processes]
  return [p.returncode for p in processes], outputs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One process x 8 devices, uninterrupted: the losses every other layout must reproduce."""
  workdir = str(tmp_path_factory.mktemp("one_process"))
  result = _launch(workdir, f"--config.train.num_train_steps={STEPS}",
                   "--config.checkpoint.save_every_steps=3")
  assert result.returncode == 0, result.stdout + result.stderr
  data = os.path.join(workdir, "data")
  dataset_dir = os.path.join(data, next(n for n in os.listdir(data) if n.startswith("builtin-")))
  return _train_losses(workdir), dataset_dir


def _assert_same_losses(losses, reference_losses, steps):
  for step in steps:
    assert losses[step] == pytest.approx(reference_losses[step], rel=1e-5), step


def test_preemption_is_agreed_and_resume_works_with_any_process_count(reference, tmp_path):
  reference_losses, dataset_dir = reference
  workdir = str(tmp_path / "preempted")
  processes = _start_processes(workdir, dataset_dir)
  # Once training runs (step 1 logged by process 0), SIGTERM both, as a cluster would.
  deadline = time.time() + 240
  while time.time() < deadline and not (
      os.path.exists(os.path.join(workdir, "metrics.jsonl")) and _train_losses(workdir)):
    time.sleep(0.05)
  for p in processes:
    p.send_signal(signal.SIGTERM)
  codes, outputs = _finish(processes)
  assert codes == [0, 0], outputs
  stopped = _checkpoint_steps(workdir)
  assert stopped and stopped[-1] < STEPS, stopped
  after = range(stopped[-1] + 1, STEPS + 1)
  # Resume with two processes to the end...
  two = str(tmp_path / "resume_two")
  shutil.copytree(workdir, two)
  codes, outputs = _finish(_start_processes(two, dataset_dir))
  assert codes == [0, 0], outputs
  assert f"Resumed from {two}/checkpoints/{stopped[-1]}" in outputs[0]
  _assert_same_losses(_train_losses(two), reference_losses, after)
  # Both processes wrote their part of each checkpoint (one iterator-state file each); only
  # process 0 logs. (2 x 4 devices from step 1 against 1 x 8, and the shares of a checkpoint the
  # processes write together: tests/test_cloud_workdir.py, with the workdir in a bucket.)
  data_files = sorted(os.listdir(os.path.join(two, "checkpoints", str(STEPS), "data")))
  assert [f for f in data_files if f.startswith("process_")] == [
      "process_0-of-2.json", "process_1-of-2.json"]
  assert f"step {STEPS}/" in outputs[0] and f"step {STEPS}/" not in outputs[1]
  # ...and with one process x 8 devices: the state is resharded, and the data position (global
  # batches consumed) means the same examples for any process count.
  one = str(tmp_path / "resume_one")
  shutil.copytree(workdir, one)
  result = _launch(one, "--config.data.source=prepared", f"--config.data.dataset_dir={dataset_dir}",
                   f"--config.train.num_train_steps={STEPS}", "--config.checkpoint.save_every_steps=3")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"Resumed from {one}/checkpoints/{stopped[-1]}" in result.stdout
  _assert_same_losses(_train_losses(one), reference_losses, after)


def test_a_dead_peer_stops_the_job_with_an_error_in_bounded_time(reference, tmp_path):
  _, dataset_dir = reference
  workdir = str(tmp_path / "dead_peer")
  processes = _start_processes(workdir, dataset_dir, "--config.train.num_train_steps=100000",
                               "--config.train.log_every_steps=1", heartbeat=10)
  deadline = time.time() + 240
  while time.time() < deadline and not (
      os.path.exists(os.path.join(workdir, "metrics.jsonl")) and _train_losses(workdir)):
    time.sleep(0.05)
  processes[1].kill()
  killed_at = time.time()
  try:
    output = processes[0].communicate(timeout=90)[0]
  finally:
    processes[0].kill()
  elapsed = time.time() - killed_at
  assert processes[0].returncode != 0
  assert elapsed < 90, elapsed
  # Either JAX's coordination service reports the missing heartbeat, or the collective the peer
  # left half-done fails first (gloo); both name the cause and abort.
  causes = ("heartbeat timeout", "another task died", "gloo")
  assert any(cause in output for cause in causes), output[-3000:]
  print(f"process 0 stopped {elapsed:.1f} s after its peer was killed")


# Objectives whose step draws more than the masks: (flags, metrics compared).
OBJECTIVES = {
    # Replaced-token detection: both encoders, GDES, the samples' per-row seeds.
    "rtd": (("--config.data.objective=rtd_nsp", "--config.rtd.embedding_sharing=gdes",
             "--config.rtd.generator_hidden_fraction=0.5"),
            ("loss", "mlm_accuracy", "disc_accuracy", "disc_auc", "replaced_fraction")),
    # Masked diffusion: a time per example, stratified over the global batch.
    "diffusion": (("--config.data.objective=diffusion",),
                  ("loss", "mlm_accuracy", "masked_nll")),
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_objective_gives_one_process_of_8_devices_losses_on_two_of_4(reference, tmp_path,
                                                                     objective):
  """An objective on 2 processes x 4 devices logs the losses and metrics of 1 process x 8
  devices."""
  _, dataset_dir = reference
  flags, keys = OBJECTIVES[objective]
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  # 1 x 8: this process (8 devices); the launch's flags as config overrides.
  config = tiny.get_config()
  for flag in [*TINY[1:], "--config.train.num_train_steps=3",
               "--config.checkpoint.save_every_steps=3", *flags]:
    path, value = flag[len("--config."):].split("=", 1)
    section, field = path.split(".")
    old = config[section][field]
    config[section][field] = (value == "true" if isinstance(old, bool) else type(old)(value))
  if packing.ROW_FORMATS[config.data.objective] != "mlm_nsp":  # Not the reference's rows.
    home = str(tmp_path / "data")
    prepared = builtin.ensure_builtin(home, builtin.BuiltinSettings.from_config(config))
    dataset_dir, _ = pipeline.resolve_dataset(pipeline.DataSpec.from_config(config), home,
                                              prepared)
  config.data.update(source="prepared", dataset_dir=dataset_dir)
  processes = _start_processes(two, dataset_dir, *flags, steps=3)
  train.train_and_evaluate(config, one)
  codes, outputs = _finish(processes)
  assert codes == [0, 0], outputs
  records = {}
  for name, workdir in (("one", one), ("two", two)):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records[name] = [r for r in map(json.loads, f) if r["split"] == "train"]
  assert [r["step"] for r in records["one"]] == [1, 2, 3] == [r["step"] for r in records["two"]]
  for ours, theirs in zip(records["one"], records["two"]):
    for key in keys:
      assert ours[key] == pytest.approx(theirs[key], rel=1e-5), (ours["step"], key)
