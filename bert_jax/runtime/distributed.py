"""JAX's multi-host runtime: `jax.distributed.initialize` from flags, or automatically on TPU VMs
and SLURM/Open MPI clusters where JAX detects the cluster itself.

On a SLURM GPU job the local devices of each process are given explicitly
(`slurm_local_device_ids`): JAX alone gives every process the one GPU of its local rank, which is
right for one process per GPU (the scheme of `launch/slurm_gpu.sbatch`, as JAX documents it) but
leaves 7 of 8 GPUs idle when one process per node was asked for.
"""

import os
import re
from collections.abc import Mapping

import jax
from absl import flags, logging

_COORDINATOR = "coordinator_address"
_NUM_PROCESSES = "num_processes"
_PROCESS_ID = "process_id"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  define = {"flag_values": flag_values}
  flags.DEFINE_string(_COORDINATOR, None, "host:port of process 0, for multi-process runs "
                      "outside auto-detected clusters (TPU VMs, SLURM).", **define)
  flags.DEFINE_integer(_NUM_PROCESSES, None, "Number of processes (with --coordinator_address).",
                       **define)
  flags.DEFINE_integer(_PROCESS_ID, None, "This process's index (with --coordinator_address).",
                       **define)
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with cluster "
                    "auto-detection (TPU pod slices, SLURM, Open MPI).", **define)
  flags.DEFINE_integer("initialization_timeout", 300, "Seconds to wait for all processes to join.",
                       **define)
  flags.DEFINE_integer("heartbeat_timeout", 100, "Seconds without a heartbeat after which a "
                       "process is declared dead and every other process stops with an error.",
                       **define)


def initialize_from_flags(values: flags.FlagValues = flags.FLAGS) -> None:
  """Initialises the multi-host runtime when asked to; a single process needs nothing."""
  explicit = [values[_COORDINATOR].value, values[_NUM_PROCESSES].value,
              values[_PROCESS_ID].value]
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise flags.ValidationError(
          "--coordinator_address, --num_processes and --process_id go together")
    jax.distributed.initialize(
        coordinator_address=values[_COORDINATOR].value,
        num_processes=values[_NUM_PROCESSES].value, process_id=values[_PROCESS_ID].value,
        initialization_timeout=values.initialization_timeout,
        heartbeat_timeout_seconds=values.heartbeat_timeout)
  elif values.distributed:
    jax.distributed.initialize(initialization_timeout=values.initialization_timeout,
                               heartbeat_timeout_seconds=values.heartbeat_timeout,
                               local_device_ids=slurm_local_device_ids(os.environ))
  else:
    return
  logging.info("Process %d of %d, %d local / %d global devices (pid %d)", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(), os.getpid())


def _tasks_per_node(spec: str) -> list[int]:
  """SLURM's tasks-per-node list, e.g. "8(x2),4" -> [8, 8, 4]."""
  counts = []
  for part in spec.split(","):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
    if match is None:
      raise ValueError(f"Cannot read SLURM's tasks per node {spec!r}")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def slurm_local_device_ids(environ: Mapping[str, str]) -> list[int] | None:
  """The GPUs (CUDA ordinals as this process sees them) that this SLURM task owns: the node's
  visible GPUs split evenly over the node's tasks, in local-rank order. One task per GPU gets
  [SLURM_LOCALID] (JAX's own default), one task per node all of them, and a task that SLURM bound
  to its own GPUs (--gpus-per-task: fewer visible GPUs than tasks) all it sees. None outside a
  SLURM GPU job (JAX decides) or when JAX_LOCAL_DEVICE_IDS is set."""
  needed = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
            "SLURM_LOCALID")  # What JAX's SLURM detection reads.
  if not all(k in environ for k in needed) or "JAX_LOCAL_DEVICE_IDS" in environ:
    return None
  node_gpus = int(environ["SLURM_GPUS_ON_NODE"]) if environ.get("SLURM_GPUS_ON_NODE") else None
  listed = environ.get("CUDA_VISIBLE_DEVICES")
  visible = len([d for d in listed.split(",") if d.strip()]) if listed is not None else node_gpus
  if visible is None:
    return None  # Not a GPU job (or GPUs SLURM does not manage): JAX decides.
  if visible == 0:
    raise ValueError("This SLURM task sees no GPU (CUDA_VISIBLE_DEVICES is empty): ask for "
                     "GPUs with --gpus-per-node")
  spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
  tasks_here = (_tasks_per_node(spec)[int(environ.get("SLURM_NODEID", "0"))] if spec
                else int(environ["SLURM_NTASKS"]))
  if visible < (node_gpus or visible) or visible < tasks_here:
    return list(range(visible))  # SLURM bound this task to its own GPUs (--gpus-per-task).
  if visible % tasks_here:
    raise ValueError(f"{visible} GPUs on this node do not divide evenly over its {tasks_here} "
                     "SLURM tasks: use one task per GPU (--ntasks-per-node equal to "
                     "--gpus-per-node, as launch/slurm_gpu.sbatch does) or one per node")
  per_task, local = visible // tasks_here, int(environ["SLURM_LOCALID"])
  return list(range(local * per_task, (local + 1) * per_task))
