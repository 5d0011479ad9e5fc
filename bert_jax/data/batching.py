"""The rows of global batches that each process reads: the one rule for training and evaluation,
pretraining and fine-tuning alike.

Global batch g of a split holds rows [g B, (g + 1) B); process p of P holds its contiguous
slice [p B/P, (p + 1) B/P) of each, so the global batch (and what is drawn for it) is the same
for any number of processes. An evaluation pass covers every row once; its last batch is filled
with copies of row 0 that weigh 0 (`example_weight`), so shapes stay static and means over the
split are exact.
"""

import math
from typing import Iterator

import numpy as np


def per_host_batch_size(global_batch_size: int, process_count: int,
                        field: str = "config.train.batch_size") -> int:
  """global_batch_size // process_count; a ValueError naming `field` when it does not divide."""
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise ValueError(f"{field}={global_batch_size} must be a positive multiple of the number of "
                     f"processes ({process_count})")
  return global_batch_size // process_count


def eval_rows(num_rows: int, global_batch_size: int, process_index: int, process_count: int,
              max_batches: int = 0, field: str = "config.train.eval_batch_size"
              ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(this process's row indices [B/P] int64, their example_weight [B/P] float32) of every
  global batch of one pass over `num_rows` rows (at most `max_batches` > 0 of them). Rows past
  the end are row 0, weighted 0."""
  per_host = per_host_batch_size(global_batch_size, process_count, field)
  num_batches = math.ceil(num_rows / global_batch_size)
  if max_batches > 0:
    num_batches = min(num_batches, max_batches)
  for batch in range(num_batches):
    indices = batch * global_batch_size + process_index * per_host + np.arange(per_host)
    real = indices < num_rows
    yield np.where(real, indices, 0), real.astype(np.float32)
