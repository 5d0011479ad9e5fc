"""The fine-tuning loop: encoder from a checkpoint (or scratch), a task head, one jitted step
sharded over the pretraining mesh, evaluation at intervals, the best checkpoint and final eval.

`finetune_and_evaluate(config, workdir)` is all `launch/finetune.py` calls. The workdir gets
- `checkpoints/<step>/`: the best params (by the task's main metric) and `meta` (task, labels,
  model config, vocabulary, lengths), self-contained for `bert_jax.predict`;
- `metrics.jsonl` (train and validation records, as pretraining), TensorBoard summaries;
- `final_eval.json`: the last evaluation, the best one and the data counts.
With `config.train.freeze_encoder` the encoder (everything under params["bert"], the pooler too)
gets `optax.set_to_zero` (no optimizer state) and its params are carried over untouched, so they
stay bit-identical.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bert_jax import checkpointing, finetune_data, finetune_eval, heads
from bert_jax import optimizer as optimizer_lib, sharding
from bert_jax.data.vocab import Vocab
from bert_jax.metrics_writer import MetricWriter
from bert_jax.model import BertConfig
from bert_jax.pretrained import load_pretrained
from bert_jax.steps import TrainState

ENCODER = "bert"  # Name of the encoder submodule in every head model (pooler included).
FINAL_EVAL_FILE = "final_eval.json"
EVAL_COUNTS = ("examples", "windows")  # Counts in an evaluation's dict, not metrics.
# The config.train fields that the compiled train step depends on.
OPTIMIZER_FIELDS = ("optimizer", "schedule", "learning_rate", "warmup_steps", "num_train_steps",
                    "weight_decay", "b1", "b2", "eps", "max_grad_norm", "freeze_encoder")


@dataclasses.dataclass
class Encoder:
  """The encoder to fine-tune: its config, pretrained params (None: random init), tokenizer."""
  config: BertConfig
  params: dict | None
  vocab: Vocab
  source: str


def load_encoder(config) -> Encoder:
  """From `config.init_from` through `load_pretrained` (its own vocabulary is the tokenizer),
  or a from-scratch config whose vocabulary comes from `config.vocab`."""
  dtype = config.model.dtype
  if config.init_from:
    model_config, params, vocab = load_pretrained(config.init_from)
    if vocab is None:
      if not config.vocab:
        raise ValueError(f"{config.init_from} has no vocabulary; give --config.vocab (the one "
                         "it was pretrained with)")
      vocab = Vocab.load(config.vocab)
    model_config = dataclasses.replace(model_config, dtype=dtype)
    return Encoder(model_config, params[ENCODER], vocab, config.init_from)
  if not config.vocab:
    raise ValueError("Training from scratch (config.init_from is empty) needs --config.vocab")
  vocab = Vocab.load(config.vocab)
  values = dict(config.model)
  values["vocab_size"] = values["vocab_size"] or vocab.size
  if vocab.size > values["vocab_size"]:
    raise ValueError(f"config.model.vocab_size={values['vocab_size']} is smaller than the "
                     f"vocabulary ({vocab.size} tokens)")
  return Encoder(BertConfig.from_config(values), None, vocab, "scratch")


# ------------------------------------------------------------------------------- data


@dataclasses.dataclass
class Splits:
  train: finetune_data.TaskData
  validation: finetune_data.TaskData | None
  labels: list[str]


def _records(config, which: str) -> list[finetune_data.Record]:
  data = config.data
  if data.tfds_name:
    split = data.tfds_train_split if which == "train" else data.tfds_validation_split
    return finetune_data.read_tfds(data.tfds_name, split, data.tfds_data_dir or None)
  path = data.train_file if which == "train" else data.validation_file
  return finetune_data.read_records(path, data.format) if path else []


def load_splits(config, vocab: Vocab) -> Splits:
  """Reads, checks and encodes the train and validation data."""
  if not (config.data.train_file or config.data.tfds_name):
    raise ValueError("No training data: set --config.data.train_file (or data.tfds_name)")
  train_records = _records(config, "train")
  labels = (["score"] if config.data.regression else
            finetune_data.label_set(config.task, train_records, config.data.labels))
  encode = functools.partial(
      finetune_data.encode, config.task, vocab=vocab, labels=labels,
      max_length=config.data.max_seq_length, max_query_length=config.data.max_query_length,
      doc_stride=config.data.doc_stride, regression=config.data.regression)
  train = encode(train_records, is_training=True)
  validation_records = _records(config, "validation")
  validation = encode(validation_records) if validation_records else None
  return Splits(train, validation, labels)


def _num_outputs(config, labels: list[str]) -> int:
  return 1 if config.data.regression else len(labels)


# ------------------------------------------------------------------------------- steps


def _example_inputs(task: str, seq_len: int) -> tuple:
  ids = jnp.zeros((1, seq_len), jnp.int32)
  return (ids, ids, ids, ids) if task == "qa" else (ids, ids, ids)


def make_optimizer(train_config) -> optax.GradientTransformation:
  """BERT's AdamW and schedule (`bert_jax.optimizer`); with a frozen encoder only the head
  gets it and the encoder gets `set_to_zero` (no updates, no optimizer state)."""
  optimizer = optimizer_lib.make_optimizer(train_config)
  if not train_config.freeze_encoder:
    return optimizer
  labels = lambda params: {k: "frozen" if k == ENCODER else "trained" for k in params}
  return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)


def init_params(rng, *, model: nn.Module, task: str, seq_len: int):
  """Random params with their logical-axis boxes (for the shardings; unbox before use)."""
  return model.init(rng, *_example_inputs(task, seq_len), deterministic=True)["params"]


def _outputs_dict(task: str, outputs) -> dict[str, jax.Array]:
  if task == "qa":
    return {"start_logits": outputs[0], "end_logits": outputs[1]}
  return {"logits": outputs}


def train_step(state: TrainState, batch: dict, rng, *, model: nn.Module, task: str,
               num_labels: int, optimizer: optax.GradientTransformation,
               schedule: optax.Schedule, freeze_encoder: bool) -> tuple[TrainState, dict]:
  """One optimizer step on a global batch: forward with dropout, loss, backward, update."""
  dropout_rng = jax.random.fold_in(rng, state.step)

  def loss_fn(params):
    outputs = model.apply({"params": params}, *heads.model_inputs(task, batch),
                          deterministic=False, rngs={"dropout": dropout_rng})
    sums = heads.loss_sums(task, outputs, batch, num_labels)
    return sums["loss_sum"] / jnp.maximum(sums["loss_count"], 1.0), sums

  (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  trained_grads = grads
  if freeze_encoder:
    # The encoder is carried over as is (not p + 0): bit-identical whatever the float rules.
    params = {**params, ENCODER: state.params[ENCODER]}
    trained_grads = {k: v for k, v in grads.items() if k != ENCODER}  # Encoder grads: dead code.
  metrics = {**sums, "loss": loss, "grad_norm": optax.tree.norm(trained_grads),
             "learning_rate": schedule(state.step)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch: dict, *, model: nn.Module, task: str,
              num_labels: int) -> tuple[dict, dict]:
  """(outputs, loss sums) of one eval batch, deterministic."""
  outputs = model.apply({"params": params}, *heads.model_inputs(task, batch), deterministic=True)
  return _outputs_dict(task, outputs), heads.loss_sums(task, outputs, batch, num_labels)


# ----------------------------------------------------------------------- compiled program


@dataclasses.dataclass(frozen=True)
class Program:
  """What one model + task + hyper-parameters + mesh compiles to."""
  state_shardings: Any  # NamedShardings of the TrainState.
  init_params: Any  # key -> params, born sharded.
  init_opt_state: Any  # params -> optimizer state, born sharded.
  train_step: Any  # (state, batch, key) -> (state, metrics); state donated.
  eval_step: Any  # (params, batch) -> (outputs, loss sums).


@functools.lru_cache(maxsize=4)
def _params_init(model: nn.Module, task: str, seq_len: int, mesh, rules):
  """(jitted init, params shardings); cached so runs on one model compile the init once."""
  init = functools.partial(init_params, model=model, task=task, seq_len=seq_len)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    shardings = sharding.logical_to_shardings(jax.eval_shape(init, jax.random.key(0)), mesh,
                                              rules)
  return jax.jit(lambda key: nn.meta.unbox(init(key)), out_shardings=shardings), shardings


@functools.lru_cache(maxsize=4)
def program(model: nn.Module, task: str, num_labels: int, seq_len: int,
            train_items: tuple[tuple[str, Any], ...], mesh, rules) -> Program:
  """The jitted functions of a run. Cached on hashable arguments (`train_items`: the
  `OPTIMIZER_FIELDS` of config.train), so runs that differ only in data or in the encoder's
  starting point (pretrained or not) reuse one compilation, as a sweep in one process would."""
  train_config = ml_collections.ConfigDict(dict(train_items))
  optimizer = make_optimizer(train_config)
  init, params_shardings = _params_init(model, task, seq_len, mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract_params = jax.eval_shape(
        functools.partial(init_params, model=model, task=task, seq_len=seq_len),
        jax.random.key(0))
    opt_shardings = sharding.logical_to_shardings(
        jax.eval_shape(optimizer.init, abstract_params), mesh, rules)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state_shardings = TrainState(step=replicated, params=params_shardings,
                               opt_state=opt_shardings)
  step = jax.jit(functools.partial(
      train_step, model=model, task=task, num_labels=num_labels, optimizer=optimizer,
      schedule=optimizer_lib.learning_rate_schedule(train_config),
      freeze_encoder=bool(train_config.freeze_encoder)),
      in_shardings=(state_shardings, None, None), out_shardings=(state_shardings, None),
      donate_argnums=0)
  evaluate_fn = jax.jit(functools.partial(eval_step, model=model, task=task,
                                          num_labels=num_labels))
  return Program(state_shardings, init, jax.jit(optimizer.init, out_shardings=opt_shardings),
                 step, evaluate_fn)


# ------------------------------------------------------------------------------- eval


def _to_host(tree):
  """Global (batch-sharded) arrays -> numpy on every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def run_eval(params, data: finetune_data.TaskData, eval_fn, mesh, batch_size: int):
  """-> (outputs over every row (QA: window), in order, as numpy; mean loss over rows)."""
  gathered: dict[str, list[np.ndarray]] = {}
  loss_sum = loss_count = 0.0
  pending = []
  for indices, local in finetune_data.eval_batches(data, batch_size, jax.process_index(),
                                                   jax.process_count()):
    pending.append((indices, eval_fn(params, sharding.global_batch_from_local(local, mesh))))
  for indices, (outputs, sums) in pending:
    outputs, sums = _to_host((outputs, sums))
    keep = indices < len(data)
    for name, value in outputs.items():
      gathered.setdefault(name, []).append(np.asarray(value)[keep])
    loss_sum += float(sums["loss_sum"])
    loss_count += float(sums["loss_count"])
  outputs = {name: np.concatenate(parts) for name, parts in gathered.items()}
  return outputs, loss_sum / max(loss_count, 1.0)


def evaluate(config, params, data, labels, eval_fn, mesh) -> dict[str, float]:
  """Loss over the rows, scores over the examples: a QA question is scored once, from the
  merged predictions of all its windows ("windows" counts those)."""
  outputs, loss = run_eval(params, data, eval_fn, mesh, config.train.eval_batch_size)
  predicted = finetune_eval.predictions(config.task, outputs, data, labels,
                                        config.data.max_answer_length)
  counts = {"examples": len(data.examples)}
  if config.task == "qa":
    counts["windows"] = len(data)
  return {"loss": loss, **finetune_eval.score(config.task, predicted, data, labels), **counts}


# ----------------------------------------------------------------------- checkpoints


def _vocab_files(vocab: Vocab) -> dict[str, str]:
  with tempfile.TemporaryDirectory() as tmp:
    vocab.save(tmp)
    return checkpointing.encode_files(tmp)


def _meta(config, encoder: Encoder, labels: list[str]) -> dict[str, Any]:
  return {
      "task": config.task,
      "labels": labels,
      "regression": bool(config.data.regression),
      "max_seq_length": config.data.max_seq_length,
      "max_query_length": config.data.max_query_length,
      "max_answer_length": config.data.max_answer_length,
      "doc_stride": config.data.doc_stride,
      "head_dropout_prob": config.head.dropout_prob,
      "init_from": encoder.source,
      "freeze_encoder": bool(config.train.freeze_encoder),
      "model_config": checkpointing.to_json(dataclasses.asdict(encoder.config)),
      "vocab": _vocab_files(encoder.vocab),
      "config": checkpointing.to_json(config.to_dict()),
  }


def _checkpoint_manager(workdir: str) -> ocp.CheckpointManager:
  """Keeps one checkpoint: a save happens only when the main metric improved."""
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory)):
    raise ValueError(f"{workdir} already holds a fine-tuned checkpoint; choose a new --workdir")
  return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
      max_to_keep=1, create=True), item_names=("params", "meta"))


def _save(checkpoints: ocp.CheckpointManager, step: int, params, meta: dict) -> None:
  if jax.process_count() == 1:
    # Host copies: orbax would otherwise compile a slice per replicated shard (seconds on CPU).
    params = jax.device_get(params)
  checkpoints.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                                 meta=ocp.args.JsonSave(meta)))


# -------------------------------------------------------------------------------- loop


def _validate(config) -> None:
  if config.task not in heads.TASKS:
    raise ValueError(f"config.task={config.task!r}: use one of {heads.TASKS}")
  if config.data.regression and config.task != "classification":
    raise ValueError("config.data.regression applies to the classification task only")
  if config.train.num_train_steps <= 0:
    raise ValueError("config.train.num_train_steps must be positive")
  if config.data.doc_stride <= 0:
    raise ValueError("config.data.doc_stride must be positive")


def _param_count(tree) -> int:
  return int(sum(x.size for x in jax.tree.leaves(tree)))


def finetune_and_evaluate(config, workdir: str) -> dict[str, Any]:
  """Fine-tunes `config.task` in `workdir`; returns what final_eval.json holds ({"final",
  "best", counts, ...}) plus "state", the final TrainState."""
  _validate(config)
  encoder = load_encoder(config)
  if config.data.max_seq_length > encoder.config.max_position_embeddings:
    raise ValueError(f"config.data.max_seq_length={config.data.max_seq_length} exceeds the "
                     f"encoder's max_position_embeddings={encoder.config.max_position_embeddings}")
  splits = load_splits(config, encoder.vocab)
  mesh = sharding.make_mesh(config.mesh)
  sharding.batch_size_per_shard(config.train.batch_size, mesh)
  sharding.batch_size_per_shard(config.train.eval_batch_size, mesh)
  checkpoints = _checkpoint_manager(workdir)
  writer = MetricWriter(workdir, config.logging.tensorboard)
  num_labels = _num_outputs(config, splits.labels)
  model = heads.make_model(config.task, encoder.config, num_labels, config.head.dropout_prob)
  best_metric = config.train.best_metric or finetune_eval.main_metric(
      config.task, splits.labels, config.data.regression)

  _log_setup(writer, config, encoder, splits)
  rules = sharding.logical_rules(config.mesh)
  compiled = program(model, config.task, num_labels, config.data.max_seq_length,
                     tuple((k, config.train[k]) for k in OPTIMIZER_FIELDS), mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
    params = _with_pretrained_encoder(compiled.init_params(init_key), encoder,
                                      compiled.state_shardings.params, writer)
    state = TrainState(step=jax.device_put(jnp.zeros((), jnp.int32),
                                           compiled.state_shardings.step),
                       params=params, opt_state=compiled.init_opt_state(params))
    frozen = _param_count(state.params[ENCODER]) if config.train.freeze_encoder else 0
    writer.log(f"{'Frozen encoder: training the head only' if frozen else 'Full fine-tuning'}"
               f" ({_param_count(state.params) - frozen:,} trained parameters, {frozen:,} "
               "frozen)")
    result = _loop(config, state, compiled.train_step, compiled.eval_step, dropout_key, splits,
                   mesh, writer, checkpoints, _meta(config, encoder, splits.labels),
                   best_metric)
  checkpoints.close()
  writer.close()
  result.update(task=config.task, labels=splits.labels, init_from=encoder.source,
                freeze_encoder=bool(config.train.freeze_encoder), best_metric=best_metric,
                train_examples=len(splits.train.examples),
                train_truncated=splits.train.num_truncated, train_dropped=splits.train.num_dropped,
                validation_examples=len(splits.validation.examples) if splits.validation else 0,
                validation_truncated=splits.validation.num_truncated if splits.validation else 0)
  if config.task == "qa":  # Rows: the windows of the passages.
    result.update(train_windows=len(splits.train),
                  validation_windows=len(splits.validation) if splits.validation else 0)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, FINAL_EVAL_FILE), "w") as f:
      json.dump({k: v for k, v in result.items() if k != "state"}, f, indent=2)
  return result


def _log_setup(writer: MetricWriter, config, encoder: Encoder, splits: Splits) -> None:
  c = encoder.config
  writer.log(f"Task {config.task}: encoder from {encoder.source} ({c.num_hidden_layers} layers, "
             f"width {c.hidden_size}, vocabulary {encoder.vocab.kind} of {encoder.vocab.size})")
  if splits.labels and config.task != "qa":
    writer.log(f"{len(splits.labels)} labels: {splits.labels}")
  for name, data in (("train", splits.train), ("validation", splits.validation)):
    if data is None:
      continue
    if config.task == "qa":
      writer.log(f"{name}: {len(data.examples)} questions from {data.source} in {len(data)} "
                 f"windows of max_seq_length={config.data.max_seq_length} (doc_stride "
                 f"{config.data.doc_stride}); {data.num_split} passages took several windows; "
                 f"{data.num_truncated} questions cut to "
                 f"max_query_length={config.data.max_query_length}")
    else:
      writer.log(f"{name}: {len(data)} examples from {data.source}; {data.num_truncated} longer "
                 f"than max_seq_length={config.data.max_seq_length} were truncated")
    if data.num_dropped:
      writer.log(f"{name}: {data.num_dropped} examples dropped: their answer covers no piece")


def _with_pretrained_encoder(params, encoder: Encoder, params_shardings, writer: MetricWriter):
  """Replaces the random encoder params by the pretrained ones (placed with the encoder's
  shardings). A pooler the checkpoint lacks keeps its random init; one the head does not use
  is left out."""
  if encoder.params is None:
    writer.log("Encoder initialised randomly (training from scratch)")
    return params
  target = params[ENCODER]
  if "pooler" in target and "pooler" not in encoder.params:
    writer.log(f"{encoder.source} has no pooler: it starts from a random init")
  loaded = {k: encoder.params.get(k, v) for k, v in target.items()}
  if jax.tree.map(np.shape, target) != jax.tree.map(np.shape, loaded):
    raise ValueError(f"{encoder.source}: encoder params do not match the model config")
  loaded = jax.device_put(jax.tree.map(lambda x, t: np.asarray(x, t.dtype), loaded, target),
                          params_shardings[ENCODER])
  return {**params, ENCODER: loaded}


def _loop(config, state, step_fn, eval_fn, rng, splits: Splits, mesh, writer, checkpoints,
          meta, best_metric) -> dict[str, Any]:
  total = config.train.num_train_steps
  batches = finetune_data.train_batches(splits.train, config.train.batch_size, config.seed,
                                        jax.process_index(), jax.process_count())
  best: dict[str, Any] = {"step": 0, best_metric: -float("inf")}
  final: dict[str, Any] = {}
  pending, start = [], time.time()
  for step in range(1, total + 1):
    batch = sharding.global_batch_from_local(next(batches), mesh)
    state, metrics = step_fn(state, batch, rng)
    pending.append(metrics)
    if step % config.train.log_every_steps == 0 or step == total:
      report = _train_report(jax.device_get(pending), step)
      report["steps_per_sec"] = len(pending) / (time.time() - start)
      writer.write(step, "train", report)
      writer.log(f"step {step}/{total} loss {report['loss']:.4f} lr "
                 f"{report['learning_rate']:.3g} {report['steps_per_sec']:.1f} steps/s")
      pending, start = [], time.time()
    eval_every = config.train.eval_every_steps
    if (eval_every and step % eval_every == 0) or step == total:
      if splits.validation is None:
        final = {}
        continue
      final = evaluate(config, state.params, splits.validation, splits.labels, eval_fn, mesh)
      writer.write(step, "validation", final)
      writer.log(f"eval step {step}: " + " ".join(
          f"{k} {v:.4f}" for k, v in final.items() if k not in EVAL_COUNTS))
      if best_metric not in final or best_metric in EVAL_COUNTS:
        raise ValueError(f"config.train.best_metric={best_metric!r} is not a metric of this "
                         f"task; use one of {sorted(k for k in final if k not in EVAL_COUNTS)}")
      if final[best_metric] > best[best_metric]:
        best = {"step": step, **final}
        _save(checkpoints, step, state.params, {**meta, "step": step, "metrics": final})
      start = time.time()
  if splits.validation is None:  # Nothing to pick a best by: keep the final params.
    _save(checkpoints, total, state.params, {**meta, "step": total, "metrics": {}})
    best = {"step": total}
  checkpoints.wait_until_finished()
  writer.log(f"best {best_metric}: {best.get(best_metric, float('nan')):.4f} at step "
             f"{best['step']} (saved in {checkpoints.directory})")
  return {"final": {"step": total, **final}, "best": best, "state": state}


def _train_report(pending: list[dict], step: int) -> dict[str, float]:
  for metrics in pending:
    if not np.isfinite(metrics["loss"]):
      raise FloatingPointError(f"Non-finite loss near step {step}; lower "
                               "config.train.learning_rate or check the data")
  loss_sum = sum(float(m["loss_sum"]) for m in pending)
  loss_count = sum(float(m["loss_count"]) for m in pending)
  return {"loss": loss_sum / max(loss_count, 1.0),
          "grad_norm": float(np.mean([m["grad_norm"] for m in pending])),
          "learning_rate": float(pending[-1]["learning_rate"])}
