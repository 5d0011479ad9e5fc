r"""Runs N processes of a launcher on this machine as one JAX multi-host job (CPU, gloo).

  python launch/local_multiprocess.py --num_processes=2 --devices_per_process=4 -- \
      launch/train.py --config=configs/tiny.py --config.data.source=synthetic

Each process gets `--coordinator_address=127.0.0.1:PORT --num_processes=N --process_id=i` and
its own forced CPU devices. `--debug` shows the runner's own tracebacks; a bad flag is one
`error:` line (exit status 2). Ctrl-C (or SIGINT to the runner alone) stops the processes too:
the runner waits up to --grace_seconds for them, kills what is left, and exits 130. Output lines are prefixed with the process id. If any process fails,
the others are stopped after --grace_seconds, and the exit status is the first failure's.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from bert_jax.runtime import cli

flags.DEFINE_integer("num_processes", 2, "Processes to start.")
flags.DEFINE_integer("devices_per_process", 4, "Forced CPU devices per process.")
flags.DEFINE_integer("port", 0, "Coordinator port (0: a free one).")
flags.DEFINE_float("grace_seconds", 30.0, "After one process fails, how long the others may "
                   "take to stop by themselves before they are killed.")
FLAGS = flags.FLAGS


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _pump(process: subprocess.Popen, prefix: str) -> None:
  for line in process.stdout:
    sys.stdout.write(f"[{prefix}] {line}")
    sys.stdout.flush()


def main(command: list[str]) -> None:
  """`command`: the launcher and its flags, everything after `--`."""
  if not command:  # One line, as every launcher's usage errors (not absl's usage page).
    print("error: give the launcher and its flags after --, e.g. -- launch/train.py "
          "--config=configs/tiny.py", file=sys.stderr)
    sys.exit(2)
  port = FLAGS.port or _free_port()
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={FLAGS.devices_per_process}")
  env["JAX_PLATFORMS"] = "cpu"
  processes = []
  for index in range(FLAGS.num_processes):
    args = [sys.executable, *command, f"--coordinator_address=127.0.0.1:{port}",
            f"--num_processes={FLAGS.num_processes}", f"--process_id={index}"]
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    threading.Thread(target=_pump, args=(process, f"p{index}"), daemon=True).start()
    processes.append(process)
  try:
    _supervise(processes)
  except KeyboardInterrupt:  # Ctrl-C or `kill -INT` of the runner: the processes stop too.
    _stop_on_interrupt(processes)
    raise


def _stop_on_interrupt(processes: list[subprocess.Popen]) -> None:
  """After SIGINT: each process still running after 1 s (Ctrl-C reached them already, `kill
  -INT` of the runner did not) gets SIGINT; those left after --grace_seconds are killed."""
  deadline = time.time() + 1.0
  while time.time() < deadline and any(p.poll() is None for p in processes):
    time.sleep(0.1)
  for p in processes:
    if p.poll() is None:
      p.send_signal(signal.SIGINT)
  deadline = time.time() + FLAGS.grace_seconds
  while time.time() < deadline and any(p.poll() is None for p in processes):
    time.sleep(0.2)
  for p in processes:
    if p.poll() is None:
      p.kill()
  print(f"[runner] exit statuses {[p.wait() for p in processes]}", flush=True)


def _supervise(processes: list[subprocess.Popen]) -> None:
  """Waits for every process; after a failure, the others get --grace_seconds. Exits with the
  first failure's status (0 if none)."""
  failed_at = None
  status = 0
  while any(p.poll() is None for p in processes):
    codes = [p.poll() for p in processes]
    bad = [c for c in codes if c not in (None, 0)]
    if bad and failed_at is None:
      failed_at, status = time.time(), bad[0]
      print(f"[runner] a process exited with status {bad[0]}; waiting up to "
            f"{FLAGS.grace_seconds:.0f} s for the others", flush=True)
    if failed_at is not None and time.time() - failed_at > FLAGS.grace_seconds:
      for p in processes:
        if p.poll() is None:
          p.kill()
      print("[runner] killed the processes that were still running", flush=True)
    time.sleep(0.2)
  codes = [p.wait() for p in processes]
  status = status or next((c for c in codes if c != 0), 0)
  print(f"[runner] exit statuses {codes}", flush=True)
  sys.exit(status)


if __name__ == "__main__":
  cli.run(main, arguments=True)
