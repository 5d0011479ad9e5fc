"""Fine-tuning heads on the shared encoder, and their losses.

Each model holds the encoder as a submodule named `bert`, so `params["bert"]` of a pretraining
checkpoint (or an import) plugs in unchanged; only the head's parameters are new.
- `BertForSequenceClassification`: dropout + dense on the pooled [CLS] vector; `num_labels == 1`
  is regression (MSE), as HuggingFace's.
- `BertForTokenClassification`: dropout + dense at every position; labels sit on the first piece
  of each word (the other pieces weigh 0), as BERT's NER setup.
- `BertForQuestionAnswering`: start and end logits over the sequence; positions outside the
  passage are masked with a large negative value, except [CLS]: run_squad.py trains a window
  that does not hold the answer to point at [CLS] (decoding never picks it).

Shapes: B batch, L sequence length, H hidden size, C labels.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import EMBED, BertConfig, BertModel

TASKS = ("classification", "tagging", "qa")

# Masked QA logits: finite, so an all-masked row still has a (uniform) softmax.
_MASKED_LOGIT = -1e9


def _head_dense(config: BertConfig, features: int, name: str) -> nn.Dense:
  return nn.Dense(
      features, dtype=config.dtype, param_dtype=config.param_dtype,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.truncated_normal(config.initializer_range), (EMBED, None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
      name=name)


class BertForSequenceClassification(nn.Module):
  """[CLS] A [SEP] (B [SEP]) -> logits [B, C] f32 (C = 1: a regression score)."""
  config: BertConfig
  num_labels: int
  dropout_prob: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool = True):
    _, pooled = BertModel(self.config, add_pooling_layer=True, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic)  # [B, H]
    pooled = nn.Dropout(self.dropout_prob)(pooled, deterministic=deterministic)
    return _head_dense(self.config, self.num_labels, "classifier")(pooled).astype(jnp.float32)


class BertForTokenClassification(nn.Module):
  """Tokens -> per-position logits [B, L, C] f32. No pooler: it would get no gradient."""
  config: BertConfig
  num_labels: int
  dropout_prob: float = 0.1

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool = True):
    sequence, _ = BertModel(self.config, add_pooling_layer=False, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic)  # [B, L, H]
    sequence = nn.Dropout(self.dropout_prob)(sequence, deterministic=deterministic)
    return _head_dense(self.config, self.num_labels, "classifier")(sequence).astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """[CLS] question [SEP] passage-window [SEP] -> (start_logits, end_logits), each [B, L] f32,
  with every position outside `context_mask` (1 on passage tokens) masked out except position
  0, [CLS]: the target of windows that do not hold the answer (run_squad's out-of-span rule)."""
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, token_type_ids, attention_mask, context_mask,
               deterministic: bool = True):
    sequence, _ = BertModel(self.config, add_pooling_layer=False, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic)  # [B, L, H]
    logits = _head_dense(self.config, 2, "qa_outputs")(sequence).astype(jnp.float32)  # [B, L, 2]
    logits = mask_qa_logits(logits, context_mask)
    return logits[..., 0], logits[..., 1]


def mask_qa_logits(logits: jax.Array, context_mask: jax.Array) -> jax.Array:
  """logits [B, L, 2] -> the same with every position but the passage (`context_mask` [B, L])
  and [CLS] (position 0) set to a large negative value. Question, [SEP] and padding stay masked
  (run_squad leaves them in its softmax, but they are never targets nor answers); [CLS] must
  compete, or "the answer is not in this window" could not be learnt."""
  is_cls = jnp.arange(context_mask.shape[-1]) == 0  # [L]
  allowed = (context_mask > 0) | is_cls[None, :]  # [B, L]
  return jnp.where(allowed[..., None], logits, _MASKED_LOGIT)


def make_model(task: str, config: BertConfig, num_labels: int,
               dropout_prob: float = 0.1) -> nn.Module:
  """The head model of `task` ("classification", "tagging" or "qa")."""
  if task == "classification":
    return BertForSequenceClassification(config, num_labels, dropout_prob)
  if task == "tagging":
    return BertForTokenClassification(config, num_labels, dropout_prob)
  if task == "qa":
    return BertForQuestionAnswering(config)
  raise ValueError(f"Unknown task {task!r}; use one of {TASKS}")


def model_inputs(task: str, batch: dict) -> tuple:
  """The positional inputs of `make_model(task, ...)` from a batch (finetune_data's fields)."""
  inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
  return inputs + (batch["context_mask"],) if task == "qa" else inputs


# ------------------------------------------------------------------------------------ losses


def _nll(logits, labels):
  """logits [..., C], labels [...] -> negative log-likelihood [...] f32."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def loss_sums(task: str, outputs, batch: dict, num_labels: int) -> dict[str, jax.Array]:
  """Summed loss and its count (f32 scalars) over the batch; `example_weight` [B] (0 on padding
  rows of eval batches), `label_weights` [B, L] (tagging: first pieces) and `answer_weight` [B]
  (QA: 0 on windows of a record without a gold answer) weigh the terms. A QA window that does
  not hold the whole answer targets [CLS] (position 0) and weighs 1, as run_squad."""
  weight = batch.get("example_weight")
  if weight is None:
    weight = jnp.ones(batch["input_ids"].shape[:1], jnp.float32)
  weight = weight.astype(jnp.float32)  # [B]
  if task == "classification":
    if num_labels == 1:
      per_example = jnp.square(outputs[:, 0] - batch["labels"].astype(jnp.float32))  # [B]
    else:
      per_example = _nll(outputs, batch["labels"])  # [B]
    return {"loss_sum": jnp.sum(per_example * weight), "loss_count": jnp.sum(weight)}
  if task == "tagging":
    token_weight = batch["label_weights"].astype(jnp.float32) * weight[:, None]  # [B, L]
    per_token = _nll(outputs, batch["labels"])  # [B, L]
    return {"loss_sum": jnp.sum(per_token * token_weight), "loss_count": jnp.sum(token_weight)}
  if task == "qa":
    start_logits, end_logits = outputs
    weight = weight * batch["answer_weight"].astype(jnp.float32)  # 0: no gold answer.
    per_example = 0.5 * (_nll(start_logits, batch["start_positions"])
                         + _nll(end_logits, batch["end_positions"]))  # [B]
    return {"loss_sum": jnp.sum(per_example * weight), "loss_count": jnp.sum(weight)}
  raise ValueError(f"Unknown task {task!r}; use one of {TASKS}")
