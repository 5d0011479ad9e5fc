"""Meshes that divide 32 chips: every sharded dimension checked against its mesh axes before
compiling (one clear line naming the config fields), and BERT-Base / BERT-Large shapes (their
head counts and 30,522-piece vocabulary, padded) lowering and compiling on 32 simulated devices."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from bert_jax.training import sharding
from bert_jax.models.model import BertConfig
from configs import base
from tests.suite_flags import xla_flags
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = sharding.logical_rules(base.get_config().mesh)
BERT_BASE = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)
BERT_LARGE = dict(hidden_size=1024, num_attention_heads=16, intermediate_size=4096)


def _mesh(data=1, fsdp=1, tensor=1) -> dict[str, int]:
  return {"data": data, "fsdp": fsdp, "tensor": tensor}


def _env(devices: int) -> dict[str, str]:
  return {**os.environ, "XLA_FLAGS": xla_flags(devices),
          "JAX_PLATFORMS": "cpu"}


def test_heads_that_do_not_split_over_tensor_name_both_fields():
  config = BertConfig(**BERT_BASE, vocab_pad_multiple=128)
  with pytest.raises(ValueError) as error:
    sharding.check_divisibility(config, _mesh(fsdp=4, tensor=8), RULES)
  assert str(error.value).startswith(
      "config.model.num_attention_heads=12 does not divide by config.mesh.tensor=8")
  assert "\n" not in str(error.value)
  sharding.check_divisibility(BertConfig(**BERT_LARGE, vocab_pad_multiple=128),
                              _mesh(fsdp=4, tensor=8), RULES)  # 16 heads, 30,592 rows: fine.


def test_the_unpadded_vocabulary_fails_on_tensor_4_and_padding_fixes_it():
  unpadded = BertConfig(**BERT_LARGE, vocab_pad_multiple=1)
  with pytest.raises(ValueError, match=r"config.model.vocab_size=30522 padded to a multiple of "
                     r"config.model.vocab_pad_multiple=1 \(30522 rows\) does not divide by "
                     r"config.mesh.tensor=4.*vocab_pad_multiple to a multiple of 4, e.g. 128"):
    sharding.check_divisibility(unpadded, _mesh(fsdp=8, tensor=4), RULES)
  sharding.check_divisibility(unpadded, _mesh(fsdp=16, tensor=2), RULES)  # 30522 is even.
  for tensor in (2, 4, 8):
    sharding.check_divisibility(BertConfig(**BERT_LARGE, vocab_pad_multiple=128),
                                _mesh(fsdp=32 // tensor, tensor=tensor), RULES)


def test_each_dimension_is_checked_against_the_axes_its_rule_names():
  config = BertConfig(hidden_size=96, num_attention_heads=12, intermediate_size=384,
                      vocab_pad_multiple=128)
  with pytest.raises(ValueError, match=r"config.model.hidden_size=96 does not divide by "
                                       r"config.mesh.fsdp=64 \(the hidden width is split over "
                                       r"fsdp"):
    sharding.check_divisibility(config, _mesh(fsdp=64), RULES)
  # The MLP width over tensor x fsdp by a custom rule: 384 / (8 x 64) is not whole.
  rules = tuple((name, ("tensor", "fsdp") if name == "mlp" else axes) for name, axes in RULES)
  sixteen_heads = dataclasses.replace(config, hidden_size=128, num_attention_heads=16)
  sharding.check_divisibility(sixteen_heads, _mesh(fsdp=64, tensor=8), RULES)
  with pytest.raises(ValueError, match=r"config.model.intermediate_size=384 does not divide by "
                                       r"config.mesh.tensor=8 x config.mesh.fsdp=64"):
    sharding.check_divisibility(sixteen_heads, _mesh(fsdp=64, tensor=8), rules)
  # The head size (kv) is replicated by the default rules; a rule onto data makes it count.
  rules = tuple((name, "data" if name == "kv" else axes) for name, axes in RULES)
  with pytest.raises(ValueError, match=r"num_attention_heads = 8 does not divide by "
                                       r"config.mesh.data=3"):
    sharding.check_divisibility(config, _mesh(data=3), rules)
  with pytest.raises(ValueError, match=r"maps 'heads' to \['model'\]"):
    sharding.check_divisibility(config, _mesh(), (("heads", "model"),))


def test_base_and_large_shapes_lower_and_compile_on_32_devices():
  """benchmarks/mesh_sweep.py at reduced sizes (one layer, head size 8, the real head counts
  and vocabulary) in one process: every mesh lowered (all shardings resolved), BERT-Large-like
  on tensor 8 x fsdp 4 compiled, 12 heads on tensor 8 refused in one line."""
  done = forked_launch.run(
      [sys.executable, "benchmarks/mesh_sweep.py", "--sizes=reduced", "--compile=large:1x4x8"],
      cwd=ROOT, env=_env(32), capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  rows = {(r["model"], r["mesh"]): r for r in map(json.loads, (
      line for line in done.stdout.splitlines() if line.startswith("{")))}
  assert len(rows) == 10
  expected_error = ("config.model.num_attention_heads=12 does not divide by config.mesh.tensor=8 "
                    "(the attention heads are split over tensor by "
                    "config.mesh.logical_axis_rules)")
  refused = rows.pop(("base", "1x4x8"))
  assert (refused["ok"], refused["error"]) == (False, expected_error)
  assert all(r["ok"] for r in rows.values()), [r for r in rows.values() if not r["ok"]]
  compiled = rows[("large", "1x4x8")]
  assert compiled["stage"] == "compiled" and 0 < compiled["train_total_gib"] < 0.1


def test_the_launcher_refuses_12_heads_on_tensor_8_in_one_line():
  done = forked_launch.run(
      [sys.executable, "launch/train.py", "--config=configs/base.py", "--compile_only",
       "--config.mesh.tensor=8", "--config.mesh.data=1", "--config.mesh.fsdp=4",
       "--config.data.source=synthetic", "--config.train.batch_size=32",
       "--config.train.eval_batch_size=32"],
      cwd=ROOT, env=_env(32), capture_output=True, text=True, timeout=120)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines() == [
      "error: config.model.num_attention_heads=12 does not divide by config.mesh.tensor=8 (the "
      "attention heads are split over tensor by config.mesh.logical_axis_rules)"]
