"""The modern encoder at tiny size, for laptops, tests and the quick start: configs/modern_base.py's
architecture and recipe (rotary, GeGLU, pre-LN without biases, local + global attention, MLM
only at 30%, StableAdamW, warmup-stable-decay) at the size and length of configs/tiny.py, with
the same parameter budget in its layers (3 layers of GeGLU 176 ~ tiny's 2 layers of MLP 512).

Run:
  python launch/train.py --config=configs/modern_tiny.py --workdir=runs/modern_tiny
"""

import ml_collections

from configs import modern_base


def get_config() -> ml_collections.ConfigDict:
  config = modern_base.get_config()
  config.model.vocab_size = 8192
  config.model.hidden_size = 128
  config.model.num_hidden_layers = 3  # Global, local, local.
  config.model.num_attention_heads = 2
  config.model.intermediate_size = 176
  config.model.local_attention = 64
  config.data.max_seq_length = 128
  config.data.dupe_factor = 2
  config.masking.max_predictions_per_seq = 40  # round(0.3 x 128) = 38 targets a full row.
  config.train.batch_size = 32
  config.train.num_train_steps = 2000
  config.train.learning_rate = 2e-3
  config.train.warmup_steps = 100
  config.train.decay_fraction = 0.2
  config.train.log_every_steps = 50
  config.train.eval_every_steps = 500
  config.train.eval_batch_size = 64
  config.checkpoint.save_every_steps = 500
  return config
