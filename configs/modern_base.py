"""The modern encoder, base size (ModernBERT-base's architecture and recipe): 22 layers, width
768, 12 heads, GeGLU MLP (1152 per half), rotary positions (θ 160k global / 10k local), pre-LN
with no biases but the decoder's, local attention in a 128-token window with a global layer
every third; HF ModernBERT's initialisation; MLM only on FULL-SENTENCES rows of 1024 tokens,
30% masked in training (15% at evaluation), StableAdamW at 8e-4 (β2 0.98) without gradient
clipping, with a warmup-stable-decay schedule.

Everything not set here comes from configs/base.py (exact BERT stays that file's default).

The step is ModernBERT's 4,608 rows of 1,024 tokens. In one pass it fits no TPU slice up to 256
v5e chips (a v5e chip holds 12 rows); a v5e:16x16 runs it with
--config.train.grad_accum_steps=2 (14.47 GiB per chip). Check a slice before renting it:
  python launch/train.py --config=configs/modern_base.py --compile_only --topology=v5e:16x16 \
      --config.train.grad_accum_steps=2
(docs/tpu.md; the table per config and slice is in docs/scale_out.md).

Run:
  python launch/prepare_data.py --input='corpus/*.txt' --output_dir=data/modern \
      --objective=mlm --max_seq_length=1024 --vocab_size=50368
  python launch/train.py --config=configs/modern_base.py --workdir=runs/modern_base \
      --config.data.source=prepared --config.data.dataset_dir=data/modern
Context extension to 8192 (ModernBERT's second phase): prepare at --max_seq_length=8192, then
  python launch/train.py --config=configs/modern_base.py --workdir=runs/modern_base_8k \
      --config.init_from=runs/modern_base --config.data.max_seq_length=8192 \
      --config.masking.max_predictions_per_seq=2458 --config.model.global_rope_theta=160000.0 \
      --config.data.source=prepared --config.data.dataset_dir=data/modern_8k
The decay phase from a stable-phase checkpoint at step s, for d steps: resume the same workdir
with --config.train.num_train_steps=s+d --config.train.decay_fraction=d/(s+d).
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  m = config.model
  m.vocab_size = 50368  # ModernBERT's vocabulary (a multiple of 64); must match the data's.
  m.hidden_size = 768
  m.num_hidden_layers = 22  # Deep and narrow.
  m.num_attention_heads = 12
  m.intermediate_size = 1152  # Each half of the GeGLU: Wi is [768, 2 x 1152].
  m.hidden_act = "gelu"
  m.max_position_embeddings = 8192  # Rotary positions have no table: the longest row allowed.
  m.type_vocab_size = 0  # No segment A/B embeddings.
  m.layer_norm_eps = 1e-5
  m.position_embedding = "rotary"
  m.mlp = "glu"
  m.norm_placement = "pre"
  m.attention_bias = False
  m.mlp_bias = False
  m.norm_bias = False
  m.classifier_bias = False
  m.global_rope_theta = 160_000.0
  m.local_rope_theta = 10_000.0
  m.local_attention = 128
  m.global_attn_every_n_layers = 3
  m.hidden_dropout_prob = 0.0  # ModernBERT pretrains without dropout.
  m.attention_probs_dropout_prob = 0.0
  m.initializer = "modernbert"  # HF ModernBERT's σ per parameter kind (model.INIT_STDS).
  config.data.objective = "mlm"  # FULL-SENTENCES rows, no NSP.
  config.data.max_seq_length = 1024
  config.masking.mask_prob = 0.3
  config.masking.eval_mask_prob = 0.15
  config.masking.max_predictions_per_seq = 308  # round(0.3 x 1024) = 307 targets a full row.
  config.train.optimizer = "stable_adamw"
  config.train.schedule = "wsd"
  config.train.learning_rate = 8e-4
  config.train.b2 = 0.98
  config.train.eps = 1e-6
  config.train.weight_decay = 1e-5
  config.train.batch_size = 4608  # Rows of 1024 tokens: ~4.7M tokens per step.
  config.train.num_train_steps = 360_000  # ~1.7T tokens at 1024.
  config.train.warmup_steps = 640  # ~3B tokens.
  config.train.decay_fraction = 0.1
  config.train.decay_shape = "1-sqrt"
  config.train.max_grad_norm = 0.0  # No gradient clipping: StableAdamW clips each update.
  return config
