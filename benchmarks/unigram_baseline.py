r"""Chance levels for a prepared dataset: what MLM and NSP accuracy mean nothing was learned.

  python benchmarks/unigram_baseline.py --dataset_dir=runs/tiny/data/builtin-<key>

MLM: always predicting the most frequent token of the train split, scored on the validation
split's maskable tokens (the unigram-frequency baseline). NSP: always predicting the majority
label. Compare with the `validation` records of a run's metrics.jsonl.
"""

import collections
import json
import os
import sys

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.data import pipeline, prepare  # pylint: disable=g-import-not-at-top

flags.DEFINE_string("dataset_dir", None, "A prepared dataset directory.", required=True)
flags.DEFINE_integer("max_batches", 200, "Train batches of 256 to count token frequencies on.")


def main(argv):
  del argv
  meta = prepare.load_meta(flags.FLAGS.dataset_dir)
  special = np.asarray(meta["special_ids"])
  counts = collections.Counter()
  train = pipeline.make_train_iterator(flags.FLAGS.dataset_dir, global_batch_size=256, seed=0,
                                       process_index=0, process_count=1)
  for _ in range(flags.FLAGS.max_batches):
    ids = next(train)["input_ids"]
    counts.update(ids[~np.isin(ids, special)].tolist())
  top_token = counts.most_common(1)[0][0]
  hits = total = nsp_ones = examples = 0
  for batch in pipeline.make_eval_batches(flags.FLAGS.dataset_dir, global_batch_size=256,
                                          process_index=0, process_count=1):
    real = batch["example_weight"] > 0
    ids = batch["input_ids"][real]
    eligible = ~np.isin(ids, special)
    hits += int((ids[eligible] == top_token).sum())
    total += int(eligible.sum())
    used = batch["nsp_weights"][real] > 0  # [rows, K]: the examples packed in each row.
    nsp_ones += int(batch["next_sentence_label"][real][used].sum())
    examples += int(used.sum())
  result = {
      "mlm_unigram_accuracy": hits / max(total, 1),
      "most_frequent_token_id": int(top_token),
      "nsp_majority_accuracy": max(nsp_ones, examples - nsp_ones) / max(examples, 1),
      "validation_examples": examples,
  }
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
