"""The one checkpoint owner (orbax manager, integrity checks)."""
