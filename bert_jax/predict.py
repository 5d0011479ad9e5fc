"""Inference: fill-mask with a pretrained BERT's MLM head, predictions of a fine-tuned
checkpoint (classification, tagging, QA), and embeddings and exact search with an embedding
model (an embedding run, a sentence-transformers directory or any encoder). `launch/predict.py` is a thin wrapper around these.

Both run on one device, in fixed-shape jitted batches (the last one padded), so a file of any
length compiles once.
"""

from __future__ import annotations

import dataclasses
import json
import functools
import warnings
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import tasks
from bert_jax.checkpoints import checkpointing
from bert_jax.training import evaluation
from bert_jax.runtime import storage
from bert_jax.data import finetune as finetune_data
from bert_jax.data.vocab import Vocab
from bert_jax.generation import diffusion as diffusion_sampler
from bert_jax.models.model import BertConfig, BertModel, MaskedLMHead, gather_positions
from bert_jax.tasks import diffusion_sft
from bert_jax.tasks.embedding import EmbeddingSettings, EmbeddingTask, resolve_pooling
from bert_jax.weights import sentence_transformers_dir as st_dir

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
  if vocab.kind == "bpe":
    return vocab.decode([token_id]).strip()  # Byte-level pieces are bytes, not text.
  return piece.replace("\u2581", "") if vocab.kind == "sentencepiece" else piece


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class _MaskedLM(nn.Module):
  """The encoder and MLM head of `BertForPreTraining` (same parameter names) without the pooler
  and NSP head: a checkpoint without them (HF BertForMaskedLM, any ModernBERT) fills masks."""
  config: BertConfig

  def setup(self):
    self.bert = BertModel(self.config, add_pooling_layer=False, name="bert")
    self.mlm = MaskedLMHead(self.config, name="mlm")

  def __call__(self, input_ids, token_type_ids, segment_ids, masked_lm_positions):
    """[B, L] inputs, masked_lm_positions [B, P] -> MLM logits [B, P, V] f32."""
    sequence, _ = self.bert(input_ids, token_type_ids, segment_ids)
    return self.mlm(gather_positions(sequence, masked_lm_positions), self.bert)


@functools.lru_cache(maxsize=4)
def _mlm_forward(config: BertConfig):
  model = _MaskedLM(config)
  # Only the encoder and the MLM head: the pooler and NSP head, when present, are not read.
  return jax.jit(lambda params, *inputs: model.apply(
      {"params": {k: params[k] for k in ("bert", "mlm")}}, *inputs))


def fill_mask(checkpoint: str | tuple[BertConfig, dict, Vocab], text: str,
              top_k: int = 5) -> list[list[tuple[str, float]]]:
  """For each [MASK] in `text` (left to right), the `top_k` (token, probability) of the MLM
  head, special tokens left out. `checkpoint` is anything `weights.load_pretrained` reads (with
  its MLM head and vocabulary), or its loaded (config, params, vocab)."""
  if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
    raise ValueError(f"top_k={top_k!r}: it must be an integer >= 1")
  config, params, vocab, source = load_mlm(checkpoint)
  if MASK_TEXT not in text:
    raise ValueError(f"The text has no {MASK_TEXT}: {text!r}")
  candidates = proposable_ids(vocab, config)
  if top_k > len(candidates):
    raise ValueError(f"top_k={top_k} is more than the {len(candidates)} tokens {source} can "
                     f"propose (its vocabulary less the special tokens); the maximum is "
                     f"{len(candidates)}")
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
  mlm_logits = _mlm_forward(config)(params, input_ids, np.zeros_like(input_ids),
                                    attention_mask, padded_positions)
  # The real vocabulary's rows (the table may have padding rows, or unused rows past it).
  logits = np.asarray(mlm_logits[0, :len(positions)], np.float64)[:, :vocab.size]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  results = []
  for row in probs[:, candidates]:  # Specials never proposed; the others keep their
    best = np.argsort(-row, kind="stable")[:top_k]  # full-vocabulary probability.
    results.append([(_display(vocab, int(candidates[i])), float(row[i])) for i in best])
  return results


def load_mlm(checkpoint: str | tuple[BertConfig, dict, Vocab]
             ) -> tuple[BertConfig, dict, Vocab, str]:
  """(config, params, vocab, what to call it) of a checkpoint with an MLM head and a vocabulary
  (fill-mask, generation): anything `weights.load_pretrained` reads, or its loaded triple."""
  if isinstance(checkpoint, str):
    from bert_jax import weights  # Imports HF/TF readers only when needed.

    with warnings.catch_warnings():
      # Of its heads it reads the MLM head (checked below); a missing NSP head is no news.
      warnings.simplefilter("ignore", UserWarning)
      config, params, vocab = weights.load_pretrained(checkpoint)
    source = checkpoint
  else:
    (config, params, vocab), source = checkpoint, "the given params"
  if vocab is None:
    raise ValueError(f"{source} has no vocabulary to tokenize the text with")
  if "mlm" not in params:
    raise ValueError(f"{source} has no MLM head (an encoder-only checkpoint cannot fill masks "
                     "or generate)")
  return config, params, vocab, source


def proposable_ids(vocab: Vocab, config: BertConfig) -> np.ndarray:
  """[N] int: the ids fill-mask may propose, the vocabulary's less its special tokens ([PAD],
  [UNK], [CLS], [SEP], [MASK]: none is an answer); N is the largest top_k."""
  ids = np.arange(min(vocab.size, config.vocab_size))
  return ids[~np.isin(ids, vocab.special_ids)]


# ---------------------------------------------------------------------------- generate


@functools.lru_cache(maxsize=8)
def _mlm_everywhere(config: BertConfig, response_from: int = 0):
  """params, ids [B, T] -> the MLM head's logits at every position [B, T, V] (no padding);
  token type 1 from position `response_from` on (an SFT row's response; 0: all type 0)."""
  model = _MaskedLM(config)

  def apply(params, ids):
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    types = (positions >= response_from).astype(jnp.int32) if response_from else (
        jnp.zeros_like(ids))
    return model.apply({"params": {k: params[k] for k in ("bert", "mlm")}}, ids, types,
                       jnp.ones_like(ids), positions)
  return apply


def conditional(checkpoint: str | tuple[BertConfig, dict, Vocab]) -> bool:
  """Whether `checkpoint` is a diffusion_sft fine-tune (generation then follows its rows'
  layout, [CLS] prompt [SEP] response [SEP])."""
  if not isinstance(checkpoint, str):
    return False
  step_dir = checkpointing.find_step_dir(checkpoint)
  if step_dir is None:  # An HF export of one records its task (the red team: it generated in
    # the pretraining layout, and accepted no prompt).
    from bert_jax.weights import hf  # pylint: disable=import-outside-toplevel
    config_file = storage.join(checkpoint, hf.CONFIG_FILE)
    if storage.isfile(config_file):
      try:
        recorded = json.loads(storage.read_text(config_file)).get(hf.TASK_KEY)
      except (ValueError, AttributeError):
        return False
      return recorded == tasks.DiffusionSftTask.name
    return False
  saved_task = checkpointing.read_meta(step_dir).get("task")
  return isinstance(saved_task, dict) and saved_task.get("name") == tasks.DiffusionSftTask.name


def generate(checkpoint: str | tuple[BertConfig, dict, Vocab], length: int,
             settings: diffusion_sampler.SamplerSettings, prompt: str | None = None,
             seed: int = 0, num_samples: int = 1) -> list[dict[str, Any]]:
  """`num_samples` texts of `length` pieces after `prompt` by the masked-diffusion sampler
  (`generation/diffusion.py`) with key(seed). The canvas follows the rows the checkpoint was
  trained on: [CLS] prompt [MASK] x length [SEP] (a pretraining run's FULL-SENTENCES rows), or
  for a diffusion_sft fine-tune [CLS] prompt [SEP] [MASK] x length [SEP] (the prompt is then
  required). Each: {"prompt", "text", "ids"} (the generated pieces)."""
  if isinstance(length, bool) or not isinstance(length, int) or length < 1:
    raise ValueError(f"length={length!r}: it must be an integer >= 1")
  if prompt is not None and not prompt.strip():
    raise ValueError("The prompt is empty (leave it out to generate from all-[MASK])")
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1:
    # jax.random.key keeps 32 bits: seeds 2**32 apart drew the same texts.
    raise ValueError(f"seed={seed!r}: it must be an integer in [0, 2**32 - 1]")
  config, params, vocab, source = load_mlm(checkpoint)
  prompt_ids = vocab.encode(prompt) if prompt else []
  if prompt and not prompt_ids:
    raise ValueError(f"The prompt {prompt!r} encodes to no piece of {source}'s vocabulary "
                     "(only characters it drops)")
  if conditional(checkpoint):
    if not prompt_ids:
      raise ValueError(f"{source} is a diffusion_sft fine-tune: it generates a response to "
                       "--prompt, give one")
    ids, _, start = diffusion_sft.layout(vocab, prompt_ids, length)
    apply = _mlm_everywhere(config, start)
  else:
    ids, start = [vocab.cls_id, *prompt_ids, *[vocab.mask_id] * length, vocab.sep_id], (
        1 + len(prompt_ids))
    apply = _mlm_everywhere(config)
  if len(ids) > config.max_position_embeddings:
    raise ValueError(f"length={length} with the prompt's {len(prompt_ids)} pieces and the "
                     f"special tokens is {len(ids)} positions; {source} has "
                     f"{config.max_position_embeddings} (max_position_embeddings)")
  batch = jnp.asarray(np.tile(np.asarray(ids, np.int32), (num_samples, 1)))
  never = sorted(set(vocab.special_ids) | set(range(vocab.size, config.vocab_size)))
  out = np.asarray(diffusion_sampler.generate(
      params, batch, jax.random.key(seed), apply=apply, start=start, length=length,
      settings=settings, mask_id=vocab.mask_id, never=tuple(never)))
  canvas = slice(start, start + length)
  return [{"prompt": prompt, "text": vocab.decode(row[canvas].tolist()),
           "ids": row[canvas].tolist()} for row in out]


# ----------------------------------------------------------------------------- fine-tuned


@dataclasses.dataclass
class Finetuned:
  """A fine-tuned checkpoint, loaded: its task (model, encoding, decoding), params, tokenizer."""
  task: tasks.FinetuneTask
  params: Any
  vocab: Vocab
  meta: dict[str, Any]
  step: int


# The tasks a pretraining checkpoint records (`tasks.PretrainingTask` and its objectives').
PRETRAINING_TASKS = ("pretraining", "rtd", "diffusion")


def load_finetuned(workdir: str) -> Finetuned:
  """The best export of a `launch/finetune.py` workdir (or a step directory of it)."""
  step_dir = checkpointing.find_step_dir(workdir)
  if step_dir is None:
    raise ValueError(f"{workdir}: no fine-tuned checkpoint (expected best/<step>/ as "
                     "launch/finetune.py writes)")
  meta = checkpointing.read_meta(step_dir)
  saved_task = meta.get("task")
  name = saved_task.get("name") if isinstance(saved_task, dict) else None
  if name not in tasks.FINETUNE_TASKS and isinstance(name, str) and name in PRETRAINING_TASKS:
    # The red team: a pretraining workdir was called "not of this bert_jax version".
    raise ValueError(f"{workdir} is a pretraining run (task {name!r}), not a fine-tuned "
                     "one: fine-tune it first (launch/finetune.py --config.init_from="
                     f"{workdir}), or read it with --mode=fill_mask, --mode=generate or "
                     "--mode=embed")
  if name not in tasks.FINETUNE_TASKS:
    raise ValueError(f"{step_dir} is not a fine-tuned checkpoint of this bert_jax version "
                     f"(task {name!r}); fine-tune again with launch/finetune.py")
  task_class = tasks.finetune_task(saved_task["name"])
  task = task_class(BertConfig(**meta["model_config"]),
                    task_class.settings_class.from_meta(saved_task))
  params = jax.device_put(checkpointing.restore_params(step_dir))
  return Finetuned(task, params, checkpointing.read_vocab(step_dir), meta,
                   int(storage.basename(step_dir)))


@functools.lru_cache(maxsize=4)
def _forward(task: tasks.FinetuneTask):
  return jax.jit(lambda params, batch: task.outputs(task.apply(params, batch, None)))


def _outputs(finetuned: Finetuned, data: finetune_data.TaskData,
             batch_size: int) -> dict[str, np.ndarray]:
  """Per row (QA: per window) outputs, in fixed-shape batches (the last one padded)."""
  return evaluation.predict_outputs(_forward(finetuned.task), finetuned.params,
                                    finetune_data.eval_batches(data, batch_size))


def predict(finetuned: Finetuned | str, records: Sequence[finetune_data.Record | dict],
            batch_size: int = 32) -> list[dict[str, Any]]:
  """Predictions of a fine-tuned checkpoint (a workdir or `load_finetuned`'s result) for
  records ({"text", "text_b"?} dicts, or `finetune_data.read_records` output): per record
  {"label", "probabilities"} / {"score"} (regression) / {"words", "tags"} / {"answer", "start",
  "end", "score"} (character offsets into text_b; a passage longer than one row is read in
  windows of the checkpoint's doc_stride, merged into one answer)."""
  _check_request(records, batch_size)
  if isinstance(finetuned, str):
    finetuned = load_finetuned(finetuned)
  data, outputs_ = outputs(finetuned, records, batch_size)
  return finetuned.task.predictions(outputs_, data)


def _check_request(records: Sequence, batch_size: int) -> None:
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size={batch_size!r}: it must be an integer >= 1")
  if not records:
    raise ValueError("No input records to predict")


def outputs(finetuned: Finetuned, records: Sequence[finetune_data.Record | dict],
            batch_size: int = 32) -> tuple[finetune_data.TaskData, dict[str, np.ndarray]]:
  """(the encoded records, the model's per-row outputs on them: {"logits"} or QA's
  {"start_logits", "end_logits"}, one row per record, QA per window): what `predict` decodes,
  and what an HF export (`hf_export`) computes."""
  _check_request(records, batch_size)
  data = finetuned.task.encode(_as_records(records), finetuned.vocab, with_labels=False)
  return data, _outputs(finetuned, data, batch_size)


def _as_records(records: Sequence[finetune_data.Record | dict]) -> list[finetune_data.Record]:
  return [r if isinstance(r, tuple) else ("<input>", i + 1, r) for i, r in enumerate(records)]


def _where(record: finetune_data.Record) -> str:
  """"file, line N", or the flag a record came from ("--text")."""
  return record[0] if record[0].startswith("--") else finetune_data.where(record)


def truncation_notes(finetuned: Finetuned, records: Sequence[finetune_data.Record | dict],
                     limit: int = 10) -> list[str]:
  """What the model does not read, one line per record the task's encoding cuts (at most
  `limit` lines, then one that counts the rest): "--text: the text has 700 pieces with [CLS]
  and [SEP]; the model reads the first 128 (max_seq_length)" (`FinetuneTask.truncation_note`)."""
  notes = []
  for record in _as_records(records):
    note = finetuned.task.truncation_note(record, finetuned.vocab)
    if note:
      notes.append(f"{_where(record)}: {note}")
  if len(notes) > limit:
    notes = notes[:limit] + [f"... and {len(notes) - limit} more inputs cut the same way"]
  return notes


def load_embedding_model(path: str) -> Finetuned:
  """An embedding model (--mode=embed / search, `downstream/beir.py`): a bert_jax embedding
  run (its pooling, normalisation and length), a sentence-transformers directory (its Pooling,
  Normalize and max_seq_length), or any encoder `config.init_from` takes (pooling by
  `embedding.resolve_pooling`, normalised, its position table's length up to 512): a
  pretraining workdir is such an encoder (the zero-shot baseline of its embeddings), an RTD
  run's its discriminator."""
  from bert_jax import weights  # pylint: disable=import-outside-toplevel
  step_dir = checkpointing.find_step_dir(path)
  saved_task = None if step_dir is None else checkpointing.read_meta(step_dir).get("task")
  finetuned_run = isinstance(saved_task, dict) and saved_task.get("name") in tasks.FINETUNE_TASKS
  if finetuned_run:
    finetuned = load_finetuned(path)
    if not isinstance(finetuned.task, EmbeddingTask):
      raise ValueError(f"{path} was fine-tuned for {finetuned.task.name!r}, not as an "
                       "embedding model")
    return finetuned
  config, params, vocab = weights.load_pretrained(path, uses=())  # The encoder alone.
  if vocab is None:
    raise ValueError(f"{path} has no vocabulary to tokenize queries and documents with")
  length = min(512, config.max_position_embeddings)
  pooling, normalize = resolve_pooling("auto", config), True
  if st_dir.is_sentence_transformers(path):
    pooling, normalize = st_dir.pooling_of(path)
    st_config = storage.join(path, "sentence_bert_config.json")
    if storage.isfile(st_config):
      length = int(json.loads(storage.read_text(st_config)).get("max_seq_length") or length)
  settings = EmbeddingSettings(labels=(), max_seq_length=length, head_dropout_prob=0.0,
                               freeze_encoder=True, pooling=pooling, normalize=normalize,
                               num_negatives=0, scale=20.0, symmetric=False,
                               mask_false_negatives=False, matryoshka_dims=())
  task = EmbeddingTask(config, settings)
  encoder = task.initial_params(params)
  return Finetuned(task, jax.device_put(encoder), vocab, {}, 0)


def embed(model: Finetuned, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
  """[len(texts), H] f32 embeddings, texts packed several to a row (`encode_texts`)."""
  data, outputs_ = outputs(model, [{"text": t} for t in texts], batch_size)
  rows = np.asarray([e["row"] for e in data.examples])
  slots = np.asarray([e["slot"] for e in data.examples])
  return np.asarray(outputs_["embeddings"][rows, slots], np.float32)


def search(model: Finetuned, corpus: Sequence[finetune_data.Record | dict],
           queries: Sequence[finetune_data.Record | dict], top_k: int,
           batch_size: int = 32) -> list[dict[str, Any]]:
  """Exact search (`retrieval.search`, inner product: cosine for a normalised model) of the
  corpus records ({"text", "id"?}; the id defaults to the line number) for each query record:
  per query {"query", "results": [{"id", "score", "text"}, ...]} best first."""
  from bert_jax.downstream import retrieval  # pylint: disable=import-outside-toplevel
  corpus, queries = _as_records(corpus), _as_records(queries)
  ids = [str(r[2].get("id", r[1])) for r in corpus]
  texts = [finetune_data.field(r, "text") for r in corpus]
  scores, indices = retrieval.search(embed(model, [finetune_data.field(q, "text") for q in queries],
                                           batch_size), embed(model, texts, batch_size), top_k)
  return [{"query": finetune_data.field(q, "text"),
           "results": [{"id": ids[j], "score": float(s), "text": texts[j]}
                       for j, s in zip(row_indices, row_scores)]}
          for q, row_indices, row_scores in zip(queries, indices, scores)]
