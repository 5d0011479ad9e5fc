"""Sentence (pair) classification on the pooled [CLS] vector (GLUE-style); regression with
`--config.data.regression=true` (one output, MSE).

Run:
  python launch/finetune.py --config=configs/finetune_classification.py --workdir=runs/cls \
      --config.init_from=runs/tiny \
      --config.data.train_file=train.jsonl --config.data.validation_file=dev.jsonl
  python launch/finetune.py --config=configs/finetune_classification.py --workdir=runs/sst2 \
      --config.init_from=hf/bert-base-uncased --config.data.tfds_name=glue/sst2
"""

import ml_collections

from configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
  config = finetune_base.get_config()
  config.task = "classification"
  config.data.max_seq_length = 128
  config.train.learning_rate = 2e-5
  return config
