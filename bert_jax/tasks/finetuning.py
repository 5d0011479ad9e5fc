"""What the fine-tuning tasks share: the settings every head needs, the head layer, loss
counting, evaluation from per-row outputs, and the encoder plumbing. Each task
(classification.py, tagging.py, qa.py; `tasks/__init__.py` registers them) adds its settings,
its model, its record fields and their encoding, its predictions, its scores and how
`launch/predict.py` calls it.

Every head model holds the encoder as a submodule named `bert`, so `params["bert"]` of a
pretraining checkpoint (or an import) plugs in unchanged; only the head's parameters are new.

Heads come in the two forms HF has (`settings.head`, from config.head.kind; "auto" follows the
encoder's family, `model.is_modernbert`):
- "bert": HF's BertFor* heads. Classification reads the tanh pooler on [CLS] (`bert/pooler`),
  then dropout and `classifier`; tagging the sequence, then dropout and `classifier`; QA the
  sequence, then `qa_outputs` (no dropout).
- "modernbert": HF's ModernBertFor* heads. `head` (`model.PredictionHead`: dense + activation +
  norm) on the pooled vector (`model.pool` by classifier_pooling: [CLS], or the mean over the
  attention mask) or on every token (tagging, QA), then dropout (config.head.classifier_dropout,
  0 by default as HF's) and `classifier`. From an MLM-pretrained encoder, `head` starts from the
  MLM head's transform, as HF's from_pretrained of a ModernBertForMaskedLM checkpoint does (the
  names match there).
Parameter names follow HF's, so an export (`bert_jax/weights/hf_export.py`) writes them as they are.
"""

import dataclasses
import warnings
from typing import Any, ClassVar, Sequence, Self

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import finetune as finetune_data
from bert_jax.data.finetune import Record, TaskData
from bert_jax.data.vocab import Vocab
from bert_jax.models import flops, model as model_lib
from bert_jax.models.model import EMBED, BertConfig, BertModel, PredictionHead
from bert_jax.weights.layout import pad_vocab
from bert_jax.weights.params import PRETRAINING_SUBTREES, TaskHead
from bert_jax.tasks.base import Batch, Scores, Task

ENCODER = "bert"  # Name of the encoder submodule in every head model (pooler included).
CLASSIFIER = "classifier"  # The last layer of a head whose outputs are the labels.
# config.head.kind: "auto" (the encoder family's), or HF's heads of BERT or of ModernBERT.
HEAD_KINDS = ("auto", "bert", "modernbert")
HF_PREFIXES = {"bert": "Bert", "modernbert": "ModernBert"}  # HF class names by head kind.


def resolve_head(kind: str, model_config: BertConfig) -> str:
  """config.head.kind with "auto" decided by the encoder: ModernBERT's heads for the modern
  architecture, BERT's otherwise (a model HF has neither for keeps BERT's)."""
  if kind != "auto":
    return kind
  return "modernbert" if model_lib.is_modernbert(model_config) else "bert"


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
  """What every fine-tuned checkpoint records to encode inputs and decode outputs; a task with
  settings of its own subclasses it (and names the subclass in `settings_class`)."""
  labels: tuple[str, ...]
  max_seq_length: int
  head_dropout_prob: float  # Before the classifier (head.dropout_prob or classifier_dropout).
  freeze_encoder: bool
  # HF's head form, "bert" or "modernbert" (see the module docstring); checkpoints from before
  # ModernBERT's heads all have BERT's.
  head: str = dataclasses.field(default="bert", kw_only=True)

  @classmethod
  def config_values(cls, config) -> dict[str, Any]:
    """The fields of this class but `labels` and the head's, from the config (a subclass adds
    its own)."""
    return {"max_seq_length": config.data.max_seq_length,
            "freeze_encoder": bool(config.train.freeze_encoder)}

  @classmethod
  def vocab_values(cls, vocab: Vocab | None) -> dict[str, Any]:
    """The fields a subclass takes from the run's vocabulary (its special ids); none here."""
    del vocab
    return {}

  @classmethod
  def from_config(cls, config, labels: Sequence[str], model_config: BertConfig,
                  vocab: Vocab | None = None) -> Self:
    """The settings of a run of `config` on an encoder of `model_config` and `vocab`."""
    head = resolve_head(config.head.kind, model_config)
    dropout = config.head.classifier_dropout if head == "modernbert" else config.head.dropout_prob
    return cls(labels=tuple(labels), head=head, head_dropout_prob=dropout,
               **cls.config_values(config), **cls.vocab_values(vocab))

  @classmethod
  def from_meta(cls, meta: dict[str, Any]) -> Self:
    """The settings a checkpoint's task meta recorded (`FinetuneTask.meta`)."""
    meta = {"head": "bert", **meta}
    # A field with a default may postdate the checkpoint: its default is what that run did.
    values = {f.name: meta[f.name] for f in dataclasses.fields(cls)
              if f.name in meta or f.default is dataclasses.MISSING}
    # JSON gave lists: settings are hashable (a task keys the compiled programs).
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def head_dense(config: BertConfig, features: int, name: str) -> nn.Dense:
  """The task's last layer (its σ: `model.INIT_STDS`' "classifier", hidden_size^-0.5 for
  ModernBERT; zero bias)."""
  return nn.Dense(
      features, dtype=config.dtype, param_dtype=config.param_dtype,
      kernel_init=model_lib.weight_init(config, (EMBED, None), "classifier"),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
      name=name)


def head_features(config: BertConfig, head: str, input_ids, token_type_ids, attention_mask,
                  deterministic: bool, pooled: bool):
  """What a head's dropout and classifier read, inside the calling module: [B, H] (`pooled`)
  or [B, L, H]. BERT's: the tanh pooler on [CLS], or the sequence; ModernBERT's: HF's
  prediction head on `model.pool`'s vector (classifier_pooling) or on every token."""
  if head == "bert":
    sequence, pooled_output = BertModel(config, add_pooling_layer=pooled, name=ENCODER)(
        input_ids, token_type_ids, attention_mask, deterministic)
    return pooled_output if pooled else sequence
  sequence, _ = BertModel(config, add_pooling_layer=False, name=ENCODER)(
      input_ids, token_type_ids, attention_mask, deterministic)  # [B, L, H]
  if pooled:
    sequence = model_lib.pool(sequence, attention_mask, None, config.classifier_pooling)
  return PredictionHead(config, name="head")(sequence)


def nll(logits, labels):
  """logits [..., C], labels [...] -> negative log-likelihood [...] f32."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def f1_from_counts(tp, fp, fn) -> float:
  denominator = 2 * tp + fp + fn
  return float(2 * tp / denominator) if denominator else 0.0


def example_weight(batch: Batch) -> jax.Array:
  """[B] f32: 0 on the padding rows of eval batches, 1 elsewhere (train batches have none)."""
  weight = batch.get("example_weight")
  if weight is None:
    return jnp.ones(batch["input_ids"].shape[:1], jnp.float32)
  return weight.astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class FinetuneTask(Task):
  """A head on the encoder, trained on encoded `TaskData`; one loss term (`loss_sum` /
  `loss_count`). Subclasses define `model`, `input_names`, `outputs`, `_terms`, `_weights`,
  `labels_from`, `encode`, `predictions`, `score`, `main_metric`."""
  model_config: BertConfig
  settings: FinetuneSettings

  loss_terms = (("loss_sum", "loss_count"),)
  keeps_eval_outputs = True  # Predictions are decoded from the per-row outputs.
  settings_class: ClassVar[type[FinetuneSettings]] = FinetuneSettings
  # launch/predict.py: --mode=<predict_mode> runs this task, and its `text_b` is "optional",
  # "required" (the passage of QA) or "unused".
  predict_mode: ClassVar[str]
  text_b: ClassVar[str] = "optional"
  input_names: ClassVar[tuple[str, ...]] = ("input_ids", "token_type_ids", "attention_mask")
  # Per-example fields of a train batch besides the inputs: name -> (shape, dtype), with L for
  # the sequence length.
  target_signature: ClassVar[dict[str, tuple[tuple[str | int, ...], Any]]] = {}
  # HF's task model of this head without the family's prefix (`HF_PREFIXES`), e.g.
  # "ForSequenceClassification"; "" for a task HF has none for (it exports its encoder only).
  hf_task: ClassVar[str] = ""
  # config.json's id2label names of a task without labels (QA: its two outputs).
  hf_labels: ClassVar[tuple[str, ...]] = ()
  # Whether the params are `BertForPreTraining`'s (bert, mlm, nsp: an MLM task such as
  # diffusion_sft), exported with those heads as a pretraining checkpoint is.
  exports_pretraining_heads: ClassVar[bool] = False
  # The pretrained heads (weights.HEADS: pooler, mlm, nsp) the task reads from `init_from`:
  # loading one that lacks them says so; the others are no news (an embedding model has none).
  pretrained_heads_read: ClassVar[tuple[str, ...]] = ()
  # Settings (of config.<config_section>) that say what the trained model computes: a resume
  # with other values is refused (`training/resume.py`), e.g. an embedding's pooling.
  resume_identity: ClassVar[tuple[str, ...]] = ()
  config_section: ClassVar[str] = "task"

  @property
  def hf_architecture(self) -> str:
    """HF's class of this model ("BertForSequenceClassification", ...), "" without one."""
    return HF_PREFIXES[self.settings.head] + self.hf_task if self.hf_task else ""

  def hf_problem_type(self) -> str | None:
    """config.json's problem_type (HF's sequence classifiers read it), None if unused."""
    return None

  def hf_head(self, params: dict) -> TaskHead:
    """This model's head as its HF task model holds it (`weights.save_hf`): the class, the
    output names, problem_type, the params besides the encoder and the dropout before the
    classifier."""
    if not self.hf_task:
      raise ValueError(f"task {self.name!r} has no HuggingFace task model to export to")
    return TaskHead(self.hf_architecture, tuple(self.settings.labels) or self.hf_labels,
                    self.hf_problem_type(), {k: v for k, v in params.items() if k != ENCODER},
                    self.settings.head_dropout_prob)

  @property
  def frozen(self) -> tuple[str, ...]:
    return (ENCODER,) if self.settings.freeze_encoder else ()

  @property
  def seq_len(self) -> int:
    return self.settings.max_seq_length

  @property
  def num_outputs(self) -> int:
    return len(self.settings.labels)

  def example_inputs(self) -> tuple:
    ids = jnp.zeros((1, self.settings.max_seq_length), jnp.int32)
    return (ids,) * len(self.input_names)

  def batch_signature(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    length = self.settings.max_seq_length
    signature = {name: ((length,), jnp.int32) for name in self.input_names}
    for name, (shape, dtype) in self.target_signature.items():
      signature[name] = (tuple(length if d == "L" else d for d in shape), dtype)
    return signature

  def batch_packer(self, row_multiple: int) -> "finetune_data.Packer | None":
    """What packs a global train batch into rows (`TrainBatches`' `pack`; their count a
    multiple of `row_multiple`), or None: a row is an example (the default)."""
    del row_multiple
    return None

  def apply(self, params, batch: Batch, dropout_rng: jax.Array | None):
    """The model's raw outputs on a batch (dropout on when `dropout_rng` is given)."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    inputs = tuple(batch[name] for name in self.input_names)
    return self.model.apply({"params": params}, *inputs, deterministic=dropout_rng is None,
                            rngs=rngs)

  def outputs(self, raw) -> dict[str, jax.Array]:
    """Raw model outputs -> named per-row outputs."""
    return {"logits": raw}

  def _terms(self, raw, batch: Batch) -> jax.Array:
    """Per-item loss terms, [B] or [B, L] f32."""
    raise NotImplementedError

  def _weights(self, batch: Batch) -> jax.Array:
    """Per-item weights from the batch alone, shaped as `_terms`; 1 per example by default."""
    return jnp.ones(batch["input_ids"].shape[:1], jnp.float32)

  def _sums(self, raw, batch: Batch) -> dict[str, jax.Array]:
    weights = self._weights(batch)
    weight = example_weight(batch)  # Padding rows of eval batches weigh 0.
    weights = weights * (weight if weights.ndim == 1 else weight[:, None])
    return {"loss_sum": jnp.sum(self._terms(raw, batch) * weights),
            "loss_count": jnp.sum(weights)}

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"loss_count": jnp.sum(self._weights(batch))}

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    return self._sums(self.apply(params, batch, dropout_rng), batch)

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    raw = self.apply(params, batch, None)
    return self.outputs(raw), self._sums(raw, batch)

  def report(self, sums: dict[str, float]) -> dict[str, float]:
    del sums
    return {}

  def scores(self, outputs: dict[str, np.ndarray], sums: dict[str, float],
             data: TaskData) -> Scores:
    predicted = self.predictions(outputs, data)
    return Scores({"loss": sums["loss_sum"] / max(sums["loss_count"], 1.0),
                   **self.score(predicted, data)}, {"examples": len(data.examples)})

  def initial_params(self, pretrained: dict) -> dict:
    # Real vocabulary rows in (every weight format's), the model's padding out. Subtrees
    # besides the pretraining ones are a task head that `head_from` took for this task.
    params = {ENCODER: pad_vocab(pretrained, self.model_config)[ENCODER],
              **{k: v for k, v in pretrained.items() if k not in PRETRAINING_SUBTREES}}
    if self.settings.head == "modernbert" and "head" not in params and "mlm" in pretrained:
      # HF's ModernBertFor*.from_pretrained of an MLM checkpoint loads its head.* here too.
      mlm = pretrained["mlm"]
      params["head"] = {"dense": mlm["transform"], "norm": mlm["transform_norm"]}
    return params

  def head_from(self, head: TaskHead) -> tuple[dict, str]:
    """(the params of a source's task head to start from, a line saying what was taken), or
    ({}, why not): the head starts fresh unless it is this task's HF model (family included)
    with the same outputs (the same label set: its classifier rows are put in this run's label
    order; regression both or neither)."""
    if head.architecture != self.hf_architecture:
      return {}, (f"its task head is a {head.architecture}, this run trains a "
                  f"{self.hf_architecture or self.name}")
    labels = tuple(self.settings.labels)
    regression = bool(getattr(self.settings, "regression", False))
    if head.regression != regression:
      return {}, (f"its head is {'a regression' if head.regression else 'a classifier'}, this "
                  f"run trains {'a regression' if regression else 'a classifier'} "
                  "(config.data.regression)")
    if not labels or regression:  # QA, or one regression output: nothing to reorder.
      return dict(head.params), f"took its task head ({head.architecture})"
    if sorted(head.labels) != sorted(labels):
      return {}, (f"its head's labels {list(head.labels)} are not this run's {list(labels)} "
                  "(config.data.labels or the training file's)")
    order = [head.labels.index(label) for label in labels]
    classifier = head.params[CLASSIFIER]
    params = {**head.params, CLASSIFIER: {"kernel": np.asarray(classifier["kernel"])[:, order],
                                          "bias": np.asarray(classifier["bias"])[order]}}
    reordered = ("" if order == sorted(order) else
                 f" (its {list(head.labels)} put in this run's order)")
    return params, f"took its task head ({head.architecture}, labels {list(labels)}{reordered})"

  def flops_per_example(self) -> float | None:
    """The encoder's train FLOPs over a row of max_seq_length (the head's, a few outputs per
    example or per token, are not counted)."""
    return flops.train_flops_per_sequence(self.model_config, self.seq_len, 0)

  def meta(self) -> dict[str, Any]:
    return {"name": self.name, **dataclasses.asdict(self.settings)}

  def describe(self, split: str, data: TaskData) -> str:
    """A log line on what encoding a split gave."""
    return (f"{split}: {len(data)} examples from {data.source}; {data.num_truncated} longer "
            f"than max_seq_length={self.settings.max_seq_length} were truncated")

  def describe_head(self, pooling: str, followed: bool) -> str:
    """The log line on the head: its form, dropout and the encoder's pooling (`followed`: the
    checkpoint's own)."""
    return (f"Head: {self.hf_architecture or self.name}'s, dropout "
            f"{self.settings.head_dropout_prob:g}, pooling {pooling}"
            + (" (the checkpoint's)" if followed else ""))

  def describe_labels(self) -> str | None:
    """A log line on the label set, None for a task without labels."""
    labels = self.settings.labels
    return f"{len(labels)} labels: {list(labels)}" if labels else None

  def truncation_note(self, record: Record, vocab: Vocab) -> str | None:
    """What the model does not read of a record to predict on ("the text has 700 pieces with
    [CLS] and [SEP]; the model reads the first 128 (max_seq_length)"), or None."""
    text_b = finetune_data.text_b(record) if self.text_b != "unused" else None
    pieces = len(vocab.encode(finetune_data.field(record, "text"))) + 2
    if text_b:
      pieces += len(vocab.encode(text_b)) + 1
    length = self.settings.max_seq_length
    if pieces <= length:
      return None
    cut = ("the longer of text and text_b is cut first" if text_b else
           f"the model reads the first {length}")
    return (f"the {'pair' if text_b else 'text'} has {pieces} pieces with [CLS] and [SEP]; "
            f"{cut}" + (f", to {length}" if text_b else "") + " (max_seq_length)")

  # ------------------------------------------------------------ task specific
  @classmethod
  def labels_from(cls, records: Sequence[Record], config) -> list[str]:
    """The label names from the training records (or config.data.labels); [] for a task
    without labels."""
    raise NotImplementedError

  def encode(self, records: Sequence[Record], vocab: Vocab, with_labels: bool = True,
             is_training: bool = False) -> TaskData:
    raise NotImplementedError

  def predictions(self, outputs: dict[str, np.ndarray], data: TaskData) -> list[dict[str, Any]]:
    raise NotImplementedError

  def score(self, predicted: list[dict[str, Any]], data: TaskData) -> dict[str, float]:
    raise NotImplementedError

  def main_metric(self) -> str:
    raise NotImplementedError

  def metric_names(self) -> list[str] | None:
    """What an evaluation reports, so that config.train.best_metric is checked before training:
    the loss and the task's scores of no examples (their names do not depend on the data; a
    task whose scores do adds those names). None when the task cannot score no examples (a
    task of a user's: its metric is then checked at the first evaluation)."""
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # Means of nothing.
      try:
        return sorted({"loss", *self.score([], TaskData("", {}, []))})
      except Exception:  # pylint: disable=broad-except  (a score that needs examples)
        return None
