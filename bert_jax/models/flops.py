"""FLOPs of BERT pretraining, counted for an encoder and derived from the model's own params: every
kernel of the encoder layers is one matmul per token, attention adds its score and weighting
matmuls (bidirectional: the full L x L score matrix in a global layer, no causal halving; the
window's keys in a local one), and the MLM head runs at
the P gathered positions only, over the real vocabulary (`vocab_size`; the rows of
`vocab_pad_multiple` padding are layout, not model work). A new block (a gated MLP, another
attention) is counted as it is, with no formula to restate."""

import math
from collections.abc import Sequence
from typing import Any

from bert_jax.models.model import BertConfig, param_shapes

_LAYERS = ("bert", "encoder", "layers")


def _kernel_weights(shapes: dict[tuple[str, ...], tuple[int, ...]], prefix: tuple[str, ...]) -> int:
  """Weights of the matmul kernels under `prefix` (all layers of a stacked prefix together)."""
  return sum(math.prod(shape) for path, shape in shapes.items()
             if path[:len(prefix)] == prefix and path[-1] == "kernel")


def forward_flops_per_sequence(config: BertConfig, seq_len: int, num_predictions: int) -> float:
  """Matmul FLOPs (2 per multiply-add) of one forward pass over one sequence."""
  shapes = param_shapes(config)
  h, length = config.hidden_size, seq_len
  layers = 2 * length * _kernel_weights(shapes, _LAYERS)  # Projections and MLP, every layer.
  # Scores Q K^T and probabilities x V: 2 x L x keys x H multiply-adds per layer, keys = L in
  # a global layer and the local_attention + 1 rows of the window in a local one.
  local_keys = min(length, config.local_attention + 1)
  layers_local = config.num_hidden_layers - config.num_global_layers
  attention = 2 * 2 * length * h * (config.num_global_layers * length + layers_local * local_keys)
  # The tied decoder: the real rows of the embedding table, E wide.
  decoder = config.vocab_size * config.embedding_width
  mlm_head = 2 * num_predictions * (_kernel_weights(shapes, ("mlm",)) + decoder)
  layers += 2 * length * _kernel_weights(shapes, ("bert", "embeddings_project"))  # E != H.
  pooler_nsp = 2 * (_kernel_weights(shapes, ("bert", "pooler")) + _kernel_weights(shapes, ("nsp",)))
  return layers + attention + mlm_head + pooler_nsp


def train_flops_per_sequence(config: BertConfig, seq_len: int, num_predictions: int) -> float:
  """Forward + backward (twice the forward: gradients w.r.t. inputs and weights)."""
  return 3 * forward_flops_per_sequence(config, seq_len, num_predictions)


# Peak dense matmul FLOP/s per chip in bf16, by `jax.devices()[0].device_kind`.
PEAK_FLOPS_BY_DEVICE_KIND = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
}


def peak_flops_per_device(device_kind: str) -> float | None:
  """The table's peak for this device kind, or None when unknown (e.g. CPUs)."""
  return PEAK_FLOPS_BY_DEVICE_KIND.get(device_kind)


def total_peak_flops(devices: Sequence[Any]) -> tuple[float | None, str]:
  """The peak FLOP/s of all `devices` together, for MFU, and where it comes from.

  A chip in the table: its peak x the number of devices. CPU devices (also the forced ones of a
  simulated mesh, which share their host's cores): a matmul measured on this host, x the hosts.
  Any other chip: None, MFU is not reported (a matmul measured on one device would be one
  device's f32 speed, not the chip's peak, and not all devices').
  """
  kind = devices[0].device_kind
  per_device = peak_flops_per_device(kind)
  if per_device:
    return per_device * len(devices), f"{kind}: {per_device:.3g} FLOP/s x {len(devices)} devices"
  if devices[0].platform == "cpu":
    hosts = len({d.process_index for d in devices})
    return measure_matmul_peak() * hosts, f"f32 matmul measured on this host x {hosts} host(s)"
  return None, (f"no peak FLOP/s known for device kind {kind!r}, so no MFU is reported; add it to "
                "PEAK_FLOPS_BY_DEVICE_KIND in bert_jax/models/flops.py")


def measure_matmul_peak(size: int = 1024, repeats: int = 10) -> float:
  """Achieved f32 FLOP/s of a square matmul on the default device (a CPU's practical peak)."""
  import time
  import jax
  import jax.numpy as jnp
  a = jnp.ones((size, size), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best
