"""Process-level services: storage paths (local and gs://), jax.distributed, signals, the
workdir lock, the launchers' shared command line and metric writers."""
