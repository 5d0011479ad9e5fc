"""BERT's pretraining task: masked LM (masking inside the jitted step) + next sentence
prediction, on `BertForPreTraining`, over rows that pack up to K examples (K = 1: unpacked).
Batch fields: WORKSPACE.md, "Batch". The MLM-only objective is the same task with every
`nsp_weights` 0 (the NSP loss and its count are then 0)."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import flops, losses
from bert_jax.masking import MaskingConfig, mask_tokens
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.weights.layout import pad_vocab
from bert_jax.tasks.base import Batch, Scores, Task


@dataclasses.dataclass(frozen=True)
class PretrainingTask(Task):
  """MLM + NSP. Frozen and hashable: equal tasks share one compiled step."""
  model_config: BertConfig
  masking: MaskingConfig
  seq_len: int
  examples_per_row: int  # K: packed examples per row (1: unpacked).

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

  def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
    """Masks the batch: adds masked_lm_{positions,ids,weights}, corrupts input_ids."""
    word_starts = batch["word_starts"] if self.masking.whole_word_masking else None
    return {**batch, **mask_tokens(rng, batch["input_ids"], self.masking, word_starts)}

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

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    sums = losses.pretraining_sums(self._forward(params, batch, None), batch)
    return {}, sums  # Exact means need the sums only.

  def report(self, sums: dict[str, float]) -> dict[str, float]:
    return losses.means(sums)

  def scores(self, outputs: dict[str, np.ndarray], sums: dict[str, float], data) -> Scores:
    del outputs, data
    return Scores(losses.means(sums), {"examples": sums["nsp_count"],
                                       "targets": sums["mlm_count"]})

  def initial_params(self, pretrained: dict) -> dict:
    return pad_vocab(pretrained, self.model_config)  # Real rows in; the model's padding.

  def meta(self) -> dict[str, Any]:
    return {"name": self.name, "masking": dataclasses.asdict(self.masking),
            "seq_len": self.seq_len, "examples_per_row": self.examples_per_row}

  def flops_per_example(self) -> float:
    return flops.train_flops_per_sequence(self.model_config, self.seq_len,
                                          self.masking.max_predictions_per_seq)
