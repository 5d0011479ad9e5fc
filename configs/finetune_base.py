"""Every fine-tuning default, one comment per field; the task configs override a few.

The encoder comes from `init_from` (a pretraining workdir, a bert_jax pretrained directory, a
HuggingFace directory or a TF checkpoint; its vocabulary is the tokenizer), or is trained from
scratch when `init_from` is empty (then `vocab` and `model` say what to build).

Run:
  python launch/finetune.py --config=configs/finetune_classification.py \
      --config.init_from=runs/tiny --config.data.train_file=train.jsonl \
      --config.data.validation_file=dev.jsonl --workdir=runs/sst
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0  # Root seed: head init, data order and dropout derive from it.
  config.task = "classification"  # "classification" (or regression), "tagging" or "qa".
  config.init_from = ""  # Pretrained encoder (any format load_pretrained reads); "" = scratch.
  config.vocab = ""  # Vocabulary for a from-scratch encoder (or a checkpoint without one).

  # ---------------------------------------------------------------- model (from scratch only)
  # A pretrained encoder keeps its checkpoint's shape; only `dtype` applies to it too.
  config.model = base.get_config().model
  config.model.vocab_size = 0  # 0 = the vocabulary's size.
  config.head = ml_collections.ConfigDict()
  config.head.dropout_prob = 0.1  # Dropout before the classifier (classification, tagging).

  # ---------------------------------------------------------------- data
  config.data = ml_collections.ConfigDict()
  config.data.train_file = ""  # JSONL or CSV with text, text_b?, label / tags / answers.
  config.data.validation_file = ""  # Same layout; evaluated at intervals and at the end.
  config.data.format = "auto"  # "auto" (by extension), "jsonl" or "csv".
  config.data.tfds_name = ""  # Instead of files: a TFDS dataset (glue/sst2, squad, ...).
  config.data.tfds_train_split = "train"  # TFDS split to train on.
  config.data.tfds_validation_split = "validation"  # TFDS split to evaluate on.
  config.data.tfds_data_dir = ""  # TFDS data_dir ("" = TFDS's default).
  config.data.labels = ()  # Label names in index order; () = sorted labels of the train file.
  config.data.regression = False  # Classification: one float output trained with MSE.
  config.data.max_seq_length = 128  # Pieces per row, specials included (longer: cut; QA: windows).
  config.data.max_query_length = 64  # QA: pieces of the question kept.
  # QA: a passage that does not fit after the question becomes several overlapping windows
  # (one model row each), the next starting this many pieces after the last (run_squad.py's
  # --doc_stride, default 128); each piece is scored in the window where it has most context.
  config.data.doc_stride = 128
  config.data.max_answer_length = 30  # QA: longest predicted answer, in pieces.
  config.data.prefetch = 2  # Batches prefetched to the devices ahead of the step.

  # ---------------------------------------------------------------- train
  config.train = ml_collections.ConfigDict()
  config.train.freeze_encoder = False  # True: train the head only; encoder stays bit-identical.
  config.train.batch_size = 32  # Global batch size (sequences per optimizer step).
  config.train.num_train_steps = 1000  # Optimizer steps.
  # "bert_adamw" (google-research/bert's AdamWeightDecayOptimizer, as run_classifier/run_squad),
  # "adamw" (optax, bias-corrected) or "lamb"; see configs/base.py.
  config.train.optimizer = "bert_adamw"
  config.train.schedule = "bert"  # "bert" (the original's) or "warmup_linear"; see base.py.
  config.train.learning_rate = 5e-5  # Peak learning rate (BERT's fine-tuning range 2e-5..5e-5).
  config.train.warmup_steps = 100  # Steps of linear warmup from 0.
  config.train.weight_decay = 0.01  # Decoupled weight decay; not on LayerNorm or biases.
  config.train.b1 = 0.9  # Adam beta1.
  config.train.b2 = 0.999  # Adam beta2.
  config.train.eps = 1e-6  # Adam epsilon (BERT uses 1e-6).
  config.train.max_grad_norm = 1.0  # Clip by global norm (0 disables).
  config.train.log_every_steps = 50  # Console / TensorBoard / metrics.jsonl interval.
  config.train.grad_accum_steps = 1  # Microbatches per step; batch_size must divide by it.
  config.train.eval_every_steps = 200  # Validation interval (and at the last step; 0: last only).
  config.train.eval_batch_size = 64  # Global batch size for evaluation.
  config.train.best_metric = ""  # Metric that picks the best checkpoint ("" = the task's).

  # ---------------------------------------------------------------- mesh / sharding
  config.mesh = base.get_config().mesh  # Same axes and logical rules as pretraining.

  # ---------------------------------------------------------------- checkpoint
  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.save_every_steps = 500  # Training checkpoint interval (0: last step, SIGTERM).
  config.checkpoint.max_to_keep = 2  # Keep the newest N training checkpoints.
  config.checkpoint.async_save = True  # Write checkpoints in a background thread.
  # A checkpoint that fails verification at start (damaged on disk): "fallback" sets it aside
  # (renamed <step>.damaged) with a warning and resumes from the newest intact one; "fail" stops.
  config.checkpoint.on_damaged = "fallback"
  # A SIGTERM that comes while a checkpoint is being written gives the write this many seconds to
  # finish before the run stops without it (a stuck bucket must not block a scheduler's stop).
  # The save a SIGTERM asks for runs to its end; a second SIGTERM or SIGINT stops at once.
  config.checkpoint.stop_grace_seconds = 5.0
  # Resume (or init_from) with weights trained on another vocabulary of the same size: refused,
  # as every embedding row would mean another token; True allows it (vocabulary surgery).
  config.checkpoint.allow_vocab_change = False

  # ---------------------------------------------------------------- logging
  config.logging = ml_collections.ConfigDict()
  config.logging.tensorboard = True  # Write TensorBoard summaries to <workdir>/tensorboard.
  # (start, count): a jax.profiler trace of steps start+1 .. start+count under <workdir>/profile
  # (TensorBoard's profile plugin, Perfetto); count 0 = no profile.
  config.logging.profile_steps = (0, 0)
  return config
