"""tests/forked_launch.py, which most launcher tests start their launchers through, against
plain processes: the same status, output and end (exception, SystemExit's code or message,
atexit handlers, threads joined), argv, cwd, environment and sys.path."""

import os
import subprocess
import sys
import textwrap

from tests import forked_launch

SCRIPT = textwrap.dedent("""\
    import atexit, os, sys, threading, time
    atexit.register(lambda: print("atexit ran", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
    here = os.path.dirname(os.path.abspath(__file__))
    print("cwd", os.getcwd(), "argv", sys.argv[1:], "path0", sys.path[0] == here,
          "env", os.environ.get("FORKED_PROBE"), "jax", "jax" in sys.modules)
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "raise":
      raise ValueError("boom")
    sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
    """)


def test_a_forked_launch_ends_as_its_own_process_would(tmp_path):
  script = tmp_path / "script.py"
  script.write_text(SCRIPT)
  env = dict(os.environ, FORKED_PROBE="probe")
  command = [sys.executable, str(script)]
  # An environment's first launch is a plain process; the server starts at its second.
  forked_launch.run([*command, "0"], cwd=str(tmp_path), env=env)
  assert not forked_launch.serving(env)
  for how in ("0", "3", "a message", "raise"):
    real = subprocess.run([*command, how], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=60)
    forked = forked_launch.run([*command, how], cwd=str(tmp_path), env=env, timeout=60)
    # The server preloads jax: all a launch sees of it is that the module is imported.
    assert forked.stdout == real.stdout.replace("jax False", "jax True"), how
    assert forked.returncode == real.returncode, how
    assert forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1], how
    assert f"cwd {tmp_path} argv ['{how}'] path0 True env probe" in forked.stdout
    assert forked.stdout.endswith("thread joined\natexit ran\n")
    assert forked_launch.serving(env)
  assert real.returncode == 1 and real.stderr.splitlines()[-1] == "ValueError: boom"


WAITER = textwrap.dedent("""\
    import signal, sys, time
    def stop(signum, frame):
      print("stopping on", signum, flush=True)
      sys.exit(7)
    signal.signal(signal.SIGTERM, stop)
    print("waiting", flush=True)
    time.sleep(60)
    """)


def test_a_forked_child_takes_signals_as_a_popen_does(tmp_path):
  """`forked_launch.popen`: the output as it comes, the child's own handler on SIGTERM and its
  status, -9 after SIGKILL; the first launch of an environment a plain Popen."""
  script = tmp_path / "waiter.py"
  script.write_text(WAITER)
  env = dict(os.environ, FORKED_PROBE="popen")
  first = forked_launch.popen([sys.executable, str(script)], cwd=str(tmp_path), env=env)
  assert isinstance(first, subprocess.Popen)
  first.kill()
  first.wait()
  for signum, status, said in ((15, 7, "stopping on 15\n"), (9, -9, "")):
    child = forked_launch.popen([sys.executable, str(script)], cwd=str(tmp_path), env=env)
    assert isinstance(child, forked_launch.Child)
    assert child.stdout.readline() == "waiting\n" and child.poll() is None
    child.send_signal(signum)
    rest, _ = child.communicate(timeout=30)
    assert (child.returncode, rest) == (status, said)
