"""Conditional masked diffusion (SFT): a response generated given its prompt, as LLaDA's and
dLLM's supervised fine-tuning of a masked-diffusion (or any MLM-trained) encoder.

Records {"prompt": ..., "response": ...}; the prompt is never masked and the loss covers the
response only (bert_jax/tasks/diffusion_sft.py). Then sample responses:
  python launch/predict.py --mode=generate --checkpoint=runs/sft --prompt="..." --length=32

Run:
  python launch/finetune.py --config=configs/finetune_diffusion_sft.py --workdir=runs/sft \
      --config.init_from=runs/diffusion_tiny \
      --config.data.train_file=train.jsonl --config.data.validation_file=dev.jsonl
"""

import ml_collections

from configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
  config = finetune_base.get_config()
  config.task = "diffusion_sft"
  config.data.max_seq_length = 128
  config.train.num_train_epochs = 3.0
  config.train.learning_rate = 5e-5  # LLaDA's SFT: 2.5e-5 at 8B; small encoders take more.
  return config
