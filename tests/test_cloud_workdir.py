"""Workdirs in a bucket (gs://, a local GCS emulator): pretraining writes its checkpoints,
metrics, TensorBoard events and log there and resumes from them after SIGKILL with the losses of
a local run; two processes share a bucket workdir; fine-tuning and prediction read and write
gs:// workdirs; a bucket workdir's built-in corpus is prepared in a local cache."""

import json
import os
import random
import signal
import sys
import time

import pytest

from bert_jax import finetune, predict, weights
from bert_jax.runtime import storage
from tests import gcs_emulator
from tests.test_finetune import _keyword_rows, _task_vocab, finetune_config
from tests.test_train_e2e import ROOT, TINY
from configs import finetune_classification
from tests.suite_flags import xla_flags
from tests import forked_launch

pytestmark = pytest.mark.usefixtures("one_device")  # tests/conftest.py

STEPS = 8
FLAGS = [*TINY, f"--config.train.num_train_steps={STEPS}", "--config.checkpoint.save_every_steps=4",
         "--config.logging.tensorboard=true"]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
  """(gs:// root, emulator environment, the built-in corpus's local cache directory, the
  emulator)."""
  server, env = gcs_emulator.start()
  yield f"gs://{gcs_emulator.BUCKET}", env, str(tmp_path_factory.mktemp("builtin_cache")), server
  server.stop()


def _launch(workdir, bucket, *flags, wait=True):
  """launch/train.py on the built-in corpus, prepared once into the module's local cache (the
  first run, the local reference, prepares it; a bucket workdir never holds it)."""
  _, env, cache, _ = bucket
  # One CPU device a process: a bucket workdir does not depend on the mesh (a 2-process run
  # is a mesh of 2), and a launch on 8 forced devices takes ~1.4x as long.
  environment = dict(os.environ, **env, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1))
  command = [sys.executable, os.path.join(ROOT, "launch/train.py"), f"--workdir={workdir}",
             *FLAGS, f"--config.data.builtin_cache_dir={cache}", *flags]
  if not wait:
    return forked_launch.popen(command, cwd=ROOT, env=environment)
  return forked_launch.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                        timeout=300)


def _losses(workdir) -> dict[int, float]:
  losses = {}
  for line in storage.read_text(storage.join(workdir, "metrics.jsonl")).splitlines():
    record = json.loads(line)
    if record["split"] == "train":
      losses[record["step"]] = record["loss"]
  return losses


def _steps(workdir) -> list[int]:
  return sorted(int(n) for n in storage.listdir(storage.join(workdir, "checkpoints"))
                if n.isdigit())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, bucket):
  """A local run of the same config: the losses a bucket workdir must reproduce."""
  workdir = str(tmp_path_factory.mktemp("local"))
  result = _launch(workdir, bucket)
  assert result.returncode == 0, result.stdout + result.stderr
  return _losses(workdir)


def test_bucket_workdir_trains_and_resumes_after_sigkill(bucket, reference):
  root = bucket[0]
  workdir = f"{root}/pretrain"
  # Saved synchronously, so that step 4's checkpoint is committed before step 5 starts (an
  # asynchronous save in a bucket takes longer than the two steps to the kill).
  process = _launch(workdir, bucket, "--config.checkpoint.async_save=false", wait=False)
  output = ""
  for line in process.stdout:  # Killed hard at step 6: after the step-4 checkpoint.
    output += line
    if "step 6/8" in line:
      break
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert "step 6/8" in output, output[-3000:]
  assert 4 in _steps(workdir)
  result = _launch(workdir, bucket)
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"Resumed from {workdir}/checkpoints/" in result.stdout
  losses = _losses(workdir)
  assert [losses[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]
  assert _steps(workdir)[-1] == STEPS
  step_dir = f"{workdir}/checkpoints/{STEPS}"
  assert {"state", "data", "meta", "bert_jax_manifest.json"} <= set(storage.listdir(step_dir))
  assert any(n.startswith("events.out.tfevents") for n in
             storage.listdir(f"{workdir}/tensorboard"))
  assert "step 8/8" in storage.read_text(f"{workdir}/train.log")
  assert not storage.exists(f"{workdir}/data")  # The built-in corpus stays in the local cache.
  # The pretrained weights read back from the bucket (convert --from_bert_jax, init_from).
  config, params, _ = weights.load_pretrained(workdir)
  assert config.hidden_size == 32 and set(params) == {"bert", "mlm", "nsp"}


def test_two_processes_share_a_bucket_workdir_and_resume(bucket, reference):
  root = bucket[0]
  workdir = f"{root}/two_processes"
  port = random.randint(20000, 40000)
  for start in range(2):  # Trained to the end; then, without checkpoint 8, again from 4.
    processes = [_launch(workdir, bucket, f"--coordinator_address=127.0.0.1:{port + start}",
                         "--num_processes=2", f"--process_id={i}", wait=False)
                 for i in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    losses = _losses(workdir)  # The later start's losses of steps 5-8 replace the first's.
    for step in range(1, STEPS + 1):  # Equal up to reduction order (gloo between processes).
      assert losses[step] == pytest.approx(reference[step], rel=1e-5), (start, step)
    if start == 0:
      data = storage.listdir(f"{workdir}/checkpoints/4/data")
      assert [n for n in data if n.startswith("process_")] == [
          "process_0-of-2.json", "process_1-of-2.json"]  # Both wrote their share.
      storage.remove_tree(f"{workdir}/checkpoints/{STEPS}")
  assert f"Resumed from {workdir}/checkpoints/4" in outputs[0]
  assert storage.exists(f"{workdir}/train.1.log")  # Each process keeps its own log.


def test_finetuning_and_prediction_in_buckets(bucket, tmp_path):
  root = bucket[0]
  vocab = _task_vocab(tmp_path)
  config = finetune_config(finetune_classification, tmp_path, _keyword_rows, 20, vocab=vocab,
                           seq_len=16, n_train=64)
  config.model.num_hidden_layers = 1
  for name in ("train_file", "validation_file"):  # The data in the bucket too.
    remote = f"{root}/data/{os.path.basename(config.data[name])}"
    storage.write_bytes(remote, storage.read_bytes(config.data[name]))
    config.data[name] = remote
  scratch = f"{root}/finetune_scratch"
  result = finetune.finetune_and_evaluate(config, scratch)
  assert storage.exists(f"{scratch}/final_eval.json") and result["best"]["step"] > 0
  assert storage.listdir(f"{scratch}/best")
  (prediction,) = predict.predict(scratch, [{"text": "we saw it good"}])
  assert prediction["label"] in ("neg", "pos")
  # A second fine-tuning starts from the first one's encoder in the bucket.
  config.init_from, config.vocab = scratch, ""
  again = finetune.finetune_and_evaluate(config, f"{root}/finetune_again")
  assert again["init_from"] == scratch
  assert storage.exists(f"{root}/finetune_again/metrics.jsonl")


def test_sigterm_while_the_bucket_hangs_stops_within_seconds(bucket, reference):
  """Storage that stops answering mid-save (the emulator frozen): a SIGTERM (a scheduler's
  graceful stop) still ends the run within seconds, in one line; the next start takes over the
  lock and trains."""
  root, _, _, server = bucket
  workdir = f"{root}/stuck"
  process = _launch(workdir, bucket, wait=False)
  output = ""
  for line in process.stdout:
    output += line
    if "step 3/8" in line:
      server.pause()  # The step-4 save (and the metrics upload before it) now hang.
    if "step 4/8" in line:
      break
  try:
    time.sleep(1.0)  # Inside the hanging save.
    process.send_signal(signal.SIGTERM)
    signalled = time.time()
    rest, _ = process.communicate(timeout=60)
    stopped_after = time.time() - signalled
  finally:
    server.resume()
  output += rest
  assert "step 4/8" in output, output[-3000:]
  assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
  assert stopped_after < 10, stopped_after
  last = [line for line in output.splitlines() if line.strip()][-1]
  assert last.startswith("error: stopped by SIGTERM while checkpoint 4 had not finished after "
                         "5 s (config.checkpoint.stop_grace_seconds=5)"), output[-3000:]
  assert "Traceback" not in output
  again = _launch(workdir, bucket)
  assert again.returncode == 0, again.stdout + again.stderr
  losses = _losses(workdir)
  assert [losses[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]
