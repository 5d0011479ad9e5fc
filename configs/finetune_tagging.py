"""Token tagging (NER-style): a label per word on its first piece; entity F1 for BIO tags.

Run:
  python launch/finetune.py --config=configs/finetune_tagging.py --workdir=runs/ner \
      --config.init_from=runs/tiny \
      --config.data.train_file=train.jsonl --config.data.validation_file=dev.jsonl
"""

import ml_collections

from configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
  config = finetune_base.get_config()
  config.task = "tagging"
  config.data.max_seq_length = 128
  config.train.learning_rate = 5e-5
  return config
