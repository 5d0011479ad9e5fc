"""Inference: fill-mask with a pretrained BERT's MLM head, and predictions of a fine-tuned
checkpoint (classification, tagging, QA). `launch/predict.py` is a thin wrapper around these.

Both run on one device, in fixed-shape jitted batches (the last one padded), so a file of any
length compiles once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import checkpointing, finetune_data, finetune_eval, heads
from bert_jax.data.vocab import Vocab
from bert_jax.model import BertConfig, BertForPreTraining

MASK_TEXT = "[MASK]"


# ---------------------------------------------------------------------------- fill-mask


def encode_with_masks(vocab: Vocab, text: str) -> list[int]:
  """[CLS] text [SEP] with every literal "[MASK]" as the mask id. The text is split on
  "[MASK]" and the pieces encoded separately: a sentencepiece vocabulary would otherwise spell
  "[MASK]" out in characters ([MASK] is a control symbol there)."""
  parts = text.split(MASK_TEXT)
  ids = [vocab.cls_id]
  for index, part in enumerate(parts):
    if part.strip():
      ids.extend(vocab.encode(part))
    if index < len(parts) - 1:
      ids.append(vocab.mask_id)
  return ids + [vocab.sep_id]


def _display(vocab: Vocab, token_id: int) -> str:
  piece = vocab.id_to_piece(token_id)
  return piece.replace("\u2581", "") if vocab.kind == "sentencepiece" else piece


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


@functools.lru_cache(maxsize=4)
def _mlm_forward(config: BertConfig):
  model = BertForPreTraining(config)
  return jax.jit(lambda params, *inputs: model.apply({"params": params}, *inputs))


def fill_mask(checkpoint: str | tuple[BertConfig, dict, Vocab], text: str,
              top_k: int = 5) -> list[list[tuple[str, float]]]:
  """For each [MASK] in `text` (left to right), the `top_k` (token, probability) of the MLM
  head, special tokens left out. `checkpoint` is anything `load_pretrained` reads (with its MLM
  head and vocabulary), or its loaded (config, params, vocab)."""
  if isinstance(checkpoint, str):
    from bert_jax.pretrained import load_pretrained

    config, params, vocab = load_pretrained(checkpoint)
    source = checkpoint
  else:
    (config, params, vocab), source = checkpoint, "the given params"
  if vocab is None:
    raise ValueError(f"{source} has no vocabulary to tokenize the text with")
  if "mlm" not in params:
    raise ValueError(f"{source} has no MLM head (an encoder-only checkpoint cannot fill masks)")
  if MASK_TEXT not in text:
    raise ValueError(f"The text has no {MASK_TEXT}: {text!r}")
  ids = encode_with_masks(vocab, text)
  if len(ids) > config.max_position_embeddings:
    raise ValueError(f"The text is {len(ids)} pieces long; the model takes at most "
                     f"{config.max_position_embeddings}")
  positions = [i for i, t in enumerate(ids) if t == vocab.mask_id]
  # Padded to buckets, so texts of similar length share one compilation.
  length = min(_round_up(len(ids), 16), config.max_position_embeddings)
  input_ids = np.full((1, length), vocab.pad_id, np.int32)
  input_ids[0, :len(ids)] = ids
  attention_mask = (np.arange(length) < len(ids)).astype(np.int32)[None]
  padded_positions = np.zeros((1, _round_up(len(positions), 4)), np.int32)
  padded_positions[0, :len(positions)] = positions
  outputs = _mlm_forward(config)(params, input_ids, np.zeros_like(input_ids), attention_mask,
                                 padded_positions)
  logits = np.asarray(outputs["mlm_logits"][0, :len(positions)], np.float64)[:, :vocab.size]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  special = [i for i in vocab.special_ids if i != vocab.unk_id]
  probs[:, special] = -1.0  # Never proposed; the others keep their full-vocabulary probability.
  results = []
  for row in probs:
    best = np.argsort(-row, kind="stable")[:top_k]
    results.append([(_display(vocab, int(i)), float(row[i])) for i in best])
  return results


# ----------------------------------------------------------------------------- fine-tuned


@dataclasses.dataclass
class Finetuned:
  """A fine-tuned checkpoint, loaded: the head model, its params and what encodes its input."""
  task: str
  labels: list[str]
  regression: bool
  model: nn.Module
  params: Any
  vocab: Vocab
  meta: dict[str, Any]
  step: int


def load_finetuned(workdir: str) -> Finetuned:
  """The best checkpoint of a `launch/finetune.py` workdir (or its checkpoints/ directory)."""
  directory = os.path.abspath(workdir)
  if os.path.isdir(os.path.join(directory, "checkpoints")):
    directory = os.path.join(directory, "checkpoints")
  steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(
      directory) else []
  if not steps or not os.path.isdir(os.path.join(directory, str(steps[-1]), "meta")):
    raise ValueError(f"{workdir}: no fine-tuned checkpoint (expected checkpoints/<step>/params "
                     "and meta, as launch/finetune.py writes)")
  step = steps[-1]
  manager = ocp.CheckpointManager(directory, item_names=("params", "meta"))
  meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  config = BertConfig(**meta["model_config"])
  labels = list(meta["labels"])
  num_outputs = 1 if meta["regression"] else len(labels)
  model = heads.make_model(meta["task"], config, num_outputs, meta["head_dropout_prob"])
  ids = jnp.zeros((1, meta["max_seq_length"]), jnp.int32)
  inputs = (ids, ids, ids, ids) if meta["task"] == "qa" else (ids, ids, ids)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
      nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))["params"]))
  params = manager.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract)))["params"]
  manager.close()
  with tempfile.TemporaryDirectory() as tmp:
    vocab = Vocab.load(checkpointing.decode_files(meta["vocab"], tmp))
  return Finetuned(meta["task"], labels, bool(meta["regression"]), model, params, vocab, meta,
                   step)


def _doc_stride(meta: dict[str, Any]) -> int:
  """The checkpoint's QA doc_stride. Checkpoints written before QA had windows have none: they
  truncated passages at training time, and read with run_squad's default stride they still
  get windows over the rest of a long passage."""
  return meta["doc_stride"] if "doc_stride" in meta else 128


def _outputs(finetuned: Finetuned, data: finetune_data.TaskData,
             batch_size: int) -> dict[str, np.ndarray]:
  task = finetuned.task

  @jax.jit
  def forward(params, batch):
    outputs = finetuned.model.apply({"params": params}, *heads.model_inputs(task, batch))
    return {"start_logits": outputs[0], "end_logits": outputs[1]} if task == "qa" else {
        "logits": outputs}

  gathered: dict[str, list[np.ndarray]] = {}  # Per row (QA: per window).
  for indices, batch in finetune_data.eval_batches(data, batch_size):
    outputs = jax.device_get(forward(finetuned.params, batch))
    for name, value in outputs.items():
      gathered.setdefault(name, []).append(np.asarray(value)[indices < len(data)])
  return {name: np.concatenate(parts) for name, parts in gathered.items()}


def predict(finetuned: Finetuned | str, records: Sequence[finetune_data.Record | dict],
            batch_size: int = 32) -> list[dict[str, Any]]:
  """Predictions of a fine-tuned checkpoint (a workdir or `load_finetuned`'s result) for
  records ({"text", "text_b"?} dicts, or `finetune_data.read_records` output): per record
  {"label", "probabilities"} / {"score"} (regression) / {"words", "tags"} / {"answer", "start",
  "end", "score"} (character offsets into text_b; a passage longer than one row is read in
  windows of the checkpoint's doc_stride, merged into one answer)."""
  if isinstance(finetuned, str):
    finetuned = load_finetuned(finetuned)
  records = [r if isinstance(r, tuple) else ("<input>", i + 1, r)
             for i, r in enumerate(records)]
  meta = finetuned.meta
  data = finetune_data.encode(
      finetuned.task, records, finetuned.vocab, labels=finetuned.labels,
      max_length=meta["max_seq_length"], max_query_length=meta["max_query_length"],
      doc_stride=_doc_stride(meta), with_labels=False, regression=finetuned.regression)
  outputs = _outputs(finetuned, data, batch_size)
  return finetune_eval.predictions(finetuned.task, outputs, data, finetuned.labels,
                                   meta["max_answer_length"])
