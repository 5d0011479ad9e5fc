"""The device mesh (data / fsdp / tensor axes) and the logical-axis rules that place arrays on it.

Parameters carry logical axis names (see `bert_jax/models/model.py`);
`config.mesh.logical_axis_rules` maps them onto mesh axes. Batches are split over data x fsdp. Every
dimension that a rule splits
must divide by the mesh axes it maps to: `check_divisibility` tells which config field does not,
before anything compiles (XLA would fail later with a bare IndivisibleError).
"""

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.models.model import AXIS_SOURCES, BertForPreTraining

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
  """Resolves -1 (all devices left over) in config.mesh into concrete (data, fsdp, tensor)."""
  sizes = [mesh_config.data, mesh_config.fsdp, mesh_config.tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one of data/fsdp/tensor may be -1, got {sizes}")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"config.mesh sizes must be positive or -1, got {sizes}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"config.mesh {sizes}: {num_devices} devices do not divide by {known}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"config.mesh data*fsdp*tensor = {math.prod(sizes)} but there are "
                     f"{num_devices} devices; set one axis to -1 or fix the sizes")
  return tuple(sizes)


def make_mesh(mesh_config, devices: Sequence[Any] | None = None) -> Mesh:
  """A Mesh with axes (data, fsdp, tensor). With config.mesh.dcn_data > 1 the data axis spans
  slices: ICI axes inside a slice, the data-parallel replicas across slices over DCN."""
  devices = list(jax.devices() if devices is None else devices)
  dcn_data = mesh_config.dcn_data
  if dcn_data > 1:
    per_slice = len(devices) // dcn_data
    ici = mesh_shape(mesh_config, per_slice)
    device_array = mesh_utils.create_hybrid_device_mesh(
        ici, (dcn_data, 1, 1), devices=devices)
  else:
    shape = mesh_shape(mesh_config, len(devices))
    try:
      device_array = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
      device_array = np.asarray(devices).reshape(shape)  # E.g. forced CPU devices.
  return Mesh(device_array, MESH_AXES)


def logical_rules(mesh_config) -> tuple[tuple[str, Any], ...]:
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in mesh_config.logical_axis_rules)


def _mesh_axes(rules, logical: str) -> tuple[str, ...]:
  """The mesh axes the first rule for `logical` maps it to (flax's lookup); () = replicated."""
  for name, axes in rules:
    if name == logical:
      return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return ()


def sharded_dims(model_config) -> dict[str, tuple[int, ...]]:
  """Logical axis -> the sizes of every parameter dimension named by it, read from the model's
  own params (traced, nothing allocated): a new block's axes are covered as they are."""
  ids = jax.ShapeDtypeStruct((1, 2), np.int32)
  abstract = jax.eval_shape(lambda i: BertForPreTraining(model_config).init(
      jax.random.key(0), i, i, i, i), ids)
  sizes: dict[str, set[int]] = {}
  boxed = jax.tree.leaves(abstract, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  for leaf in boxed:
    if isinstance(leaf, nn.Partitioned):
      for name, size in zip(leaf.names, leaf.value.shape):
        if name is not None:
          sizes.setdefault(name, set()).add(size)
  return {name: tuple(sorted(found)) for name, found in sizes.items()}


def _describe(model_config, logical: str, size: int) -> tuple[str, str]:
  """(the config fields a dimension comes from, "<what> is") for a mesh error."""
  if logical in AXIS_SOURCES:
    what, fields = AXIS_SOURCES[logical]
    return fields(model_config), what
  return f"a parameter dimension {logical!r} of size {size}", f"the {logical!r} dimension is"


def check_divisibility(model_config, mesh_sizes: dict[str, int], rules) -> None:
  """Raises a one-line ValueError naming the config fields when a dimension the logical `rules`
  split over mesh axes does not divide by their product (`mesh_sizes`: axis -> size)."""
  dims = sharded_dims(model_config)
  order = [a for a in AXIS_SOURCES if a in dims] + sorted(set(dims) - set(AXIS_SOURCES))
  for logical in order:
    axes = _mesh_axes(rules, logical)
    unknown = [axis for axis in axes if axis not in mesh_sizes]
    if unknown:
      raise ValueError(f"config.mesh.logical_axis_rules maps {logical!r} to {unknown}, which are "
                       f"not mesh axes {tuple(mesh_sizes)}")
    shards = math.prod(mesh_sizes[axis] for axis in axes)
    size = next((s for s in dims[logical] if s % shards), None)
    if size is None:
      continue
    fields, what = _describe(model_config, logical, size)
    mesh = " x ".join(f"config.mesh.{axis}={mesh_sizes[axis]}" for axis in axes)
    hint = ""
    if logical == "vocab":
      hint = (f"; set config.model.vocab_pad_multiple to a multiple of {shards}, e.g. "
              f"{math.lcm(128, shards)}")
    raise ValueError(f"{fields} does not divide by {mesh} ({what} split over "
                     f"{'x'.join(axes)} by config.mesh.logical_axis_rules){hint}")


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading (batch) dimension split over data x fsdp; the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def batch_size_per_shard(global_batch_size: int, mesh: Mesh,
                         field: str = "config.train.batch_size") -> int:
  """Rows of `global_batch_size` per data x fsdp shard; `field` is the config field (or
  expression) the size comes from, which the error names (e.g. "config.train.eval_batch_size")."""
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if global_batch_size % shards:
    raise ValueError(f"{field}={global_batch_size} is not divisible by the "
                     f"data x fsdp mesh axes ({mesh.shape['data']} x {mesh.shape['fsdp']} = "
                     f"{shards})")
  return global_batch_size // shards


def logical_to_shardings(abstract_tree, mesh: Mesh, rules) -> Any:
  """Boxed (logically partitioned) abstract tree -> NamedShardings for its unboxed leaves."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def global_batch_from_local(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict:
  """Process-local numpy slices -> global jax.Arrays split over data x fsdp.

  Each process holds its own rows; `jax.make_array_from_process_local_data` stitches them."""
  return {
      name: jax.make_array_from_process_local_data(batch_sharding(mesh, value.ndim), value)
      for name, value in local_batch.items()
  }
