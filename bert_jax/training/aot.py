"""Ahead-of-time compiles of a run's programs for the chips it will run on (`launch/train.py
--compile_only [--topology=v5e:4x4]`): the init, train and eval steps of the task, compiled by
the real compiler of the target on `config.mesh` laid over its devices, against abstract shapes
(nothing allocated, no data read), and one report of what that costs per chip.

With a topology the target is a TPU slice this host does not have: libtpu (the `tpu` extra)
gives its abstract devices (`jax.experimental.topologies`) and the TPU compiler partitions,
inserts the collectives, lowers splash attention through Mosaic and lays out the memory, as it
would on the slice. Every chip-dependent choice of the model reads the mesh's device
(`models.target`). Without one the target is this process's own devices.

The report (`report`): memory per chip against the chip's memory (`fits`), the compile times,
the model's FLOPs, the collectives of the train step (`collectives.py`), and a lower bound on the
step time from FLOPs against the chip's peak and bytes against its HBM, ICI and DCN bandwidths
(`estimated_*`: arithmetic on public figures, never a measurement; docs/tpu.md gives the method).
"""

import contextlib
import dataclasses
import os
import re
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.compilation_cache import compilation_cache

from bert_jax.models import flops, model
from bert_jax.tasks.base import Task
from bert_jax.training import collectives, programs, sharding
from bert_jax.training.settings import TrainSettings

GIB = 2 ** 30
TPU_INSTALL = "pip install -e '.[tpu]' (or -r requirements-tpu.txt)"
# family:AxB or family:AxBxC, as jax.experimental.topologies names a slice.
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$")
# Families whose chips hold two TensorCores run as one device each ("megacore"), as a TPU VM's
# runtime presents them.
_MEGACORE = ("v4", "v5p")


@dataclasses.dataclass(frozen=True)
class Chip:
  """The figures of one chip the step-time bound is computed from.

  hbm_gib: the HBM the TPU compiler allows a program (its own figure: what a compile that does
  not fit reports as "available HBM"); bandwidths in bytes/s from Cloud TPU's pages: HBM, ICI
  (per chip, one direction: half the bidirectional figure) and DCN (per chip: the host's NICs
  over its chips)."""
  hbm_gib: float
  hbm_bytes_per_s: float
  ici_bytes_per_s: float
  dcn_bytes_per_s: float


# By `device_kind`. v4: 1200 GB/s HBM, ICI from its pod's 1.1 PB/s all-reduce bandwidth over
# 4096 chips; v5e: 819 GB/s, 400 GB/s bidirectional ICI, 2 x 100 Gb/s NICs per 8-chip host;
# v5p: 2765 GB/s, 1200 GB/s ICI, 50 Gb/s DCN per chip; v6e: 1638 GB/s, 800 GB/s ICI, DCN as v5e.
CHIPS = {
    "TPU v4": Chip(30.75, 1200e9, 268e9, 6.25e9),
    "TPU v5 lite": Chip(15.75, 819e9, 200e9, 3.125e9),
    "TPU v5": Chip(95.74, 2765e9, 600e9, 6.25e9),
    "TPU v6 lite": Chip(31.25, 1638e9, 400e9, 3.125e9),
}


STEPS = ("init", "train", "eval")  # The programs a compile-only report compiles by default.


@dataclasses.dataclass(frozen=True)
class Target:
  """Where the programs are compiled for: a named TPU topology or this process's devices."""
  devices: Sequence[Any]
  topology: str = ""  # "" = this process's own devices.
  num_slices: int = 1

  @property
  def device_kind(self) -> str:
    return self.devices[0].device_kind

  @property
  def platform(self) -> str:
    return self.devices[0].platform


def host_target() -> Target:
  return Target(tuple(jax.devices()))


def topology_target(name: str, num_slices: int = 1) -> Target:
  """The abstract devices of TPU slice `name` (e.g. "v5e:4x4", "v5p:2x2x1"), `num_slices` of
  them joined over DCN. A one-line ValueError for a name the compiler does not know, or
  without libtpu."""
  match = _TOPOLOGY.match(name)
  if not match:
    raise ValueError(f"--topology={name!r} is not a TPU slice: use FAMILY:AxB or FAMILY:AxBxC "
                     "with FAMILY one of v4, v5e, v5p, v6e (e.g. v5e:4x4, v5p:2x2x1, v4:2x2x1)")
  if num_slices < 1:
    raise ValueError(f"--num_slices={num_slices} must be at least 1")
  try:
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ValueError(f"--topology needs libtpu, the TPU compiler: {TPU_INSTALL}") from None
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  # Compiling touches no chip: other processes may hold libtpu too (its lock file would refuse
  # a second compile-only run, or one beside a training on a TPU VM).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  options = {"chip_config_name": "megacore"} if match.group(1) in _MEGACORE else {}
  if num_slices > 1:
    options["num_slices"] = num_slices
  with _quiet_native_stderr():
    try:
      devices = topologies.get_topology_desc(topology_name=name, platform="tpu",
                                             **options).devices
    except Exception as error:  # pylint: disable=broad-except  (libtpu's own error types)
      raise ValueError(f"--topology={name!r}: the TPU compiler refuses it "
                       f"({_first_line(error)})") from None
  return Target(tuple(devices), name, num_slices)


class _quiet_native_stderr:  # pylint: disable=invalid-name
  """libtpu writes warnings about the TPU VM it is not on (TPU_ACCELERATOR_TYPE, worker
  hostnames) straight to file descriptor 2 when it starts: kept off the console, so that a
  compile-only run prints its report or its one error line."""

  def __enter__(self):
    import tempfile  # pylint: disable=import-outside-toplevel
    self._saved = os.dup(2)
    self._sink = tempfile.TemporaryFile()
    os.dup2(self._sink.fileno(), 2)
    return self

  def __exit__(self, *exc):
    os.dup2(self._saved, 2)
    os.close(self._saved)
    self._sink.close()
    return False


def _first_line(error: BaseException) -> str:
  return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def target_mesh(settings: TrainSettings, target: Target):
  """config.mesh over the target's devices; on several slices the data axis must span them."""
  if target.num_slices > 1 and settings.mesh.dcn_data != target.num_slices:
    raise ValueError(f"--num_slices={target.num_slices} needs config.mesh.dcn_data="
                     f"{target.num_slices} (the data-parallel replicas across slices), got "
                     f"{settings.mesh.dcn_data}")
  return sharding.make_mesh(settings.mesh, target.devices)


def device_memory_gib(target: Target) -> tuple[float | None, str]:
  """(GiB a program may use on one device, where the figure comes from)."""
  chip = CHIPS.get(target.device_kind)
  if chip:
    return chip.hbm_gib, f"{target.device_kind} HBM (the TPU compiler's limit)"
  device = target.devices[0]
  if target.platform == "cpu":
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local = sum(d.process_index == device.process_index for d in target.devices)
    return total / GIB / local, f"this host's memory over its {local} devices"
  try:
    return device.memory_stats()["bytes_limit"] / GIB, f"{target.device_kind} memory"
  except Exception:  # pylint: disable=broad-except  (no stats on this backend)
    return None, f"unknown for {target.device_kind}"


# ------------------------------------------------------------------------------ compiling


def eval_batch_spec(task: Task, batch_size: int, mesh) -> dict[str, jax.ShapeDtypeStruct]:
  """An abstract eval batch: the task's rows one example each (as eval reads them) and the
  padding rows' `example_weight`, split over data x fsdp."""
  shapes = {name: ((batch_size, *shape), dtype)
            for name, (shape, dtype) in task.batch_signature().items()}
  shapes["example_weight"] = ((batch_size,), jnp.float32)
  return {name: jax.ShapeDtypeStruct(shape, dtype,
                                     sharding=sharding.batch_sharding(mesh, len(shape)))
          for name, (shape, dtype) in shapes.items()}


class DoesNotFit(ValueError):
  """The compiler refused a program for want of memory (it checks its temporaries alone)."""

  def __init__(self, needed_gib: float, available_gib: float, program: str):
    super().__init__(f"{program}: {needed_gib:.2f} GiB of temporaries, {available_gib:.2f} GiB "
                     "available")
    self.needed_gib, self.available_gib, self.program = needed_gib, available_gib, program


def _compile(lowered, program: str):
  """lowered.compile(), with the compiler's out-of-memory refusal as `DoesNotFit`."""
  try:
    return lowered.compile()
  except Exception as error:  # pylint: disable=broad-except  (XLA's runtime error types)
    text = str(error)
    # XLA writes sizes in binary units: "2.00T", "15.75G", "512.0M", "64B".
    found = re.search(r"required for HLO temporaries \(([\d.]+)([TGMKB])\) exceeds available "
                      r"HBM \(([\d.]+)([TGMKB])\)", text)
    if "RESOURCE_EXHAUSTED" in text and found:
      scale = {"T": 1024.0, "G": 1.0, "M": 1 / 1024, "K": 1 / 2**20, "B": 1 / 2**30}
      raise DoesNotFit(float(found.group(1)) * scale[found.group(2)],
                       float(found.group(3)) * scale[found.group(4)], program) from None
    raise


def _memory(compiled) -> dict[str, float]:
  """XLA's memory analysis of one program, in GiB per device."""
  memory = compiled.memory_analysis()
  if memory is None:
    return {}
  return {"arguments_gib": memory.argument_size_in_bytes / GIB,
          "outputs_gib": memory.output_size_in_bytes / GIB,
          "temporaries_gib": memory.temp_size_in_bytes / GIB,
          "code_gib": memory.generated_code_size_in_bytes / GIB}


@contextlib.contextmanager
def _without_persistent_cache():
  """jax's persistent compilation cache off (JAX_COMPILATION_CACHE_DIR, often set on TPU VMs):
  it cannot load an executable compiled for a topology's abstract devices (jax warns once per
  program), and a report's compile seconds are a compile's, not a cache read's.
  jax decides once per process whether the cache is used: that decision is reset on both sides."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


def compile_programs(settings: TrainSettings, task: Task, mesh,
                     steps: tuple[str, ...] = STEPS) -> dict[str, Any]:
  """The init, train and eval steps (those in `steps`) compiled for `mesh`'s devices, never read
  from the persistent cache -> {program: (compiled, seconds)}. Raises `DoesNotFit` when the
  compiler runs out of memory."""
  prog = programs.make_program(settings, task, mesh)
  key = programs.abstract_key(mesh)  # Replicated, as the run's keys are: its programs.
  compiled = {}
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(settings.mesh)), \
      _without_persistent_cache():
    state = prog.sharded_abstract_state()
    lowerings = {
        "init": lambda: prog.init.lower(key),
        "train": lambda: prog.train_step.lower(
            state, programs.batch_spec(task, settings.batch_size, mesh,
                                       settings.step.grad_accum_steps), key),
        "eval": lambda: prog.eval_step.lower(
            state.params, eval_batch_spec(task, settings.eval_batch_size, mesh), key)}
    for name in steps:
      lower = lowerings[name]
      start = time.time()
      compiled[name] = (_compile(lower(), f"the {name} step"), time.time() - start)
  return compiled


# ------------------------------------------------------------------------------ the report


def report(settings: TrainSettings, task: Task, target: Target,
           steps: tuple[str, ...] = STEPS) -> dict[str, Any]:
  """Compiles the run's programs (`steps`, train among them) for `target` and reports their
  cost per chip (see the module docstring). A program the compiler refuses for memory gives a
  report with `fits` false."""
  mesh = target_mesh(settings, target)
  programs.check_mesh(settings, task.model_config, mesh)
  memory_gib, memory_source = device_memory_gib(target)
  with jax.set_mesh(mesh):
    impl = model.resolve_attention_impl(task.model_config, length=task.seq_len)
  head = {
      "topology": target.topology or None, "num_slices": target.num_slices,
      "platform": target.platform, "device_kind": target.device_kind,
      "devices": len(target.devices), "mesh": dict(mesh.shape),
      "attention_impl": impl,
      "attention_in_training": ("einsum (attention dropout)"
                                if task.model_config.attention_probs_dropout_prob > 0 else impl),
      "batch_size": settings.batch_size, "eval_batch_size": settings.eval_batch_size,
      "batch_per_chip": settings.batch_size / len(target.devices),
      "grad_accum_steps": settings.step.grad_accum_steps, "remat": task.model_config.remat,
      "hbm_gib": memory_gib, "hbm_source": memory_source, "compile_steps": list(steps)}
  start = time.time()
  try:
    compiled = compile_programs(settings, task, mesh, steps)
  except DoesNotFit as refused:
    return {**head, "fits": False, "per_device_gib": refused.needed_gib,
            "refused_by_compiler": str(refused), "compile_seconds": time.time() - start}
  memory = {name: _memory(program) for name, (program, _) in compiled.items()}
  train = memory["train"]
  per_device = None
  if train:
    # Donated state: the train step's outputs reuse its arguments. Evaluation runs beside the
    # resident state (the train step's arguments stand for it); init writes the state.
    needs = {"train": train["arguments_gib"] + train["temporaries_gib"] + train["code_gib"]}
    if "eval" in memory:
      needs["eval"] = (train["arguments_gib"] + memory["eval"]["temporaries_gib"]
                       + memory["eval"]["code_gib"])
    if "init" in memory:
      needs["init"] = (memory["init"]["outputs_gib"] + memory["init"]["temporaries_gib"]
                       + memory["init"]["code_gib"])
    per_device = max(needs.values())
    memory.update({name: {**memory[name], "total_gib": value} for name, value in needs.items()})
  flops_per_example = task.flops_per_example()
  step_flops = settings.batch_size * flops_per_example if flops_per_example else None
  texts = {name: program.as_text() for name, (program, _) in compiled.items()}
  hlo = texts["train"]
  slices = [getattr(d, "slice_index", 0) or 0 for d in mesh.devices.flat]
  found = collectives.collectives(hlo, slices)
  result = {
      **head, "fits": None if per_device is None or memory_gib is None
      else bool(per_device <= memory_gib),
      "per_device_gib": per_device,
      **{f"{name}_{key}": value for name, values in memory.items()
         for key, value in values.items()},
      "compile_seconds": sum(seconds for _, seconds in compiled.values()),
      **{f"compile_seconds_{name}": seconds for name, (_, seconds) in compiled.items()},
      "model_flops_per_step": step_flops,
      "model_flops_per_chip": step_flops / len(target.devices) if step_flops else None,
      "collectives": {kind: {"count": v["count"], "bytes": v["bytes"]}
                      for kind, v in found.items() if kind in collectives.KINDS},
      "collective_unknown_trip_counts": len(found["unknown_trip_counts"]),
      # Pallas kernels compiled by Mosaic (splash attention on a TPU) per program.
      "mosaic_kernels": {name: text.count('custom_call_target="tpu_custom_call"')
                         for name, text in texts.items()}}
  result.update(estimate(target, step_flops, train, found))
  return result


def estimate(target: Target, step_flops: float | None, train_memory: dict[str, float],
             found: dict) -> dict[str, Any]:
  """A lower bound on the train step's time on the target: each resource at its peak and all
  of them overlapped, so the step takes at least the longest of
  - compute: the model's FLOPs per chip at the chip's bf16 peak;
  - HBM: the state read once and written once (the step's arguments and outputs);
  - ICI / DCN: what the chip sends for the step's collectives (ring algorithm) at its links'
    bandwidth.
  The MFU ceiling is compute / bound. Figures for chips in `CHIPS` only."""
  chip, peak = CHIPS.get(target.device_kind), flops.peak_flops_per_device(target.device_kind)
  if chip is None or peak is None or not step_flops or not train_memory:
    return {"estimated_step_seconds_lower_bound": None}
  devices = len(target.devices)
  ici = sum(v["sent_bytes_per_chip"] for k, v in found.items() if k in collectives.KINDS)
  dcn = sum(v["dcn_sent_bytes_per_chip"] for k, v in found.items() if k in collectives.KINDS)
  seconds = {
      "compute": step_flops / devices / peak,
      "hbm": (train_memory["arguments_gib"] + train_memory["outputs_gib"]) * GIB
      / chip.hbm_bytes_per_s,
      "ici": ici / chip.ici_bytes_per_s,
      "dcn": dcn / chip.dcn_bytes_per_s}
  bound = max(seconds.values())
  return {"estimated_ici_bytes_per_chip": ici, "estimated_dcn_bytes_per_chip": dcn,
          **{f"estimated_{name}_seconds": value for name, value in seconds.items()},
          "estimated_step_seconds_lower_bound": bound,
          "estimated_bound_by": max(seconds, key=seconds.get),
          "estimated_mfu_ceiling": seconds["compute"] / bound if bound else None}


def fit_error(result: dict[str, Any]) -> str:
  """The one line for a report that does not fit: GiB needed per chip against the chip's
  memory, and the fields that lower it."""
  mesh = result["mesh"]
  per_chip = result["batch_per_chip"]
  hints = [f"config.train.batch_size (now {result['batch_size']}, "
           f"{int(per_chip) if per_chip == int(per_chip) else per_chip} per chip)"]
  if result["grad_accum_steps"] == 1:
    hints.append("raise config.train.grad_accum_steps (microbatches)")
  if result["remat"] != "full":
    hints.append(f"set config.model.remat='full' (now {result['remat']!r})")
  if mesh["data"] > 1:
    hints.append(f"move config.mesh.data into config.mesh.fsdp (now data {mesh['data']}, fsdp "
                 f"{mesh['fsdp']}: params and optimizer state sharded)")
  where = result["topology"] or f"this host's {result['device_kind']}"
  at_least = "at least " if result.get("refused_by_compiler") else ""
  return (f"the config does not fit {where}: it needs {at_least}{result['per_device_gib']:.2f} GiB per "
          f"chip, more than the {result['hbm_gib']:.2f} GiB of {result['hbm_source']}; lower "
          + ", or ".join(hints))


def check_fits(result: dict[str, Any]) -> None:
  """A one-line ValueError when the report says the config does not fit."""
  if result.get("fits") is False:
    raise ValueError(fit_error(result))


def target(topology: str = "", num_slices: int = 1) -> Target:
  """--topology / --num_slices: a TPU slice, or this process's devices when empty."""
  if not topology:
    if num_slices != 1:
      raise ValueError("--num_slices needs --topology (the slices' chips, e.g. v5e:4x4)")
    return host_target()
  return topology_target(topology, num_slices)
