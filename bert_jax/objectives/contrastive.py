"""The contrastive objective of embedding models (`bert_jax/tasks/embedding.py`): InfoNCE, as
sentence-transformers' MultipleNegativesRankingLoss (MNRL), over the whole global batch.

Example e has a query q_e, a positive p_e and up to N hard negatives n_e,1..N. The candidates of
every query are all the documents of the global batch, every example's positive and hard
negatives (E x (1 + N) rows): in-batch negatives come from every device, whatever the mesh. The
score of a pair is scale x cos(q, d) (MNRL's `cos_sim` and scale 20), and

    loss_e = -log softmax_d(score(q_e, d))[p_e]

A candidate that is not there (a padding example, a missing hard negative) takes no part. With
`mask_false_negatives` a candidate whose text equals q_e's positive (by a hash of its tokens),
other than p_e itself, takes no part either: a duplicate in the batch is not a negative. With
`symmetric` (MultipleNegativesSymmetricRankingLoss) each positive also ranks the batch's queries,
-log softmax_j(score(p_e, q_j))[q_e], and loss_e is the mean of both terms. With
`matryoshka_dims` (MatryoshkaLoss, weights 1) the loss is the sum of this loss on the embeddings
cut to each of those leading dimensions.

The query-document scores are computed from global arrays inside the jitted step: the documents'
embeddings are gathered over the batch axes (`nn.with_logical_constraint`: replicated) and each
device computes its own query rows of the [E, E x (1 + N)] score matrix.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.model import BATCH

# A candidate that takes no part: finite, so a padding row's terms stay finite (they weigh 0).
_ABSENT = -1e9


@dataclasses.dataclass(frozen=True)
class ContrastiveSettings:
  """What the loss needs besides the embeddings (config.embedding)."""
  scale: float = 20.0  # 1 / temperature; sentence-transformers' MNRL default.
  symmetric: bool = False  # Add the positive -> queries term (mean of both).
  mask_false_negatives: bool = False  # Drop candidates whose text equals the positive's.
  matryoshka_dims: tuple[int, ...] = ()  # Sum the loss over these leading dims; (): full only.


def l2_normalize(x):
  """x / max(||x||, 1e-12) over the last axis, with a finite gradient at x = 0 (an absent
  text's vector is 0; the gradient of a norm there is NaN)."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), 1e-24))


def _cosine(a, b):
  """a [M, D], b [N, D] -> cos [M, N] f32."""
  return l2_normalize(a) @ l2_normalize(b).T


def _ranking_terms(scores, valid, target):
  """scores [M, N] f32, valid [M, N] bool, target [M] int -> (-log softmax at target [M],
  top-1 hit [M] f32)."""
  scores = jnp.where(valid, scores, _ABSENT)
  target_score = jnp.take_along_axis(scores, target[:, None], axis=1)[:, 0]
  terms = jax.nn.logsumexp(scores, axis=-1) - target_score
  best = jnp.max(jax.lax.stop_gradient(scores), axis=-1)
  return terms, (jax.lax.stop_gradient(target_score) >= best).astype(jnp.float32)


def _terms_at(queries, positives, negatives, example_weight, negative_weight, hashes,
              settings: ContrastiveSettings):
  """The per-example terms [E] and top-1 hits [E] at one embedding width."""
  num_examples, num_negatives = negative_weight.shape
  documents = jnp.concatenate(
      [positives, negatives.reshape(num_examples * num_negatives, negatives.shape[-1])], axis=0)
  # Every device needs every document; each keeps its own query rows.
  documents = nn.with_logical_constraint(documents, (None, None))
  doc_valid = jnp.concatenate([example_weight > 0,
                               ((negative_weight > 0) & (example_weight[:, None] > 0)).reshape(-1)])
  scores = settings.scale * _cosine(queries, documents)  # [E, E (1 + N)]
  scores = nn.with_logical_constraint(scores, (BATCH, None))
  valid = jnp.broadcast_to(doc_valid[None, :], scores.shape)
  target = jnp.arange(num_examples)
  if settings.mask_false_negatives:
    query_hash, positive_hash, negative_hash = hashes
    doc_hash = jnp.concatenate([positive_hash, negative_hash.reshape(-1)])
    duplicate = doc_hash[None, :] == positive_hash[:, None]
    duplicate = duplicate & (jnp.arange(documents.shape[0])[None, :] != target[:, None])
    valid = valid & ~duplicate
  terms, hits = _ranking_terms(scores, valid, target)
  if settings.symmetric:
    back = settings.scale * _cosine(positives, nn.with_logical_constraint(queries, (None, None)))
    back = nn.with_logical_constraint(back, (BATCH, None))  # [E, E]
    back_valid = jnp.broadcast_to((example_weight > 0)[None, :], back.shape)
    if settings.mask_false_negatives:
      query_hash = hashes[0]
      same = (query_hash[None, :] == query_hash[:, None]) & ~jnp.eye(num_examples, dtype=bool)
      back_valid = back_valid & ~same
    back_terms, _ = _ranking_terms(back, back_valid, target)
    terms = (terms + back_terms) / 2
  return terms, hits


def contrastive_sums(queries, positives, negatives, example_weight, negative_weight,
                     settings: ContrastiveSettings, hashes=None) -> dict[str, jax.Array]:
  """queries [E, D], positives [E, D], negatives [E, N, D] (f32 embeddings of the whole
  global batch); example_weight [E] (0: a padding example), negative_weight [E, N] (0: no such
  hard negative); hashes (query [E], positive [E], negative [E, N] int32 token hashes) when
  `settings.mask_false_negatives`. -> f32 sums: `contrastive_loss_sum` (weighted terms, summed
  over the Matryoshka widths), `contrastive_correct_sum` (the positive ranked first, at the widest
  width), `contrastive_count` (examples)."""
  if settings.mask_false_negatives and hashes is None:
    raise ValueError("mask_false_negatives needs the texts' hashes")
  weight = example_weight.astype(jnp.float32)
  dims = settings.matryoshka_dims or (queries.shape[-1],)
  total = jnp.zeros((), jnp.float32)
  hits = jnp.zeros_like(weight)
  for dim in dims:
    terms, dim_hits = _terms_at(queries[:, :dim], positives[:, :dim], negatives[..., :dim],
                                example_weight, negative_weight, hashes, settings)
    total = total + jnp.sum(terms * weight)
    if dim == max(dims):
      hits = dim_hits
  return {"contrastive_loss_sum": total, "contrastive_correct_sum": jnp.sum(hits * weight),
          "contrastive_count": jnp.sum(weight)}
