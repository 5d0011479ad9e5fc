"""Evaluation over a split's batches, for training runs and for prediction alike: each batch's
outputs and sums, with the padding rows of the last batch (`example_weight` 0) dropped and
the sums added exactly; the task turns them into its scores.

Batches are this process's rows of each global batch; with several processes, per-row outputs
are gathered from all of them (in global row order) before scoring.
"""

import collections
from typing import Any, Callable, Iterable

import jax
import numpy as np
from jax.experimental import multihost_utils

from bert_jax.training import sharding

Outputs = dict[str, np.ndarray]


def to_host(tree):
  """Global (batch-sharded) arrays -> numpy on every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def collect(results: Iterable[tuple[dict[str, Any], dict[str, Any]]], keep_outputs: bool,
            gather: Callable = to_host) -> tuple[Outputs, dict[str, float]]:
  """(outputs with `example_weight`, sums) per batch -> (every real row's outputs [N, ...] in
  order, the summed sums). Outputs are fetched only when `keep_outputs`."""
  sums: dict[str, float] = collections.defaultdict(float)
  gathered: dict[str, list[np.ndarray]] = collections.defaultdict(list)
  for outputs, batch_sums in results:
    for name, value in jax.device_get(batch_sums).items():
      sums[name] += float(value)
    if keep_outputs:
      outputs = dict(gather(outputs))
      keep = np.asarray(outputs.pop("example_weight")) > 0
      for name, value in outputs.items():
        gathered[name].append(np.asarray(value)[keep])
  return {name: np.concatenate(parts) for name, parts in gathered.items()}, dict(sums)


def eval_key(seed: int) -> jax.Array:
  """The key of every evaluation's draws (pretraining's masks): the same at every eval."""
  return jax.random.fold_in(jax.random.key(seed), 1)


def evaluate(params, eval_step, local_batches: Iterable[dict], mesh, seed: int,
             keep_outputs: bool) -> tuple[Outputs, dict[str, float]]:
  """Runs `eval_step(params, global batch, key) -> (outputs, sums)` over every batch (all
  dispatched before any result is fetched) -> `collect`'s (outputs, sums)."""
  key = eval_key(seed)
  pending = [eval_step(params, sharding.global_batch_from_local(local, mesh),
                       jax.random.fold_in(key, index))
             for index, local in enumerate(local_batches)]
  return collect(pending, keep_outputs)


def predict_outputs(forward, params, batches: Iterable[dict]) -> Outputs:
  """Per-row outputs of `forward(params, batch) -> outputs` on one device (prediction: no
  labels, no sums)."""
  results = ((dict(jax.device_get(forward(params, batch)),
                   example_weight=batch["example_weight"]), {}) for batch in batches)
  outputs, _ = collect(results, keep_outputs=True, gather=lambda tree: tree)
  return outputs
