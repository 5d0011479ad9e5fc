"""Embedding models: contrastive fine-tuning of an encoder on (query, positive, hard negatives)
records, scored by retrieval on the validation set (nDCG@10). configs/finetune_base.py holds
every field (with its comment) and derives from configs/base.py; this changes the task's few.

Run:
  python launch/finetune.py --config=configs/finetune_embedding.py --workdir=runs/embed \
      --config.init_from=runs/tiny \
      --config.data.train_file=pairs.jsonl --config.data.validation_file=dev_pairs.jsonl
A record: {"query": "how do I sort a list", "positive": "sorted(iterable) returns ...",
"negatives": ["..."]} (negatives optional; up to config.embedding.num_negatives are read).
"""

import ml_collections

from configs import finetune_base


def get_config() -> ml_collections.ConfigDict:
  config = finetune_base.get_config()
  config.task = "embedding"
  config.data.max_seq_length = 128  # Pieces per text ([CLS] text [SEP]); longer texts are cut.
  config.train.learning_rate = 2e-5  # sentence-transformers' default.
  config.train.batch_size = 64  # Examples per global batch: 63 in-batch negatives per query.
  config.train.best_metric = "ndcg@10"  # Retrieval on the validation set picks the best.
  config.embedding.num_negatives = 1  # One hard negative per example when records have them.
  # Texts packed several to a row: the loss and update of one text per row (tests), 4.9x its
  # pairs/s on the offline retrieval suite's pairs (docs/embeddings.md).
  config.embedding.pack = True
  return config
