"""Replaced-token detection at the quick start's size: configs/tiny.py's encoder (2 layers, width
128) as the discriminator, a generator a quarter as wide (32, one head, 2 layers, as ELECTRA-Small's
1/4), tied embeddings (ELECTRA), λ = 50, on the built-in corpus's MLM rows (no NSP, as ELECTRA).

Run:
  python launch/train.py --config=configs/electra_tiny.py --workdir=runs/electra_tiny
"""

import ml_collections

from configs import tiny


def get_config() -> ml_collections.ConfigDict:
  config = tiny.get_config()
  config.data.objective = "rtd"  # FULL-SENTENCES rows (objective "mlm"'s), one per row.
  config.rtd.generator_hidden_fraction = 0.25
  config.rtd.embedding_sharing = "electra"
  config.rtd.disc_weight = 50.0
  return config
