"""Every fine-tuning default: configs/base.py's sections (model, train, mesh, checkpoint,
logging, with their comments there) with the values fine-tuning changes, plus the fields of its
own, one comment each; the task configs override a few.

The encoder comes from `init_from` (a pretraining workdir, a bert_jax pretrained directory, a
HuggingFace directory or a TF checkpoint; its vocabulary is the tokenizer), or is trained from
scratch when `init_from` is empty (then `vocab` and `model` say what to build).

Run:
  python launch/finetune.py --config=configs/finetune_classification.py \
      --config.init_from=runs/tiny --config.data.train_file=train.jsonl \
      --config.data.validation_file=dev.jsonl --workdir=runs/sst
"""

import ml_collections
from ml_collections import config_dict

from configs import base


def get_config() -> ml_collections.ConfigDict:
  pretraining = base.get_config()
  config = ml_collections.ConfigDict()
  config.seed = pretraining.seed  # Root seed: head init, data order and dropout derive from it.
  config.task = "classification"  # A fine-tuning task: "classification" (or regression),
  #                                 "tagging", "qa", "embedding", "diffusion_sft"
  #                                 (bert_jax/tasks/, tasks.FINETUNE_TASKS).
  config.init_from = pretraining.init_from  # Pretrained encoder; "" = trained from scratch.
  config.vocab = ""  # Vocabulary for a from-scratch encoder (or a checkpoint without one).

  # ---------------------------------------------------------------- model
  # From scratch: this model. A pretrained encoder keeps its checkpoint's shape and
  # architecture fields (sizes, hidden_act, layer_norm_eps, blocks); its run fields come from
  # here (dtype, param_dtype, dropout probabilities, dropout_rng, attention_impl, remat,
  # vocab_pad_multiple; `BertConfig` marks each field's role).
  config.model = pretraining.model
  config.model.vocab_size = 0  # 0 = the vocabulary's size.
  # "auto": the pretrained encoder's own (a ModernBERT fine-tune's "mean" stays; from scratch
  # "cls"); "cls" or "mean" override it.
  config.model.classifier_pooling = "auto"
  config.head = ml_collections.ConfigDict()
  # HF's head of the encoder's family ("auto"), or of one: "bert" (BertFor*: the tanh pooler on
  # [CLS] for classification, dropout, the classifier) or "modernbert" (ModernBertFor*: dense +
  # activation + norm on the pooled vector or each token, dropout, the classifier).
  config.head.kind = "auto"
  config.head.dropout_prob = 0.1  # BERT's head: dropout before the classifier (not QA's).
  config.head.classifier_dropout = 0.0  # ModernBERT's head: the same (HF's classifier_dropout).

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
  # QA: SQuAD 2.0, questions without an answer in the passage (empty `answers`) train to
  # [CLS] in every window, and prediction may answer "" (run_squad.py's flag of that name).
  config.data.version_2_with_negative = False
  # QA with version_2_with_negative: answer "" when the null score (the [CLS] start + end logits,
  # the least over a question's windows) exceeds the best span's by more than this.
  config.data.null_score_diff_threshold = 0.0
  config.data.prefetch = pretraining.data.prefetch  # Batches prefetched to the devices.

  # ---------------------------------------------------------------- embedding
  # Task "embedding" (bert_jax/tasks/embedding.py): records {"query", "positive", "negatives"?},
  # each text its own row of data.max_seq_length pieces.
  config.embedding = ml_collections.ConfigDict()
  # A text's vector: "auto" (a sentence-transformers init_from's Pooling module, else a
  # ModernBERT encoder's classifier_pooling, else "mean"), "mean" (over its pieces, as
  # sentence-transformers), "cls" or "max".
  config.embedding.pooling = "auto"
  # L2-normalised vectors (sentence-transformers' Normalize module); unset (None): a
  # sentence-transformers init_from's own choice, else True. A value given always wins.
  config.embedding.normalize = config_dict.placeholder(bool)
  config.embedding.num_negatives = 0  # Hard negatives read per record ("negatives"; fewer: absent).
  config.embedding.scale = 20.0  # InfoNCE scores are scale x cos (1 / temperature; MNRL's 20).
  config.embedding.symmetric = False  # Also rank the batch's queries for each positive (mean).
  # Candidates whose text is the query's positive (a duplicate in the batch) are no negatives.
  config.embedding.mask_false_negatives = False
  # Matryoshka: the loss summed over the vectors cut to these leading widths; () = full width.
  config.embedding.matryoshka_dims = ()
  # Train batches packed: the batch's texts several to a row (up to max_seq_length // 8, each
  # its own segment, best fit decreasing), not one row of max_seq_length each. The same loss and
  # gradient, fewer padding slots. Evaluation and prediction read texts alone (prediction packs).
  config.embedding.pack = False

  # ---------------------------------------------------------------- conditional diffusion
  # Task "diffusion_sft" (bert_jax/tasks/diffusion_sft.py): records {"prompt", "response"}, the
  # response masked at a time t per example (the prompt never), the loss its NELBO per piece.
  config.diffusion = ml_collections.ConfigDict()
  config.diffusion.schedule = pretraining.diffusion.schedule  # "linear" or "loglinear" (base.py).
  # Points of the fixed grid of t the validation bound (elbo_nats_per_token) is taken over.
  config.diffusion.eval_points = 8

  # ---------------------------------------------------------------- train
  # bert_adamw and the "bert" schedule, as run_classifier.py / run_squad.py.
  config.train = pretraining.train
  del config.train.eval_max_batches  # Fine-tuning scores every validation example.
  config.train.freeze_encoder = False  # True: train the head only; encoder stays bit-identical.
  config.train.batch_size = 32
  # 0: num_train_epochs passes over the training examples, int(examples / batch_size x epochs)
  # as run_classifier.py / run_squad.py (QA counts questions, not windows); > 0 wins.
  config.train.num_train_steps = 0
  config.train.num_train_epochs = 3.0  # The original's fine-tuning length.
  config.train.learning_rate = 5e-5  # BERT's fine-tuning range: 2e-5 .. 5e-5.
  config.train.warmup_steps = 0  # > 0 wins over warmup_proportion.
  # Warmup as a fraction of the run's steps, int(steps x proportion), as the original (0.1).
  config.train.warmup_proportion = 0.1
  config.train.log_every_steps = 50
  config.train.eval_every_steps = 200
  config.train.eval_batch_size = 64
  config.train.best_metric = ""  # Metric that picks the best checkpoint ("" = the task's).

  # ---------------------------------------------------------------- mesh, checkpoint, logging
  config.mesh = pretraining.mesh
  config.checkpoint = pretraining.checkpoint
  config.checkpoint.save_every_steps = 500
  config.checkpoint.max_to_keep = 2
  config.logging = pretraining.logging
  return config
