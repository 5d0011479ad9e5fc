"""File handling the weight formats share: JSON files read with errors that name them, and output
directories that are never silently overwritten. Paths are local or in a bucket (gs://, through
`bert_jax.storage`)."""

import json
import os

from bert_jax import storage


def read_json(path: str) -> dict:
  """The JSON object in `path`; a ValueError naming the file when it is not valid JSON."""
  try:
    return json.loads(storage.read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e


def write_json(path: str, value: dict) -> None:
  storage.write_text(path, json.dumps(value, indent=2))


def fresh_output_dir(directory: str, overwrite: bool) -> str:
  """`directory` as an absolute path (a bucket URL unchanged), created empty. A non-empty one is
  replaced only with `overwrite` (a conversion must never mix its files with an older one's)."""
  directory = storage.absolute(os.fspath(directory))
  if storage.exists(directory) and (not storage.isdir(directory) or storage.listdir(directory)):
    if not overwrite:
      raise ValueError(f"{directory} exists and is not empty; choose another directory or "
                       "pass overwrite=True (--overwrite)")
    storage.remove_tree(directory)
  storage.makedirs(directory)  # (In a bucket directories exist only through their files.)
  return directory
