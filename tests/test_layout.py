"""The params layout across the move to a scanned encoder: today's layout (layers stacked [S, ...]
under bert/encoder/layers) and the one saved before (bert/layer_<i>, `LayerNorm` names) convert
both ways exactly, a training checkpoint of the old layout resumes bit-identically, and an old
pretrained directory still loads."""

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import checkpoint_integrity, checkpointing, train, weights
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.weights import layout
from configs import tiny


def _tiny_config(workdir_steps: int):
  config = tiny.get_config()
  for name, value in dict(vocab_size=64, hidden_size=32, num_hidden_layers=3,
                          num_attention_heads=2, intermediate_size=64,
                          max_position_embeddings=32).items():
    config.model[name] = value
  config.data.source = "synthetic"
  config.data.max_seq_length = 32
  config.masking.max_predictions_per_seq = 5
  config.train.batch_size = 8
  config.train.num_train_steps = workdir_steps
  config.train.log_every_steps = 1
  config.train.eval_every_steps = 0
  config.checkpoint.save_every_steps = 2
  config.checkpoint.async_save = False
  config.logging.tensorboard = False
  return config


def _losses(workdir: str) -> dict[int, float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_old_and_new_layouts_convert_both_ways_exactly():
  config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=8)
  ids = np.zeros((1, 8), np.int32)
  params = jax.tree.map(np.asarray, jax.tree.map(
      lambda x: x.unbox() if hasattr(x, "unbox") else x,
      BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids, ids[:, :2])["params"],
      is_leaf=lambda x: hasattr(x, "unbox")))
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
  """Checkpoint 2 rewritten as the previous bert_jax wrote it (per-layer params and optimizer
  moments): the resumed steps 3-4 equal the uninterrupted run's."""
  reference_dir, resumed_dir = str(tmp_path / "reference"), str(tmp_path / "resumed")
  train.train_and_evaluate(_tiny_config(4), reference_dir)
  first = train.train_and_evaluate(_tiny_config(2), resumed_dir)
  step_dir = os.path.join(resumed_dir, "checkpoints", "2")
  state_dir = os.path.join(step_dir, "state")
  shutil.rmtree(state_dir)
  with ocp.StandardCheckpointer() as checkpointer:  # What the old layout's save wrote.
    checkpointer.save(state_dir, layout.downgrade(first["state"]))
    checkpointer.wait_until_finished()
  checkpoint_integrity.write_manifest(step_dir)
  assert "layer_0" in checkpointing.restore_tree(state_dir, subtree="params")["bert"]
  train.train_and_evaluate(_tiny_config(4), resumed_dir)
  reference, resumed = _losses(reference_dir), _losses(resumed_dir)
  assert [resumed[s] for s in (3, 4)] == [reference[s] for s in (3, 4)]
  # The old checkpoint also loads as pretrained weights (converted), equal to the new one's.
  _, old_params, _ = weights.load_pretrained(step_dir)
  _, new_params, _ = weights.load_pretrained(os.path.join(reference_dir, "checkpoints", "2"))
  jax.tree.map(np.testing.assert_array_equal, old_params, new_params)


def test_a_pretrained_directory_of_the_old_layout_loads(tmp_path):
  config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=8)
  ids = np.zeros((1, 8), np.int32)
  params = jax.tree.map(np.asarray, jax.tree.map(
      lambda x: x.unbox() if hasattr(x, "unbox") else x,
      BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids, ids[:, :2])["params"],
      is_leaf=lambda x: hasattr(x, "unbox")))
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
