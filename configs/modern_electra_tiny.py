"""Replaced-token detection on the modern encoder at tiny size: configs/modern_tiny.py's
discriminator (rotary, GeGLU, pre-LN, local + global attention, StableAdamW, warmup-stable-decay)
with a generator a quarter as wide (32, one head, 3 layers) reading the discriminator's
embeddings through DeBERTa-v3's gradient-disentangled sharing ("gdes"), λ = 50. ELECTRA masks
15%, so this does too (ModernBERT's 30% suits MLM, where the masked tokens are all it learns
from); the discriminator learns from every token.

Run:
  python launch/train.py --config=configs/modern_electra_tiny.py --workdir=runs/modern_electra_tiny
  python launch/convert.py --from_bert_jax=runs/modern_electra_tiny --to_hf=export/me_tiny
"""

import ml_collections

from configs import modern_tiny


def get_config() -> ml_collections.ConfigDict:
  config = modern_tiny.get_config()
  config.data.objective = "rtd"
  config.masking.mask_prob = 0.15
  config.masking.eval_mask_prob = 0.15
  config.masking.max_predictions_per_seq = 20  # round(0.15 x 128) = 19 targets a full row.
  config.rtd.generator_hidden_fraction = 0.25
  config.rtd.embedding_sharing = "gdes"
  config.rtd.disc_weight = 50.0
  return config
