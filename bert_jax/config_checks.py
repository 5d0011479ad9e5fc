"""Every value of a config, checked before any device work: one ValueError, one line, naming the
field (`config.model.hidden_dropout_prob=1.5 must be in [0, 1]`).

A field's own range lives in one table per config kind (`PRETRAINING_RULES` for configs/base.py
and its children, `FINETUNING_RULES` for configs/finetune_base.py and its children): dotted path
-> check, so a new config field is one line here. A field the table does not name, or a named
field the config lacks, is refused too, and tests/test_config_checks.py walks every leaf of both
default configs, so "every field is checked" stays true. Relations between fields (the batch
divides into microbatches, ...) are the `*_RELATIONS` below; they run once every field has
passed, so they may rely on types and ranges. The model's block names and its own relations
(heads divide the width, ...) are defined once, in bert_jax/models/model.py (`choices`,
`relation_problem`): a BertConfig checks them too when built, from a checkpoint as well.

Ranges refuse what is broken, not what is unusual. Examples of the decisions (see the code that
reads each field):
- warmup_steps may exceed num_train_steps with schedules "bert" and "warmup_linear": they stay
  defined (the learning rate is still rising at the last step), and short test runs do exactly
  that. Schedule "wsd" is chosen for its stable phase at the peak: a warmup past the decay's
  start is refused.
- 0 means something for eval_every_steps (the last step only), eval_max_batches (the whole
  split), save_every_steps (only the last step and a SIGTERM save), max_grad_norm (no clipping),
  builtin_max_mb (all of the corpus), num_workers (read in the main process), prefetch (no batch
  ahead) and logging.profile_steps' count (no profile); negative values mean nothing there.
- Dropout probabilities are in [0, 1] (1 zeroes the layer, as torch's); Adam's betas in [0, 1);
  eps > 0 (with eps = 0, bert_adamw divides 0 by 0 on a parameter that never had a gradient).
- QA's max_query_length is a cap, not a size: it may leave no room for a passage in
  max_seq_length, as short questions still fit (a long one is refused by the QA task).
- A mesh axis is -1 (all devices left over) or >= 1; at most one of data / fsdp / tensor is -1
  (`sharding.mesh_shape`). What needs the device count (batch vs mesh) is checked by the trainer.
Pure Python on the config: nothing here touches a device or a file.
"""

import math
import numbers
from typing import Any, Callable, Sequence

import ml_collections

from bert_jax.objectives import masking as masking_lib
from bert_jax import tasks
from bert_jax.tasks import embedding
from bert_jax.models import model, splash
from bert_jax.models import rtd as rtd_model
from bert_jax.objectives import diffusion
from bert_jax.training import optimizer, sharding
from bert_jax.data import packing

# value -> what is wrong with it ("must be an integer >= 1"), or None when it is fine.
Check = Callable[[Any], str | None]
# config -> one line naming the fields whose relation is broken, or None.
Relation = Callable[[ml_collections.ConfigDict], str | None]

# Values the code that reads these fields accepts (it holds them inline).
DATA_SOURCES = ("builtin", "prepared", "mixture", "synthetic")  # data/pipeline.py, train.py
VOCAB_MODEL_TYPES = ("unigram", "bpe")  # data/vocab.py train_sentencepiece
ON_DAMAGED = ("fallback", "fail")  # checkpointing.py
DATA_FORMATS = ("auto", "jsonl", "csv")  # finetune_data.py
# grain's shuffle and numpy's generators take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1
# Steps, sizes and counts end up in int32 arrays and XLA's int32 shapes and loop bounds: a
# larger one overflowed deep inside JAX (OverflowError). An explicit `high` may be lower.
MAX_INT32 = 2**31 - 1
# Every vocabulary has [PAD], [UNK], [CLS], [SEP] and [MASK]; masking needs one more piece.
MIN_VOCAB_SIZE = 6


# ------------------------------------------------------------------------- field checks


def _is_int(value: Any) -> bool:
  # bool is an int to Python and ml_collections lets True into an int field: refused here.
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _note(meaning: str) -> str:
  return f" ({meaning})" if meaning else ""


def integer(low: int, meaning: str = "", high: int | None = None) -> Check:
  """An int >= `low` and <= `high` (default: the int32 range every count lives in); `meaning`
  says what the smallest values mean."""
  bound = f">= {low}" if high is None else f"in [{low}, {high}]"

  def check(value: Any) -> str | None:
    if _is_int(value) and value >= low and value <= (high if high is not None else MAX_INT32):
      return None
    if high is None and _is_int(value) and value > MAX_INT32:
      return f"must be an integer <= {MAX_INT32} (steps, sizes and counts are int32)"
    return f"must be an integer {bound}{_note(meaning)}"
  return check


def number(low: float, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, meaning: str = "") -> Check:
  """A finite int or float in the interval; `meaning` says what its edge values mean."""
  if high is None:
    bound = f"{'>' if low_open else '>='} {low:g}"
  else:
    bound = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

  def check(value: Any) -> str | None:
    if not _is_number(value) or not math.isfinite(value):
      return f"must be a finite number {bound}{_note(meaning)}"
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    return None if above and below else f"must be {bound}{_note(meaning)}"
  return check


def probability() -> Check:
  return number(0.0, 1.0)


def one_of(choices) -> Check:
  """A name among `choices`: a sequence, or a registry dict read at check time (a block
  registered after import, e.g. by a test or a user's module, is accepted)."""
  fixed = None if isinstance(choices, dict) else tuple(choices)

  def check(value: Any) -> str | None:
    names = fixed if fixed is not None else tuple(choices)
    if isinstance(value, str) and value in names:
      return None
    return "must be one of " + ", ".join(repr(c) for c in names)
  return check


def boolean(optional: bool = False) -> Check:
  """True or False; with `optional` also None (unset: a default decided later)."""
  def check(value: Any) -> str | None:
    if isinstance(value, bool) or (optional and value is None):
      return None
    return "must be True or False" + (" (or unset)" if optional else "")
  return check


def string(meaning: str = "", nonempty: bool = False) -> Check:
  """A str (a path, a name); `meaning` says what "" means."""
  def check(value: Any) -> str | None:
    if isinstance(value, str) and (value or not nonempty):
      return None
    return f"must be a{' non-empty' if nonempty else ''} string{_note(meaning)}"
  return check


def mesh_axis() -> Check:
  def check(value: Any) -> str | None:
    if _is_int(value) and (value == -1 or value >= 1):
      return None
    return "must be -1 (all devices left over) or an integer >= 1"
  return check


def profile_window() -> Check:
  """(start, count) of non-negative ints: reporting.Profiler."""
  def check(value: Any) -> str | None:
    if (isinstance(value, (tuple, list)) and len(value) == 2
        and all(_is_int(x) and 0 <= x <= MAX_INT32 for x in value)):
      return None
    return (f"must be a pair (start, count) of integers in [0, {MAX_INT32}] (count 0: no "
            "profile)")
  return check


def axis_rules() -> Check:
  """((logical name, mesh axis | (mesh axes) | None), ...) with mesh axes of `sharding`."""
  problem = ("must be pairs (logical axis name, mesh axis or tuple of mesh axes or None), mesh "
             f"axes from {sharding.MESH_AXES}")

  def axes_ok(axes: Any) -> bool:
    if axes is None:
      return True
    if isinstance(axes, str):
      return axes in sharding.MESH_AXES
    return isinstance(axes, (tuple, list)) and all(
        isinstance(a, str) and a in sharding.MESH_AXES for a in axes)

  def check(value: Any) -> str | None:
    if isinstance(value, (tuple, list)) and all(
        isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
        and axes_ok(rule[1]) for rule in value):
      return None
    return problem
  return check


def token_types() -> Check:
  def check(value: Any) -> str | None:
    if _is_int(value) and (value == 0 or value >= 2):
      return None
    return "must be 0 (no token types) or an integer >= 2 (token types 0 (A) and 1 (B))"
  return check


def even_window() -> Check:
  """model.local_attention: 0 or an even width (a token sees width / 2 rows each way)."""
  def check(value: Any) -> str | None:
    if _is_int(value) and value >= 0 and value % 2 == 0:
      return None
    return "must be 0 (every layer global) or an even integer >= 2 (the window's width)"
  return check


def splash_block() -> Check:
  """model.splash_block_q / _kv: 0 (min(512, L)) or whole TPU lanes (`splash.LANES`)."""
  def check(value: Any) -> str | None:
    if _is_int(value) and value >= 0 and value % splash.LANES == 0:
      return None
    return f"must be 0 (min({splash.DEFAULT_BLOCK}, L)) or a positive multiple of {splash.LANES}"
  return check


def widths() -> Check:
  """Matryoshka widths: distinct integers >= 1 (the encoder's width bounds them once loaded)."""
  def check(value: Any) -> str | None:
    if (isinstance(value, (tuple, list)) and all(_is_int(v) and v >= 1 for v in value)
        and len(set(value)) == len(value)):
      return None
    return "must be distinct integers >= 1 (() = the full width only)"
  return check


def fractions(low_open: bool) -> Check:
  """A non-empty tuple of numbers in [0, 1] ((0, 1] when `low_open`): rates, or stage starts."""
  def check(value: Any) -> str | None:
    if (isinstance(value, (tuple, list)) and value and all(
        _is_number(v) and (0.0 < v if low_open else 0.0 <= v) and v <= 1.0 for v in value)):
      return None
    return f"must be a non-empty tuple of numbers in {'(0' if low_open else '[0'}, 1]"
  return check


def label_names() -> Check:
  """Distinct label names (str or int; 1 and "1" are one label: finetune_data.label_name)."""
  def check(value: Any) -> str | None:
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(v, str) or _is_int(v) for v in value):
      return "must be a tuple of label names (() = the sorted labels of the train file)"
    names = [str(v) for v in value]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
      return f"must name each label once ({duplicates} more than once: one index per label)"
    return None
  return check


# -------------------------------------------------------------------------------- tables


def _model_choice(field: str) -> Check:
  """A model field naming an entry of its table (`model.choices()`, the one list of them)."""
  return one_of(model.choices()[field])


def _model_rules(vocab_size: Check, classifier_pooling: Check) -> dict[str, Check]:
  """config.model: pretraining and fine-tuning differ in vocab_size and classifier_pooling
  (fine-tuning's "auto": the checkpoint's) only."""
  return {
      "model.vocab_size": vocab_size,
      "model.hidden_size": integer(1),
      "model.num_hidden_layers": integer(1),
      "model.num_attention_heads": integer(1),
      "model.intermediate_size": integer(1),
      "model.hidden_act": _model_choice("hidden_act"),
      "model.hidden_dropout_prob": probability(),
      "model.attention_probs_dropout_prob": probability(),
      "model.max_position_embeddings": integer(1),
      # Token type 1 marks segment B (pairs, QA passages); a table of 1 is read out of range.
      "model.type_vocab_size": token_types(),
      "model.embedding_size": integer(0),  # 0: hidden_size.
      # 0 would start every weight at 0: no symmetry to break, nothing learns.
      "model.initializer_range": number(0.0, low_open=True),
      "model.layer_norm_eps": number(0.0, low_open=True),
      "model.dtype": one_of(model.DTYPES),
      "model.param_dtype": one_of(model.DTYPES),
      "model.attention_impl": _model_choice("attention_impl"),
      "model.splash_block_q": splash_block(),
      "model.splash_block_kv": splash_block(),
      "model.vocab_pad_multiple": integer(1, "1: no padding"),
      "model.dropout_rng": _model_choice("dropout_rng"),
      "model.position_embedding": _model_choice("position_embedding"),
      "model.mlp": _model_choice("mlp"),
      "model.norm_placement": _model_choice("norm_placement"),
      "model.norm": _model_choice("norm"),
      "model.remat": _model_choice("remat"),
      "model.scan_unroll": integer(1, "1: one repeat of the layer pattern per scan step"),
      "model.attention_bias": boolean(),
      "model.mlp_bias": boolean(),
      "model.norm_bias": boolean(),
      "model.classifier_bias": boolean(),
      "model.global_rope_theta": number(0.0, low_open=True),
      "model.local_rope_theta": number(0.0, low_open=True),
      "model.local_attention": even_window(),
      "model.global_attn_every_n_layers": integer(1, "1: every layer global"),
      "model.classifier_pooling": classifier_pooling,
      "model.initializer": _model_choice("initializer"),
  }


_TRAIN_RULES: dict[str, Check] = {
    "train.batch_size": integer(1),
    "train.num_train_steps": integer(1),
    "train.optimizer": one_of(optimizer.OPTIMIZERS),
    "train.schedule": one_of(optimizer.SCHEDULES),
    "train.decay_fraction": number(0.0, 1.0, meaning="0: no decay"),
    "train.decay_shape": one_of(optimizer.DECAY_SHAPES),
    "train.learning_rate": number(0.0, low_open=True),
    "train.warmup_steps": integer(0, "0: no warmup"),
    "train.weight_decay": number(0.0),
    "train.b1": number(0.0, 1.0, high_open=True),
    "train.b2": number(0.0, 1.0, high_open=True),
    "train.eps": number(0.0, low_open=True),
    "train.max_grad_norm": number(0.0, meaning="0: no clipping"),
    "train.grad_accum_steps": integer(1),
    "train.log_every_steps": integer(1),
    "train.eval_every_steps": integer(0, "0: the last step only"),
    "train.eval_batch_size": integer(1),
}

_MESH_RULES: dict[str, Check] = {
    "mesh.data": mesh_axis(),
    "mesh.fsdp": mesh_axis(),
    "mesh.tensor": mesh_axis(),
    "mesh.dcn_data": integer(1, "1: one slice"),
    "mesh.logical_axis_rules": axis_rules(),
}

_CHECKPOINT_RULES: dict[str, Check] = {
    "checkpoint.save_every_steps": integer(0, "0: only the last step and a SIGTERM save"),
    # 0 made orbax delete each checkpoint as soon as it was written.
    "checkpoint.max_to_keep": integer(1),
    "checkpoint.async_save": boolean(),
    "checkpoint.on_damaged": one_of(ON_DAMAGED),
    # NaN would never run out (a stuck save would block the stop); inf is as bad.
    "checkpoint.stop_grace_seconds": number(0.0),
    "checkpoint.allow_vocab_change": boolean(),
}

_LOGGING_RULES: dict[str, Check] = {
    "logging.tensorboard": boolean(),
    "logging.profile_steps": profile_window(),
}

_SEED = integer(0, "", MAX_SEED)

# configs/base.py (tiny.py, large.py): every field.
PRETRAINING_RULES: dict[str, Check] = {
    "seed": _SEED,
    "init_from": string('"": a random init'),
    **_model_rules(vocab_size=integer(MIN_VOCAB_SIZE, "5 special tokens and a piece to mask"),
                   classifier_pooling=_model_choice("classifier_pooling")),
    "data.source": one_of(DATA_SOURCES),
    "data.dataset_dir": string('"": none; source "prepared" needs one'),
    "data.mixture": string('"": none; source "mixture" needs one'),
    "data.mixture_temperature": number(0.0, low_open=True, meaning="1: sizes' proportions"),
    "data.mixture_phases": string('"": one phase'),
    # [CLS] A [SEP] B [SEP]: the shortest row prepare and the synthetic source can build.
    "data.max_seq_length": integer(5, "[CLS] A [SEP] B [SEP]"),
    "data.objective": one_of(tuple(packing.ROW_FORMATS)),
    "data.max_examples_per_row": integer(1, "1: one example per row, unpacked"),
    "data.short_seq_prob": probability(),
    "data.span_warmup_steps": integer(0, "0: no example-length warmup"),
    "data.span_warmup_start": integer(1),
    "data.dupe_factor": integer(1),
    "data.validation_fraction": number(0.0, 1.0, high_open=True),
    "data.vocab_model_type": one_of(VOCAB_MODEL_TYPES),
    "data.builtin_max_mb": number(0.0, meaning="0: all of it"),
    "data.builtin_cache_dir": string('"": <workdir>/data'),
    "data.num_workers": integer(0, "0: read in the main process"),
    "data.prefetch": integer(0, "0: no batch ahead"),
    "masking.mask_prob": number(0.0, 1.0, low_open=True),
    "rtd.generator_hidden_fraction": number(0.0, 1.0, low_open=True,
                                            meaning="1: as wide as the discriminator"),
    "rtd.generator_layers": integer(0, "0: the discriminator's"),
    "rtd.generator_heads": integer(0, "0: one per 64 of width"),
    "rtd.embedding_sharing": one_of(rtd_model.SHARINGS),
    "rtd.disc_weight": number(0.0, low_open=True),
    "rtd.temperature": number(0.0, low_open=True),
    "masking.eval_mask_prob": number(0.0, 1.0, meaning="0: mask_prob"),
    "masking.max_predictions_per_seq": integer(1),
    "masking.mask_token_prob": probability(),
    "masking.random_token_prob": probability(),
    "masking.whole_word_masking": boolean(),
    "masking.rate_schedule": one_of(("constant", "stages")),
    "masking.stage_rates": fractions(low_open=True),
    "masking.stage_starts": fractions(low_open=False),
    "diffusion.schedule": one_of(diffusion.SCHEDULES),
    "diffusion.eval_points": integer(-1, "0: no held-out bound, -1: 8 for objective diffusion, "
                                     "0 otherwise", high=1024),
    **_TRAIN_RULES,
    "train.eval_max_batches": integer(0, "0: the whole validation split"),
    **_MESH_RULES,
    **_CHECKPOINT_RULES,
    **_LOGGING_RULES,
}

# configs/finetune_base.py (finetune_*.py): every field.
FINETUNING_RULES: dict[str, Check] = {
    "seed": _SEED,
    "task": one_of(tasks.FINETUNE_TASKS),  # The registry, read at check time (`tasks.register`).
    "init_from": string('"": from scratch'),
    "vocab": string('"": the checkpoint\'s own'),
    # From scratch: 0 takes the vocabulary's size (finetune.load_encoder checks a larger one).
    **_model_rules(vocab_size=integer(0, "0: the vocabulary's size"),
                   classifier_pooling=one_of(("auto", *model.POOLINGS))),
    "head.kind": one_of(tasks.HEAD_KINDS),
    "head.dropout_prob": probability(),
    "head.classifier_dropout": probability(),
    "data.train_file": string(),
    "data.validation_file": string('"": no evaluation'),
    "data.format": one_of(DATA_FORMATS),
    "data.tfds_name": string('"": read data.train_file'),
    "data.tfds_train_split": string(nonempty=True),
    "data.tfds_validation_split": string(nonempty=True),
    "data.tfds_data_dir": string('"": TFDS\'s default'),
    "data.labels": label_names(),
    "data.regression": boolean(),
    # [CLS] A [SEP] B [SEP]: the three special tokens of a pair.
    "data.max_seq_length": integer(3, "[CLS] A [SEP] B [SEP]"),
    "data.max_query_length": integer(1),
    "data.doc_stride": integer(1),
    "data.max_answer_length": integer(1),
    "data.version_2_with_negative": boolean(),
    "data.null_score_diff_threshold": number(-math.inf, meaning="run_squad.py's default: 0"),
    "data.prefetch": integer(0, "0: no batch ahead"),
    "embedding.pooling": one_of(("auto", *embedding.POOLINGS)),
    "embedding.normalize": boolean(optional=True),
    "embedding.num_negatives": integer(0, "0: in-batch negatives only"),
    "embedding.scale": number(0.0, low_open=True),  # 1 / temperature: a temperature > 0.
    "embedding.symmetric": boolean(),
    "embedding.mask_false_negatives": boolean(),
    "embedding.matryoshka_dims": widths(),
    "embedding.pack": boolean(),
    "diffusion.schedule": one_of(diffusion.SCHEDULES),
    "diffusion.eval_points": integer(1, high=1024),
    "train.freeze_encoder": boolean(),
    **_TRAIN_RULES,
    "train.num_train_steps": integer(0, "0: num_train_epochs over the training set"),
    "train.num_train_epochs": number(0.0, low_open=True),
    "train.warmup_proportion": number(0.0, 1.0, high_open=True, meaning="0: no warmup"),
    "train.best_metric": string('"": the task\'s main metric'),
    **_MESH_RULES,
    **_CHECKPOINT_RULES,
    **_LOGGING_RULES,
}


# ----------------------------------------------------------------------------- relations


def _model_relations_hold(config) -> str | None:
  """The model's own rules between its fields (`model.relation_problem`, which a BertConfig
  checks too when it is built)."""
  return model.relation_problem(config.model, prefix="config.model.")


def _microbatches_divide_batch(config) -> str | None:
  t = config.train
  if t.batch_size % t.grad_accum_steps:
    return (f"config.train.batch_size={t.batch_size} is not divisible by "
            f"config.train.grad_accum_steps={t.grad_accum_steps}")
  return None


def _one_inferred_mesh_axis(config) -> str | None:
  sizes = {axis: config.mesh[axis] for axis in sharding.MESH_AXES}
  inferred = [axis for axis, size in sizes.items() if size == -1]
  if len(inferred) > 1:
    return (" and ".join(f"config.mesh.{axis}=-1" for axis in inferred)
            + ": at most one mesh axis may take the devices left over")
  return None


def _length_fits_positions(config) -> str | None:
  length, positions = config.data.max_seq_length, config.model.max_position_embeddings
  if length > positions:
    return (f"config.data.max_seq_length={length} exceeds "
            f"config.model.max_position_embeddings={positions}")
  return None


def _predictions_cover_a_row(config) -> str | None:
  # Each example of a row gets its own max(1, round(rate x its eligible tokens)) targets: the P
  # slots must hold what a row's K examples can need together (short ones round up, each has at
  # least 1: BERT-Base's 16 at L = 512 can need 80 > round(0.15 x 512)), in training and at the
  # evaluation rate.
  masking, data = config.masking, config.data
  if data.objective == "diffusion":  # Its corruption has a slot per position (P = L).
    return None
  rates = [("mask_prob", masking.mask_prob), ("eval_mask_prob", masking.eval_mask_prob)]
  if masking.rate_schedule == "stages":
    rates = [(f"stage_rates[{i}]", r) for i, r in enumerate(masking.stage_rates)] + rates[1:]
  name, rate = max(rates, key=lambda pair: pair[1])
  rows = packing.row_format(data.objective)
  examples = packing.examples_per_row(rows, data.max_examples_per_row)
  needed = masking_lib.max_targets_per_row(rate, data.max_seq_length, examples,
                                           *packing.example_specials(rows))
  if masking.max_predictions_per_seq < needed:
    return (f"config.masking.max_predictions_per_seq={masking.max_predictions_per_seq} cannot "
            f"hold the {needed} targets of a full row (up to {examples} examples in "
            f"max_seq_length {data.max_seq_length}, each max(1, round({name} {rate} x its "
            f"eligible tokens)) targets); set it to at least {needed}")
  return None


def _window_fits_a_row(config) -> str | None:
  window, length = config.model.local_attention, config.data.max_seq_length
  if window > length:
    return (f"config.model.local_attention={window} is wider than a row "
            f"(config.data.max_seq_length={length}): every layer would be global; use 0 or a "
            "smaller window")
  return None


def _splash_blocks_divide_a_row(config) -> str | None:
  """With attention_impl "splash" the row length and blocks fit the kernel (`splash.block_sizes`
  says the same at trace time, also for "auto" on a TPU)."""
  if config.model.attention_impl != "splash":
    return None
  m, length = config.model, config.data.max_seq_length
  try:
    splash.block_sizes(length, m.splash_block_q, m.splash_block_kv)
  except ValueError as error:
    return str(error)
  return None


def _rtd_generator_fits(config) -> str | None:
  """Objectives rtd / rtd_nsp: a generator no larger than the discriminator, of a width its
  heads divide, and a mask rate that leaves most tokens original."""
  if not config.data.objective.startswith("rtd"):
    return None
  m, r = config.model, config.rtd
  if r.generator_layers > m.num_hidden_layers:
    return (f"config.rtd.generator_layers={r.generator_layers} makes the generator deeper than "
            f"the discriminator (config.model.num_hidden_layers={m.num_hidden_layers})")
  width = int(round(m.hidden_size * r.generator_hidden_fraction))
  heads = r.generator_heads or max(1, width // 64)
  if width < 1 or width % heads:
    return (f"config.rtd.generator_hidden_fraction={r.generator_hidden_fraction} gives a "
            f"generator width of {width}, which {heads} heads (config.rtd.generator_heads="
            f"{r.generator_heads}) cannot split")
  for name in ("mask_prob", "eval_mask_prob"):
    rate = config.masking[name]
    if rate > 0.5:
      return (f"config.masking.{name}={rate} with objective {config.data.objective!r}: above "
              "0.5 most real tokens would be replaced, so the discriminator's classes swap "
              "and the generator sees mostly [MASK]; ELECTRA masks 0.15 (0.25 at large size)")
  return None


def _rate_stages_line_up(config) -> str | None:
  """masking.rate_schedule "stages": a start per rate, ascending from 0; not with objectives
  whose rate is their own (diffusion's t)."""
  m = config.masking
  if m.rate_schedule != "stages":
    return None
  if config.data.objective == "diffusion":
    return ("config.masking.rate_schedule='stages' with objective 'diffusion': diffusion masks "
            "each example at its own t; use rate_schedule 'constant'")
  starts = list(m.stage_starts)
  if len(starts) != len(m.stage_rates):
    return (f"config.masking.stage_starts has {len(starts)} entries and "
            f"config.masking.stage_rates {len(m.stage_rates)}: give one start per rate")
  if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
    return (f"config.masking.stage_starts={tuple(starts)} must start at 0 and ascend "
            "(fractions of num_train_steps)")
  return None


def _span_warmup_is_mlm(config) -> str | None:
  data = config.data
  if not data.span_warmup_steps:
    return None
  if packing.row_format(data.objective) != "mlm":
    return (f"config.data.span_warmup_steps={data.span_warmup_steps} cuts MLM-only rows into "
            f"spans: it needs config.data.objective 'mlm' or 'rtd' (it is {data.objective!r})")
  if data.span_warmup_start > data.max_seq_length:
    return (f"config.data.span_warmup_start={data.span_warmup_start} exceeds "
            f"config.data.max_seq_length={data.max_seq_length}")
  return None


def _wsd_warmup_ends_before_the_decay(config) -> str | None:
  # Warmup overrides the rest of the schedule: a warmup past the decay's start never reaches
  # the peak, and the stable phase the schedule is chosen for never happens.
  train = config.train
  if train.schedule != "wsd":
    return None
  decay = optimizer.wsd_decay_steps(train.decay_fraction, train.num_train_steps)
  stable_end = train.num_train_steps - decay
  if train.warmup_steps > stable_end:
    return (f"config.train.warmup_steps={train.warmup_steps} runs past the start of schedule "
            f"'wsd''s decay at step {stable_end} (num_train_steps {train.num_train_steps} less "
            f"{decay} decay steps, decay_fraction {train.decay_fraction:g}): the learning rate "
            f"would never reach its peak; use warmup_steps <= {stable_end} or a smaller "
            "decay_fraction")
  return None


def _replacements_sum_to_at_most_one(config) -> str | None:
  masking = config.masking
  total = masking.mask_token_prob + masking.random_token_prob
  if total > 1.0 + 1e-9:  # 0.8 + 0.2 is 1.0000000000000002 in floats.
    return (f"config.masking.mask_token_prob={masking.mask_token_prob} + "
            f"config.masking.random_token_prob={masking.random_token_prob} = {total:g} must be "
            "<= 1 (the rest keep their token)")
  return None


def _prepared_needs_dataset_dir(config) -> str | None:
  if config.data.source == "prepared" and not config.data.dataset_dir:
    return ("config.data.dataset_dir is empty: config.data.source='prepared' reads a directory "
            "written by launch/prepare_data.py")
  return None


def _mixture_fields_with_a_mixture(config) -> str | None:
  """A mixture needs its datasets, and its fields are read by source "mixture" only; the
  mixture's own syntax (`data/mixture.py`)."""
  data = config.data
  if data.source != "mixture":
    for field, default in (("mixture", ""), ("mixture_temperature", 1.0),
                           ("mixture_phases", "")):
      if data[field] != default:
        return (f"config.data.{field}={data[field]!r} is read by config.data.source='mixture' "
                f"only (this run's source: {data.source!r})")
    return None
  from bert_jax.data import mixture  # pylint: disable=import-outside-toplevel
  try:
    mixture.MixtureSpec.parse(data.mixture, data.mixture_temperature, data.mixture_phases)
  except ValueError as e:
    return str(e)
  return None


def _builtin_needs_validation(config) -> str | None:
  # Pretraining evaluates on the validation split (at least at its last step); with 0 the
  # built-in corpus would be prepared (minutes) only to fail on an empty split.
  if config.data.source == "builtin" and config.data.validation_fraction <= 0:
    return (f"config.data.validation_fraction={config.data.validation_fraction!r} leaves the "
            "built-in corpus no validation split, which pretraining evaluates on: use > 0 "
            "(e.g. 0.01)")
  return None


def _scratch_needs_vocab(config) -> str | None:
  if not config.init_from and not config.vocab:
    return ("config.vocab is empty: training from scratch (config.init_from is empty) needs a "
            "vocabulary")
  return None


def _scratch_length_fits_positions(config) -> str | None:
  # A pretrained encoder brings its own position table (checked once it is loaded).
  return None if config.init_from else _length_fits_positions(config)


def _regression_is_classification(config) -> str | None:
  if config.data.regression and tasks.finetune_task(config.task) is not tasks.ClassificationTask:
    return (f"config.data.regression=True applies to the classification task only, "
            f"config.task={config.task!r}")
  return None


def _one_training_source(config) -> str | None:
  data = config.data
  if not data.train_file and not data.tfds_name:
    return "config.data.train_file is empty: set it (or config.data.tfds_name) to train on"
  if data.tfds_name:
    # The TFDS splits replace both files: a file given as well would be silently ignored.
    given = [name for name in ("train_file", "validation_file") if data[name]]
    if given:
      return (f"config.data.{given[0]}={data[given[0]]!r} is ignored with "
              f"config.data.tfds_name={data.tfds_name!r}: use one of them")
  return None


PRETRAINING_RELATIONS: tuple[Relation, ...] = (
    _model_relations_hold, _length_fits_positions, _predictions_cover_a_row,
    _replacements_sum_to_at_most_one, _microbatches_divide_batch, _one_inferred_mesh_axis,
    _prepared_needs_dataset_dir, _builtin_needs_validation, _mixture_fields_with_a_mixture,
    _window_fits_a_row, _span_warmup_is_mlm, _splash_blocks_divide_a_row,
    _wsd_warmup_ends_before_the_decay, _rtd_generator_fits, _rate_stages_line_up)

FINETUNING_RELATIONS: tuple[Relation, ...] = (
    _model_relations_hold, _scratch_length_fits_positions,
    _microbatches_divide_batch,
    _one_inferred_mesh_axis, _scratch_needs_vocab, _regression_is_classification,
    _one_training_source, _splash_blocks_divide_a_row, _wsd_warmup_ends_before_the_decay)

# What a compile-only fine-tuning run does not read.
_DATA_RELATIONS = (_scratch_needs_vocab, _one_training_source)


# ---------------------------------------------------------------------------------- entry


def leaf_paths(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  """Dotted path -> value of every leaf (a tuple is one leaf: profile_steps, labels, rules)."""
  leaves = {}
  for name, value in config.items():
    path = f"{prefix}{name}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      leaves.update(leaf_paths(value, f"{path}."))
    else:
      leaves[path] = value
  return leaves


def check_config(config: ml_collections.ConfigDict, rules: dict[str, Check],
                 relations: tuple[Relation, ...], kind: str) -> None:
  """Raises ValueError (one line, naming the field) on the first field of `config` that
  `rules` does not know or refuses, then on the first broken relation."""
  leaves = leaf_paths(config)
  for path in leaves:
    if path not in rules:
      raise ValueError(f"config.{path} is not a {kind} config field (a typo? its defaults are in "
                       "configs/); a new field needs its rule in bert_jax/config_checks.py")
  for path, rule in rules.items():
    if path not in leaves:
      raise ValueError(f"config.{path} is missing: a {kind} config has every field of its "
                       "defaults in configs/")
    problem = rule(leaves[path])
    if problem:
      raise ValueError(f"config.{path}={leaves[path]!r} {problem}")
  for relation in relations:
    problem = relation(config)
    if problem:
      raise ValueError(problem)


def with_registered(rules: dict[str, Check]) -> dict[str, Check]:
  """`rules` and the rules the registries own: each registered optimizer's own config.train
  fields (`optimizer.OPTIMIZERS`; one added later, by a user's module or a test, included)."""
  return {**rules, **{f"train.{name}": check for name, check in optimizer.own_fields().items()}}


# Sections that only some objectives (pretraining) or tasks (fine-tuning) read: an override of
# one that the run's objective or task does not read is refused (`check_overrides_read`), not
# ignored. Keys: section; values: the objectives / tasks that read it.
PRETRAINING_SECTION_READERS = {"rtd": ("rtd", "rtd_nsp"),
                               "diffusion": ("mlm_nsp", "mlm", "diffusion")}
FINETUNING_SECTION_READERS = {"embedding": ("embedding",), "diffusion": ("diffusion_sft",)}


def check_overrides_read(config: ml_collections.ConfigDict, overrides: Sequence[str],
                         fine_tuning: bool) -> None:
  """Refuses a `--config.<section>.<field>=...` override (as given on the command line) of a
  section that this run's objective (pretraining) or task (fine-tuning) never reads."""
  readers = FINETUNING_SECTION_READERS if fine_tuning else PRETRAINING_SECTION_READERS
  chosen, what = ((config.task, "task") if fine_tuning
                  else (config.data.objective, "objective"))
  for override in overrides:
    path = override.split("=", 1)[0].removeprefix("--config.")
    section = path.split(".", 1)[0]
    if section in readers and chosen not in readers[section]:
      choose = "--config.task" if fine_tuning else "--config.data.objective"
      raise ValueError(f"--config.{path} is not read by {what} {chosen!r}: config.{section} is "
                       f"read by {what} {', '.join(repr(r) for r in readers[section])} only; "
                       f"drop the override or set {choose}")


def check_pretraining(config: ml_collections.ConfigDict) -> None:
  """Every field of a pretraining config (configs/base.py, tiny.py, large.py and overrides)."""
  check_config(config, with_registered(PRETRAINING_RULES), PRETRAINING_RELATIONS, "pretraining")


def check_finetuning(config: ml_collections.ConfigDict, compile_only: bool = False) -> None:
  """Every field of a fine-tuning config (configs/finetune_base.py, finetune_*.py, overrides).
  A compile-only run reads no data and builds no tokenizer: it needs neither a training source
  nor, from scratch, more than the vocabulary's size (`finetune.compile_report`)."""
  relations = tuple(r for r in FINETUNING_RELATIONS
                    if not (compile_only and r in _DATA_RELATIONS))
  check_config(config, with_registered(FINETUNING_RULES), relations, "fine-tuning")
