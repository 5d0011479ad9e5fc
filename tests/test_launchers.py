"""Cluster launchers do what they say: SLURM processes own all of a node's GPUs, the TPU pod
script hands its arguments to train.py unchanged and survives its ssh session, MFU's peak counts
every device."""

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import jax
import pytest
from absl import flags

from bert_jax.runtime import distributed
from bert_jax.models import flops
from bert_jax.training import reporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------ SLURM


def _sbatch_options() -> dict[str, str]:
  with open(os.path.join(ROOT, "launch", "slurm_gpu.sbatch")) as f:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", f.read(), flags=re.M))


def _slurm_env(nodes: int, tasks_per_node: int, gpus_per_node: int, node: int, local: int,
               **extra) -> dict[str, str]:
  """The variables SLURM sets for one task of a job (srun under sbatch)."""
  return {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": f"gpu[001-{nodes:03d}]",
          "SLURM_NTASKS": str(nodes * tasks_per_node),
          "SLURM_PROCID": str(node * tasks_per_node + local), "SLURM_LOCALID": str(local),
          "SLURM_NODEID": str(node), "SLURM_STEP_NUM_NODES": str(nodes),
          "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
          "SLURM_GPUS_ON_NODE": str(gpus_per_node), **extra}


def test_the_sbatch_script_runs_one_process_per_gpu_and_passes_the_cpus_to_srun():
  options = _sbatch_options()
  assert options["ntasks-per-node"] == options["gpus-per-node"] == "8"
  with open(os.path.join(ROOT, "launch", "slurm_gpu.sbatch")) as f:
    text = f.read()
  assert re.search(r"srun [^\n]*--cpus-per-task=\"\$\{SLURM_CPUS_PER_TASK\}\"", text)
  assert subprocess.run(["bash", "-n", os.path.join(ROOT, "launch", "slurm_gpu.sbatch")]).returncode == 0


@pytest.mark.parametrize("tasks_per_node", [8, 1, 2])
def test_slurm_tasks_of_a_node_own_all_its_gpus_together(tasks_per_node):
  nodes, gpus = 3, 8
  for node in range(nodes):
    owned = [distributed.slurm_local_device_ids(_slurm_env(nodes, tasks_per_node, gpus, node, i))
             for i in range(tasks_per_node)]
    assert sorted(sum(owned, [])) == list(range(gpus))  # Every GPU, each once.
    assert all(len(ids) == gpus // tasks_per_node for ids in owned)
  # One process per GPU is JAX's own default: the GPU of the local rank.
  if tasks_per_node == 8:
    assert distributed.slurm_local_device_ids(_slurm_env(nodes, 8, gpus, 2, 5)) == [5]


def test_slurm_tasks_bound_to_their_own_gpus_use_what_they_see():
  # --gpus-per-task=2: SLURM shows each task its own two GPUs (ordinals 0 and 1 for it).
  env = _slurm_env(2, 4, 8, 1, 3, CUDA_VISIBLE_DEVICES="6,7")
  assert distributed.slurm_local_device_ids(env) == [0, 1]


def test_slurm_outside_a_gpu_job_or_with_uneven_gpus():
  env = _slurm_env(2, 8, 8, 0, 0)
  del env["SLURM_GPUS_ON_NODE"]
  assert distributed.slurm_local_device_ids(env) is None  # JAX decides (e.g. CPU jobs).
  assert distributed.slurm_local_device_ids({}) is None
  assert distributed.slurm_local_device_ids({**_slurm_env(2, 8, 8, 0, 0),
                                             "JAX_LOCAL_DEVICE_IDS": "0"}) is None
  with pytest.raises(ValueError, match="8 GPUs on this node do not divide evenly over its 3"):
    distributed.slurm_local_device_ids(_slurm_env(2, 3, 8, 0, 1))


def test_distributed_flag_gives_jax_all_of_the_nodes_devices(monkeypatch):
  """What `--distributed` hands to jax.distributed.initialize under the script's own SLURM
  options, resolved with JAX's own cluster detection: 2 nodes x 8 GPUs, 16 processes that
  together cover every GPU of each node, with one coordinator."""
  from jax._src import clusters  # pylint: disable=import-outside-toplevel
  options = _sbatch_options()
  per_node, gpus = int(options["ntasks-per-node"]), int(options["gpus-per-node"])
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
  values = flags.FlagValues()
  distributed.define_flags(values)
  values(["prog", "--distributed"])
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  monkeypatch.setattr(jax, "process_count", lambda: 16)
  resolved = {}
  for node in range(2):
    for local in range(per_node):
      env = _slurm_env(2, per_node, gpus, node, local)
      with monkeypatch.context() as patch:
        for key in [k for k in os.environ if k.startswith(("SLURM_", "CUDA_VISIBLE", "JAX_"))]:
          patch.delenv(key)
        for key, value in env.items():
          patch.setenv(key, value)
        distributed.initialize_from_flags(values)
        ids = calls[-1]["local_device_ids"]
        resolved[(node, local)] = clusters.ClusterEnv.auto_detect_unset_distributed_params(
            None, None, None, ids, None, 300)
  assert {r[0] for r in resolved.values()} == {f"gpu001:{4242 % 4096 + 61440}"}
  assert sorted(r[2] for r in resolved.values()) == list(range(16))
  assert all(r[1] == 16 for r in resolved.values())
  for node in range(2):
    assert sorted(sum((list(resolved[(node, i)][3]) for i in range(per_node)), [])) == list(range(gpus))


# ------------------------------------------------------------------------------------ TPU pod

_FAKE_PYTHON = """#!{python}
# The worker's .venv/bin/python: says libtpu is there, records train.py's arguments, then
# waits for SIGTERM as a training would (and records it).
import json, os, signal, sys, time
if sys.argv[1] == "-c":
    sys.exit(int(os.environ.get("FAKE_NO_LIBTPU", "0")))
def stop(signum, frame):
    open(os.path.expanduser("~/stopped"), "w").write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
with open(os.path.expanduser("~/argv.json.tmp"), "w") as f:
    json.dump(sys.argv[1:], f)
os.rename(os.path.expanduser("~/argv.json.tmp"), os.path.expanduser("~/argv.json"))
time.sleep(60)
"""

# `gcloud compute tpus tpu-vm ssh NAME --zone=Z --worker=all --command=CMD`, run here: CMD in a
# login shell of the (fake) worker, as ssh runs it.
_FAKE_GCLOUD = """#!/usr/bin/env bash
for arg in "$@"; do
  case "$arg" in --command=*) command="${arg#--command=}" ;; esac
done
echo "$*" > "$HOME/gcloud_args"
cd "$HOME" && exec bash -c "$command"
"""


def _fake_worker(tmp_path, no_venv=False):
  home = tmp_path / "home"
  repo = home / "bert_jax"
  (repo / ".venv" / "bin").mkdir(parents=True)
  python = repo / ".venv" / "bin" / "python"
  python.write_text(_FAKE_PYTHON.format(python=sys.executable))
  python.chmod(0o755)
  if no_venv:
    (tmp_path / "venv_template").mkdir()
    os.rename(repo / ".venv", tmp_path / "venv_template" / ".venv")
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name, text in [("gcloud", _FAKE_GCLOUD), ("gcsfuse", "#!/bin/sh\nexit 0\n")]:
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
         "TPU_NAME": "my v4-32", "ZONE": "us-central2-b", "WORKDIR": "gs://bucket/run one",
         "DATASET_DIR": "gs://bucket/data (wiki)", "CONFIG": "configs/base.py"}
  return home, env


_TRICKY = ["--config.logging.profile_steps=(100, 5)", "--config.train.name=it's \"quoted\"",
           "--config.x=$HOME `date` ; echo no", "--config.y=a\\b *"]


def _pod(env, *args, **kwargs):
  return subprocess.run(["bash", os.path.join(ROOT, "launch", "tpu_pod.sh"), *args], env=env,
                        capture_output=True, text=True, timeout=60, **kwargs)


def _wait_for(path, seconds=30):
  deadline = time.time() + seconds
  while not path.exists():
    assert time.time() < deadline, f"{path} never appeared"
    time.sleep(0.1)


def test_tpu_pod_dry_run_prints_a_command_that_hands_the_arguments_over_unchanged(tmp_path):
  home, env = _fake_worker(tmp_path)
  dry = _pod(env, "--dry_run", *_TRICKY)
  assert dry.returncode == 0, dry.stderr
  assert "--worker=all" in dry.stderr and "my\\ v4-32" in dry.stderr
  assert subprocess.run(["bash", "-n"], input=dry.stdout, text=True).returncode == 0
  assert not (home / "argv.json").exists() and not (home / "gcloud_args").exists()
  # The printed command, run by a (fake) worker, starts train.py with exactly these arguments.
  subprocess.run(["bash", "-c", dry.stdout], cwd=home, env=env, check=True, timeout=60,
                 capture_output=True)
  _wait_for(home / "argv.json")
  argv = json.loads((home / "argv.json").read_text())
  assert argv == ["launch/train.py", "--distributed", "--config=configs/base.py",
                  "--workdir=gs://bucket/run one", "--config.model.dtype=bfloat16",
                  "--config.data.source=prepared",
                  f"--config.data.dataset_dir={home}/gcs/bucket/data (wiki)", *_TRICKY]
  _stop(env, home)


def _stop(env, home):
  stopped = _pod(env, "--stop")
  assert stopped.returncode == 0 and "SIGTERM sent" in stopped.stdout, stopped.stdout + stopped.stderr
  _wait_for(home / "stopped")
  assert (home / "stopped").read_text() == str(int(signal.SIGTERM))


def test_tpu_pod_run_outlives_its_ssh_session_and_stops_with_sigterm(tmp_path):
  home, env = _fake_worker(tmp_path)
  started = _pod(env, *_TRICKY)  # Through the fake gcloud: returns while the run goes on.
  assert started.returncode == 0, started.stderr
  assert "started (pid" in started.stdout
  assert "--zone=us-central2-b --worker=all" in (home / "gcloud_args").read_text()
  _wait_for(home / "argv.json")
  assert json.loads((home / "argv.json").read_text())[-len(_TRICKY):] == _TRICKY
  again = _pod(env)
  assert again.returncode == 1 and "a run is going on here" in again.stderr
  _stop(env, home)
  deadline = time.time() + 30  # The run exits after its save; then there is nothing to stop.
  while "no bert_jax run" not in _pod(env, "--stop").stdout:
    assert time.time() < deadline
    time.sleep(0.2)


def test_tpu_pod_refuses_a_copied_venv_without_libtpu(tmp_path):
  home, env = _fake_worker(tmp_path)
  result = _pod({**env, "FAKE_NO_LIBTPU": "1"})
  assert result.returncode == 1
  assert "~/bert_jax/.venv has no libtpu" in result.stderr
  assert not (home / "argv.json").exists()


def test_tpu_pod_creates_the_venv_with_the_workers_python(tmp_path):
  home, env = _fake_worker(tmp_path, no_venv=True)
  # The worker's Python (PYTHON): `-m venv .venv` puts the fake interpreter in place, and the
  # fake pip records what it was asked to install.
  template = tmp_path / "venv_template" / ".venv"
  pip = template / "bin" / "pip"
  pip.write_text("#!/bin/sh\necho \"$@\" > \"$HOME/pip_args\"\n")
  pip.chmod(0o755)
  worker_python = tmp_path / "bin" / "python3.11"
  worker_python.write_text(f"#!/bin/sh\n[ \"$1\" = -m ] && cp -r {shlex.quote(str(template))} "
                           "\"$3\" && exit 0\nexit 0\n")
  worker_python.chmod(0o755)
  result = _pod({**env, "PYTHON": "python3.11"}, "--config.train.num_train_steps=3")
  assert result.returncode == 0, result.stderr
  assert "-e .[tpu]" in (home / "pip_args").read_text()  # libtpu from the tpu extra
  _wait_for(home / "argv.json")
  _stop(env, home)


# ------------------------------------------------------------------------------------ MFU


@dataclasses.dataclass
class _Device:
  device_kind: str
  platform: str = "gpu"
  process_index: int = 0


def test_mfu_peak_counts_every_device_and_is_never_one_devices_guess():
  known = [_Device("TPU v4", "tpu")] * 8
  assert flops.total_peak_flops(known)[0] == 8 * 275e12
  peak, source = flops.total_peak_flops([_Device("NVIDIA B300 (unreleased)")] * 8)
  assert peak is None and "no MFU is reported" in source
  # 8 simulated CPU devices share this host's cores: one host's peak, not 8 of them.
  cpu_peak, source = flops.total_peak_flops(jax.devices())
  assert len(jax.devices()) == 8 and "1 host" in source
  assert cpu_peak < 3 * flops.measure_matmul_peak()


def test_the_trainer_reports_no_mfu_for_an_unknown_chip(monkeypatch):
  monkeypatch.setattr(jax, "devices", lambda: [_Device("Mystery Accelerator")] * 8)
  task = type("Task", (), {"flops_per_example": lambda self: 1.0e9})()
  assert reporting.peak_flops(task) is None


# ------------------------------------------------------------------------------------ --help

SHARED_FLAGS = {"launch/train.py": ("config", "workdir", "debug", "coordinator_address",
                                    "num_processes", "process_id", "distributed"),
                "launch/finetune.py": ("config", "workdir", "debug", "coordinator_address",
                                       "num_processes", "process_id", "distributed"),
                "launch/downstream.py": ("config", "debug", "checkpoint", "suite", "tasks"),
                "launch/local_multiprocess.py": ("debug", "num_processes")}


@pytest.mark.parametrize("launcher", sorted(SHARED_FLAGS))
def test_help_shows_the_shared_flags_with_their_defaults(launcher):
  """absl's --help lists the launcher module's own flags only; cli.run makes the flags bert_jax
  defines for it (config, workdir, debug, multi-host) its key flags."""
  shown = subprocess.run([sys.executable, launcher, "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout
  listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+):", shown, flags=re.M))
  assert set(SHARED_FLAGS[launcher]) <= listed, (launcher, sorted(listed))
  if "heartbeat_timeout" in listed:
    assert re.search(r"--heartbeat_timeout:.*\n(.*\n)*?\s+\(default: '100'\)", shown)


def test_local_multiprocess_reports_a_bad_flag_in_one_line():
  result = subprocess.run([sys.executable, "launch/local_multiprocess.py", "--num_processes=x",
                           "--", "launch/train.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: bad flag or config override: flag --num_processes=x: invalid literal for int() "
      "with base 10: 'x'"]


def test_local_multiprocess_sigint_stops_its_processes_and_waits_for_them(tmp_path):
  """`kill -INT` of the runner alone (Ctrl-C signals the whole group): it passes SIGINT on,
  waits for its processes, reports their statuses and exits 130 with one error line."""
  marker = tmp_path / "started"
  child = ("import pathlib, sys, time\n"
           f"pathlib.Path({str(marker)!r} + sys.argv[-1].split('=')[1]).touch()\n"
           "time.sleep(120)\n")
  runner = subprocess.Popen(
      [sys.executable, "launch/local_multiprocess.py", "--num_processes=2", "--grace_seconds=30",
       "--", "-c", child], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 60
  while not all((tmp_path / f"started{i}").exists() for i in range(2)):
    assert time.time() < deadline and runner.poll() is None, runner.communicate()
    time.sleep(0.2)
  runner.send_signal(signal.SIGINT)
  out, err = runner.communicate(timeout=60)
  assert runner.returncode == 128 + signal.SIGINT, (out, err)
  assert err.strip().splitlines()[-1].startswith("error: interrupted (SIGINT)"), err
  statuses = re.search(r"\[runner\] exit statuses \[(-?\d+), (-?\d+)\]", out)
  assert statuses and all(int(s) != 0 for s in statuses.groups()), out  # Stopped, not finished.


def test_orbax_leftovers_after_a_failed_read_or_write_go_to_the_log_not_the_console(monkeypatch):
  """After a failed restore, orbax's pending reads are coroutines garbage-collected with their
  error, each printed by Python as a traceback (hundreds of lines under a one-line refusal);
  after a failed save, "Event loop is closed". Both are logged; any other unraisable error
  still goes to Python's own hook, which prints it."""
  import types  # pylint: disable=import-outside-toplevel
  from bert_jax.runtime import cli  # pylint: disable=import-outside-toplevel

  printed = []
  monkeypatch.setattr(sys, "__unraisablehook__", printed.append)
  namespace: dict = {}
  exec(compile("async def _read_array_index_and_device_put():\n  pass\n",  # pylint: disable=exec-used
               os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py"),
               "exec"), namespace)
  orbax_read = namespace["_read_array_index_and_device_put"]()
  ours = namespace["_read_array_index_and_device_put"].__code__.replace(
      co_filename=__file__)  # The same coroutine name, outside orbax.
  for obj, value in ((orbax_read, Exception("Encountered error while reading")),
                     (None, RuntimeError("Event loop is closed")),
                     (types.SimpleNamespace(cr_code=ours), ValueError("a bug of ours"))):
    cli._unraisablehook(types.SimpleNamespace(  # pylint: disable=protected-access
        exc_type=type(value), exc_value=value, exc_traceback=None, err_msg=None, object=obj))
  orbax_read.close()
  assert [str(u.exc_value) for u in printed] == ["a bug of ours"]
