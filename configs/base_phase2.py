"""BERT-Base pretraining, phase 2 of the original's two-phase recipe: 100k steps at L=512 after
phase 1's steps at L=128 (configs/base.py), continuing from phase 1's parameters.

As google-research/bert's `run_pretraining.py --init_checkpoint`: the parameters carry over
(the position table's 512 rows included: configs/base.py has max_position_embeddings 512 from the
start, and a phase 1 with fewer rows is refused), while the optimizer state, the step and the
warmup start again at 0. 256 rows of 512 tokens per step, each packing up to 16 examples; P = 80
target slots, the most 16 examples of one row can need at 15% (config.masking's check).

Run (phase 1 on data prepared at 128, phase 2 on the same corpus and vocabulary at 512):
  python launch/prepare_data.py --input='corpus/*.txt' --output_dir=data/wiki_512 \
      --vocab=data/wiki/vocab --max_seq_length=512 --max_examples_per_row=16
  python launch/train.py --config=configs/base_phase2.py --workdir=runs/base_phase2 \
      --config.init_from=runs/base --config.data.source=prepared \
      --config.data.dataset_dir=data/wiki_512
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.data.max_seq_length = 512
  config.data.max_examples_per_row = 16  # About L / 32 (fill 99.2% on the built-in corpus).
  config.masking.max_predictions_per_seq = 80  # The original's 80 at 512.
  config.train.num_train_steps = 100_000  # The original's phase 2 (after 900k at 128).
  config.train.learning_rate = 1e-4  # The original's peak for BERT-Base, both phases.
  config.train.warmup_steps = 10_000  # Warmup starts again at step 0, as the original's.
  return config
