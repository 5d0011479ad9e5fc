"""JAX's multi-host runtime: `jax.distributed.initialize` from flags, or automatically on TPU VMs
and SLURM/Open MPI clusters where JAX detects the cluster itself."""

import os

import jax
from absl import flags, logging

_COORDINATOR = "coordinator_address"
_NUM_PROCESSES = "num_processes"
_PROCESS_ID = "process_id"


def define_flags() -> None:
  flags.DEFINE_string(_COORDINATOR, None, "host:port of process 0, for multi-process runs "
                      "outside auto-detected clusters (TPU VMs, SLURM).")
  flags.DEFINE_integer(_NUM_PROCESSES, None, "Number of processes (with --coordinator_address).")
  flags.DEFINE_integer(_PROCESS_ID, None, "This process's index (with --coordinator_address).")
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with cluster "
                    "auto-detection (TPU pod slices, SLURM, Open MPI).")
  flags.DEFINE_integer("initialization_timeout", 300, "Seconds to wait for all processes to join.")
  flags.DEFINE_integer("heartbeat_timeout", 100, "Seconds without a heartbeat after which a "
                       "process is declared dead and every other process stops with an error.")


def initialize_from_flags() -> None:
  """Initialises the multi-host runtime when asked to; a single process needs nothing."""
  values = flags.FLAGS
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
                               heartbeat_timeout_seconds=values.heartbeat_timeout)
  else:
    return
  logging.info("Process %d of %d, %d local / %d global devices (pid %d)", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(), os.getpid())
