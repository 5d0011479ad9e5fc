"""BERT's pretraining task: masked LM (masking inside the jitted step) + next sentence
prediction, on `BertForPreTraining`. Batch fields: WORKSPACE.md, "Batch"."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import flops, losses
from bert_jax.masking import MaskingConfig, mask_tokens
from bert_jax.model import BertConfig, BertForPreTraining
from bert_jax.tasks.base import Batch, Task


@dataclasses.dataclass(frozen=True)
class PretrainingTask(Task):
  """MLM + NSP. Frozen and hashable: equal tasks share one compiled step."""
  model_config: BertConfig
  masking: MaskingConfig
  seq_len: int

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
    tokens = ((self.seq_len,), jnp.int32)
    return {"input_ids": tokens, "token_type_ids": tokens, "attention_mask": tokens,
            "word_starts": tokens, "next_sentence_label": ((), jnp.int32)}

  def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
    """Masks the batch: adds masked_lm_{positions,ids,weights}, corrupts input_ids."""
    word_starts = batch["word_starts"] if self.masking.whole_word_masking else None
    return {**batch, **mask_tokens(rng, batch["input_ids"], self.masking, word_starts)}

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"mlm_count": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "nsp_count": jnp.float32(batch["input_ids"].shape[0])}

  def _forward(self, params, batch: Batch, dropout_rng: jax.Array | None):
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                            batch["attention_mask"], batch["masked_lm_positions"],
                            deterministic=dropout_rng is None, rngs=rngs)

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    outputs = self._forward(params, batch, dropout_rng)
    return {**losses.mlm_sums(outputs["mlm_logits"], batch["masked_lm_ids"],
                              batch["masked_lm_weights"]),
            **losses.nsp_sums(outputs["nsp_logits"], batch["next_sentence_label"])}

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    _, sums = losses.pretraining_loss(self._forward(params, batch, None), batch)
    return {}, sums  # Exact means need the sums only.

  def report(self, sums: dict[str, float]) -> dict[str, float]:
    return losses.means(sums)

  def scores(self, outputs: dict[str, np.ndarray], sums: dict[str, float], data) -> dict:
    del outputs, data
    return {**losses.means(sums), "examples": sums["nsp_count"]}

  def initial_params(self, pretrained: dict) -> dict:
    return dict(pretrained)

  def meta(self) -> dict[str, Any]:
    return {"name": self.name, "masking": dataclasses.asdict(self.masking),
            "seq_len": self.seq_len}

  def flops_per_example(self) -> float:
    return flops.train_flops_per_sequence(self.model_config, self.seq_len,
                                          self.masking.max_predictions_per_seq)
