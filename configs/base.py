"""BERT-Base pretraining (12 layers, width 768, 12 heads, L=128, 20 predictions per sequence).

This file holds every default of bert_jax; `tiny.py` and `large.py` override a few of them.

Run:
  python launch/train.py --config=configs/base.py --workdir=runs/base
  python launch/train.py --config=configs/base.py --config.train.batch_size=32
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0  # Root seed: parameter init, data order and masking all derive from it.
  # Weights to start from when the workdir has no checkpoint yet: a bert_jax pretrained dir, a
  # training or fine-tuning workdir, a HuggingFace dir or a TF checkpoint ("" = random init).
  # Pretraining continues from them (the optimizer starts afresh); fine-tuning takes their
  # encoder and vocabulary.
  config.init_from = ""

  # ---------------------------------------------------------------- model
  # Field names follow HuggingFace's BertConfig so configs convert one-to-one.
  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 30522  # Must equal the prepared vocabulary's size.
  config.model.hidden_size = 768  # Width H of every layer.
  config.model.num_hidden_layers = 12  # Number of transformer layers.
  config.model.num_attention_heads = 12  # Heads per attention layer; H must divide by it.
  config.model.intermediate_size = 3072  # Width of the feed-forward (MLP) layer.
  config.model.hidden_act = "gelu"  # "gelu" (exact erf, as BERT), "gelu_new" (tanh) or "relu".
  config.model.hidden_dropout_prob = 0.1  # Dropout on embeddings and residual branches.
  config.model.attention_probs_dropout_prob = 0.1  # Dropout on attention probabilities.
  config.model.max_position_embeddings = 512  # Rows of the learned position table.
  config.model.type_vocab_size = 2  # Segment ids (0 for A, 1 for B); 0: none (ModernBERT).
  # Width of the embedding tables and of the tied MLM decoder (0: hidden_size). Another width
  # projects the embeddings to hidden_size, as ELECTRA's small models and generators do.
  config.model.embedding_size = 0
  config.model.initializer_range = 0.02  # Std of the truncated-normal initializer.
  # The σ per parameter kind (bert_jax/models/model.py's INIT_STDS table, cut at 2 σ): "bert"
  # (initializer_range everywhere, google-research/bert's), "modernbert" (HF ModernBERT's:
  # output projections and the MLM transform initializer_range / sqrt(2 x layers), the
  # fine-tuning classifier hidden_size^-0.5) or "auto" (ModernBERT's for the modern
  # architecture, BERT's for any other).
  config.model.initializer = "auto"
  config.model.layer_norm_eps = 1e-12  # LayerNorm epsilon, as in the original BERT.
  # The blocks, by name (bert_jax/models/model.py's registries): "learned" absolute positions added
  # to the embeddings, BERT's "dense" MLP, "post"-LN layers (x = LN(x + f(x))).
  config.model.position_embedding = "learned"
  config.model.mlp = "dense"
  config.model.norm_placement = "post"
  # Every normalisation layer: a key of bert_jax/models/model.py's NORMS ("layer_norm", BERT's
  # and ModernBERT's; a new one is a class and a registry line there).
  config.model.norm = "layer_norm"
  # The modern encoder's options (configs/modern_*.py; names as HF's ModernBertConfig): "rotary"
  # positions, a "glu" (GeGLU) MLP, "pre"-LN layers with a final norm, and:
  config.model.attention_bias = True  # Biases of the q/k/v and output projections.
  config.model.mlp_bias = True  # Biases of the MLP's matmuls.
  config.model.norm_bias = True  # The shift of every LayerNorm.
  config.model.classifier_bias = True  # Bias of the MLM head's dense transform.
  config.model.global_rope_theta = 160_000.0  # "rotary": θ of the global layers.
  config.model.local_rope_theta = 10_000.0  # "rotary": θ of the local layers.
  # Local layers attend within a sliding window this many tokens wide (a token sees the tokens
  # at most local_attention / 2 rows away, in its own packed example); 0: every layer global.
  config.model.local_attention = 0
  # With local_attention: layers 0, n, 2n, ... stay global, the others are local (ModernBERT: 3).
  config.model.global_attn_every_n_layers = 1
  # What a fine-tuning head (and NSP) reads of each example: its [CLS] vector ("cls", BERT) or
  # the mean of its tokens ("mean").
  config.model.classifier_pooling = "cls"
  # What the backward pass recomputes per layer: "none" (keep all activations), "dots" (keep
  # the weight matmuls' outputs, recompute the rest: BERT-Base L=128 B=32 takes 3.6 GiB per
  # device instead of 7.1, and its CPU step is 6% faster than with "none") or "full" (recompute
  # the layer; least memory, ~1/3 more compute). benchmarks/compile_time.py measures them.
  config.model.remat = "dots"
  # Repeats of the layer pattern per step of the encoder's scan (jax.lax.scan's unroll; params
  # stay stacked): 1 loops over the layers (compile time flat in depth); >= the layer count runs
  # them as straight-line code, which XLA can fuse across layers.
  config.model.scan_unroll = 1
  config.model.dtype = "float32"  # Compute dtype: "float32" or "bfloat16".
  config.model.param_dtype = "float32"  # Parameter (and optimizer state) dtype.
  # Attention where no attention dropout applies: "auto" (splash on TPUs for L a multiple of
  # 128, cudnn on NVIDIA GPUs in bfloat16, else xla), "xla" (anywhere), "cudnn" (NVIDIA GPUs, fused), "splash" (TPUs,
  # Pallas; interpreted elsewhere, slowly) or "einsum" (reference). Attention dropout: einsum.
  config.model.attention_impl = "auto"
  config.model.splash_block_q = 0  # "splash": query rows per block, 128k | L (0: min(512, L)).
  config.model.splash_block_kv = 0  # "splash": key rows per block, 128k | L (0: min(512, L)).
  # Rows of the embedding table / MLM bias: vocab_size rounded up to a multiple of this, so the
  # vocabulary splits over mesh.tensor (30522 -> 30592 at 128); 1 = no padding. Padded rows are
  # never drawn, looked up or predicted; exported weights hold the real vocab_size rows.
  config.model.vocab_pad_multiple = 128
  config.model.dropout_rng = "hash"  # Dropout mask bits: "hash" (keyed counter hash, several
  #                                    times cheaper on CPU) or "threefry" (jax.random.bits).

  # ---------------------------------------------------------------- data
  config.data = ml_collections.ConfigDict()
  config.data.source = "builtin"  # "builtin" (docstring corpus, prepared into the workdir),
  #                                  "prepared" (data.dataset_dir), "mixture" (data.mixture) or
  #                                  "synthetic" (random ids).
  config.data.dataset_dir = ""  # A directory written by launch/prepare_data.py (source=prepared).
  # source="mixture": prepared datasets (one vocabulary, one row format) and their weights,
  # "DIR_A:0.7,DIR_B:0.3"; without weights ("DIR_A,DIR_B") each weighs its train rows ^
  # mixture_temperature. Each row of a batch is drawn from one source (data/mixture.py).
  config.data.mixture = ""
  config.data.mixture_temperature = 1.0  # mmBERT / XLM-R's tau: 1 = sizes' proportions.
  # Other weights from a fraction of train.num_train_steps on (annealing): "0.9:0.5,0.5", ";"
  # between phases. "": the weights above throughout.
  config.data.mixture_phases = ""
  config.data.max_seq_length = 128  # Tokens per row, [CLS] A [SEP] B [SEP] included.
  # "mlm_nsp": BERT's NSP pairs, MLM + NSP losses. "mlm": RoBERTa's FULL-SENTENCES rows
  # (contiguous text across sentences and documents, [SEP] between documents, every row full),
  # MLM only. "diffusion": FULL-SENTENCES rows, masked diffusion (config.diffusion).
  config.data.objective = "mlm_nsp"
  # K: NSP examples packed per row of max_seq_length (attention stays inside each example);
  # 1 = unpacked (one example per row, padded). A prepared dataset is packed for one K: train
  # with the K it was prepared with. Ignored by objective "mlm" (a row is one sequence, K = 1).
  # About max_seq_length / 32 fills rows >= 98% on the built-in corpus (4 at 128, 16 at 512).
  config.data.max_examples_per_row = 4
  # Example-length warmup, objective "mlm": each row is cut into spans (attention and positions
  # within a span) of span_warmup_start tokens at step 0, growing linearly to the full row at
  # step span_warmup_steps (0: off). Short examples leave the early plateau sooner.
  config.data.span_warmup_steps = 0
  config.data.span_warmup_start = 64  # Span length at step 0 (tokens).
  config.data.short_seq_prob = 0.1  # Fraction of examples with a random shorter target length.
  # Passes over the corpus, each with its own seed (as the original). 5, not the original flag's
  # default 10 (its README's command uses 5): its copies existed to give each example 10 static
  # masks, while masking here is drawn anew every step, so a pass only varies the NSP pairs and
  # chunk boundaries; 5 halves preparation time and disk (`tiny.py` uses 2).
  config.data.dupe_factor = 5
  config.data.validation_fraction = 0.01  # Documents held out for the validation split.
  config.data.vocab_model_type = "unigram"  # sentencepiece model type for the builtin corpus.
  config.data.builtin_max_mb = 0.0  # Cap on built-in corpus text in MB (0 = all of it).
  # The directory under which the built-in corpus is prepared, into <dir>/data/builtin-<key>
  # ("": the workdir; for a workdir in a bucket, ~/.cache/bert_jax on each host, as ArrayRecord
  # reads local files only).
  config.data.builtin_cache_dir = ""
  config.data.num_workers = 0  # grain worker processes (0 = read in the main process).
  config.data.prefetch = 2  # Batches prefetched to the devices ahead of the step.

  # ---------------------------------------------------------------- masking
  config.masking = ml_collections.ConfigDict()
  config.masking.mask_prob = 0.15  # Fraction of eligible positions selected as MLM targets.
  # The rate held-out evaluation masks at (ModernBERT trains at 0.3, evaluates at 0.15); 0: the
  # training rate, mask_prob.
  config.masking.eval_mask_prob = 0.0
  # P: static number of target slots per row. Each example of a row gets max(1, round(mask_prob
  # x its eligible tokens)) targets, so P must cover the most a row's K examples can need
  # together (checked: 19 at L=128 with K=4, 80 at L=512 with K=16).
  config.masking.max_predictions_per_seq = 20
  config.masking.mask_token_prob = 0.8  # Of the selected: replaced by [MASK].
  config.masking.random_token_prob = 0.1  # Of the selected: replaced by a random token.
  #                                          The rest (0.1) keep their token.
  config.masking.whole_word_masking = False  # Select whole words (pieces of a word together).
  # "constant": mask_prob at every step. "stages": mmBERT's inverse schedule, stage_rates[i]
  # from step stage_starts[i] x num_train_steps on (P must hold the largest rate's targets).
  config.masking.rate_schedule = "constant"
  config.masking.stage_rates = (0.3, 0.15, 0.05)  # "stages": mmBERT's 30% -> 15% -> 5%.
  # "stages": where each stage starts, as fractions of num_train_steps (mmBERT: 2.3T, 0.6T and
  # 0.1T of its 3T tokens).
  config.masking.stage_starts = (0.0, 0.767, 0.967)

  # ---------------------------------------------------------------- masked diffusion
  # Objective "diffusion" (bert_jax/objectives/diffusion.py): each example masked at its own
  # t ~ U(1e-3, 1), stratified over the global batch, every masked token [MASK] (the masking
  # section's rates, 80/10/10, P and whole-word option are not used), loss the NELBO per token.
  config.diffusion = ml_collections.ConfigDict()
  # "linear": masked with probability t, ELBO weight 1/t (LLaDA, MDLM); "loglinear": MDLM's
  # LogLinearNoise (masked with probability (1 - 1e-3) t).
  config.diffusion.schedule = "linear"
  # Points of the fixed grid of t over which held-out evaluation reports the NELBO
  # (elbo_nats_per_token) for objectives mlm, mlm_nsp and diffusion, each one more forward pass
  # over the evaluation rows; 0: not reported; -1: 8 for objective diffusion, 0 for the others
  # (an MLM evaluation then costs what it did before the bound; ask with 8 to compare by it).
  config.diffusion.eval_points = -1

  # ---------------------------------------------------------------- replaced-token detection
  # Objectives "rtd" / "rtd_nsp" (bert_jax/tasks/rtd.py): a generator (an MLM encoder of the
  # same family, smaller) fills the masked positions with samples, and the model of
  # config.model (the discriminator) labels every real token replaced or original.
  config.rtd = ml_collections.ConfigDict()
  # Generator width as a fraction of config.model.hidden_size (its MLP scaled alike); ELECTRA:
  # 1/4 (small), 1/3 (base). At most 1: a generator wider than the discriminator is refused.
  config.rtd.generator_hidden_fraction = 0.25
  config.rtd.generator_layers = 0  # Generator layers (0: the discriminator's, as ELECTRA).
  config.rtd.generator_heads = 0  # Generator heads (0: one per 64 of width, at least 1).
  # "electra": one embedding table set for both, both losses reach it; "gdes" (DeBERTa-v3):
  # the discriminator reads stop_gradient(generator's) + a delta initialised to 0; "none".
  config.rtd.embedding_sharing = "electra"
  config.rtd.disc_weight = 50.0  # λ: loss = mlm + λ x discriminator (+ nsp). ELECTRA: 50.
  # Samples are drawn from softmax(generator logits / temperature) (> 0); ELECTRA's
  # `temperature`, 1.0. Above 1 the replacements are less plausible, easier to detect.
  config.rtd.temperature = 1.0

  # ---------------------------------------------------------------- train
  config.train = ml_collections.ConfigDict()
  # Global batch size in ROWS per optimizer step; a row packs up to max_examples_per_row
  # examples, so a step learns from more examples than rows (metrics.jsonl: examples_per_step).
  config.train.batch_size = 256
  config.train.num_train_steps = 1_000_000  # Optimizer steps.
  # "bert_adamw": google-research/bert's AdamWeightDecayOptimizer (no bias correction, eps
  # outside the sqrt, decoupled decay); "adamw": optax's bias-corrected AdamW; "lamb";
  # "stable_adamw": ModernBERT's StableAdamW (AdamW with its step clipped per tensor).
  config.train.optimizer = "bert_adamw"
  # "bert": the original's lr = peak * (1 - t/T) over all T steps, replaced by peak * t/W during
  # warmup (0.9 * peak right after a 10% warmup); "warmup_linear": warmup, then peak -> 0 over
  # the T - W steps after it.
  # "wsd": warmup, a stable phase at the peak, then a decay to 0 over the last decay_fraction of
  # the steps (ModernBERT); a run decays from any stable-phase checkpoint by resuming it with a
  # larger num_train_steps whose decay phase starts after that step.
  config.train.schedule = "bert"
  config.train.decay_fraction = 0.1  # "wsd": fraction of num_train_steps spent decaying.
  config.train.decay_shape = "1-sqrt"  # "wsd": "1-sqrt" (peak x (1 - sqrt(t)), t 0 -> 1), "linear".
  config.train.learning_rate = 1e-4  # Peak learning rate.
  config.train.warmup_steps = 10_000  # Steps W of linear warmup from 0.
  config.train.weight_decay = 0.01  # Decoupled weight decay; not on LayerNorm or biases.
  config.train.b1 = 0.9  # Adam beta1.
  config.train.b2 = 0.999  # Adam beta2.
  config.train.eps = 1e-6  # Adam epsilon (BERT uses 1e-6).
  # Clip by global norm (0 disables): one norm over the whole batch's gradient (the original
  # clipped per TPU core, each core's gradient before the cross-core sum).
  config.train.max_grad_norm = 1.0
  config.train.grad_accum_steps = 1  # Microbatches per step; batch_size must divide by it.
  config.train.log_every_steps = 100  # Console / TensorBoard / metrics.jsonl interval.
  # Held-out evaluation interval; the last step is always evaluated (0: the last step only).
  config.train.eval_every_steps = 10_000
  config.train.eval_batch_size = 256  # Global batch size for evaluation.
  config.train.eval_max_batches = 0  # Cap on eval batches (0 = the whole validation split).

  # ---------------------------------------------------------------- mesh / sharding
  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # Data-parallel axis size (-1: all devices left over).
  config.mesh.fsdp = 1  # Parameter/optimizer-state sharding axis (ZeRO-3 style).
  config.mesh.tensor = 1  # Tensor (model) parallel axis: heads and MLP width.
  config.mesh.dcn_data = 1  # Data-parallel replicas across slices (DCN); 1 = one slice.
  # Logical axis name -> mesh axis (or axes, or None = replicated).
  config.mesh.logical_axis_rules = (
      ("batch", ("data", "fsdp")),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("mlp", "tensor"),
      ("heads", "tensor"),
      ("kv", None),
      ("length", None),
      ("layers", None),  # The encoder's stacked layer dimension: never split.
  )

  # ---------------------------------------------------------------- checkpoint
  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.save_every_steps = 10_000  # Steps between checkpoints (0: last step, SIGTERM).
  config.checkpoint.max_to_keep = 3  # Keep the newest N checkpoints.
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
