"""Masked diffusion at base size: configs/modern_base.py's encoder and recipe (ModernBERT-base's
architecture, StableAdamW, warmup-stable-decay) trained with objective "diffusion" (MDLM /
LLaDA's continuous-time NELBO under the linear schedule, t ~ U(1e-3, 1) per example, stratified
over the global batch). Every masked token is [MASK] and the loss covers every masked position,
so the masking section's rate, 80/10/10 and P are not read. The step (4,608 rows of 1,024) needs
microbatches on TPUs, as modern_base's: check a slice with --compile_only --topology=...
(docs/tpu.md).

Run:
  python launch/train.py --config=configs/diffusion_base.py --workdir=gs://bucket/diffusion_base \
      --config.data.source=prepared --config.data.dataset_dir=/mnt/bucket/data
(ArrayRecord reads local files: a bucket's prepared dataset is read through gcsfuse, mounted
at /mnt/bucket here; docs/tpu.md.)
"""

import ml_collections

from configs import modern_base


def get_config() -> ml_collections.ConfigDict:
  config = modern_base.get_config()
  config.data.objective = "diffusion"
  config.diffusion.schedule = "linear"
  config.diffusion.eval_points = 8
  return config
