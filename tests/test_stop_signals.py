"""SIGTERM handling (bert_jax/runtime/stop_signals.py): the handler never waits for a lock, a stop
request is announced once by the main thread, and waits honour the grace and a second SIGTERM."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from bert_jax.runtime import stop_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A process that logs long records into train.log (through the launchers' file handler) while
# SIGTERMs arrive: a handler that logged itself would wait for the lock the interrupted write
# holds. Before the fix this hung 5 times out of 5 (CI saw it as a 120 s timeout in the SIGTERM
# end-to-end test).
_LOGGING_UNDER_SIGTERM = textwrap.dedent("""
    import logging, os, signal, sys, threading, time
    from bert_jax.runtime import cli, stop_signals
    cli.log_to_file(sys.argv[1], 0)
    stop = stop_signals.StopSignals(grace_seconds=5.0).install()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    deadline = time.time() + 1.5
    while time.time() < deadline:
      logging.getLogger("load").warning("x" * 20000)
    stop.announce()
    stop.announce()
    print("requested", stop.requested, flush=True)
""")


def test_a_sigterm_during_a_log_write_does_not_deadlock(tmp_path):
  result = subprocess.run([sys.executable, "-c", _LOGGING_UNDER_SIGTERM, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
  assert result.returncode == 0, result.stderr[-2000:]
  assert "requested True" in result.stdout
  with open(tmp_path / "train.log", encoding="utf-8") as f:
    notices = [line for line in f if "SIGTERM (at" in line]
  assert len(notices) == 1, notices  # Announced once, by the main thread.


@pytest.fixture
def installed():
  stop = stop_signals.StopSignals(grace_seconds=0.3).install()
  yield stop
  stop.restore()


def test_a_wait_that_began_after_the_sigterm_runs_to_its_end(installed):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.05)
  assert installed.requested
  # The graceful save: longer than the grace, and still not cut.
  assert installed.wait(lambda: time.sleep(0.8) or "saved", "a save") == "saved"


def test_a_sigterm_during_a_wait_gives_it_the_grace_then_stops_it(installed):
  threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
  started = time.time()
  with pytest.raises(stop_signals.Interrupted, match="stop_grace_seconds=0.3") as raised:
    installed.wait(lambda: time.sleep(30), "a stuck write")
  assert raised.value.exit_status == 143
  assert time.time() - started < 5


def test_a_second_sigterm_stops_at_once(installed):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.05)
  with pytest.raises(stop_signals.Interrupted, match="second SIGTERM"):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # The handler raises in this (main) thread.


# The launcher run as __main__, with a SIGINT sent from a timer thread 0.05 s after the train
# step's XLA compile (`Lowered.compile`, compile_step) has begun: the signal lands while XLA's
# compile threads run, whatever the machine's speed (a delay after start did not: on a fast
# machine the whole run ended first).
_SIGINT_IN_THE_COMPILE = textwrap.dedent("""
    import os, runpy, signal, sys, threading
    from jax._src import stages
    original = stages.Lowered.compile
    def compile_and_interrupt(self, *args, **kwargs):
      print("compile began", flush=True)
      threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
      return original(self, *args, **kwargs)
    stages.Lowered.compile = compile_and_interrupt
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_sigint_during_a_compile_exits_130_after_one_line(tmp_path):
  """Ctrl-C while XLA compiled printed the right line, then segfaulted in the interpreter's
  teardown under XLA's compile threads: exit 139, not 130 (#37). tests/test_train_e2e.py
  interrupts a run between its steps and saves."""
  from tests.test_train_e2e import TINY, _env  # pylint: disable=import-outside-toplevel
  result = subprocess.run(
      [sys.executable, "-c", _SIGINT_IN_THE_COMPILE, os.path.join(ROOT, "launch", "train.py"),
       f"--workdir={tmp_path}", *TINY, "--config.data.source=synthetic",
       "--config.train.num_train_steps=8"],
      cwd=ROOT, env={**_env(), "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
  assert "compile began" in result.stdout, result.stderr[-3000:]
  assert "Compiled the train step" not in result.stdout  # Stopped in the compile, not after.
  assert result.returncode == 130, (result.returncode, result.stderr[-3000:])
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert lines[-1].startswith("error: interrupted (SIGINT)"), lines[-5:]
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_compile_only_compile_stops_at_once_in_one_line(name):
  """--compile_only --topology: libtpu's handler printed a stack trace on SIGTERM, and Python's
  handlers wait for a compile to return (minutes for a large config). Both signals now end the
  process at once with one line (`cli.stop_at_once_on_signals`); nothing is written."""
  from tests.test_train_e2e import TINY, _env  # pylint: disable=import-outside-toplevel
  script = _SIGINT_IN_THE_COMPILE.replace("signal.SIGINT", f"signal.{name}")
  start = time.time()
  result = subprocess.run(
      [sys.executable, "-c", script, os.path.join(ROOT, "launch", "train.py"), *TINY,
       "--config.data.source=synthetic", "--compile_only", "--topology=v5e:2x2"],
      cwd=ROOT, env={**_env(), "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"},
      capture_output=True, text=True, timeout=300)
  assert "compile began" in result.stdout, result.stderr[-3000:]
  assert "{" not in result.stdout  # No report.
  number = getattr(signal, name)
  assert result.returncode == 128 + number, (result.returncode, result.stderr[-3000:])
  assert result.stderr.strip() == (f"error: stopped by {name} during --compile_only; nothing "
                                   "was written")
  assert time.time() - start < 120


def test_errors_of_the_wait_come_back_to_the_caller():
  with pytest.raises(ValueError, match="disk"):
    stop_signals.interruptible(lambda: (_ for _ in ()).throw(ValueError("disk")), "a write")
