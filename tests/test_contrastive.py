"""The contrastive objective (bert_jax/objectives/contrastive.py) against sentence-transformers'
losses on the same embeddings, and its in-batch negatives over the whole global batch on a mesh."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax.objectives.contrastive import ContrastiveSettings, contrastive_sums
from bert_jax.training import sharding
from configs import base

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
  warnings.simplefilter("ignore")
  from sentence_transformers.sentence_transformer import losses as st_losses

E, N, D = 8, 2, 16


def _embeddings(seed=0, examples=E, negatives=N, dim=D):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(examples, dim)).astype(np.float32),
          rng.normal(size=(examples, dim)).astype(np.float32),
          rng.normal(size=(examples, negatives, dim)).astype(np.float32))


def _mean(sums) -> float:
  return float(sums["contrastive_loss_sum"] / sums["contrastive_count"])


def _st(loss_class, q, p, n, **kwargs) -> float:
  loss = loss_class(model=None, **kwargs)
  columns = [torch.tensor(q), torch.tensor(p)] + [torch.tensor(n[:, k]) for k in range(n.shape[1])]
  return loss.compute_loss_from_embeddings(columns, None).item()


def _ours(q, p, n, settings=ContrastiveSettings(), example_weight=None, negative_weight=None,
          hashes=None):
  example_weight = np.ones(len(q), np.float32) if example_weight is None else example_weight
  negative_weight = (np.ones(n.shape[:2], np.float32) if negative_weight is None
                     else negative_weight)
  return contrastive_sums(q, p, n, example_weight, negative_weight, settings, hashes)


@pytest.mark.parametrize("negatives", [0, 1, 3])
def test_equals_sentence_transformers_multiple_negatives_ranking_loss(negatives):
  q, p, n = _embeddings(negatives=negatives)
  reference = _st(st_losses.MultipleNegativesRankingLoss, q, p, n)
  assert _mean(_ours(q, p, n)) == pytest.approx(reference, rel=1e-5)
  # Another temperature is another loss, the same in both.
  reference = _st(st_losses.MultipleNegativesRankingLoss, q, p, n, scale=7.0)
  assert _mean(_ours(q, p, n, ContrastiveSettings(scale=7.0))) == pytest.approx(reference,
                                                                                 rel=1e-5)


@pytest.mark.parametrize("negatives", [0, 2])
def test_symmetric_equals_sentence_transformers_symmetric_loss(negatives):
  q, p, n = _embeddings(negatives=negatives)
  # sentence-transformers' MultipleNegativesSymmetricRankingLoss, as it now spells it.
  reference = _st(st_losses.MultipleNegativesRankingLoss, q, p, n,
                  directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
  ours = _mean(_ours(q, p, n, ContrastiveSettings(symmetric=True)))
  assert ours == pytest.approx(reference, rel=1e-5)
  assert ours != pytest.approx(_mean(_ours(q, p, n)), rel=1e-3)


def test_matryoshka_sums_the_loss_of_each_leading_width():
  q, p, n = _embeddings()
  dims = (16, 8, 4)
  expected = sum(_st(st_losses.MultipleNegativesRankingLoss, q[:, :d], p[:, :d], n[..., :d])
                 for d in dims)
  ours = _ours(q, p, n, ContrastiveSettings(matryoshka_dims=dims))
  assert _mean(ours) == pytest.approx(expected, rel=1e-5)


def test_absent_examples_and_negatives_take_no_part():
  """A padding example (weight 0) and a missing hard negative are not candidates: the loss
  equals the batch without them."""
  q, p, n = _embeddings()
  example_weight = np.ones(E, np.float32)
  example_weight[-2:] = 0
  negative_weight = np.ones((E, N), np.float32)
  negative_weight[:, 1] = 0
  padded = _ours(q, p, n, example_weight=example_weight, negative_weight=negative_weight)
  assert float(padded["contrastive_count"]) == E - 2
  reference = _st(st_losses.MultipleNegativesRankingLoss, q[:-2], p[:-2], n[:-2, :1])
  assert _mean(padded) == pytest.approx(reference, rel=1e-5)
  assert np.isfinite(float(padded["contrastive_loss_sum"]))


def test_a_duplicate_of_the_positive_is_masked_when_asked():
  """Example 1's hard negative has example 0's positive text: unmasked it is a (false)
  negative of query 0; masked, query 0's loss is as if it were not in the batch."""
  q, p, n = _embeddings(negatives=1)
  n[1, 0] = p[0]
  query_hash = np.arange(E, dtype=np.int32)
  positive_hash = 100 + np.arange(E, dtype=np.int32)
  negative_hash = 200 + np.arange(E, dtype=np.int32)[:, None]
  negative_hash[1, 0] = positive_hash[0]
  hashes = (query_hash, positive_hash, negative_hash)
  masked = _ours(q, p, n, ContrastiveSettings(mask_false_negatives=True), hashes=hashes)
  unmasked = _ours(q, p, n, ContrastiveSettings(), hashes=hashes)
  # Reference: query 0 without the duplicate among its candidates, the others with it.
  cos = lambda a, b: (a / np.linalg.norm(a, axis=-1, keepdims=True)) @ (  # noqa: E731
      b / np.linalg.norm(b, axis=-1, keepdims=True)).T
  scores = 20.0 * cos(q, np.concatenate([p, n[:, 0]]))  # [E, 2E]
  scores[0, E + 1] = -np.inf
  log_softmax = scores - np.log(np.exp(scores - scores.max(1, keepdims=True)).sum(
      1, keepdims=True)) - scores.max(1, keepdims=True)
  expected = -np.mean(log_softmax[np.arange(E), np.arange(E)])
  assert _mean(masked) == pytest.approx(expected, rel=1e-5)
  assert _mean(masked) < _mean(unmasked)
  with pytest.raises(ValueError, match="mask_false_negatives needs the texts' hashes"):
    _ours(q, p, n, ContrastiveSettings(mask_false_negatives=True))


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 4, 1)])
def test_negatives_come_from_the_whole_global_batch_on_any_mesh(mesh_shape):
  """On 8 devices (data 8; data 2 x fsdp 4) the loss and its gradients equal one device's to
  1e-6; negatives from each device's rows alone would give another loss (checked)."""
  q, p, n = _embeddings(seed=3, examples=16)
  settings = ContrastiveSettings(symmetric=True)

  def loss(q, p, n):
    sums = contrastive_sums(q, p, n, jnp.ones(len(q)), jnp.ones((len(q), N)), settings)
    return sums["contrastive_loss_sum"] / sums["contrastive_count"]

  grad_fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
  one = grad_fn(q, p, n)
  config = base.get_config()
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
  mesh = sharding.make_mesh(config.mesh)
  rows = NamedSharding(mesh, P(("data", "fsdp")))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config.mesh)):
    sharded = [jax.device_put(x, rows) for x in (q, p, n)]
    many = grad_fn(*sharded)
  np.testing.assert_allclose(float(many[0]), float(one[0]), rtol=1e-6)
  for got, want in zip(many[1], one[1]):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
  # What per-device negatives would give: each device's 2 examples among themselves.
  local = np.mean([float(loss(q[i::8], p[i::8], n[i::8])) for i in range(8)])
  assert abs(local - float(one[0])) > 0.1
