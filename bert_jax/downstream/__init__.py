"""Downstream suites (GLUE-style task specs, the suite runner and its metrics)."""
