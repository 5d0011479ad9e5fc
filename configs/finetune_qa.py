"""Extractive QA (SQuAD v1.1-style): start/end logits over the passage (`text_b`), long passages
in overlapping windows merged per question at evaluation (google-research/bert's run_squad.py).

Run:
  python launch/finetune.py --config=configs/finetune_qa.py --workdir=runs/squad \
      --config.init_from=hf/bert-base-uncased --config.data.tfds_name=squad
  python launch/finetune.py --config=configs/finetune_qa.py --workdir=runs/qa \
      --config.init_from=runs/tiny \
      --config.data.train_file=train.jsonl --config.data.validation_file=dev.jsonl
"""

import ml_collections

from configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
  config = finetune_base.get_config()
  config.task = "qa"
  config.data.max_seq_length = 384
  config.data.max_query_length = 64
  config.data.doc_stride = 128  # run_squad.py's SQuAD settings: 384 / 64 / 128 / 30.
  config.data.max_answer_length = 30
  config.train.batch_size = 32
  config.train.learning_rate = 3e-5
  config.train.eval_every_steps = 1000
  config.train.best_metric = "f1"
  return config
