"""BERT-Large pretraining (24 layers, width 1024, 16 heads); the rest as configs/base.py.

Run:
  python launch/train.py --config=configs/large.py --workdir=runs/large
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.model.hidden_size = 1024
  config.model.num_hidden_layers = 24
  config.model.num_attention_heads = 16
  config.model.intermediate_size = 4096
  return config
