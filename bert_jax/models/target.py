"""The device a trace is compiled for, which every chip-dependent choice reads (attention
"auto", whether splash runs as a Mosaic kernel or interpreted).

Under `jax.set_mesh(mesh)` it is the mesh's abstract device: a TPU slice compiled ahead of time
from a CPU host (`--compile_only --topology=v5e:4x4`) is a TPU here although `jax.devices()` is
the host's CPU. Without a mesh it is this process's first device."""

import jax


def target_device():
  """An object with `.platform` ("tpu", "gpu", "cpu") and `.device_kind` ("TPU v5 lite")."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  return jax.devices()[0] if device is None else device


def target_platform() -> str:
  return target_device().platform
