"""What the trainer needs from a task: one small interface shared by pretraining and every
fine-tuning task, so the loop, resume, preemption, sharding and logging exist once.

A task owns its model and its objective. Inside the jitted step it may `prepare` a batch (the
pretraining task masks it there), computes loss sums and the counts that normalise them, and
for evaluation returns per-row outputs plus sums; on the host it turns summed metrics and
gathered outputs into the numbers a user reads. Metrics are sums plus counts so that means over
microbatches, batches and hosts are exact.
"""

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models.model import BertConfig

Batch = dict[str, jax.Array]


def chunked(batch, num: int):
  """[B, ...] -> [num, B/num, ...]; chunk j takes rows j, j+num, ... so every chunk stays spread
  over all data-parallel devices."""
  def split(x):
    x = x.reshape(x.shape[0] // num, num, *x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def unchunked(chunks, num: int):
  """`chunked`'s inverse: [num, B/num, ...] -> [B, ...] in the batch's row order."""
  def join(x):
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape(x.shape[0] * num, *x.shape[2:])
  return jax.tree.map(join, chunks)


@dataclasses.dataclass
class Scores:
  """An evaluation: the task's metrics (what a best checkpoint is picked by) and, apart, the
  counts of what was scored ({"examples": 954}; QA also its windows)."""
  metrics: dict[str, float]
  counts: dict[str, float]


class Task:
  """The interface; subclasses set `model`, `loss_terms` and override what they need."""

  name: ClassVar[str]
  # (sum name, count name) per loss term: loss = sum over terms of sum / batch count.
  loss_terms: ClassVar[tuple[tuple[str, str], ...]]
  # Metrics of the console line (after "loss"), in order.
  log_keys: ClassVar[tuple[str, ...]] = ()
  # Whether evaluation gathers per-row outputs for `scores` (else the sums alone suffice).
  keeps_eval_outputs: ClassVar[bool] = False
  model: nn.Module
  model_config: BertConfig  # The encoder's shape (mesh checks, vocabulary padding, FLOPs).
  # Top-level params subtrees the optimizer leaves bit-identical (a frozen encoder).
  frozen: tuple[str, ...] = ()

  # ------------------------------------------------------------ shapes (host, static)
  seq_len: int  # L: tokens per row of its batches (the slots throughput is counted against).

  def example_inputs(self) -> tuple:
    """Positional inputs (batch 1) that `model.init` traces."""
    raise NotImplementedError

  def batch_signature(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Per-example fields of a train batch: name -> (shape without batch, dtype)."""
    raise NotImplementedError

  def batch_shapes(self, batch_size: int, row_multiple: int) -> dict[str, tuple[tuple[int, ...],
                                                                              Any]]:
    """A representative global train batch of `batch_size` examples: name -> (shape, dtype)
    (what `--compile_only` and the compile report lower). A task that packs its examples into
    rows, a multiple of `row_multiple` of them, gives a typical packed batch."""
    del row_multiple
    return {name: ((batch_size, *shape), dtype)
            for name, (shape, dtype) in self.batch_signature().items()}

  # ------------------------------------------------------------ inside the jitted step
  def prepare(self, batch: Batch, rng: jax.Array, step: jax.Array) -> Batch:
    """The train batch as the loss sees it at optimizer step `step` (int32 scalar; random
    corruption happens here, and anything that changes over training); identity by default."""
    del rng, step
    return batch

  def prepare_eval(self, batch: Batch, rng: jax.Array) -> Batch:
    """The eval batch as the model sees it (a fixed `rng`); identity by default."""
    del rng
    return batch

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    """The count of each loss term over a whole (prepared) batch, from the batch alone: the
    denominators, fixed before microbatching so accumulation equals the full batch."""
    raise NotImplementedError

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    """Forward (dropout on when `dropout_rng` is given) -> f32 sums and counts."""
    raise NotImplementedError

  def real_tokens(self, batch: Batch) -> jax.Array:
    """Non-padding tokens of a batch (f32 scalar): the work done, where slots are not."""
    key = "segment_ids" if "segment_ids" in batch else "attention_mask"
    return jnp.sum((batch[key] > 0).astype(jnp.float32))

  def examples(self, batch: Batch) -> jax.Array:
    """Examples in a (prepared) train batch (f32 scalar): one a row unless rows pack several."""
    return jnp.float32(batch["input_ids"].shape[0])

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    return sum(sums[total] / jnp.maximum(counts[count], 1.0) for total, count in self.loss_terms)

  def gradients(self, params, batch: Batch, dropout_rng: jax.Array, counts: dict[str, jax.Array],
                num_chunks: int) -> tuple[jax.Array, dict[str, jax.Array], Any]:
    """(loss, sums, gradients) of a whole (prepared) batch, in `num_chunks` pieces of memory
    (config.train.grad_accum_steps). By default microbatch j takes rows j, j + num_chunks, ...
    (spread over every data-parallel device), with dropout rng fold_in(dropout_rng, j); the
    loss is normalised by the whole batch's `counts`, so the sum of the microbatches' gradients
    is the batch's. A loss that couples rows (in-batch negatives) overrides this."""
    def loss_fn(params, micro, micro_rng):
      sums = self.loss_sums(params, micro, micro_rng)
      return self.loss(sums, counts), sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_chunks == 1:
      (loss, sums), grads = grad_fn(params, batch, dropout_rng)
      return loss, sums, grads

    def accumulate(carry, xs):
      index, micro = xs
      (loss, sums), grads = grad_fn(params, micro, jax.random.fold_in(dropout_rng, index))
      return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

    micro = chunked(batch, num_chunks)
    shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), dropout_rng)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (*shapes[0], shapes[1]))
    (loss, sums, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(num_chunks), micro))
    return loss, sums, grads

  def eval_outputs(self, params, batch: Batch) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Deterministic forward of a (prepared) eval batch -> (per-row outputs kept for host
    scoring, sums). Rows with `example_weight` 0 are padding."""
    raise NotImplementedError

  # ------------------------------------------------------------ on the host
  def report(self, sums: dict[str, float]) -> dict[str, float]:
    """Summed train metrics (over steps) -> means for the log."""
    raise NotImplementedError

  def scores(self, outputs: dict[str, np.ndarray], sums: dict[str, float], data) -> Scores:
    """The evaluation from the outputs of every real eval row (in order; empty unless
    `keeps_eval_outputs`) and the summed sums; `data` is the evaluation data the driver passed
    (None for pretraining)."""
    raise NotImplementedError

  def initial_params(self, pretrained: dict) -> dict:
    """Pretrained params (BertForPreTraining layout: bert, mlm, nsp) -> the subtrees of this
    model's params they fill; the rest keeps its fresh initialisation."""
    raise NotImplementedError

  def meta(self) -> dict[str, Any]:
    """What a checkpoint records to rebuild this task (prediction, resume checks)."""
    return {"name": self.name}

  def check_saved(self, saved_task: dict[str, Any], saved_config: dict[str, Any],
                  where: str) -> None:
    """Refuses, before anything is restored, a checkpoint (its `meta()` and config) whose
    params this task's would not fit for a setting of its own; nothing to check by default."""
    del saved_task, saved_config, where

  def flops_per_example(self) -> float | None:
    """Model FLOPs of one train example (for MFU), or None when not counted."""
    return None
