"""The XLA flags of the test process and of every process the tests start (launchers, hosts,
workers), so that numbers compared across processes come from the same compiler settings.

XLA:CPU's LLVM backend runs at -O0: the tests compile a few hundred small programs and run most
of them for a few steps, so compiling is most of their time, and -O0 compiles ~30% faster (a
tiny train step: ~6 s -> ~4 s). Numbers are compared within the suite, never against -O2 runs.
"""

COMPILER = "--xla_backend_optimization_level=0"


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a process with `devices` simulated CPU devices."""
  return f"--xla_force_host_platform_device_count={devices} {COMPILER}"
