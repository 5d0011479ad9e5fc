"""ELECTRA-Base (Clark et al. 2020, table 6 and google-research/electra's configure_pretraining):
BERT-Base as the discriminator (12 layers, width 768, 12 heads), a generator a third as wide (256,
4 heads, MLP 1024, 12 layers), tied embeddings, λ = 50, 15% masked, on FULL-SENTENCES rows of 512
tokens (no NSP), 256 rows a step for 766k steps at lr 2e-4 (10k warmup, linear decay to 0),
BERT's AdamWeightDecay (weight decay 0.01, eps 1e-6).

Run:
  python launch/prepare_data.py --input='corpus/*.txt' --output_dir=data/electra \
      --objective=mlm --max_seq_length=512
  python launch/train.py --config=configs/electra_base.py --workdir=runs/electra_base \
      --config.data.source=prepared --config.data.dataset_dir=data/electra
  python launch/convert.py --from_bert_jax=runs/electra_base --to_hf=export/electra_base
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.data.objective = "rtd"  # FULL-SENTENCES rows, no NSP (ELECTRA).
  config.data.max_seq_length = 512
  # ELECTRA's int((mask_prob + 0.005) x L) = 79 target slots at 512.
  config.masking.max_predictions_per_seq = 79
  config.rtd.generator_hidden_fraction = 1 / 3  # 256 wide, MLP 1024.
  config.rtd.generator_layers = 0  # All 12, as ELECTRA-Base's generator.
  config.rtd.generator_heads = 0  # 256 / 64 = 4.
  config.rtd.embedding_sharing = "electra"
  config.rtd.disc_weight = 50.0
  config.train.batch_size = 256
  config.train.num_train_steps = 766_000
  config.train.learning_rate = 2e-4
  config.train.warmup_steps = 10_000
  # Schedule "bert" (base.py): peak x (1 - t/T), warmup replacing it for t < W. ELECTRA
  # multiplies the two (peak x (1 - t/T) x t/W in warmup): the same after the 10k warmup steps.
  config.train.schedule = "bert"
  return config
