"""Verification records of checkpoints: the size and CRC-32 of every file of a finished
checkpoint, written once orbax has committed it and checked before it is restored, so a
checkpoint damaged on disk (truncated, garbled, files missing) is never trained from.
`bert_jax/checkpointing.py` is the only user."""

import json
import os
import zlib

MANIFEST_FILE = "bert_jax_manifest.json"
_CHUNK = 1 << 20


def _crc32(path: str) -> int:
  crc = 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return crc


def _listing(step_dir: str) -> dict[str, dict[str, int]]:
  """{path relative to the step directory: {"bytes", "crc32"}} of every file but the manifest."""
  files = {}
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.join(root, name)
      relative = os.path.relpath(path, step_dir)
      if not relative.startswith(MANIFEST_FILE):  # The record and its temporary file.
        files[relative] = {"bytes": os.path.getsize(path), "crc32": _crc32(path)}
  return files


def write_manifest(step_dir: str) -> None:
  """Records the files of a committed checkpoint (atomically: a partial record never exists)."""
  temporary = os.path.join(step_dir, MANIFEST_FILE + ".tmp")
  with open(temporary, "w") as f:
    json.dump({"version": 1, "files": _listing(step_dir)}, f, indent=1, sort_keys=True)
  os.replace(temporary, os.path.join(step_dir, MANIFEST_FILE))


def has_manifest(step_dir: str) -> bool:
  return os.path.isfile(os.path.join(step_dir, MANIFEST_FILE))


def damage(step_dir: str) -> str | None:
  """Why the checkpoint in `step_dir` cannot be trusted, or None when every recorded file is
  there with its size and checksum."""
  manifest = os.path.join(step_dir, MANIFEST_FILE)
  if not os.path.isfile(manifest):
    return "it has no verification record (the run stopped before it was written)"
  try:
    with open(manifest) as f:
      recorded = json.load(f)["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"its verification record is unreadable ({e})"
  for relative, expected in sorted(recorded.items()):
    path = os.path.join(step_dir, relative)
    if not os.path.isfile(path):
      return f"{relative} is missing"
    if os.path.getsize(path) != expected["bytes"]:
      return f"{relative} has {os.path.getsize(path)} bytes, {expected['bytes']} were written"
    if _crc32(path) != expected["crc32"]:
      return f"{relative} does not match its checksum"
  return None
