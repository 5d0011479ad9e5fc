"""The modern encoder, large size (ModernBERT-large's shape): 28 layers, width 1024, 16 heads,
GeGLU MLP (2624 per half); the recipe as configs/modern_base.py (ModernBERT-large's peak
learning rate, 5e-4). Its 4,608 rows of 1,024 tokens need microbatches on TPUs (a v5e chip holds 4
rows): check a slice with --compile_only --topology=... (docs/tpu.md).

Run:
  python launch/train.py --config=configs/modern_large.py --workdir=runs/modern_large \
      --config.data.source=prepared --config.data.dataset_dir=data/modern
"""

import ml_collections

from configs import modern_base


def get_config() -> ml_collections.ConfigDict:
  config = modern_base.get_config()
  config.model.hidden_size = 1024
  config.model.num_hidden_layers = 28
  config.model.num_attention_heads = 16
  config.model.intermediate_size = 2624
  config.train.learning_rate = 5e-4
  return config
