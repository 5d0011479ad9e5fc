"""Test setup: 8 simulated CPU devices and the suite's compiler flags (`suite_flags.py`, before
jax initialises), one persistent compilation cache for the session, and the repo on sys.path."""

import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_flags import xla_flags  # noqa: E402  (the flags of every process the tests start)

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags(8)).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The launchers the tests start (about 60 processes) compile the same few tiny programs again and
# again: jax's persistent cache, shared through the environment, compiles each once (a launch:
# ~20 s -> ~8 s). The same executables, so the same numbers. A size limit turns on jax's file
# lock, so that processes running side by side never read a half-written entry.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="bert_jax_tests_jit_cache_")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE,
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
                    JAX_COMPILATION_CACHE_MAX_SIZE=str(4 << 30))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
