"""bert_jax/config_checks.py: every field of every config kind has a rule, the shipped configs
pass, and each bad value is refused in one line naming its field. Pure Python: no compile."""

import math
import types

import pytest

from bert_jax import config_checks, train
from bert_jax.models import model
from bert_jax.training import sharding
from bert_jax.models.model import BertConfig
from configs import (base, finetune_base, finetune_classification, finetune_diffusion_sft,
                     finetune_qa, finetune_tagging, large, tiny)

PRETRAINING_CONFIGS = (base, tiny, large)
FINETUNING_CONFIGS = (finetune_base, finetune_classification, finetune_qa, finetune_tagging,
                      finetune_diffusion_sft)


def _set(config, path: str, value) -> None:
  """config.<path> = value, through ml_collections' own type checks (what an override does)."""
  *sections, name = path.split(".")
  for section in sections:
    config = config[section]
  config[name] = value


def _pretraining(**overrides):
  config = base.get_config()
  for path, value in overrides.items():
    _set(config, path.replace("__", "."), value)
  return config


def _finetuning(module=finetune_classification, **overrides):
  """A fine-tuning config with the inputs its docstring's Run line gives (encoder, data)."""
  config = module.get_config()
  config.init_from, config.data.train_file = "runs/tiny", "train.jsonl"
  for path, value in overrides.items():
    _set(config, path.replace("__", "."), value)
  return config


def _refused(check, config) -> str:
  with pytest.raises(ValueError) as error:
    check(config)
  message = str(error.value)
  assert "\n" not in message
  return message


# ------------------------------------------------------------------------------ coverage


@pytest.mark.parametrize("module, rules", [
    (base, config_checks.PRETRAINING_RULES), (finetune_base, config_checks.FINETUNING_RULES)])
def test_every_config_field_has_a_rule(module, rules):
  """A new field of configs/base.py or finetune_base.py fails here until it has its rule (and a
  rule of a removed field fails too)."""
  fields = set(config_checks.leaf_paths(module.get_config()))
  assert sorted(fields - set(rules)) == [], "config fields without a rule in config_checks"
  assert sorted(set(rules) - fields) == [], "rules of fields the config does not have"


@pytest.mark.parametrize("module", PRETRAINING_CONFIGS)
def test_pretraining_configs_pass(module):
  config_checks.check_pretraining(module.get_config())


@pytest.mark.parametrize("module", FINETUNING_CONFIGS)
def test_finetuning_configs_pass_once_given_encoder_and_data(module):
  config_checks.check_finetuning(_finetuning(module))
  # From scratch with a vocabulary, or on a TFDS dataset, instead.
  config_checks.check_finetuning(_finetuning(module, init_from="", vocab="vocab.txt"))
  config_checks.check_finetuning(_finetuning(module, data__train_file="",
                                             data__tfds_name="glue/sst2"))
  # As shipped, the encoder (or vocabulary) and the data are the inputs still to give.
  assert _refused(config_checks.check_finetuning, module.get_config()).startswith("config.vocab")


def test_documented_edge_values_pass():
  """0 where it has a meaning, warmup past the last step, an axis other than data at -1."""
  config = tiny.get_config()
  config.train.update(num_train_steps=12, warmup_steps=100, eval_every_steps=0,
                      eval_max_batches=0, max_grad_norm=0.0, b1=0.0, weight_decay=0.0,
                      learning_rate=1e38)
  config.model.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=1.0,
                      dtype="bfloat16", param_dtype="bfloat16", vocab_pad_multiple=1)
  config.data.update(builtin_max_mb=0.0, num_workers=0, prefetch=0, objective="mlm")
  config.masking.update(mask_prob=1.0, max_predictions_per_seq=128, mask_token_prob=0.8,
                        random_token_prob=0.2)
  config.checkpoint.update(save_every_steps=0, stop_grace_seconds=0.0)
  config.mesh.update(data=1, fsdp=-1, dcn_data=2)
  config.logging.profile_steps = [3, 2]  # A list from an override becomes a tuple.
  config_checks.check_pretraining(config)
  # Synthetic data has no validation split to need.
  config_checks.check_pretraining(_pretraining(data__source="synthetic",
                                               data__validation_fraction=0.0))
  # max_query_length only caps questions: rows of 24 take short ones (tests/test_finetune.py).
  qa = _finetuning(finetune_qa, data__max_seq_length=24, data__max_query_length=64,
                   data__labels=("1", "2"))
  config_checks.check_finetuning(qa)


# -------------------------------------------------------------------------- bad values

# (field, a value ml_collections lets through that the run cannot use). Every rule has one.
_SHARED_BAD = [
    ("seed", -1), ("seed", 2**32),
    ("model.hidden_size", -32), ("model.num_hidden_layers", -1), ("model.num_hidden_layers", 0),
    ("model.num_attention_heads", 0), ("model.intermediate_size", 0),
    ("model.hidden_act", "swish"), ("model.hidden_dropout_prob", 1.5),
    ("model.attention_probs_dropout_prob", -0.1), ("model.max_position_embeddings", 0),
    ("model.type_vocab_size", 1), ("model.embedding_size", -1), ("model.initializer_range", 0.0),
    ("model.layer_norm_eps", 0.0), ("model.dtype", "fp32"), ("model.dtype", None),
    ("model.param_dtype", "float16"), ("model.attention_impl", "flash"),
    ("model.vocab_pad_multiple", 0), ("model.dropout_rng", "philox"),
    ("model.position_embedding", "sinusoidal"), ("model.mlp", "moe"),
    ("model.norm_placement", "sandwich"), ("model.norm", "batch_norm"), ("model.remat", "offload"),
    ("model.scan_unroll", 0),
    ("model.attention_bias", None), ("model.mlp_bias", None), ("model.norm_bias", None),
    ("model.classifier_bias", None), ("model.global_rope_theta", 0.0),
    ("model.local_rope_theta", -1.0), ("model.local_attention", 7),
    ("model.local_attention", -2), ("model.global_attn_every_n_layers", 0),
    ("model.classifier_pooling", "max"), ("model.type_vocab_size", -1),
    ("model.initializer", "xavier"),
    ("model.splash_block_q", 100), ("model.splash_block_kv", -128),
    ("train.decay_fraction", 1.5), ("train.decay_shape", "cosine"),
    ("train.batch_size", True), ("train.batch_size", 0),
    ("train.optimizer", "sgd"), ("train.schedule", "cosine"), ("train.learning_rate", -1),
    ("train.learning_rate", 0.0), ("train.learning_rate", math.nan),
    ("train.learning_rate", math.inf), ("train.warmup_steps", -5),
    ("train.weight_decay", -0.01), ("train.b1", 1.0), ("train.b2", -0.5), ("train.eps", 0.0),
    ("train.max_grad_norm", -1.0), ("train.grad_accum_steps", 0), ("train.log_every_steps", 0),
    ("train.eval_every_steps", -1), ("train.eval_batch_size", 0), ("train.eval_batch_size", None),
    ("mesh.data", 0), ("mesh.fsdp", -2), ("mesh.tensor", 0), ("mesh.dcn_data", 0),
    ("mesh.logical_axis_rules", (("batch", "model"),)),
    ("mesh.logical_axis_rules", (("batch", ("data", "fsdp"), "extra"),)),
    ("checkpoint.save_every_steps", -1), ("checkpoint.max_to_keep", 0),
    ("checkpoint.async_save", None), ("checkpoint.on_damaged", "ignore"),
    ("checkpoint.stop_grace_seconds", math.nan), ("checkpoint.stop_grace_seconds", -1.0),
    ("checkpoint.allow_vocab_change", None),
    ("logging.tensorboard", None), ("logging.profile_steps", (5,)),
    ("logging.profile_steps", (-1, 2)), ("logging.profile_steps", (0, 1.5)),
]
PRETRAINING_BAD = _SHARED_BAD + [
    ("model.vocab_size", 5), ("data.source", "gcs"), ("data.dataset_dir", None),
    ("data.mixture", None), ("data.mixture_temperature", 0.0), ("data.mixture_phases", None),
    ("data.max_seq_length", 4), ("data.objective", "nsp"), ("data.max_examples_per_row", 0),
    ("data.short_seq_prob", 2.0), ("data.dupe_factor", 0), ("data.validation_fraction", 1.0),
    ("data.vocab_model_type", "wordpiece"), ("data.builtin_max_mb", -1.0),
    ("data.builtin_cache_dir", None), ("data.num_workers", -1), ("data.prefetch", -1),
    ("masking.mask_prob", 0.0), ("masking.max_predictions_per_seq", 0),
    ("masking.mask_token_prob", 1.2), ("masking.random_token_prob", -0.1),
    ("masking.whole_word_masking", None), ("masking.eval_mask_prob", 1.5),
    ("rtd.generator_hidden_fraction", 0.0), ("rtd.generator_layers", -1),
    ("rtd.generator_heads", -1), ("rtd.embedding_sharing", "tied"), ("rtd.disc_weight", -1.0), ("rtd.temperature", 0.0),
    ("masking.rate_schedule", "mmbert"), ("masking.stage_rates", (0.3, 0.0)),
    ("masking.stage_rates", ()), ("masking.stage_starts", (0.0, 1.5)),
    ("diffusion.schedule", "cosine"), ("diffusion.eval_points", -2),
    ("train.num_train_steps", 0),
    ("data.span_warmup_steps", -1), ("data.span_warmup_start", 0),
    ("model.classifier_pooling", "auto"),  # Fine-tuning's only: "the checkpoint's".
    ("train.eval_max_batches", -1),
    ("init_from", None),
]
FINETUNING_BAD = _SHARED_BAD + [
    ("task", "ner"), ("init_from", None), ("vocab", None), ("model.vocab_size", -1),
    ("head.dropout_prob", 1.5), ("head.kind", "roberta"), ("head.classifier_dropout", -0.1),
    ("data.train_file", None), ("data.validation_file", None),
    ("data.format", "tsv"), ("data.tfds_name", None), ("data.tfds_train_split", ""),
    ("data.tfds_validation_split", ""), ("data.tfds_data_dir", None),
    ("data.labels", ("a", "b", "a")), ("data.labels", ("1", 1)), ("data.labels", (None,)),
    ("data.regression", None), ("data.max_seq_length", 2), ("data.max_query_length", 0),
    ("data.doc_stride", 0), ("data.max_answer_length", 0), ("data.prefetch", -1),
    ("train.freeze_encoder", None), ("train.best_metric", None),
    ("train.num_train_epochs", 0.0), ("train.warmup_proportion", 1.0),
    ("data.version_2_with_negative", None), ("data.null_score_diff_threshold", math.nan),
    ("train.num_train_steps", -1),
    ("embedding.pooling", "first"),
    ("embedding.num_negatives", -1), ("embedding.scale", 0.0), ("embedding.scale", -20.0),
    ("embedding.symmetric", None), ("embedding.mask_false_negatives", None),
    ("embedding.matryoshka_dims", (64, 64)), ("embedding.matryoshka_dims", (0,)),
    ("embedding.pack", None),
    ("diffusion.schedule", "cosine"), ("diffusion.eval_points", 0),
]


@pytest.mark.parametrize("bad, rules", [(PRETRAINING_BAD, config_checks.PRETRAINING_RULES),
                                        (FINETUNING_BAD, config_checks.FINETUNING_RULES)])
def test_the_bad_values_cover_every_rule(bad, rules):
  assert sorted(set(rules) - {path for path, _ in bad} - TYPED_PLACEHOLDERS) == []


# Fields declared `config_dict.placeholder(type)` (unset: None): ml_collections refuses a value
# of another type at assignment, so no bad value reaches the rule through an override.
TYPED_PLACEHOLDERS = {"embedding.normalize"}


def test_typed_placeholders_refuse_other_types_at_assignment():
  config = finetune_classification.get_config()
  for path in TYPED_PLACEHOLDERS:
    for value in ("yes", 1):
      with pytest.raises(TypeError):
        _set(config, path, value)
    _set(config, path, None)
    assert config_checks.leaf_paths(config)[path] is None


def _names_the_field(message: str, path: str, value) -> None:
  assert message.startswith(f"config.{path}={value!r} must "), message


@pytest.mark.parametrize("path, value", PRETRAINING_BAD)
def test_bad_pretraining_value_is_refused_naming_the_field(path, value):
  config = base.get_config()
  _set(config, path, value)
  value = config_checks.leaf_paths(config)[path]  # As stored (ml_collections makes 1 1.0).
  _names_the_field(_refused(config_checks.check_pretraining, config), path, value)


@pytest.mark.parametrize("path, value", FINETUNING_BAD)
def test_bad_finetuning_value_is_refused_naming_the_field(path, value):
  config = _finetuning()
  _set(config, path, value)
  value = config_checks.leaf_paths(config)[path]
  _names_the_field(_refused(config_checks.check_finetuning, config), path, value)


@pytest.mark.parametrize("path, value, message", [
    # The cases, word for word.
    ("model.num_hidden_layers", -1, "config.model.num_hidden_layers=-1 must be an integer >= 1"),
    ("train.learning_rate", -1, "config.train.learning_rate=-1.0 must be > 0"),
    ("model.hidden_dropout_prob", 1.5, "config.model.hidden_dropout_prob=1.5 must be in [0, 1]"),
    ("train.warmup_steps", -5,
     "config.train.warmup_steps=-5 must be an integer >= 0 (0: no warmup)"),
    ("model.num_attention_heads", 0, "config.model.num_attention_heads=0 must be an integer >= 1"),
    ("train.grad_accum_steps", 0, "config.train.grad_accum_steps=0 must be an integer >= 1"),
    ("train.log_every_steps", 0, "config.train.log_every_steps=0 must be an integer >= 1"),
    ("model.dtype", "fp32", "config.model.dtype='fp32' must be one of 'float32', 'bfloat16'"),
    ("model.hidden_size", -32, "config.model.hidden_size=-32 must be an integer >= 1"),
    ("model.intermediate_size", 0, "config.model.intermediate_size=0 must be an integer >= 1"),
    ("checkpoint.max_to_keep", 0, "config.checkpoint.max_to_keep=0 must be an integer >= 1"),
    ("train.eval_every_steps", -1,
     "config.train.eval_every_steps=-1 must be an integer >= 0 (0: the last step only)"),
    ("train.learning_rate", math.nan, "config.train.learning_rate=nan must be a finite number > 0"),
    ("train.batch_size", True, "config.train.batch_size=True must be an integer >= 1"),
])
def test_messages(path, value, message):
  config = base.get_config()
  _set(config, path, value)
  assert _refused(config_checks.check_pretraining, config) == message


@pytest.mark.parametrize("path, value", [
    ("train.num_train_steps", 2**31), ("data.span_warmup_steps", 10**11),
    ("train.warmup_steps", 10**12), ("checkpoint.save_every_steps", 2**40),
    ("train.batch_size", 2**31), ("logging.profile_steps", (2**31, 1))])
def test_counts_past_int32_are_refused_by_range(path, value):
  """They ended in JAX's OverflowError traceback, some only after compiling (#37)."""
  config = base.get_config()
  _set(config, path, value)
  message = _refused(config_checks.check_pretraining, config)
  assert message.startswith(f"config.{path}={config_checks.leaf_paths(config)[path]!r} must be "
                            ) and "2147483647" in message, message
  _set(config, path, (2**31 - 1, 1) if path == "logging.profile_steps" else 2**31 - 1)
  assert config_checks.PRETRAINING_RULES[path](config_checks.leaf_paths(config)[path]) is None


def test_unavailable_attention_kernel_is_refused_before_any_work():
  """attention_impl="cudnn" without an NVIDIA GPU gave a traceback after the workdir was made."""
  config = tiny.get_config()
  config.model.attention_impl = "cudnn"
  with pytest.raises(ValueError, match=r"^config.model.attention_impl='cudnn' needs an NVIDIA GPU "
                                       r"\(with cuDNN\); the devices it compiles for are cpu \(cpu\); use 'auto'"):
    train.check(config)
  gpu = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
  with pytest.raises(ValueError, match="needs config.model.dtype='bfloat16'"):
    model.check_attention_impl("cudnn", "float32", 64, device=gpu)
  with pytest.raises(ValueError, match=r"head size <= 128 and a multiple of 8 \(hidden_size / "
                                       r"num_attention_heads is 12\)"):
    model.check_attention_impl("cudnn", "bfloat16", 12, device=gpu)
  model.check_attention_impl("cudnn", "bfloat16", 64, device=gpu)
  model.check_attention_impl("xla", "float32", 12)


# ----------------------------------------------------------------------------- relations


@pytest.mark.parametrize("overrides, message", [
    (dict(model__hidden_size=100),
     "config.model.hidden_size=100 is not divisible by config.model.num_attention_heads=12"),
    (dict(data__max_seq_length=1024),
     "config.data.max_seq_length=1024 exceeds config.model.max_position_embeddings=512"),
    (dict(masking__max_predictions_per_seq=10),
     "config.masking.max_predictions_per_seq=10 cannot hold the 19 targets of a full row"),
    (dict(masking__mask_token_prob=0.9, masking__random_token_prob=0.2),
     "config.masking.mask_token_prob=0.9 + config.masking.random_token_prob=0.2 = 1.1 must be "
     "<= 1"),
    (dict(train__grad_accum_steps=3),
     "config.train.batch_size=256 is not divisible by config.train.grad_accum_steps=3"),
    (dict(mesh__data=-1, mesh__tensor=-1),
     "config.mesh.data=-1 and config.mesh.tensor=-1: at most one mesh axis"),
    (dict(data__source="prepared"), "config.data.dataset_dir is empty: config.data.source="),
    (dict(data__mixture="a:1,b:1"), "config.data.mixture='a:1,b:1' is read by "
     "config.data.source='mixture' only"),
    (dict(data__source="mixture", data__mixture="a:1,b:1", data__mixture_phases="0.5:1"),
     "config.data.mixture_phases phase '0.5:1' gives 1 weights for 2 datasets"),
    (dict(data__validation_fraction=0.0), "config.data.validation_fraction=0.0 leaves the "
     "built-in corpus no validation split"),
    # The peak of a warmup-stable-decay schedule is never reached (#37).
    (dict(train__schedule="wsd", train__num_train_steps=1000, train__warmup_steps=950),
     "config.train.warmup_steps=950 runs past the start of schedule 'wsd''s decay at step 900 "
     "(num_train_steps 1000 less 100 decay steps, decay_fraction 0.1): the learning rate would "
     "never reach its peak; use warmup_steps <= 900"),
    # mmBERT's stages: a start per rate, from 0, ascending; P holds the largest stage's targets.
    (dict(masking__rate_schedule="stages", masking__stage_starts=(0.0, 0.5),
          masking__max_predictions_per_seq=40),
     "config.masking.stage_starts has 2 entries and config.masking.stage_rates 3"),
    (dict(masking__rate_schedule="stages", masking__stage_starts=(0.1, 0.5, 0.9),
          masking__max_predictions_per_seq=40),
     "config.masking.stage_starts=(0.1, 0.5, 0.9) must start at 0 and ascend"),
    (dict(masking__rate_schedule="stages"),
     "config.masking.max_predictions_per_seq=20 cannot hold the 38 targets of a full row (up to "
     "4 examples in max_seq_length 128, each max(1, round(stage_rates[0] 0.3 x"),
    (dict(masking__rate_schedule="stages", data__objective="diffusion"),
     "config.masking.rate_schedule='stages' with objective 'diffusion'"),
])
def test_broken_pretraining_relations(overrides, message):
  assert _refused(config_checks.check_pretraining, _pretraining(**overrides)).startswith(message)


@pytest.mark.parametrize("module, overrides, message", [
    (finetune_classification, dict(init_from=""), "config.vocab is empty: training from scratch"),
    (finetune_classification, dict(init_from="", vocab="vocab.txt", data__max_seq_length=1024),
     "config.data.max_seq_length=1024 exceeds config.model.max_position_embeddings=512"),
    (finetune_tagging, dict(data__regression=True),
     "config.data.regression=True applies to the classification task only"),
    (finetune_classification, dict(data__train_file=""), "config.data.train_file is empty"),
    (finetune_classification, dict(data__tfds_name="glue/sst2"),
     "config.data.train_file='train.jsonl' is ignored with config.data.tfds_name='glue/sst2'"),
    (finetune_classification, dict(model__num_attention_heads=5),
     "config.model.hidden_size=768 is not divisible by config.model.num_attention_heads=5"),
    (finetune_classification, dict(train__batch_size=30, train__grad_accum_steps=4),
     "config.train.batch_size=30 is not divisible by config.train.grad_accum_steps=4"),
])
def test_broken_finetuning_relations(module, overrides, message):
  refused = _refused(config_checks.check_finetuning, _finetuning(module, **overrides))
  assert refused.startswith(message), refused


def test_a_pretrained_encoder_brings_its_own_length_limit():
  # Its position table is checked against max_seq_length once loaded (finetune._log_setup).
  config_checks.check_finetuning(_finetuning(data__max_seq_length=1024))


def test_unknown_and_missing_fields_are_refused():
  config = base.get_config()
  config.train.learning_rat = 0.1
  assert _refused(config_checks.check_pretraining, config).startswith(
      "config.train.learning_rat is not a pretraining config field")
  config = _finetuning()
  del config.train.best_metric
  assert _refused(config_checks.check_finetuning, config).startswith(
      "config.train.best_metric is missing")
  # A pretraining config is not a fine-tuning one.
  assert "is not a fine-tuning config field" in _refused(config_checks.check_finetuning,
                                                         base.get_config())


# ------------------------------------------------------------------- the other owners


def test_eval_batch_size_against_the_mesh_names_its_own_field():
  mesh = types.SimpleNamespace(shape={"data": 8, "fsdp": 1, "tensor": 1})  # Only .shape is read.
  with pytest.raises(ValueError, match=r"^config.train.eval_batch_size=12 is not divisible by "
                                       r"the data x fsdp mesh axes \(8 x 1 = 8\)$"):
    sharding.batch_size_per_shard(12, mesh, "config.train.eval_batch_size")
  with pytest.raises(ValueError, match=r"^config.train.batch_size=12 is not divisible"):
    sharding.batch_size_per_shard(12, mesh)
  assert sharding.batch_size_per_shard(16, mesh, "config.train.eval_batch_size") == 2


@pytest.mark.parametrize("dtype", ["fp32", "int32", "float16", None])
def test_model_config_refuses_other_dtypes_with_a_value_error(dtype):
  with pytest.raises(ValueError, match=r"dtype=.* is not supported; use one of \['float32', "
                                       r"'bfloat16'\]"):
    BertConfig(dtype=dtype)
  assert BertConfig(dtype="bfloat16", param_dtype="float32").dtype.name == "bfloat16"


def test_an_override_of_a_section_the_run_never_reads_is_refused():
  """The red team: config.rtd.* set with a non-RTD objective was ignored without a word; so
  were the other sections that the chosen objective or task does not read."""
  config = base.get_config()
  config_checks.check_overrides_read(config, ["--config.diffusion.eval_points=8"], False)
  with pytest.raises(ValueError, match=r"^--config.rtd.disc_weight is not read by objective "
                                       r"'mlm_nsp': config.rtd is read by objective 'rtd', "
                                       r"'rtd_nsp' only; drop the override or set "
                                       r"--config.data.objective$"):
    config_checks.check_overrides_read(config, ["--config.rtd.disc_weight=30"], False)
  config.data.objective = "rtd"
  config_checks.check_overrides_read(config, ["--config.rtd.disc_weight=30"], False)
  with pytest.raises(ValueError, match=r"^--config.diffusion.schedule is not read by objective "
                                       r"'rtd'"):
    config_checks.check_overrides_read(config, ["--config.diffusion.schedule", "loglinear"],
                                       False)
  tuning = finetune_classification.get_config()
  for override in ("--config.embedding.normalize=false", "--config.diffusion.eval_points=4"):
    with pytest.raises(ValueError, match=r"is not read by task 'classification': "):
      config_checks.check_overrides_read(tuning, [override], True)
  config_checks.check_overrides_read(tuning, ["--config.train.learning_rate=1e-5"], True)
