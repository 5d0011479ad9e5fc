"""Verification records of checkpoints: the size and checksum of every file of a finished
checkpoint, written once orbax has committed it and checked before it is restored, so a
checkpoint damaged in storage (truncated, garbled, files missing) is never trained from.
Checksums are CRC-32 of local files, and the object's own CRC-32C in a GCS bucket (read from
its metadata: nothing is downloaded). `bert_jax/checkpoints/checkpointing.py` is the only user."""

import json

from absl import logging

from bert_jax.runtime import storage

MANIFEST_FILE = "bert_jax_manifest.json"


def _listing(step_dir: str) -> dict[str, dict]:
  """{path relative to the step directory: {"bytes", "checksum"}} of every file but the
  record itself."""
  return {relative: found for relative, found in sorted(storage.describe_files(step_dir).items())
          if not relative.startswith(MANIFEST_FILE)}


def write_manifest(step_dir: str) -> None:
  """Records the files of a committed checkpoint (written at once: never a partial record)."""
  storage.write_text(storage.join(step_dir, MANIFEST_FILE),
                     json.dumps({"version": 2, "files": _listing(step_dir)}, indent=1,
                                sort_keys=True))


def damage(step_dir: str) -> str | None:
  """Why the committed checkpoint in `step_dir` cannot be trusted, or None when every recorded
  file is there with its size and checksum. One without a record (the run stopped between
  orbax's commit and the record: seconds in a bucket) is trusted on orbax's word."""
  manifest = storage.join(step_dir, MANIFEST_FILE)
  if not storage.exists(manifest):
    logging.info("Checkpoint %s has no verification record (the run stopped right after saving "
                 "it); orbax marked it complete, so it is trusted.", step_dir)
    return None
  try:
    recorded = json.loads(storage.read_text(manifest))["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"its verification record is unreadable ({e})"
  found = _listing(step_dir)  # One listing in a bucket.
  for relative, expected in sorted(recorded.items()):
    if relative not in found:
      return f"{relative} is missing"
    if found[relative]["bytes"] != expected["bytes"]:
      return f"{relative} has {found[relative]['bytes']} bytes, {expected['bytes']} were written"
    if found[relative]["checksum"] != expected["checksum"]:
      return f"{relative} does not match its checksum"
  return None
