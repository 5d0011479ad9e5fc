"""`bert_jax.models.model.dropout`: rate, scale, determinism and independence of the masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.model import BertConfig, dropout

RATE = 0.1
SCALE = 65536 / (65536 - round(RATE * 65536))


@pytest.mark.parametrize("rng", ["hash", "threefry"])
@pytest.mark.parametrize("shape", [(8, 12, 64, 64), (8, 64, 96), (4, 33, 7), (10_001,)])
def test_rate_scale_and_mean(rng, shape):
  x = jnp.ones(shape, jnp.float32)
  y = np.asarray(dropout(x, RATE, jax.random.key(0), rng))
  assert y.shape == shape and y.dtype == np.float32
  assert set(np.unique(y)) <= {0.0, np.float32(SCALE)}
  dropped = (y == 0).mean()
  tolerance = 5 * np.sqrt(RATE * (1 - RATE) / y.size)
  assert abs(dropped - RATE) < tolerance
  assert abs(y.mean() - 1.0) < 5 * tolerance


@pytest.mark.parametrize("rng", ["hash", "threefry"])
def test_masks_are_pure_functions_of_the_key_and_independent(rng):
  x = jnp.ones((8, 12, 64, 64), jnp.float32)
  first = np.asarray(dropout(x, RATE, jax.random.key(1), rng)) == 0
  again = np.asarray(dropout(x, RATE, jax.random.key(1), rng)) == 0
  other = np.asarray(dropout(x, RATE, jax.random.fold_in(jax.random.key(1), 1), rng)) == 0
  np.testing.assert_array_equal(first, again)  # Resumed runs redraw the same masks.
  tolerance = 5 * np.sqrt(RATE ** 2 / first.size)
  assert abs((first & other).mean() - RATE ** 2) < tolerance  # Other key: independent mask.
  flat = first.reshape(-1)
  assert abs((flat[:-1] & flat[1:]).mean() - RATE ** 2) < tolerance  # Neighbours (same word).
  assert abs((flat[:-2] & flat[2:]).mean() - RATE ** 2) < tolerance  # Neighbouring words.
  rows = first.reshape(8, -1)
  assert abs((rows[:-1] & rows[1:]).mean() - RATE ** 2) < tolerance  # Neighbouring rows.


def test_rate_edges_and_gradient():
  x = jnp.arange(1.0, 7.0).reshape(2, 3)
  np.testing.assert_array_equal(dropout(x, 0.0, jax.random.key(0)), x)
  np.testing.assert_array_equal(dropout(x, 1.0, jax.random.key(0)), jnp.zeros_like(x))
  y = dropout(x, 0.5, jax.random.key(0))
  grad = jax.grad(lambda v: jnp.sum(dropout(v, 0.5, jax.random.key(0))))(x)
  np.testing.assert_allclose(grad, np.where(np.asarray(y) == 0, 0.0, 2.0))


def test_config_rejects_an_unknown_dropout_rng():
  with pytest.raises(ValueError, match="dropout_rng"):
    BertConfig(dropout_rng="mt19937")
