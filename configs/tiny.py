"""Tiny BERT (2 layers, width 128) for laptops, tests and the README's first command.

Everything not set here comes from configs/base.py.

Run:
  python launch/train.py --config=configs/tiny.py
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.model.vocab_size = 8192
  config.model.hidden_size = 128
  config.model.num_hidden_layers = 2
  config.model.num_attention_heads = 2
  config.model.intermediate_size = 512
  config.model.max_position_embeddings = 128
  config.data.dupe_factor = 2
  config.train.batch_size = 32
  config.train.num_train_steps = 2000
  config.train.learning_rate = 1e-3
  config.train.warmup_steps = 100
  config.train.log_every_steps = 50
  config.train.eval_every_steps = 500
  config.train.eval_batch_size = 64
  config.train.eval_max_batches = 0
  config.checkpoint.save_every_steps = 500
  return config
