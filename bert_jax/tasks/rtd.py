"""Replaced-token detection (ELECTRA, Clark et al. 2020; DeBERTa-v3's gradient-disentangled
embedding sharing, He et al. 2021): config.data.objective "rtd" (MLM's FULL-SENTENCES rows) or
"rtd_nsp" (BERT's NSP rows, with the NSP loss on the discriminator's pooler).

One step, inside jit: the rows are masked as for MLM (the same draws for the same key), the
generator predicts the targets (its MLM loss), one token per target is sampled from its
distribution (`objectives/rtd.py`: Gumbel-max, each row's noise from a seed drawn in `prepare`,
no gradient), every target position of the discriminator's input takes its sample, and the
discriminator labels every real token replaced or original. Loss: mlm + λ x disc (+ nsp), each
term normalised by its own count; λ = `rtd.disc_weight`, ELECTRA's 50. Both encoders are one
module (`models/rtd.py`) and one params tree, so the optimizer, sharding, checkpoints and resume
are the pretraining task's."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bert_jax.models import flops
from bert_jax.models.model import BertConfig
from bert_jax.models.rtd import ReplacedTokenDetection
from bert_jax.objectives import losses
from bert_jax.objectives import rtd as rtd_lib
from bert_jax.tasks.base import Batch, Scores
from bert_jax.tasks.pretraining import PretrainingTask

SAMPLE_STREAM = 0x52544400  # fold_in of the masking key: the rows' sampling seeds ("RTD").


@dataclasses.dataclass(frozen=True)
class RtdSettings:
  """config.rtd, checked (`config_checks`)."""
  generator: BertConfig  # `models.rtd.generator_config` of the discriminator.
  embedding_sharing: str  # "electra" | "gdes" | "none".
  disc_weight: float  # λ.
  temperature: float  # Samples from softmax(logits / temperature) (ELECTRA's).
  nsp: bool  # Objective "rtd_nsp".


@dataclasses.dataclass(frozen=True)
class RtdTask(PretrainingTask):
  """The pretraining task's rows and masking; generator, sampling and discriminator on top."""
  rtd: RtdSettings | None = None

  name = "rtd"
  loss_terms = (("mlm_loss_sum", "mlm_count"), ("disc_loss_sum", "disc_count"),
                ("nsp_loss_sum", "nsp_count"))
  log_keys = ("mlm_accuracy", "disc_accuracy", "disc_auc", "replaced_fraction", "nsp_accuracy")

  @property
  def model(self) -> ReplacedTokenDetection:
    return ReplacedTokenDetection(self.model_config, self.rtd.generator,
                                  self.rtd.embedding_sharing, self.rtd.nsp)

  def prepare(self, batch: Batch, rng: jax.Array, step: jax.Array) -> Batch:
    """MLM's masking (and spans), plus `sample_seed` [B] uint32: the rows' sampling seeds."""
    return _with_seeds(super().prepare(batch, rng, step), rng)

  def prepare_eval(self, batch: Batch, rng: jax.Array) -> Batch:
    return _with_seeds(super().prepare_eval(batch, rng), rng)

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {**super().loss_counts(batch),
            "disc_count": jnp.sum((batch["segment_ids"] > 0).astype(jnp.float32))}

  def loss(self, sums: dict[str, jax.Array], counts: dict[str, jax.Array]) -> jax.Array:
    mean = lambda total, count: sums[total] / jnp.maximum(counts[count], 1.0)
    return (mean("mlm_loss_sum", "mlm_count")
            + self.rtd.disc_weight * mean("disc_loss_sum", "disc_count")
            + mean("nsp_loss_sum", "nsp_count"))

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    return self._sums(params, batch, dropout_rng)

  def _sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    """Generator -> samples -> discriminator; the MLM, discriminator and NSP sums. Eval rows
    of `example_weight` 0 (padding) count nowhere."""
    deterministic = dropout_rng is None
    generator_rng, discriminator_rng = ((None, None) if deterministic
                                        else jax.random.split(dropout_rng))
    rngs = lambda key: None if key is None else {"dropout": key}
    model, variables = self.model, {"params": params}
    logits = model.apply(variables, batch["input_ids"], batch["token_type_ids"],
                         batch["segment_ids"], batch["masked_lm_positions"], deterministic,
                         position_ids=batch["position_ids"], rngs=rngs(generator_rng),
                         method=ReplacedTokenDetection.generate)  # [B, P, V]
    sampled = rtd_lib.sample_replacements(logits, batch["sample_seed"],
                                          self.rtd.temperature)  # [B, P]
    original, corrupted = rtd_lib.corrupt(batch, sampled)  # [B, L] each
    outputs = model.apply(variables, corrupted, batch["token_type_ids"], batch["segment_ids"],
                          deterministic, position_ids=batch["position_ids"],
                          cls_positions=batch["cls_positions"], rngs=rngs(discriminator_rng),
                          method=ReplacedTokenDetection.discriminate)
    real = (batch["segment_ids"] > 0).astype(jnp.float32)  # [B, L]
    mlm_weights, nsp_weights = batch["masked_lm_weights"], batch["nsp_weights"]
    if "example_weight" in batch:  # Eval batches only.
      row = batch["example_weight"][:, None]
      real, mlm_weights, nsp_weights = real * row, mlm_weights * row, nsp_weights * row
    if self.rtd.nsp:
      nsp = losses.nsp_sums(outputs["nsp_logits"], batch["next_sentence_label"], nsp_weights)
    else:
      nsp = {name: jnp.float32(0.0) for name in ("nsp_loss_sum", "nsp_correct_sum", "nsp_count")}
    return {**losses.mlm_sums(logits, batch["masked_lm_ids"], mlm_weights),
            **rtd_lib.discriminator_sums(outputs["disc_logits"], original, corrupted, real),
            **nsp}

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    return {}, {**self._sums(params, batch, None), "examples": self.examples(batch)}

  def report(self, sums: dict[str, float]) -> dict[str, float]:
    return {**super().report(sums), **rtd_lib.means(sums)}

  def scores(self, outputs, sums: dict[str, float], data) -> Scores:
    base = super().scores(outputs, sums, data)
    return Scores({**base.metrics, **rtd_lib.means(sums)}, base.counts)

  def initial_params(self, pretrained: dict) -> dict:
    raise ValueError("config.init_from: objective rtd trains its generator and discriminator "
                     "from scratch (starting from a pretrained encoder is not supported)")

  def meta(self) -> dict[str, Any]:
    g = self.rtd.generator
    return {**super().meta(), "name": self.name,
            "rtd": {"embedding_sharing": self.rtd.embedding_sharing,
                    "disc_weight": self.rtd.disc_weight, "nsp": self.rtd.nsp,
                    "temperature": self.rtd.temperature,
                    "generator": {"hidden_size": g.hidden_size,
                                  "num_hidden_layers": g.num_hidden_layers,
                                  "num_attention_heads": g.num_attention_heads,
                                  "intermediate_size": g.intermediate_size,
                                  "embedding_size": g.embedding_size}}}

  def check_saved(self, saved_task: dict[str, Any], saved_config: dict[str, Any],
                  where: str) -> None:
    """The generator's shape, what it shares and the NSP head decide the params' tree: a
    checkpoint of other ones would fail in orbax's restore (the red team: a refusal, then
    hundreds of lines of its tracebacks). Refused here in one line, naming the settings."""
    saved, ours = saved_task.get("rtd"), self.meta()["rtd"]
    if not saved:
      return
    if saved.get("nsp", ours["nsp"]) != ours["nsp"]:
      objective = "rtd_nsp" if saved["nsp"] else "rtd"
      raise ValueError(f"{where} was trained with config.data.objective={objective}, this run "
                       f"has {'rtd_nsp' if ours['nsp'] else 'rtd'}: set "
                       f"--config.data.objective={objective} to resume it, or use another "
                       "--workdir")
    differs = [k for k in ("generator", "embedding_sharing") if k in saved and saved[k] != ours[k]]
    if not differs:
      return
    fields = ("generator_hidden_fraction", "generator_layers", "generator_heads",
              "embedding_sharing")
    saved_rtd = saved_config.get("rtd", {})
    flags = " ".join(f"--config.rtd.{f}={saved_rtd[f]}" for f in fields if f in saved_rtd)
    shown = "; ".join(f"{k}: checkpoint {_shown(saved[k])}, this run {_shown(ours[k])}"
                      for k in differs)
    raise ValueError(f"{where} was trained with another generator ({shown}): its params do not "
                     f"fit this run. Resume it with its settings ({flags or 'see its meta'}), or "
                     "use another --workdir")

  def flops_per_example(self) -> float:
    """The discriminator over the row (its head's dense H x H and H x 1 per token) plus the
    generator with its MLM head at the P targets: what one step computes per row."""
    c, length = self.model_config, self.seq_len
    head = 3 * 2 * length * (c.hidden_size * c.hidden_size + c.hidden_size)
    return (flops.train_flops_per_sequence(c, length, 0) + head
            + flops.train_flops_per_sequence(self.rtd.generator, length,
                                             self.masking.max_predictions_per_seq))


def _with_seeds(batch: Batch, rng: jax.Array) -> Batch:
  """`sample_seed` [B] uint32 from fold_in(rng, SAMPLE_STREAM): the masking's draws stay those
  of `rng` itself, as MLM's."""
  rows = batch["input_ids"].shape[0]
  seeds = jax.random.bits(jax.random.fold_in(rng, SAMPLE_STREAM), (rows,), jnp.uint32)
  return {**batch, "sample_seed": seeds}


def _shown(value: Any) -> str:
  """A generator's shape as `hidden_size=32 num_hidden_layers=2 ...`, another value as is."""
  if isinstance(value, dict):
    return " ".join(f"{k}={v}" for k, v in value.items())
  return str(value)
