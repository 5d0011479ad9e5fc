"""Masked diffusion as a pretraining objective (config.data.objective "diffusion"): MLM's
FULL-SENTENCES rows, each example masked at its own time t (`objectives/diffusion.py`: the
forward process, the ELBO weight and the bound), every masked token [MASK], the loss the
continuous-time NELBO per text token. The model is `BertForPreTraining` with its MLM head read at
every position (P = L), so a diffusion run's checkpoint fills masks, exports and fine-tunes as
any MLM checkpoint, and `launch/predict.py --mode=generate` samples from it
(`generation/diffusion.py`).

The held-out evaluation reports the NELBO on a fixed grid of t (`elbo_nats_per_token`), as the
MLM objectives do (`PretrainingTask`), so diffusion-trained and MLM-trained encoders compare by
one number."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax.models import flops
from bert_jax.objectives import diffusion as diffusion_lib
from bert_jax.tasks.base import Batch, Scores
from bert_jax.tasks.pretraining import PretrainingTask, cut_into_spans, span_length


@dataclasses.dataclass(frozen=True)
class DiffusionTask(PretrainingTask):
  """The pretraining task's rows; corruption at a time per example, the NELBO as the loss."""

  name = "diffusion"
  loss_terms = (("diffusion_loss_sum", "text_tokens"),)
  log_keys = ("mlm_accuracy", "masked_nll")

  def example_inputs(self) -> tuple:
    ids = jnp.zeros((1, self.seq_len), jnp.int32)
    return ids, ids, ids, ids  # Targets at every position: P = L.

  @property
  def corruption(self):
    return diffusion_lib.corruption(self.masking, self.seq_len)

  def prepare(self, batch: Batch, rng: jax.Array, step: jax.Array) -> Batch:
    """Times per example (stratified over the global batch), the masks they give, and
    `text_tokens` [B] (each row's maskable tokens before corruption: the loss's count)."""
    batch = self._corrupted(batch, rng)
    if self.span_warmup_steps:
      batch = cut_into_spans(batch, span_length(step, self.span_warmup_start,
                                                self.span_warmup_steps, self.seq_len))
    return batch

  def prepare_eval(self, batch: Batch, rng: jax.Array) -> Batch:
    """The same corruption from the evaluation's fixed key, and the clean rows for the bound."""
    return {**self._corrupted(batch, rng), "clean_input_ids": batch["input_ids"],
            "eval_key": rng}

  def _corrupted(self, batch: Batch, rng: jax.Array) -> Batch:
    times = diffusion_lib.example_times(jax.random.fold_in(rng, diffusion_lib.TIME_STREAM),
                                        batch["segment_ids"], self.examples_per_row)  # [B, L]
    tokens = jnp.sum(diffusion_lib.text_tokens(batch["input_ids"], self.masking), axis=1)
    return {**diffusion_lib.corrupt(rng, batch, self.corruption, times, self.diffusion.schedule),
            "text_tokens": tokens}

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"text_tokens": jnp.sum(batch["text_tokens"]),
            "mlm_count": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))}

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    logits = self._forward(params, batch, dropout_rng)["mlm_logits"]  # [B, L, V]
    tokens = batch["text_tokens"]  # [B]
    if "example_weight" in batch:  # Eval batches: padding rows weigh 0.
      tokens = tokens * batch["example_weight"]
    return {**diffusion_lib.diffusion_sums(logits, batch, self.diffusion.schedule,
                                           self.masking.special_token_ids),
            "text_tokens": jnp.sum(tokens)}

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    sums = self.loss_sums(params, batch, None)
    if self.diffusion.eval_points:
      sums.update(self.elbo(params, {**batch, "input_ids": batch["clean_input_ids"]},
                            batch["eval_key"]))
    return {}, {**sums, "examples": self.examples(batch)}

  def report(self, sums: dict[str, float]) -> dict[str, float]:
    return _means(sums)

  def scores(self, outputs, sums: dict[str, float], data) -> Scores:
    del outputs, data
    return Scores({**_means(sums), **diffusion_lib.means(sums)},
                  {"examples": sums["examples"], "targets": sums["mlm_count"]})

  def meta(self) -> dict[str, Any]:
    return {**super().meta(), "name": self.name}

  def flops_per_example(self) -> float:
    return flops.train_flops_per_sequence(self.model_config, self.seq_len, self.seq_len)


def _means(sums: dict[str, float]) -> dict[str, float]:
  tokens, targets = max(float(sums["text_tokens"]), 1.0), max(float(sums["mlm_count"]), 1.0)
  return {"diffusion_loss": float(sums["diffusion_loss_sum"]) / tokens,
          "masked_nll": float(sums["masked_nll_sum"]) / targets,
          "mlm_accuracy": float(sums["mlm_correct_sum"]) / targets}

