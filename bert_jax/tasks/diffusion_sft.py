"""Conditional masked diffusion (SFT; config.task "diffusion_sft"): an MLM-headed encoder trained
to generate a response given a prompt, as LLaDA's and dLLM's supervised fine-tuning.

Records: {"prompt": ..., "response": ...}. A row is [CLS] prompt [SEP] response [SEP] (token
types 0 then 1). Each example takes its own t (stratified over the global batch, as the
pretraining objective, `objectives/diffusion.py`), and each response piece is [MASK] with
probability 1 - alpha_t; the prompt, [CLS] and [SEP]s are never masked. The loss is the NELBO of
the response given the prompt, per response piece of the batch: the prompt's positions carry no
loss. The held-out evaluation reports that bound (`elbo_nats_per_token`, its perplexity bound)
on the fixed grid of t and keys, and `token_accuracy` (argmax hits over the grid's masks: the
main metric, higher is better).

The model is `BertForPreTraining` with its MLM head read at every position, so the checkpoint
is an MLM checkpoint (fill-mask, fine-tuning, `launch/convert.py --to_hf` as a *ForMaskedLM /
BertForPreTraining); `launch/predict.py --mode=generate` samples a response after --prompt in
this layout. A response longer than the row is cut at its end, a prompt from its start (it
keeps its last pieces, next to the response); both are counted as truncated."""

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import finetune as finetune_data
from bert_jax.data.finetune import Record, TaskData
from bert_jax.data.vocab import Vocab
from bert_jax.models import flops
from bert_jax.models.model import BertForPreTraining
from bert_jax.objectives import diffusion as diffusion_lib
from bert_jax.objectives.masking import MaskingConfig
from bert_jax.tasks.base import Batch, Scores
from bert_jax.tasks.finetuning import ENCODER, FinetuneSettings, FinetuneTask
from bert_jax.weights.layout import pad_vocab

NSP = "nsp"  # BertForPreTraining's NSP head: kept as loaded, never trained here.


@dataclasses.dataclass(frozen=True)
class DiffusionSftSettings(FinetuneSettings):
  """config.diffusion's schedule and grid, and the vocabulary's ids the corruption needs."""
  schedule: str = dataclasses.field(default="linear", kw_only=True)
  eval_points: int = dataclasses.field(default=8, kw_only=True)
  vocab_size: int = dataclasses.field(default=0, kw_only=True)  # The tokenizer's pieces.
  mask_id: int = dataclasses.field(default=0, kw_only=True)
  # Never masked, never predicted: [PAD], [CLS], [SEP], [MASK] (not [UNK]).
  control_ids: tuple[int, ...] = dataclasses.field(default=(), kw_only=True)

  def __post_init__(self):
    diffusion_lib.DiffusionSettings(self.schedule, self.eval_points)  # Checks the schedule.
    if self.eval_points < 1:
      raise ValueError(f"config.diffusion.eval_points={self.eval_points}: task diffusion_sft "
                       "scores by the bound, it needs >= 1")

  @classmethod
  def config_values(cls, config) -> dict[str, Any]:
    return {**super().config_values(config), "schedule": config.diffusion.schedule,
            "eval_points": config.diffusion.eval_points}

  @classmethod
  def vocab_values(cls, vocab: Vocab | None) -> dict[str, Any]:
    if vocab is None:
      raise ValueError("task diffusion_sft needs the run's vocabulary (its [MASK] and control ids)")
    return {"vocab_size": vocab.size, "mask_id": vocab.mask_id,
            "control_ids": tuple(sorted(set(vocab.special_ids) - {vocab.unk_id}))}


@dataclasses.dataclass(frozen=True)
class DiffusionSftTask(FinetuneTask):
  """The response's NELBO given the prompt, on the MLM head."""
  settings: DiffusionSftSettings

  name = "diffusion_sft"
  predict_mode = "generate"
  text_b = "unused"
  settings_class = DiffusionSftSettings
  keeps_eval_outputs = False  # The scores are sums (the bound), no per-row predictions.
  target_signature = {"response_mask": (("L",), jnp.int32)}
  exports_pretraining_heads = True
  pretrained_heads_read = ("mlm",)  # It fine-tunes the MLM head.

  @property
  def model(self) -> BertForPreTraining:
    return BertForPreTraining(self.model_config)

  @property
  def frozen(self) -> tuple[str, ...]:
    return (NSP, *super().frozen)

  @property
  def masking(self) -> MaskingConfig:
    """The forward process's policy: each response piece on its own, every one [MASK]."""
    s = self.settings
    policy = MaskingConfig(vocab_size=s.vocab_size, mask_token_id=s.mask_id,
                           special_token_ids=s.control_ids)
    return diffusion_lib.corruption(policy, s.max_seq_length)

  def flops_per_example(self) -> float:
    """The encoder and its MLM head at every position (P = L), as objective "diffusion"."""
    return flops.train_flops_per_sequence(self.model_config, self.seq_len, self.seq_len)

  def example_inputs(self) -> tuple:
    ids = jnp.zeros((1, self.settings.max_seq_length), jnp.int32)
    return ids, ids, ids, ids  # Targets at every position: P = L.

  def apply(self, params, batch: Batch, dropout_rng: jax.Array | None):
    """MLM logits [B, P, V] f32 at the corrupted batch's P = L slots (slot p reads position
    masked_lm_positions[b, p], the order `diffusion_sums` scores them in)."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    return self.model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                            batch["attention_mask"], batch["masked_lm_positions"],
                            deterministic=dropout_rng is None, rngs=rngs)["mlm_logits"]

  # ------------------------------------------------------------ inside the jitted step
  def _corrupted(self, batch: Batch, rng: jax.Array) -> Batch:
    """The batch at a time per example: the MLM fields at P = L slots, `masked_lm_times`."""
    times = diffusion_lib.example_times(jax.random.fold_in(rng, diffusion_lib.TIME_STREAM),
                                        batch["attention_mask"], 1)  # [B, L]
    rows = {**batch, "segment_ids": batch["attention_mask"]}
    corrupted = diffusion_lib.corrupt(rng, rows, self.masking, times, self.settings.schedule,
                                      batch["response_mask"])
    del corrupted["segment_ids"]
    return corrupted

  def prepare(self, batch: Batch, rng: jax.Array, step: jax.Array) -> Batch:
    del step
    return self._corrupted(batch, rng)

  def prepare_eval(self, batch: Batch, rng: jax.Array) -> Batch:
    return {**self._corrupted(batch, rng), "clean_input_ids": batch["input_ids"],
            "eval_key": rng}

  def _response_pieces(self, batch: Batch) -> jax.Array:
    """f32 scalar: the response pieces of the batch (eval padding rows: 0): the loss's count."""
    pieces = jnp.sum(batch["response_mask"].astype(jnp.float32), axis=1)  # [B]
    if "example_weight" in batch:
      pieces = pieces * batch["example_weight"]
    return jnp.sum(pieces)

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"loss_count": self._response_pieces(batch)}

  def loss_sums(self, params, batch: Batch, dropout_rng: jax.Array | None) -> dict[str, jax.Array]:
    sums = diffusion_lib.diffusion_sums(self.apply(params, batch, dropout_rng), batch,
                                        self.settings.schedule, self.settings.control_ids)
    return {"loss_sum": sums.pop("diffusion_loss_sum"),
            "loss_count": self._response_pieces(batch), **sums}

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    sums = self.loss_sums(params, batch, None)
    clean = {**batch, "input_ids": batch["clean_input_ids"],
             "segment_ids": batch["attention_mask"]}

    def forward(corrupted: Batch) -> jax.Array:
      return self.apply(params, corrupted, None)  # [B, P, V]

    sums.update(diffusion_lib.elbo_sums(forward, clean, batch["eval_key"], self.masking,
                                        self.settings.schedule, self.settings.eval_points,
                                        batch["response_mask"]))
    return {}, sums

  # ------------------------------------------------------------ on the host
  def report(self, sums: dict[str, float]) -> dict[str, float]:
    targets = max(float(sums["mlm_count"]), 1.0)
    return {"masked_nll": float(sums["masked_nll_sum"]) / targets,
            "mlm_accuracy": float(sums["mlm_correct_sum"]) / targets}

  def scores(self, outputs, sums: dict[str, float], data: TaskData) -> Scores:
    del outputs
    return Scores({"loss": float(sums["loss_sum"]) / max(float(sums["loss_count"]), 1.0),
                   **diffusion_lib.means(sums),
                   "token_accuracy": float(sums["elbo_correct_sum"]) /
                   max(float(sums["elbo_targets"]), 1.0)},
                  {"examples": len(data.examples)})

  def metric_names(self) -> list[str]:
    return ["elbo_nats_per_token", "elbo_perplexity_bound", "loss", "token_accuracy"]

  def main_metric(self) -> str:
    return "token_accuracy"

  def initial_params(self, pretrained: dict) -> dict:
    if "mlm" not in pretrained:
      raise ValueError("task diffusion_sft trains the MLM head: the encoder to start from has "
                       "none (an encoder-only import); start from a pretraining checkpoint, a "
                       "*ForMaskedLM / BertForPreTraining directory, or from scratch")
    padded = pad_vocab(pretrained, self.model_config)
    return {k: padded[k] for k in (ENCODER, "mlm", NSP) if k in padded}

  def describe_head(self, pooling: str, followed: bool) -> str:
    del pooling, followed
    return (f"Head: the MLM head at every position; masked diffusion given the prompt "
            f"({self.settings.schedule} schedule, bound on {self.settings.eval_points} times)")

  # ------------------------------------------------------------ records
  @classmethod
  def labels_from(cls, records: Sequence[Record], config) -> list[str]:
    del records, config
    return []

  def encode(self, records: Sequence[Record], vocab: Vocab, with_labels: bool = True,
             is_training: bool = False) -> TaskData:
    """[CLS] prompt [SEP] response [SEP] per record; `response_mask` 1 on the response's
    pieces (what is masked and scored)."""
    del is_training
    length, n = self.settings.max_seq_length, len(records)
    if length < 4:
      raise ValueError(f"config.data.max_seq_length={length}: a prompt and a response need "
                       ">= 4 positions with [CLS] and two [SEP]")
    arrays = {name: np.zeros((n, length), np.int32) for name in
              ("input_ids", "token_type_ids", "attention_mask", "response_mask")}
    examples, truncated = [], 0
    for row, record in enumerate(records):
      prompt = _pieces(record, "prompt", vocab)
      response = _pieces(record, "response", vocab) if with_labels else []
      prompt_kept, response_kept = _fit(len(prompt), len(response), length - 3)
      truncated += (prompt_kept, response_kept) != (len(prompt), len(response))
      prompt = prompt[len(prompt) - prompt_kept:]
      ids = [vocab.cls_id, *prompt, vocab.sep_id, *response[:response_kept], vocab.sep_id]
      first = len(prompt) + 2  # The response's first position.
      arrays["input_ids"][row] = ids + [vocab.pad_id] * (length - len(ids))
      arrays["attention_mask"][row, :len(ids)] = 1
      arrays["token_type_ids"][row, first:len(ids)] = 1
      arrays["response_mask"][row, first:first + response_kept] = 1
      examples.append({"line": record[1], "prompt_pieces": prompt_kept,
                       "response_pieces": response_kept})
    return TaskData(records[0][0] if records else "", arrays, examples, truncated)

  def truncation_note(self, record: Record, vocab: Vocab) -> str | None:
    del record, vocab
    return None  # Generation reads its prompt alone (`predict.generate` checks the length).

  def predictions(self, outputs: dict[str, np.ndarray], data: TaskData) -> list[dict[str, Any]]:
    raise ValueError("task diffusion_sft predicts by sampling: launch/predict.py --mode=generate "
                     "--prompt=... (predict.generate)")

  def score(self, predicted: list[dict[str, Any]], data: TaskData) -> dict[str, float]:
    raise ValueError("task diffusion_sft scores by its bound (`scores`), not by predictions")


def _text(record: Record, name: str) -> str:
  text = finetune_data.field(record, name)
  if not text.strip():
    raise ValueError(f"{finetune_data.where(record)}: field {name!r} is empty")
  return text


def _pieces(record: Record, name: str, vocab: Vocab) -> list[int]:
  """The field's pieces; a text the vocabulary encodes to nothing (zero-width spaces, control
  characters) is refused as an empty one is: it would train on an empty response."""
  pieces = vocab.encode(_text(record, name))
  if not pieces:
    raise ValueError(f"{finetune_data.where(record)}: field {name!r} encodes to no piece of the "
                     "vocabulary (only characters it drops)")
  return pieces


def _fit(prompt: int, response: int, room: int) -> tuple[int, int]:
  """(prompt pieces kept, response pieces kept) in `room` positions: all of both when they fit;
  else the prompt keeps at least min(prompt, room // 2) and the response fills the rest."""
  if prompt + response <= room:
    return prompt, response
  response_kept = min(response, room - min(prompt, room // 2))
  return min(prompt, room - response_kept), response_kept


def layout(vocab: Vocab, prompt: Sequence[int], length: int) -> tuple[list[int], list[int], int]:
  """The generation canvas of an SFT checkpoint: (ids [CLS] prompt [SEP] [MASK] x length [SEP],
  token types, the canvas's first position): the rows this task trains on."""
  ids = [vocab.cls_id, *prompt, vocab.sep_id, *[vocab.mask_id] * length, vocab.sep_id]
  start = len(prompt) + 2
  return ids, [0] * start + [1] * (len(ids) - start), start

