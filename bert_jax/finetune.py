"""Fine-tuning: an encoder (pretrained or scratch), a task's head and data, handed to the one
trainer (`bert_jax/training/trainer.py`), so resume, preemption, gradient accumulation, prefetch,
sharding and logging are the pretraining ones. `finetune_and_evaluate(config, workdir)` is all
`launch/finetune.py` calls. The workdir gets
- `checkpoints/<step>/`: training checkpoints (resume after preemption or a crash);
- `best/<step>/`: the best params by the task's main metric, self-contained for prediction;
- `metrics.jsonl`, TensorBoard summaries, and `final_eval.json` (last and best evaluation,
  data counts).
With `config.train.freeze_encoder` the encoder (params["bert"], pooler included) gets no
updates and no optimizer state, and stays bit-identical.
"""

import copy
import dataclasses
import json
from typing import Any

import jax
from absl import logging

from bert_jax import config_checks, tasks
from bert_jax.models import model as model_lib
from bert_jax.training import aot, programs, sharding, trainer
from bert_jax.runtime import storage
from bert_jax.data import finetune as finetune_data
from bert_jax.data.vocab import Vocab
from bert_jax.runtime.metrics_writer import console
from bert_jax.models.model import BertConfig
from bert_jax.weights.layout import num_params
from bert_jax.training.settings import TrainSettings

FINAL_EVAL_FILE = "final_eval.json"


# config.model.classifier_pooling's value that keeps the pretrained encoder's own (a ModernBERT
# fine-tune's "mean"); from scratch it is "cls".
POOLING_OF_CHECKPOINT = "auto"


@dataclasses.dataclass
class Encoder:
  """The encoder to fine-tune: its config, pretrained params (None: random init), tokenizer,
  and the task head beside it in a HuggingFace task model (the run takes it if it fits)."""
  config: BertConfig
  params: dict | None  # Pretrained layout (bert, and heads the source had).
  vocab: Vocab
  source: str
  head: "weights.TaskHead | None" = None


def check(config) -> None:
  """Every value of `config` and the batch sizes against the mesh (one clear error naming the
  field), before the workdir is touched or anything is compiled."""
  config_checks.check_finetuning(config)
  settings = TrainSettings.from_config(config)
  programs.check_batch_sizes(settings, sharding.make_mesh(settings.mesh))
  # The head size is the encoder's, checked once it is loaded (programs.check_mesh).
  model_lib.check_attention_impl(config.model.attention_impl, config.model.dtype)


def finetune_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Fine-tunes `config.task` in `workdir` (resuming from its latest checkpoint); returns what
  final_eval.json holds ({"final", "best", counts, ...}) plus "state", the final TrainState."""
  check(config)
  task_class = tasks.finetune_task(config.task)
  encoder = load_encoder(config)
  train_records, validation_records = _records(config, "train"), _records(config, "validation")
  labels = task_class.labels_from(train_records, config)
  task = task_class(encoder.config,
                    task_class.settings_class.from_config(config, labels, encoder.config,
                                                          encoder.vocab))
  check_best_metric(config.train.best_metric, task)
  initial = _with_task_head(encoder, task)
  train_data = task.encode(train_records, encoder.vocab, is_training=True)
  validation = task.encode(validation_records, encoder.vocab) if validation_records else None
  config = with_train_length(config, len(train_data.examples))
  _log_setup(config, task, encoder, train_data, validation)
  index, count = jax.process_index(), jax.process_count()
  settings = TrainSettings.from_config(config)
  pack = task.batch_packer(programs.row_multiple(sharding.make_mesh(settings.mesh),
                                                 settings.step.grad_accum_steps))
  run = trainer.Run(
      task=task,
      train_iter=finetune_data.TrainBatches(train_data, config.train.batch_size, config.seed,
                                            index, count, pack),
      eval_batches=(lambda: finetune_data.eval_batches(
          validation, config.train.eval_batch_size, index, count)) if validation else None,
      eval_data=validation,
      meta={"config": config.to_dict(), "model_config": dataclasses.asdict(encoder.config),
            "init_from": encoder.source},
      vocab=encoder.vocab,
      initial_params=(lambda: initial) if initial is not None else None,
      initial_source=encoder.source,
      best_metric=config.train.best_metric or task.main_metric())
  result = trainer.train(settings, workdir, run)
  summary = _summary(run, result, train_data, validation)
  if jax.process_index() == 0:
    storage.write_text(storage.join(workdir, FINAL_EVAL_FILE), json.dumps(summary, indent=2))
  return {**summary, "state": result["state"]}


# The schedule's length when the run's own comes from its data (epochs): a compile-only run reads
# none, and the length changes no shape of the compiled programs.
COMPILE_ONLY_STEPS = 1000


def compile_report(config, target: "aot.Target | None" = None,
                   steps: tuple[str, ...] = aot.STEPS) -> dict[str, Any]:
  """The init, train and eval steps of `config.task` compiled for `target` (default: this
  process's devices) against abstract shapes (`training/aot.py`): no training data is read.
  The encoder's shape comes from `config.init_from` (a checkpoint's config and vocabulary),
  else from config.model with `config.vocab` or config.model.vocab_size; labels from
  config.data.labels (else two, named in the report)."""
  config_checks.check_finetuning(config, compile_only=True)
  task_class = tasks.finetune_task(config.task)
  encoder = _compile_only_encoder(config)
  try:
    labels, assumed = task_class.labels_from([], config), False
  except ValueError:  # The labels come from the training records, which are not read.
    labels, assumed = ["0", "1"], True
  task = task_class(encoder.config,
                    task_class.settings_class.from_config(config, labels, encoder.config,
                                                          encoder.vocab))
  config = copy.deepcopy(config)
  config.train.num_train_steps = config.train.num_train_steps or COMPILE_ONLY_STEPS
  settings = TrainSettings.from_config(config)
  report = aot.report(settings, task, target or aot.host_target(), steps)
  return {"task": task.name, "labels": len(labels),
          **({"labels_assumed": "2 (config.data.labels is empty)"} if assumed else {}),
          "encoder": encoder.source, **report}


def _compile_only_encoder(config) -> Encoder:
  """The encoder of a compile-only run: a checkpoint's (load_encoder), or config.model's with
  the vocabulary's size (config.vocab) or config.model.vocab_size."""
  if config.init_from or config.vocab:
    return load_encoder(config)
  values = dict(config.model)
  if values["vocab_size"] <= 0:
    raise ValueError("--compile_only of an encoder from scratch needs its vocabulary size: "
                     "--config.model.vocab_size=N (e.g. 30522), --config.vocab or "
                     "--config.init_from")
  if values["classifier_pooling"] == POOLING_OF_CHECKPOINT:
    values["classifier_pooling"] = "cls"
  return Encoder(BertConfig.from_config(values), None, None, "scratch")


def check_best_metric(metric: str, task: tasks.FinetuneTask) -> None:
  """config.train.best_metric names one of the task's metrics ("" = its main one): refused
  before training, not at the first evaluation."""
  names = task.metric_names()
  if metric and names is not None and metric not in names:
    raise ValueError(f"config.train.best_metric={metric!r} is not a metric of task {task.name!r}"
                     f"; use one of {names}")


def train_length(train_config, num_examples: int) -> tuple[int, int]:
  """(steps, warmup steps) as run_classifier.py / run_squad.py compute them:
  int(num_examples / batch_size x num_train_epochs) and int(steps x warmup_proportion), unless
  `num_train_steps` / `warmup_steps` are set (> 0)."""
  steps = train_config.num_train_steps or int(
      num_examples / train_config.batch_size * train_config.num_train_epochs)
  if steps < 1:
    raise ValueError(f"config.train.num_train_epochs={train_config.num_train_epochs} of "
                     f"{num_examples} training examples at config.train.batch_size="
                     f"{train_config.batch_size} is less than one step: train longer, or set "
                     "config.train.num_train_steps")
  if steps > config_checks.MAX_INT32:  # The step counter is int32 (XLA overflowed at 2**31).
    raise ValueError(f"config.train.num_train_epochs={train_config.num_train_epochs:g} of "
                     f"{num_examples} training examples at config.train.batch_size="
                     f"{train_config.batch_size} is {steps:.3g} steps, more than the "
                     f"{config_checks.MAX_INT32} a run can count")
  warmup = train_config.warmup_steps or int(steps * train_config.warmup_proportion)
  return steps, warmup


def with_train_length(config, num_examples: int):
  """A copy of `config` whose num_train_steps and warmup_steps are the run's (`train_length`),
  logged: the trainer and the schedule read them, and checkpoints record them."""
  steps, warmup = train_length(config.train, num_examples)
  source = ("config.train.num_train_steps" if config.train.num_train_steps else
            f"{config.train.num_train_epochs:g} epochs of {num_examples} examples at batch "
            f"{config.train.batch_size}")
  console(f"Training {steps} steps ({source}), warmup {warmup}")
  config = copy.deepcopy(config)
  config.train.num_train_steps, config.train.warmup_steps = steps, warmup
  return config


def load_encoder(config) -> Encoder:
  """From `config.init_from` through `weights.load_with_head` (its own vocabulary is the
  tokenizer), or a from-scratch config whose vocabulary comes from `config.vocab`."""
  from bert_jax import weights  # Imports HF/TF readers only when needed.
  if config.init_from:
    model_config, params, vocab, head = weights.load_with_head(
        config.init_from, tasks.finetune_task(config.task).pretrained_heads_read)
    if vocab is None:
      if not config.vocab:
        raise ValueError(f"{config.init_from} has no vocabulary; give --config.vocab (the one "
                         "it was pretrained with)")
      vocab = Vocab.load(config.vocab)
    # The checkpoint fixes the shape and architecture; the run fields (dtypes, dropout, the
    # attention kernel, remat, vocabulary padding: `initial_params` pads) are this run's, but
    # for a pooling left to the checkpoint.
    run = {name: config.model[name] for name in BertConfig.fields_of(model_lib.RUN)}
    if run["classifier_pooling"] == POOLING_OF_CHECKPOINT:
      del run["classifier_pooling"]
    return Encoder(dataclasses.replace(model_config, **run), params, vocab, config.init_from,
                   head)
  if not config.vocab:
    raise ValueError("Training from scratch (config.init_from is empty) needs --config.vocab")
  vocab = Vocab.load(config.vocab)
  values = dict(config.model)
  values["vocab_size"] = values["vocab_size"] or vocab.size
  if values["classifier_pooling"] == POOLING_OF_CHECKPOINT:
    values["classifier_pooling"] = "cls"
  if vocab.size > values["vocab_size"]:
    raise ValueError(f"config.model.vocab_size={values['vocab_size']} is smaller than the "
                     f"vocabulary ({vocab.size} tokens)")
  return Encoder(BertConfig.from_config(values), None, vocab, "scratch")


def _with_task_head(encoder: Encoder, task: tasks.FinetuneTask) -> dict | None:
  """The pretrained params the run starts from: the encoder's, with the source's task head when
  it is this task's with the same outputs (`FinetuneTask.head_from`); else the head starts
  fresh, with a warning saying why."""
  if encoder.head is None:
    return encoder.params
  head_params, note = task.head_from(encoder.head)
  if head_params:
    console(f"{encoder.source}: {note}")
  else:
    logging.warning("%s: %s; the head starts fresh (only the encoder is taken)", encoder.source,
                    note)
  return {**encoder.params, **head_params}


def _records(config, which: str) -> list[finetune_data.Record]:
  data = config.data
  if data.tfds_name:
    split = data.tfds_train_split if which == "train" else data.tfds_validation_split
    return finetune_data.read_tfds(data.tfds_name, split, data.tfds_data_dir or None)
  path = data.train_file if which == "train" else data.validation_file
  return finetune_data.read_records(path, data.format) if path else []


def _log_setup(config, task: tasks.FinetuneTask, encoder: Encoder,
               train_data: finetune_data.TaskData,
               validation: finetune_data.TaskData | None) -> None:
  c = encoder.config
  if config.data.max_seq_length > c.max_position_embeddings:
    raise ValueError(f"config.data.max_seq_length={config.data.max_seq_length} exceeds the "
                     f"encoder's max_position_embeddings={c.max_position_embeddings}")
  console(f"Task {task.name}: encoder from {encoder.source} ({c.num_hidden_layers} layers, "
          f"width {c.hidden_size}, vocabulary {encoder.vocab.kind} of {encoder.vocab.size})")
  followed = config.model.classifier_pooling == POOLING_OF_CHECKPOINT and config.init_from
  console(task.describe_head(c.classifier_pooling, bool(followed)))
  if task.describe_labels():
    console(task.describe_labels())
  for name, data in (("train", train_data), ("validation", validation)):
    if data is not None:
      console(task.describe(name, data))
  shapes = jax.eval_shape(lambda: task.model.init(jax.random.key(0), *task.example_inputs()))
  sizes = {k: num_params({k: v}, c)  # Real vocabulary rows only.
           for k, v in shapes["params"].items()}
  frozen = sum(sizes[k] for k in task.frozen)
  console(f"{'Frozen encoder: training the head only' if tasks.ENCODER in task.frozen else 'Full fine-tuning'} "
          f"({sum(sizes.values()) - frozen:,} trained parameters, {frozen:,} frozen"
          + (f": {', '.join(task.frozen)})" if frozen else ")"))


def _summary(run: trainer.Run, result: dict, train_data: finetune_data.TaskData,
             validation: finetune_data.TaskData | None) -> dict[str, Any]:
  task = run.task
  summary = {
      "final": {"step": result["step"], **result.get("validation", {})}, "best": result["best"],
      "task": task.name, "labels": list(task.settings.labels), "init_from": run.initial_source,
      "freeze_encoder": task.settings.freeze_encoder, "best_metric": run.best_metric,
      **{f"train_{name}": value for name, value in train_data.counts().items()},
      **{f"validation_{name}": value for name, value in (
          validation.counts() if validation else {"examples": 0, "truncated": 0, "rows": 0}
      ).items()}}
  if "preempted_at" in result:
    summary["preempted_at"] = result["preempted_at"]
  return summary
