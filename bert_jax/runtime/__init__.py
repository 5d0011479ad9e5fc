"""Process-level services: storage paths (local and gs://), jax.distributed, signals, the workdir lock, the command line and metric writers."""
