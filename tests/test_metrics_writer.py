"""The metric writer (bert_jax/runtime/metrics_writer.py): metrics.jsonl and TensorBoard events,
with tensorboardX imported without torch (2 s a process otherwise), torch still importable."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, os, sys
from bert_jax.runtime.metrics_writer import MetricWriter
writer = MetricWriter(sys.argv[1], tensorboard=True)
writer.write(3, "train", {"loss": 1.5})
writer.close()
torch_loaded = "torch" in sys.modules
import torch  # Still importable afterwards.
print(json.dumps({"torch_loaded": torch_loaded, "torch": torch.__version__,
                  "events": sorted(os.listdir(os.path.join(sys.argv[1], "tensorboard"))),
                  "jsonl": open(os.path.join(sys.argv[1], "metrics.jsonl")).read()}))
"""


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
  done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 0, done.stderr[-2000:]
  import json  # pylint: disable=import-outside-toplevel
  result = json.loads(done.stdout.splitlines()[-1])
  assert result["torch_loaded"] is False and result["torch"]
  assert any(name.startswith("events.out.tfevents") for name in result["events"])
  assert json.loads(result["jsonl"])["loss"] == 1.5
