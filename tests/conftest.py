"""Test setup: 8 simulated CPU devices and the suite's compiler flags (`suite_flags.py`, before
jax initialises), one persistent compilation cache for the session, and the repo on sys.path."""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

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
# The processes the tests start import this checkout's bert_jax and configs, also when the venv
# has another checkout installed (`pip install -e .` elsewhere; PYTHONPATH comes first).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

# The suite runs on 2 xdist workers a file at a time (`--dist loadfile --no-loadscope-reorder`,
# README's command). xdist's default order (most tests first) left the few-test, long files
# (multi-process, bucket, mesh sweep) for the end, where one worker ran them alone. Longest file
# first balances the two workers (the longest-processing-time rule): the files below, from the
# suite's `--durations` (longest first), then the rest in name order. Reorder from a fresh
# `--durations=0` when a file's weight changes a lot.
HEAVIEST_FILES = (
    "test_train_e2e.py", "test_multihost.py", "test_cloud_workdir.py", "test_rtd.py",
    "test_diffusion.py", "test_finetune.py", "test_modern_encoder.py", "test_tpu_compile.py",
    "test_embedding.py", "test_beir.py", "test_optimizer.py", "test_interop.py",
    "test_downstream.py", "test_beam_prepare.py", "test_model.py", "test_interop_modern.py",
    "test_convert_predict_guards.py", "test_task_extension.py", "test_train_step.py",
    "test_dropout.py", "test_contrastive.py", "test_diffusion_sft.py", "test_squad2.py",
    "test_hf_heads.py", "test_splash_attention.py", "test_mesh_sweep.py", "test_two_phase.py",
    "test_pipeline.py")


# End-to-end files: they start launchers or other processes (hosts, emulators, Beam workers) or
# train for many steps. `pytest -m "not e2e"` leaves them out: the unit tests, a few minutes.
E2E_FILES = (
    "test_train_e2e.py", "test_cloud_workdir.py", "test_finetune.py", "test_modern_encoder.py",
    "test_multihost.py", "test_stop_signals.py", "test_downstream.py", "test_beam_prepare.py",
    "test_two_phase.py", "test_task_extension.py", "test_local_suite.py", "test_squad2.py",
    "test_convert_predict_guards.py", "test_data_guards.py", "test_mesh_sweep.py",
    "test_cloud_storage.py", "test_launchers.py", "test_docs.py", "test_interop.py",
    "test_interop_modern.py", "test_hf_heads.py", "test_layout.py", "test_train_step.py",
    "test_pipeline.py", "test_sentence_transformers.py", "test_beir.py", "test_tpu_compile.py")
# Single end-to-end tests in otherwise unit files: many steps against a reference.
E2E_TESTS = (
    "test_optimizer.py::test_lamb_trust_ratio_is_per_layer_of_the_stacked_encoder",
    "test_optimizer.py::test_100_steps_equal_the_original_optimizer_on_a_small_model",
    "test_model.py::test_packed_examples_equal_each_example_alone_and_never_see_each_other",
    "test_embedding.py::test_fine_tuning_raises_retrieval_over_the_zero_shot_encoder",
    "test_embedding.py::test_sigterm_saves_and_the_resumed_run_is_bit_identical")


@pytest.fixture(scope="module")
def one_device():
  """In-process trainings on one of the 8 simulated devices: the meshes that
  `sharding.make_mesh` builds without explicit devices (the trainer's, the drivers') hold the
  first device only. For tests whose trainings pin what a mesh does not change (learning,
  resume, errors, exports): on 2 cores the 8-device step costs ~1.4x (compiling 8 partitions).
  The mesh tests pass their devices or run a launcher on 8."""
  import jax  # pylint: disable=import-outside-toplevel
  from bert_jax.training import sharding  # pylint: disable=import-outside-toplevel
  make_mesh = sharding.make_mesh
  with pytest.MonkeyPatch.context() as patch:  # A module's fixtures train on one device too.
    patch.setattr(sharding, "make_mesh", lambda mesh_config, devices=None: make_mesh(
        mesh_config, jax.devices()[:1] if devices is None else devices))
    yield


def pytest_configure(config):
  config.addinivalue_line("markers", "e2e: starts processes or trains for many steps "
                          "(tests/conftest.py E2E_FILES); -m 'not e2e' runs the unit tests")


def pytest_collection_modifyitems(items):
  """Heaviest files first (see HEAVIEST_FILES); the order within a file is kept. Tests of
  E2E_FILES get the e2e marker."""
  for item in items:
    if (os.path.basename(str(item.path)) in E2E_FILES
        or any(item.nodeid.endswith(test) or f"{test}[" in item.nodeid for test in E2E_TESTS)):
      item.add_marker(pytest.mark.e2e)
  rank = {name: i for i, name in enumerate(HEAVIEST_FILES)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.path)), len(rank)))
