"""BERT's pretraining task: masked LM (masking inside the jitted step) + next sentence
prediction, on `BertForPreTraining`, over rows that pack up to K examples (K = 1: unpacked).
Batch fields: WORKSPACE.md, "Batch". The MLM-only objective is the same task with every
`nsp_weights` 0 (the NSP loss and its count are then 0). Each example of a row is masked as the
original masks one instance (its own count of targets: `masking.mask_tokens`); the train metrics
add the examples of each step (`examples`) and the mean targets per example.

Two options of the modern recipe live here: evaluation may mask at another rate than training
(`eval_masking`: ModernBERT trains at 30% and evaluates at 15%), and MLM-only rows may be cut
into spans early in training (example-length warmup, `cut_into_spans`): each span attends only
within itself and its positions restart at 0, as a packed row of short examples would, with no
padding; the span length grows with the step, so a resumed run cuts exactly as the first did."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models import flops
from bert_jax.objectives import diffusion as diffusion_lib
from bert_jax.objectives import losses
from bert_jax.objectives.masking import MaskingConfig, mask_tokens, stage_rate
from bert_jax.models.model import BertConfig, BertForPreTraining
from bert_jax.weights.layout import pad_vocab
from bert_jax.tasks.base import Batch, Scores, Task


@dataclasses.dataclass(frozen=True)
class PretrainingTask(Task):
  """MLM + NSP. Frozen and hashable: equal tasks share one compiled step."""
  model_config: BertConfig
  masking: MaskingConfig
  seq_len: int
  examples_per_row: int  # K: packed examples per row (1: unpacked).
  eval_masking: MaskingConfig | None = None  # Held-out evaluation's policy (None: `masking`).
  # Example-length warmup (MLM-only rows): spans of span_warmup_start tokens at step 0, growing
  # linearly to whole rows at step span_warmup_steps (0: off).
  span_warmup_steps: int = 0
  span_warmup_start: int = 0
  # mmBERT's inverse masking schedule: (first step, rate) of each stage, the first at step 0;
  # () keeps masking.mask_prob at every step.
  rate_stages: tuple[tuple[int, float], ...] = ()
  # The masked-diffusion schedule (objective "diffusion"), and the held-out NELBO's grid of t
  # that every MLM-headed objective reports (`objectives/diffusion.py`; 0 points: none).
  diffusion: diffusion_lib.DiffusionSettings = diffusion_lib.DiffusionSettings()

  name = "pretraining"
  loss_terms = (("mlm_loss_sum", "mlm_count"), ("nsp_loss_sum", "nsp_count"))
  log_keys = ("mlm_accuracy", "nsp_accuracy")

  @property
  def model(self) -> BertForPreTraining:
    return BertForPreTraining(self.model_config)

  def example_inputs(self) -> tuple:
    ids = jnp.zeros((1, self.seq_len), jnp.int32)
    return ids, ids, ids, jnp.zeros((1, self.masking.max_predictions_per_seq), jnp.int32)

  def batch_signature(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    tokens, slots = ((self.seq_len,), jnp.int32), ((self.examples_per_row,), jnp.int32)
    return {"input_ids": tokens, "token_type_ids": tokens, "segment_ids": tokens,
            "position_ids": tokens, "word_starts": tokens, "cls_positions": slots,
            "next_sentence_label": slots,
            "nsp_weights": ((self.examples_per_row,), jnp.float32)}

  def prepare(self, batch: Batch, rng: jax.Array, step: jax.Array) -> Batch:
    """Masks the batch (adds masked_lm_{positions,ids,weights}, corrupts input_ids), each
    example of a row on its own, then cuts rows into spans while the example-length warmup
    lasts (the spans change attention and positions, not what an example's targets are)."""
    rate = None
    if self.rate_stages:
      starts, rates = zip(*self.rate_stages)
      rate = stage_rate(step, starts, rates)
    batch = _masked(batch, rng, self.masking, self.examples_per_row, rate)
    if self.span_warmup_steps:
      batch = cut_into_spans(batch, span_length(step, self.span_warmup_start,
                                                self.span_warmup_steps, self.seq_len))
    return batch

  def prepare_eval(self, batch: Batch, rng: jax.Array) -> Batch:
    """Masks each example at the evaluation rate, over whole rows (no spans); keeps the clean
    rows and the key for the held-out bound."""
    masked = _masked(batch, rng, self.eval_masking or self.masking, self.examples_per_row)
    if not self.diffusion.eval_points:
      return masked
    return {**masked, "clean_input_ids": batch["input_ids"], "eval_key": rng}

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"mlm_count": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "nsp_count": jnp.sum(batch["nsp_weights"].astype(jnp.float32))}

  def _forward(self, params, batch: Batch, dropout_rng: jax.Array | None):
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                            batch["segment_ids"], batch["masked_lm_positions"],
                            deterministic=dropout_rng is None, rngs=rngs,
                            position_ids=batch["position_ids"],
                            cls_positions=batch["cls_positions"])

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    return losses.pretraining_sums(self._forward(params, batch, dropout_rng), batch)

  def examples(self, batch: Batch) -> jax.Array:
    """The real examples of a batch: slot k of a row is one when its [CLS] lies in the row's
    k-th example (an empty slot points at position 0, in example 1), so MLM-only rows count 1
    each (also once cut into spans) and NSP rows their examples."""
    segment_at_cls = jnp.take_along_axis(batch["segment_ids"], batch["cls_positions"], axis=1)
    slot = jnp.arange(1, batch["cls_positions"].shape[1] + 1, dtype=segment_at_cls.dtype)
    return jnp.sum((segment_at_cls == slot[None, :]).astype(jnp.float32))

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    sums = losses.pretraining_sums(self._forward(params, batch, None), batch)
    if self.diffusion.eval_points:
      sums.update(self.elbo(params, {**batch, "input_ids": batch["clean_input_ids"]},
                            batch["eval_key"]))
    # Exact means need the sums only; the examples the evaluation covered (padding rows: 0).
    return {}, {**sums, "examples": self.examples(batch)}

  def elbo(self, params, clean: Batch, key: jax.Array) -> dict[str, jax.Array]:
    """The held-out NELBO's sums of uncorrupted rows (`diffusion.elbo_sums`), the MLM head read
    at every position; the same grid and keys for every model."""
    def forward(corrupted: Batch) -> jax.Array:
      return self._forward(params, corrupted, None)["mlm_logits"]  # [B, L, V]
    return diffusion_lib.elbo_sums(forward, clean, key, self.masking, self.diffusion.schedule,
                                   self.diffusion.eval_points)

  def report(self, sums: dict[str, float]) -> dict[str, float]:
    # Targets per example: each example's own min(P, max(1, round(mask_prob x n))), on average.
    return {**losses.means(sums),
            "targets_per_example": float(sums["mlm_count"]) / max(float(sums["examples"]), 1.0)}

  def scores(self, outputs: dict[str, np.ndarray], sums: dict[str, float], data) -> Scores:
    del outputs, data
    # "examples": every example evaluated (MLM-only rows too: one each), not NSP's count.
    return Scores({**losses.means(sums), **diffusion_lib.means(sums)},
                  {"examples": sums["examples"], "targets": sums["mlm_count"]})

  def initial_params(self, pretrained: dict) -> dict:
    return pad_vocab(pretrained, self.model_config)  # Real rows in; the model's padding.

  def meta(self) -> dict[str, Any]:
    return {"name": self.name, "masking": dataclasses.asdict(self.masking),
            "eval_masking": dataclasses.asdict(self.eval_masking or self.masking),
            "seq_len": self.seq_len, "examples_per_row": self.examples_per_row,
            "span_warmup": [self.span_warmup_steps, self.span_warmup_start]}

  def flops_per_example(self) -> float:
    return flops.train_flops_per_sequence(self.model_config, self.seq_len,
                                          self.masking.max_predictions_per_seq)


def _masked(batch: Batch, rng: jax.Array, masking: MaskingConfig, examples_per_row: int,
            rate: jax.Array | None = None) -> Batch:
  """Masks each example of a row (`segment_ids`) as the original masks one instance. A row of
  K = 1 (or a test's bare rows, without segment ids) is one example and padding: masked as a
  whole row, which draws the same targets with less work."""
  word_starts = batch["word_starts"] if masking.whole_word_masking else None
  segment_ids = batch.get("segment_ids") if examples_per_row > 1 else None
  return {**batch, **mask_tokens(rng, batch["input_ids"], masking, word_starts, segment_ids,
                                 rate)}


def span_length(step: jax.Array, start: int, warmup_steps: int, seq_len: int) -> jax.Array:
  """int32 scalar: the example-length warmup's span at optimizer step `step` (0-based),
  `start` at step 0 growing linearly to `seq_len` at `warmup_steps` and after."""
  progress = jnp.minimum(jnp.asarray(step, jnp.float32) / warmup_steps, 1.0)
  return jnp.floor(start + (seq_len - start) * progress).astype(jnp.int32)


def cut_into_spans(batch: Batch, length: jax.Array) -> Batch:
  """One-sequence rows (objective "mlm") -> rows of consecutive spans of `length` tokens (the
  last may be shorter): segment_ids 1, 2, ... per span (padding stays 0) and position_ids
  restarting at 0 in each, so attention and positions stay within a span. Tokens, types and
  the slot fields are unchanged. length >= L leaves the rows as they were."""
  rows = jnp.arange(batch["segment_ids"].shape[1], dtype=jnp.int32)[None]  # [1, L]
  real = batch["segment_ids"] > 0  # [B, L]
  return {**batch,
          "segment_ids": jnp.where(real, rows // length + 1, 0).astype(batch["segment_ids"].dtype),
          "position_ids": jnp.where(real, rows % length, 0).astype(batch["position_ids"].dtype)}
