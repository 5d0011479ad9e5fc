"""Launcher processes for the tests, forked from a process that has already imported jax and
bert_jax: `run` is `subprocess.run([sys.executable, "launch/X.py", ...])` less the ~3 s every
new Python process spends importing them and tearing them down at exit.

A server (this file run as a script) imports the modules, then forks one child per request. The
child is a fresh launcher in all that a test can see:
- a new process (its own pid, which `run` kills on a timeout) with the request's argv, cwd,
  environment and stdin/stdout/stderr (the caller's pipes, passed over a Unix socket);
- the script runs as `__main__` (`runpy`), and ends as `python script.py` ends: an exception's
  traceback on stderr and status 1, `SystemExit`'s code, non-daemon threads joined, atexit
  handlers, stdio flushed (then `os._exit`: the teardown of the imported modules, ~1.2 s, is
  all it skips); `cli.run`'s own `os._exit` after a signal;
- jax's backends are not initialised before the fork (the server never computes), so each child
  reads XLA_FLAGS (its device count) and initialises its own.

Environment read at import time (jax's JAX_* options, PYTHONPATH) is the server's: there is one
server per distinct environment, started with it, so a child never sees an import made under
another environment. Tests that signal a launcher mid-run (`Popen`) start real processes.
"""

import atexit
import hashlib
import io
import json
import os
import runpy
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

# What a launcher imports before it parses its flags: the bulk of its start.
PRELOAD = ("jax", "flax.linen", "optax", "orbax.checkpoint", "grain", "ml_collections",
           "absl.app", "absl.flags", "bert_jax.runtime.cli", "bert_jax.train", "bert_jax.finetune")
_LENGTH = struct.Struct("<I")


# ------------------------------------------------------------------------------- the server


def _serve(path: str) -> None:
  for name in PRELOAD:
    __import__(name)
  server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  server.bind(path)
  server.listen(64)
  print("ready", flush=True)
  while True:
    conn, _ = server.accept()
    header, fds, _, _ = socket.recv_fds(conn, _LENGTH.size, 3)
    (length,) = _LENGTH.unpack(header)
    payload = b""
    while len(payload) < length:
      payload += conn.recv(length - len(payload))
    request = json.loads(payload)
    pid = os.fork()
    if pid == 0:
      server.close()
      conn.close()
      _child(request, fds)  # Ends the child's process as `python script.py` ends.
    for fd in fds:
      os.close(fd)
    threading.Thread(target=_report, args=(conn, pid), daemon=True).start()


def _report(conn: socket.socket, pid: int) -> None:
  """Tells the client the child's pid, then its exit status (subprocess's returncode)."""
  with conn:
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def _child(request: dict, fds: list[int]) -> None:
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  script = os.path.abspath(request["argv"][0])
  sys.argv = [script, *request["argv"][1:]]
  sys.path[0] = os.path.dirname(script)  # As `python script.py` sets it.
  code = 0
  try:
    runpy.run_path(script, run_name="__main__")
  except SystemExit as e:  # As the interpreter treats the code of an uncaught SystemExit.
    code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    if not isinstance(e.code, (int, type(None))):
      print(e.code, file=sys.stderr)
  except BaseException:  # pylint: disable=broad-except
    sys.excepthook(*sys.exc_info())
    code = 1
  # The interpreter's exit, less tearing down the modules (~1.2 s in a process that has jax):
  # non-daemon threads joined, atexit handlers, stdio flushed.
  threading._shutdown()  # pylint: disable=protected-access
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  os._exit(code)


# ------------------------------------------------------------------------------- the client

_SERVERS: dict[str, tuple[subprocess.Popen, str]] = {}  # Most recently used last.
_SEEN: set[str] = set()  # Environments launched in once (by a plain process).
MAX_SERVERS = 3  # Per test process: each holds its imports (~400 MB).
_LOCK = threading.Lock()
_SOCKETS = tempfile.mkdtemp(prefix="bert_jax_forked_launch_")


def _stop(process: subprocess.Popen) -> None:
  process.kill()
  process.wait()
  process.stdout.close()  # Its stderr is read to its end by a thread, which closes nothing.


def _stop_servers() -> None:
  for process, _ in _SERVERS.values():
    _stop(process)
  shutil.rmtree(_SOCKETS, ignore_errors=True)


atexit.register(_stop_servers)


def _key(env: dict[str, str]) -> str:
  return hashlib.sha256(json.dumps(sorted(env.items())).encode()).hexdigest()[:16]


def serving(env: dict[str, str]) -> bool:
  """Whether launches in `env` are forked from a running server."""
  key = _key(env)
  return key in _SERVERS and _SERVERS[key][0].poll() is None


def _server(env: dict[str, str], cwd: str) -> str | None:
  """The socket of the server for `env`, started (its imports done) at the second launch in
  that environment; None at the first (a test's own environment, used once, would pay the
  server's start for nothing)."""
  key = _key(env)
  with _LOCK:
    if key in _SERVERS and _SERVERS[key][0].poll() is None:
      _SERVERS[key] = _SERVERS.pop(key)
      return _SERVERS[key][1]
    if key not in _SEEN:
      _SEEN.add(key)
      return None
    while len(_SERVERS) >= MAX_SERVERS:
      _stop(_SERVERS.pop(next(iter(_SERVERS)))[0])
    path = os.path.join(_SOCKETS, key)
    if os.path.exists(path):
      os.remove(path)
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), path], env=env,
                               cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if process.stdout.readline().strip() != "ready":
      raise RuntimeError(f"forked_launch: the server did not start: {process.stderr.read()}")
    threading.Thread(target=process.stderr.read, daemon=True).start()  # Never blocks it.
    _SERVERS[key] = (process, path)
    return path


def _text(data: bytes) -> str:
  """As `subprocess.run(text=True)` decodes: UTF-8, universal newlines."""
  return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run(command: list[str], *, cwd: str, env: dict[str, str] | None = None,
        timeout: float | None = None, capture_output: bool = True,
        text: bool = True) -> subprocess.CompletedProcess:
  """`subprocess.run(command, env=env, cwd=cwd, timeout=timeout, capture_output=True,
  text=True)`: for `command` = [sys.executable, SCRIPT.py, *args] a forked child (a plain
  process at an environment's first launch), for any other command a plain process."""
  assert capture_output and text, "forked_launch.run captures text output only"
  env = dict(os.environ if env is None else env)
  forkable = command[0] == sys.executable and command[1].endswith(".py")
  path = _server(env, cwd) if forkable else None  # `python -c ...`: a plain process.
  if path is None:
    return subprocess.run(command, cwd=cwd, env=env, timeout=timeout, capture_output=True,
                          text=True, check=False)
  out_read, out_write = os.pipe()
  err_read, err_write = os.pipe()
  stdin = os.open(os.devnull, os.O_RDONLY)
  payload = json.dumps({"argv": command[1:], "env": env, "cwd": cwd}).encode()
  with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
    conn.connect(path)
    socket.send_fds(conn, [_LENGTH.pack(len(payload))], [stdin, out_write, err_write])
    conn.sendall(payload)
    for fd in (stdin, out_write, err_write):
      os.close(fd)
    outputs: dict[int, bytes] = {}

    def drain(fd: int) -> None:
      with os.fdopen(fd, "rb") as f:
        outputs[fd] = f.read()

    readers = [threading.Thread(target=drain, args=(fd,), daemon=True)
               for fd in (out_read, err_read)]
    for reader in readers:
      reader.start()
    replies = conn.makefile("r")
    pid = int(replies.readline())
    conn.settimeout(timeout)
    try:
      returncode = int(replies.readline())
    except (TimeoutError, socket.timeout):
      os.kill(pid, 9)
      for reader in readers:
        reader.join()
      raise subprocess.TimeoutExpired(command, timeout, _text(outputs.get(out_read, b"")),
                                      _text(outputs.get(err_read, b""))) from None
    for reader in readers:
      reader.join()
  return subprocess.CompletedProcess(command, returncode, _text(outputs[out_read]),
                                     _text(outputs[err_read]))


class Child:
  """`subprocess.Popen(command, stdout=PIPE, stderr=STDOUT, text=True)`'s face of a forked
  launch: `pid` (signal it), `stdout` (its text, stderr merged), `poll`, `wait`,
  `communicate`, `send_signal`, `kill`, `terminate`, `returncode`."""

  def __init__(self, command: list[str], path: str, env: dict[str, str], cwd: str):
    self.args = command
    read, write = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    payload = json.dumps({"argv": command[1:], "env": env, "cwd": cwd}).encode()
    self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    self._conn.connect(path)
    socket.send_fds(self._conn, [_LENGTH.pack(len(payload))], [stdin, write, write])
    self._conn.sendall(payload)
    for fd in (stdin, write):
      os.close(fd)
    self.stdout = io.TextIOWrapper(os.fdopen(read, "rb"), encoding="utf-8")
    self._replies = self._conn.makefile("r")
    self.pid = int(self._replies.readline())
    self.returncode: int | None = None
    self._done = threading.Event()
    threading.Thread(target=self._wait_for_status, daemon=True).start()

  def _wait_for_status(self) -> None:
    line = self._replies.readline()
    self.returncode = int(line) if line else -9
    self._conn.close()
    self._done.set()

  def poll(self) -> int | None:
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    if not self._done.wait(timeout):
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, timeout: float | None = None) -> tuple[str, None]:
    rest = self.stdout.read()  # Until the child (the pipe's only writer) has exited.
    self.wait(timeout)
    return rest, None

  def send_signal(self, signum: int) -> None:
    if self.returncode is None:
      os.kill(self.pid, signum)

  def kill(self) -> None:
    self.send_signal(9)

  def terminate(self) -> None:
    self.send_signal(15)


def popen(command: list[str], *, cwd: str, env: dict[str, str] | None = None):
  """`subprocess.Popen(command, cwd=cwd, env=env, stdout=PIPE, stderr=STDOUT, text=True)`: a
  forked `Child` for [sys.executable, SCRIPT.py, *args] once the environment has a server, a
  plain process otherwise."""
  env = dict(os.environ if env is None else env)
  forkable = command[0] == sys.executable and command[1].endswith(".py")
  path = _server(env, cwd) if forkable else None
  if path is None:
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
  return Child(command, path, env, cwd)


if __name__ == "__main__":
  _serve(sys.argv[1])
