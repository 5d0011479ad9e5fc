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
  # 400, not 100: BERT's optimizer has no bias correction, so its step at t is (1 - b1^t) /
  # sqrt(1 - b2^t) times a bias-corrected Adam's (3.2x at step 100, 1.7x at 400). With 100 warmup
  # steps the effective peak is 3.2e-3 at step 100, and 2 of 5 seeds collapsed there onto the
  # unigram plateau: held-out MLM 6.0% and 6.8% at step 300 (seeds 2, 3) against 10.1-11.1% for
  # the others, the MLM head's output vectors all alike (mean cosine 0.94 and 0.57, against
  # 0.14-0.24 in runs that learn), so every position predicted the same tokens. Lowering that
  # peak is what lifts seed 2 off the plateau at step 300 (9.9% with 400 warmup steps, 10.1% at
  # lr 5e-4, 9.2% with the bias-corrected "adamw"), and raising it (lr 2e-3) sinks seed 0 (5.8%).
  # 400 steps keep the peak learning rate and BERT's optimizer; benchmarks/quick_start.py.
  config.train.warmup_steps = 400
  config.train.log_every_steps = 50
  config.train.eval_every_steps = 500
  config.train.eval_batch_size = 64
  config.train.eval_max_batches = 0
  config.checkpoint.save_every_steps = 500
  return config
