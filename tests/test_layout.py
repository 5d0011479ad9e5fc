"""The params layout across the move to a scanned encoder: today's layout (layers stacked [S, ...]
under bert/encoder/layers) and the one saved before (bert/layer_<i>, `LayerNorm` names) convert
both ways exactly, a training checkpoint of the old layout resumes bit-identically, and an old
pretrained directory still loads."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import weights
from bert_jax.checkpoints import integrity as checkpoint_integrity, checkpointing
from bert_jax.models.model import BertConfig, param_shapes
from bert_jax.weights import params as params_lib
from bert_jax.weights import layout
from tests import test_train_e2e
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(workdir: str, steps: int) -> None:
  """test_train_e2e's tiny launch on one device (its compilations are cached already)."""
  result = forked_launch.run(
      [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--workdir={workdir}",
       *test_train_e2e.TINY, "--config.data.source=synthetic",
       f"--config.train.num_train_steps={steps}", "--config.checkpoint.save_every_steps=2",
       "--config.checkpoint.async_save=false"],
      cwd=ROOT, env=test_train_e2e._env(), capture_output=True, text=True, timeout=300)  # pylint: disable=protected-access
  assert result.returncode == 0, result.stderr[-3000:]


def _losses(workdir: str) -> dict[int, float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _random_params(config: BertConfig) -> dict:
  """BertForPreTraining params of `config` (random numpy, in the model's own tree)."""
  rng = np.random.default_rng(0)
  flat = {path: rng.normal(size=shape).astype(np.float32)
          for path, shape in param_shapes(config).items()}
  return params_lib.unflatten(flat)


def test_old_and_new_layouts_convert_both_ways_exactly():
  config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=8)
  params = _random_params(config)
  old = layout.downgrade(params)
  assert sorted(old["bert"]) == ["embeddings", "layer_0", "layer_1", "layer_2", "pooler"]
  assert sorted(old["bert"]["layer_1"]) == ["attention", "attention_LayerNorm", "intermediate",
                                            "output", "output_LayerNorm"]
  assert "LayerNorm" in old["bert"]["embeddings"] and "transform_LayerNorm" in old["mlm"]
  np.testing.assert_array_equal(old["bert"]["layer_2"]["intermediate"]["kernel"],
                                params["bert"]["encoder"]["layers"]["mlp"]["intermediate"][
                                    "kernel"][2])
  assert layout.holds_layout_1(old) and not layout.holds_layout_1(params)
  back = layout.upgrade(old)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  jax.tree.map(np.testing.assert_array_equal, layout.upgrade(params), params)  # Already new.


def test_a_training_checkpoint_of_the_old_layout_resumes_bit_identically(tmp_path):
  """Checkpoint 2 of a run rewritten as the previous bert_jax wrote it (per-layer params and
  optimizer moments): resumed from it, steps 3-4 equal the uninterrupted run's."""
  reference_dir, resumed_dir = str(tmp_path / "reference"), str(tmp_path / "resumed")
  _launch(reference_dir, 4)
  assert _checkpoint_steps(reference_dir) == [2, 4]
  step_dir = os.path.join(resumed_dir, "checkpoints", "2")
  shutil.copytree(os.path.join(reference_dir, "checkpoints", "2"), step_dir)
  state_dir = os.path.join(step_dir, "state")
  with ocp.PyTreeCheckpointer() as checkpointer:
    state = checkpointing.restore_tree(state_dir)  # As numpy, in the saved tree's structure.
    shutil.rmtree(state_dir)
    checkpointer.save(state_dir, layout.downgrade(state))  # What the old layout's save wrote.
  checkpoint_integrity.write_manifest(step_dir)
  assert "layer_0" in checkpointing.restore_tree(state_dir, subtree="params")["bert"]
  _launch(resumed_dir, 4)
  reference, resumed = _losses(reference_dir), _losses(resumed_dir)
  assert sorted(resumed) == [3, 4] and [resumed[s] for s in (3, 4)] == [reference[s]
                                                                         for s in (3, 4)]
  # The old checkpoint also loads as pretrained weights (converted), equal to the new one's.
  _, old_params, _ = weights.load_pretrained(step_dir)
  _, new_params, _ = weights.load_pretrained(os.path.join(reference_dir, "checkpoints", "2"))
  jax.tree.map(np.testing.assert_array_equal, old_params, new_params)


def _checkpoint_steps(workdir: str) -> list[int]:
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def test_a_pretrained_directory_of_the_old_layout_loads(tmp_path):
  config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=8)
  params = _random_params(config)
  directory = weights.save_pretrained(str(tmp_path / "new"), params, config, None)
  info_file = os.path.join(directory, weights.FORMAT_FILE)
  assert json.load(open(info_file))["format_version"] == 2
  # As version 1 wrote it: one subtree per layer.
  shutil.rmtree(os.path.join(directory, "params"))
  checkpointing.save_tree(os.path.join(directory, "params"), layout.downgrade(params))
  json.dump({**json.load(open(info_file)), "format_version": 1}, open(info_file, "w"))
  loaded_config, loaded, _ = weights.load_pretrained(directory)
  assert loaded_config == config
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
