"""The XLA flags of the test process and of every process the tests start (launchers, hosts,
workers), so that numbers compared across processes come from the same compiler settings.

XLA:CPU's LLVM backend runs at -O0, with the elemental IR emitters instead of the MLIR fusion
emitters: the tests compile a few hundred small programs and run most of them for a few steps,
so compiling is most of their time. -O0 compiles ~30% faster (a tiny train step: ~6 s -> ~4 s),
and the elemental emitters ~40% faster again (tests/modern_runs.py's tiny train step, compiled
on one device: 3.1 s -> 1.9 s; on 8: 3.7 s -> 2.5 s). Numbers are compared within the suite, never against runs with XLA's defaults.
"""

COMPILER = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a process with `devices` simulated CPU devices."""
  return f"--xla_force_host_platform_device_count={devices} {COMPILER}"
