"""Embedding models: an encoder whose pooled, optionally L2-normalised vector of a text is its
embedding, trained contrastively (`bert_jax/objectives/contrastive.py`: InfoNCE over the whole
global batch's documents, as sentence-transformers' MultipleNegativesRankingLoss) and evaluated
by retrieval (`bert_jax/downstream/retrieval.py`: nDCG@10, MRR@10, recall@100, MAP).

Records: {"query": ..., "positive": ..., "negatives": [...]} (JSONL or CSV; `negatives` are
optional hard negatives, at most config.embedding.num_negatives of them are read). Every text
is its own row of max_seq_length pieces ([CLS] text [SEP], cut to fit). A train batch row is one
example: its query, its positive and N negative slots, [2 + N, L] (a slot with no negative
weighs 0).

Pooling (config.embedding.pooling) is "mean" (over the text's pieces, [CLS] and [SEP]
included, as sentence-transformers' mean pooling over the attention mask), "cls" or "max";
"auto" takes the encoder's: a sentence-transformers directory's Pooling and Normalize modules,
a ModernBERT's `classifier_pooling`, else "mean".

Batches beyond memory: with config.train.grad_accum_steps = C > 1 the step is GradCache's
(Gao et al. 2021): the embeddings of the C chunks without gradients, the loss of the whole batch
and its gradient with respect to every embedding, then each chunk's vector-Jacobian product
through the encoder under `lax.scan`. The gradient is the whole batch's, in-batch negatives
included; activations are held for one chunk at a time.
"""

import dataclasses
import zlib
from typing import Any, ClassVar, Sequence, Self

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import finetune as finetune_data, packing
from bert_jax.data.finetune import Record, TaskData
from bert_jax.data.vocab import Vocab
from bert_jax.downstream import retrieval
from bert_jax.models import model as model_lib
from bert_jax.models.model import BertConfig, BertModel
from bert_jax.objectives.contrastive import ContrastiveSettings, contrastive_sums, l2_normalize
from bert_jax.tasks.base import Batch, Scores, chunked, unchunked
from bert_jax.tasks.finetuning import ENCODER, FinetuneSettings, FinetuneTask
from bert_jax.weights import sentence_transformers_dir as st_dir

POOLINGS = ("mean", "cls", "max")


def pool_texts(sequence, attention_mask, pooling: str, normalize: bool):
  """sequence [T, L, H], attention_mask [T, L] -> embeddings [T, H] f32."""
  sequence = sequence.astype(jnp.float32)
  mask = attention_mask.astype(jnp.float32)[..., None]  # [T, L, 1]
  if pooling == "cls":
    vectors = sequence[:, 0]
  elif pooling == "mean":
    vectors = jnp.sum(sequence * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
  else:  # "max": over the text's pieces only.
    vectors = jnp.max(jnp.where(mask > 0, sequence, jnp.finfo(jnp.float32).min), axis=1)
  return l2_normalize(vectors) if normalize else vectors


def pool_packed(sequence, segment_ids, starts, pooling: str, normalize: bool):
  """Rows of packed texts: sequence [R, L, H], segment_ids [R, L] (text k of a row is segment
  k + 1, 0 padding), starts [R, K] (each text's [CLS]) -> embeddings [R, K, H] f32, each text's
  pooled over its own pieces as `pool_texts` pools a text alone."""
  sequence = sequence.astype(jnp.float32)
  member = segment_ids[:, :, None] == jnp.arange(1, starts.shape[1] + 1)  # [R, L, K]
  if pooling == "cls":
    vectors = model_lib.gather_positions(sequence, starts)
  elif pooling == "mean":
    weights = member.astype(jnp.float32)
    vectors = (jnp.einsum("rlk,rlh->rkh", weights, sequence)
               / jnp.maximum(weights.sum(axis=1), 1.0)[..., None])
  else:  # "max"
    masked = jnp.where(member[..., None], sequence[:, :, None, :], jnp.finfo(jnp.float32).min)
    vectors = jnp.max(masked, axis=1)  # [R, K, H]
  return l2_normalize(vectors) if normalize else vectors


def packed_rows(rows: int, row_multiple: int) -> int:
  """`rows` packed rows rounded up to a bucket, so that batches take a few shapes (a
  compilation each): to a multiple of a step, a sixteenth of the power of two below `rows`
  raised to a multiple of `row_multiple` (data x fsdp shards times GradCache chunks). When
  `row_multiple` is a power of two that is at most 1/16 more rows, or up to the next multiple
  of `row_multiple` when that is larger. On the offline retrieval suite's pairs at B = 64 the
  batches pack into 27-32 rows: 6 buckets, fill 0.977 (quarters: 2 buckets, 0.928)."""
  step = max(1, 2 ** (max(rows, 1).bit_length() - 1) // 16)
  step = row_multiple * -(-step // row_multiple)
  return max(1, -(-rows // step)) * step


def _example_weight(batch: Batch) -> jax.Array:
  """[B] f32 (`example_weight`, counted in examples: a packed batch has R rows of B texts')."""
  weight = batch.get("example_weight")
  return (jnp.ones(batch["text_weight"].shape[:1], jnp.float32) if weight is None
          else weight.astype(jnp.float32))


class BertForEmbedding(nn.Module):
  """The encoder (params["bert"], no pooler) and the pooling: ids [T, L] with their attention
  mask -> [T, H] f32; or rows of packed texts (`segment_ids` as the mask, with `position_ids`
  and `starts` [R, K]) -> [R, K, H]."""
  config: BertConfig
  pooling: str
  normalize: bool

  @nn.compact
  def __call__(self, input_ids, attention_mask, deterministic: bool = True, *,
               position_ids=None, starts=None):
    sequence, _ = BertModel(self.config, add_pooling_layer=False, name=ENCODER)(
        input_ids, None, attention_mask, deterministic, position_ids=position_ids)
    if starts is not None:
      return pool_packed(sequence, attention_mask, starts, self.pooling, self.normalize)
    return pool_texts(sequence, attention_mask, self.pooling, self.normalize)


def resolve_pooling(pooling: str, model_config: BertConfig) -> str:
  """config.embedding.pooling with "auto" decided by the encoder."""
  if pooling != "auto":
    return pooling
  return model_config.classifier_pooling if model_lib.is_modernbert(model_config) else "mean"


def text_hash(ids: Sequence[int]) -> int:
  """A text's identity for false-negative masking: CRC-32 of its pieces, as int32."""
  value = zlib.crc32(np.asarray(ids, np.int32).tobytes())
  return value - (1 << 32) if value >= 1 << 31 else value


@dataclasses.dataclass(frozen=True)
class EmbeddingSettings(FinetuneSettings):
  pooling: str  # "mean", "cls" or "max" (resolved).
  normalize: bool  # L2-normalised embeddings (sentence-transformers' Normalize module).
  num_negatives: int  # N: hard-negative slots per example.
  scale: float
  symmetric: bool
  mask_false_negatives: bool
  matryoshka_dims: tuple[int, ...]
  # Train batches packed several texts to a row (`pack_batch`); checkpoints from before it
  # was a setting did not pack.
  pack: bool = False

  @classmethod
  def config_values(cls, config) -> dict[str, Any]:
    e = config.embedding
    return {**super().config_values(config), "pooling": e.pooling, "normalize": e.normalize,
            "num_negatives": e.num_negatives, "scale": float(e.scale),
            "symmetric": e.symmetric, "mask_false_negatives": e.mask_false_negatives,
            "matryoshka_dims": tuple(int(d) for d in e.matryoshka_dims), "pack": e.pack}

  @classmethod
  def from_config(cls, config, labels: Sequence[str], model_config: BertConfig,
                  vocab=None) -> Self:
    settings = super().from_config(config, labels, model_config, vocab)
    widest = max(settings.matryoshka_dims, default=0)
    if widest > model_config.hidden_size:
      raise ValueError(f"config.embedding.matryoshka_dims={list(settings.matryoshka_dims)} has "
                       f"{widest}, wider than the encoder's hidden_size={model_config.hidden_size}")
    # Unset choices: a sentence-transformers directory's own modules, else the defaults. A value
    # given (--config.embedding.normalize=false) always wins over the directory's.
    pooling, normalize = resolve_pooling(settings.pooling, model_config), True
    if st_dir.is_sentence_transformers(config.init_from):
      own_pooling, own_normalize = st_dir.pooling_of(config.init_from)
      pooling = own_pooling if settings.pooling == "auto" else pooling
      normalize = own_normalize
    if settings.normalize is not None:
      normalize = settings.normalize
    return dataclasses.replace(settings, pooling=pooling, normalize=normalize)

  @property
  def contrastive(self) -> ContrastiveSettings:
    return ContrastiveSettings(self.scale, self.symmetric, self.mask_false_negatives,
                               self.matryoshka_dims)


@dataclasses.dataclass(frozen=True)
class EmbeddingTask(FinetuneTask):
  """Contrastive training of text embeddings; evaluation by retrieval over the validation set."""
  settings: EmbeddingSettings

  name = "embedding"
  settings_class = EmbeddingSettings
  predict_mode = "embed"
  text_b = "unused"
  loss_terms = (("contrastive_loss_sum", "contrastive_count"),)
  log_keys = ("contrastive_accuracy",)
  input_names = ("input_ids", "attention_mask")
  # A packed train batch's token inputs [R, L] (`pack_batch`), then all its model inputs.
  packed_token_names = ("input_ids", "segment_ids", "position_ids")
  packed_names = (*packed_token_names, "starts")  # starts: [R, K].
  # What the vectors are (checked on resume, `training/resume.py`), under config.embedding.
  resume_identity = ("pooling", "normalize")
  config_section = "embedding"

  @property
  def model(self) -> BertForEmbedding:
    return BertForEmbedding(self.model_config, self.settings.pooling, self.settings.normalize)

  @property
  def seq_len(self) -> int:
    """Token slots per batch row: its 2 + N texts of max_seq_length (throughput, fill rate)."""
    return self.slots * self.settings.max_seq_length

  @property
  def slots(self) -> int:
    """Texts per example: the query, the positive and N negative slots."""
    return 2 + self.settings.num_negatives

  @property
  def texts_per_row(self) -> int:
    """K: the most texts a packed row holds (prediction's and training's)."""
    return max(1, self.settings.max_seq_length // 8)

  def example_inputs(self) -> tuple:
    ids = jnp.zeros((1, self.settings.max_seq_length), jnp.int32)
    return ids, ids

  def batch_signature(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    texts, length = self.slots, self.settings.max_seq_length
    return {"input_ids": ((texts, length), jnp.int32),
            "attention_mask": ((texts, length), jnp.int32),
            "text_weight": ((texts,), jnp.float32), "text_hash": ((texts,), jnp.int32)}

  def batch_shapes(self, batch_size: int, row_multiple: int):
    if not self.settings.pack:
      return super().batch_shapes(batch_size, row_multiple)
    texts, length = self.slots, self.settings.max_seq_length
    rows = packed_rows(-(-batch_size * texts // self.texts_per_row), row_multiple)
    shapes = {name: ((batch_size, *shape), dtype) for name, (shape, dtype) in
              self.batch_signature().items() if name in ("text_weight", "text_hash")}
    return {**shapes, "text_index": ((batch_size, texts), jnp.int32),
            **{name: ((rows, length), jnp.int32) for name in self.packed_token_names},
            "starts": ((rows, self.texts_per_row), jnp.int32)}

  def batch_packer(self, row_multiple: int):
    if not self.settings.pack:
      return None
    return lambda batch: self.pack_batch(batch, row_multiple)

  def pack_batch(self, batch: dict[str, np.ndarray], row_multiple: int
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A global train batch of examples [B, 2 + N, L] -> (per example: text_weight, text_hash
    and text_index [B, 2 + N], each text's place r K + k among the packed rows' slots; the rows:
    input_ids, segment_ids, position_ids [R, L] and starts [R, K]). The batch's texts go best
    fit decreasing (`packing.pack`) up to K = `texts_per_row` to a row, each [CLS] text [SEP]
    its own segment with positions from 0, so that each embedding equals the text's alone.
    R is rounded up to a bucket (`packed_rows`), a multiple of `row_multiple`."""
    ids, mask, weight = batch["input_ids"], batch["attention_mask"], batch["text_weight"]
    examples, texts, length = ids.shape
    slots = self.texts_per_row
    lengths = mask.sum(axis=-1).reshape(-1)  # [B (2 + N)]
    present = np.flatnonzero(weight.reshape(-1) > 0)
    groups = packing.pack(lengths[present].tolist(), length, slots)
    rows = packed_rows(len(groups), row_multiple)
    packed = {name: np.zeros((rows, length), np.int32) for name in self.packed_token_names}
    packed["starts"] = np.zeros((rows, slots), np.int32)
    text_index = np.zeros((examples * texts,), np.int32)  # Absent texts (weight 0): slot 0.
    flat_ids = ids.reshape(examples * texts, length)
    for row, members in enumerate(groups):
      start = 0
      for slot, member in enumerate(members):
        text = present[member]
        end = start + lengths[text]
        packed["input_ids"][row, start:end] = flat_ids[text, :lengths[text]]
        packed["segment_ids"][row, start:end] = slot + 1
        packed["position_ids"][row, start:end] = np.arange(lengths[text])
        packed["starts"][row, slot] = start
        text_index[text] = row * slots + slot
        start = end
    return ({"text_weight": weight, "text_hash": batch["text_hash"],
             "text_index": text_index.reshape(examples, texts)}, packed)

  # ------------------------------------------------------------ inside the jitted step
  def embed(self, params, batch: Batch, dropout_rng) -> jax.Array:
    """Examples [B, 2 + N, L] -> their texts' embeddings [B, 2 + N, H] f32; rows of packed texts
    (`encode_texts`: segment_ids [B, L]) -> [B, K, H]."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    if "segment_ids" in batch:
      return self.model.apply({"params": params}, batch["input_ids"], batch["segment_ids"],
                              deterministic=dropout_rng is None, rngs=rngs,
                              position_ids=batch["position_ids"], starts=batch["starts"])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows, texts, length = ids.shape
    vectors = self.model.apply({"params": params}, ids.reshape(rows * texts, length),
                               mask.reshape(rows * texts, length),
                               deterministic=dropout_rng is None, rngs=rngs)
    return vectors.reshape(rows, texts, -1)

  def sums_from_embeddings(self, embeddings, batch: Batch) -> dict[str, jax.Array]:
    """[B, 2 + N, H] embeddings of the whole batch (or of its packed rows, [R, K, H], taken
    to the examples' texts by `text_index`) -> the contrastive sums."""
    weights, hashes = batch["text_weight"], batch["text_hash"]
    if "text_index" in batch:
      embeddings = embeddings.reshape(-1, embeddings.shape[-1])[batch["text_index"]]
    return contrastive_sums(
        embeddings[:, 0], embeddings[:, 1], embeddings[:, 2:],
        _example_weight(batch) * weights[:, 1], weights[:, 2:], self.settings.contrastive,
        (hashes[:, 0], hashes[:, 1], hashes[:, 2:]))

  def loss_counts(self, batch: Batch) -> dict[str, jax.Array]:
    return {"contrastive_count": jnp.sum(_example_weight(batch) * batch["text_weight"][:, 1])}

  def examples(self, batch: Batch) -> jax.Array:
    return jnp.float32(batch["text_weight"].shape[0])  # Packed or not: B.

  def loss_sums(self, params, batch: Batch, dropout_rng) -> dict[str, jax.Array]:
    return self.sums_from_embeddings(self.embed(params, batch, dropout_rng), batch)

  def gradients(self, params, batch: Batch, dropout_rng, counts, num_chunks: int):
    """One pass (num_chunks 1), or GradCache over `num_chunks` chunks: the same loss and
    gradient, the negatives of the whole batch either way (the module docstring)."""
    if num_chunks == 1:
      return super().gradients(params, batch, dropout_rng, counts, 1)
    names = self.packed_names if "segment_ids" in batch else self.input_names
    chunks = chunked({name: batch[name] for name in names}, num_chunks)  # [C, B/C, 2 + N, L]
    indices = jnp.arange(num_chunks)

    def embed_chunk(params, chunk, index):
      return self.embed(params, chunk, jax.random.fold_in(dropout_rng, index))

    # 1. Every chunk's embeddings, no activations kept.
    embedded = jax.lax.map(lambda xs: embed_chunk(params, xs[0], xs[1]), (chunks, indices))
    # [B, 2 + N, H] (packed: [R, K, H])
    embeddings = unchunked(jax.lax.stop_gradient(embedded), num_chunks)

    # 2. The whole batch's loss and its gradient with respect to each embedding.
    def loss_of(embeddings):
      sums = self.sums_from_embeddings(embeddings, batch)
      return self.loss(sums, counts), sums

    (loss, sums), embedding_grads = jax.value_and_grad(loss_of, has_aux=True)(embeddings)

    # 3. Each chunk's vector-Jacobian product through the encoder, accumulated.
    def accumulate(total, xs):
      chunk, index, cotangent = xs
      _, pullback = jax.vjp(lambda p: embed_chunk(p, chunk, index), params)
      return jax.tree.map(jnp.add, total, pullback(cotangent)[0]), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, _ = jax.lax.scan(accumulate, zeros,
                            (chunks, indices, chunked(embedding_grads, num_chunks)))
    return loss, sums, grads

  def apply(self, params, batch: Batch, dropout_rng):
    """Rows of any number of texts [B, T, L] -> embeddings [B, T, H] (prediction: T = 1)."""
    return self.embed(params, batch, dropout_rng)

  def outputs(self, raw) -> dict[str, jax.Array]:
    return {"embeddings": raw}

  def eval_outputs(self, params, batch: Batch) -> tuple[dict, dict]:
    embeddings = self.embed(params, batch, None)
    return {"embeddings": embeddings}, self.sums_from_embeddings(embeddings, batch)

  # ------------------------------------------------------------ on the host
  def report(self, sums: dict[str, float]) -> dict[str, float]:
    return {"contrastive_accuracy": sums["contrastive_correct_sum"]
            / max(sums["contrastive_count"], 1.0)}

  @classmethod
  def labels_from(cls, records: Sequence[Record], config) -> list[str]:
    del records, config
    return []

  def encode(self, records: Sequence[Record], vocab: Vocab, with_labels: bool = True,
             is_training: bool = False) -> TaskData:
    """Each record -> [2 + N, L] rows (query, positive, negatives), weights and text hashes;
    examples keep the texts' hashes (retrieval's document ids). For prediction
    (`with_labels` False) a record is {"text"}, encoded by `encode_texts`. Training records
    need 2 distinct positives at least: every other example's positive is an example's negative,
    so with one the loss has nothing to contrast."""
    length = self.settings.max_seq_length
    if not with_labels:
      return self.encode_texts(records, vocab)
    texts = self.slots
    columns = [[self._text(r, "query"), self._text(r, "positive")] + self._negatives(r)
               for r in records]
    flat = [text for column in columns for text in column]
    pieces = vocab.encode_batch(flat)
    truncated = sum(len(p) + 2 > length for p in pieces)
    ids = np.zeros((len(records), texts, length), np.int32)
    mask = np.zeros_like(ids)
    weight = np.zeros((len(records), texts), np.float32)
    hashes = np.zeros((len(records), texts), np.int32)
    position = 0
    for row, column in enumerate(columns):
      for slot in range(len(column)):
        body = pieces[position][:length - 2]
        position += 1
        row_ids = [vocab.cls_id, *body, vocab.sep_id]
        ids[row, slot, :len(row_ids)] = row_ids
        mask[row, slot, :len(row_ids)] = 1
        weight[row, slot] = 1.0
        hashes[row, slot] = text_hash(row_ids)
    distinct = len(set(hashes[:, 1].tolist()))
    if is_training and records and distinct < 2:
      raise ValueError(f"{records[0][0]}: {len(records)} training record(s) with {distinct} "
                       "distinct positive: in-batch negatives are the other examples' "
                       "positives, so training needs 2 distinct positives at least")
    examples = [{"line": r[1], "hashes": hashes[i].tolist(), "texts": len(columns[i])}
                for i, r in enumerate(records)]
    arrays = {"input_ids": ids, "attention_mask": mask, "text_weight": weight,
              "text_hash": hashes}
    return TaskData(records[0][0], arrays, examples, truncated)

  def encode_texts(self, records: Sequence[Record], vocab: Vocab,
                   texts_per_row: int | None = None) -> TaskData:
    """Records {"text"} packed several to a row of max_seq_length pieces, in order (a text goes
    to the current row while it fits and the row has fewer than `texts_per_row` texts: default
    max_seq_length // 8): each [CLS] text [SEP] (cut to fit a row alone) is its own segment,
    with positions from 0, and its embedding equals the text's alone (`pool_packed`).
    Examples record each text's (row, slot)."""
    length = self.settings.max_seq_length
    slots = texts_per_row or max(1, length // 8)
    pieces = vocab.encode_batch([self._text(r, "text") for r in records])
    truncated = sum(len(p) + 2 > length for p in pieces)
    placed, rows, fill = [], 0, length  # (row, slot, pieces) per text.
    count = slots
    for body in pieces:
      ids = [vocab.cls_id, *body[:length - 2], vocab.sep_id]
      if fill + len(ids) > length or count == slots:
        rows, fill, count = rows + 1, 0, 0
      placed.append((rows - 1, count, fill, ids))
      fill, count = fill + len(ids), count + 1
    arrays = {"input_ids": np.zeros((rows, length), np.int32),
              "segment_ids": np.zeros((rows, length), np.int32),
              "position_ids": np.zeros((rows, length), np.int32),
              "starts": np.zeros((rows, slots), np.int32)}
    for row, slot, start, ids in placed:
      end = start + len(ids)
      arrays["input_ids"][row, start:end] = ids
      arrays["segment_ids"][row, start:end] = slot + 1
      arrays["position_ids"][row, start:end] = np.arange(len(ids))
      arrays["starts"][row, slot] = start
    examples = [{"line": r[1], "row": row, "slot": slot}
                for r, (row, slot, _, _) in zip(records, placed)]
    return TaskData(records[0][0], arrays, examples, truncated)

  def initial_params(self, pretrained: dict) -> dict:
    return {ENCODER: super().initial_params(pretrained)[ENCODER]}  # No head: the encoder alone.

  @staticmethod
  def _text(record: Record, name: str) -> str:
    value = finetune_data.field(record, name)
    if not value.strip():
      raise ValueError(f"{finetune_data.where(record)}: field {name!r} is empty")
    return value

  def _negatives(self, record: Record) -> list[str]:
    value = record[2].get("negatives") or []
    if isinstance(value, str):
      value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
      raise ValueError(f"{finetune_data.where(record)}: field 'negatives' should be a list of "
                       "strings")
    for text in value:
      if not text.strip():
        raise ValueError(f"{finetune_data.where(record)}: an empty hard negative")
    return value[:self.settings.num_negatives]

  def truncation_note(self, record: Record, vocab: Vocab) -> str | None:
    pieces = len(vocab.encode(finetune_data.field(record, "text"))) + 2
    length = self.settings.max_seq_length
    if pieces <= length:
      return None
    return (f"the text has {pieces} pieces with [CLS] and [SEP]; the model reads the first "
            f"{length} (max_seq_length)")

  def predictions(self, outputs: dict[str, np.ndarray], data: TaskData) -> list[dict[str, Any]]:
    """{"embedding"} of each record's text (`encode_texts`: its row and slot)."""
    vectors = outputs["embeddings"]
    return [{"embedding": vectors[e["row"], e["slot"]].tolist()} for e in data.examples]

  def score(self, predicted, data: TaskData) -> dict[str, float]:
    raise NotImplementedError  # `scores` ranks the validation documents itself.

  def scores(self, outputs: dict[str, np.ndarray], sums: dict[str, float],
             data: TaskData) -> Scores:
    """Retrieval over the validation set: each query against every distinct document text of
    it (positives and hard negatives), its positive the relevant one."""
    embeddings = outputs["embeddings"]  # [E, 2 + N, H]
    documents: dict[int, np.ndarray] = {}
    qrels, query_vectors = {}, []
    for e, example in enumerate(data.examples):
      hashes = example["hashes"]
      for slot in range(1, example["texts"]):
        documents.setdefault(hashes[slot], embeddings[e, slot])
      qrels[f"q{e}"] = {str(hashes[1]): 1}
      query_vectors.append(embeddings[e, 0])
    doc_ids = list(documents)
    scores, indices = retrieval.search(np.stack(query_vectors), np.stack(list(documents.values())),
                                       k=100)
    run = retrieval.run_from_search(list(qrels), [str(d) for d in doc_ids], scores, indices)
    means, _ = retrieval.evaluate(qrels, run)
    loss = sums["contrastive_loss_sum"] / max(sums["contrastive_count"], 1.0)
    return Scores({"loss": loss, **means}, {"examples": len(data.examples),
                                           "documents": len(doc_ids)})

  def metric_names(self) -> list[str] | None:
    return sorted({"loss", *retrieval.METRICS})

  def main_metric(self) -> str:
    return "ndcg@10"

  def describe_head(self, pooling: str, followed: bool) -> str:
    del pooling, followed  # The encoder's classifier pooling plays no part.
    s = self.settings
    return (f"Embeddings: {s.pooling} pooling{', L2-normalised' if s.normalize else ''}; "
            f"InfoNCE at scale {s.scale:g} over the global batch, {s.num_negatives} hard "
            f"negative slot(s){', symmetric' if s.symmetric else ''}"
            f"{', false negatives masked' if s.mask_false_negatives else ''}"
            + (f", Matryoshka widths {list(s.matryoshka_dims)}" if s.matryoshka_dims else ""))

  def describe(self, split: str, data: TaskData) -> str:
    return (f"{split}: {len(data)} examples from {data.source} ({self.slots} texts each); "
            f"{data.num_truncated} texts longer than max_seq_length="
            f"{self.settings.max_seq_length} were truncated")

  def flops_per_example(self) -> float | None:
    return None
