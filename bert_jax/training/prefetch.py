"""Batches to the devices ahead of the step: host input work overlaps the (asynchronously
dispatched) train step, and each batch comes with the input iterator's position after it."""

import collections
import json
from typing import Iterator

from bert_jax.training import sharding


def prefetched(train_iter, mesh, depth: int) -> Iterator[tuple[dict, bytes]]:
  """Yields (global device batch, iterator state after it), keeping `depth` batches in flight.
  The state is recorded per batch: a checkpoint must resume after the last *consumed* batch,
  not the last prefetched one."""
  queue = collections.deque()
  while True:
    while len(queue) <= depth:
      local = next(train_iter)
      state = json.dumps(train_iter.get_state()).encode()
      queue.append((sharding.global_batch_from_local(local, mesh), state))
    yield queue.popleft()
