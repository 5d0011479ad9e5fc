"""Masked diffusion at the quick start's size: configs/modern_tiny.py's encoder (rotary, GeGLU,
pre-LN, local + global attention, StableAdamW, warmup-stable-decay) trained with objective
"diffusion" (MDLM / LLaDA: each row masked at its own t ~ U(1e-3, 1), every masked token [MASK],
the loss the NELBO per token under the linear schedule), on the built-in corpus's
FULL-SENTENCES rows. Its checkpoint samples text:

Run:
  python launch/train.py --config=configs/diffusion_tiny.py --workdir=runs/diffusion_tiny
  python launch/predict.py --mode=generate --checkpoint=runs/diffusion_tiny --length=48 --steps=48
"""

import ml_collections

from configs import modern_tiny


def get_config() -> ml_collections.ConfigDict:
  config = modern_tiny.get_config()
  config.data.objective = "diffusion"
  config.diffusion.schedule = "linear"
  config.diffusion.eval_points = 8
  return config
