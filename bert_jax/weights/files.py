"""File handling the weight formats share: JSON files read with errors that name them, and output
directories that are never silently overwritten."""

import json
import os
import shutil


def read_json(path: str) -> dict:
  """The JSON object in `path`; a ValueError naming the file when it is not valid JSON."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e


def write_json(path: str, value: dict) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)


def fresh_output_dir(directory: str, overwrite: bool) -> str:
  """`directory` as an absolute path, created empty. A non-empty one is replaced only with
  `overwrite` (a conversion must never mix its files with an older one's)."""
  directory = os.path.abspath(directory)
  if os.path.exists(directory) and os.listdir(directory):
    if not overwrite:
      raise ValueError(f"{directory} exists and is not empty; choose another directory or "
                       "pass overwrite=True (--overwrite)")
    shutil.rmtree(directory)
  os.makedirs(directory, exist_ok=True)
  return directory
