"""File handling the weight formats share: JSON files read with errors that name them, output
directories that are never silently overwritten, and never one that is, holds or lies inside a
conversion's input. Paths are local or in a bucket (gs://, through `bert_jax.runtime.storage`)."""

import contextlib
import json
import os
import posixpath
import shutil
import uuid
from typing import Iterator, Mapping

from bert_jax.runtime import storage


def read_json(path: str) -> dict:
  """The JSON object in `path`; a ValueError naming the file when it is not valid JSON."""
  try:
    value = json.loads(storage.read_text(path))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e
  if not isinstance(value, dict):  # Every reader looks fields up by name.
    raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object of fields")
  return value


def write_json(path: str, value: dict) -> None:
  storage.write_text(path, json.dumps(value, indent=2))


def check_output_dir(directory: str, flag: str = "") -> str:
  """`directory` (absolute), refused in one line when it is a file: it would be created as a
  directory (the red team: "[Errno 20] Not a directory", or --overwrite deleting the file)."""
  directory = storage.absolute(os.fspath(directory))
  if storage.exists(directory) and not storage.isdir(directory):
    raise ValueError(f"{flag + '=' if flag else ''}{directory} is a file, not a directory: give "
                     "a directory (it is created if missing)")
  return directory


def fresh_output_dir(directory: str, overwrite: bool) -> str:
  """`directory` as an absolute path (a bucket URL unchanged), created empty. A non-empty one is
  replaced only with `overwrite` (a conversion must never mix its files with an older one's); a
  file is never taken for one."""
  directory = check_output_dir(directory)
  if storage.exists(directory) and (not storage.isdir(directory) or storage.listdir(directory)):
    if not overwrite:
      raise ValueError(f"{directory} exists and is not empty; choose another directory or "
                       "pass overwrite=True (--overwrite)")
    storage.remove_tree(directory)
  storage.makedirs(directory)  # (In a bucket directories exist only through their files.)
  return directory


# Directories an enclosing `output_dir_in_place` is writing -> the directory they become.
_STAGED: dict[str, str] = {}


def shown(path: str) -> str:
  """`path` as messages name it: a staged export directory by the directory it becomes."""
  return _STAGED.get(path, path)


@contextlib.contextmanager
def output_dir_in_place(directory: str, overwrite: bool) -> Iterator[str]:
  """An export written whole or not at all. Yields an empty directory beside local `directory`
  (`.NAME.partial-*`); when the block succeeds it replaces `directory` by renames, and when
  anything stops it (an error, a full disk, Ctrl-C) it is deleted and `directory` is as it was.
  A non-empty `directory` is refused before anything is written unless `overwrite`. Nested
  inside another's block, it writes straight into that staged directory. In a bucket, where
  objects have no atomic rename, the files go straight to `directory` and a failure deletes
  what the block wrote there."""
  directory = check_output_dir(directory)
  if directory in _STAGED:
    yield fresh_output_dir(directory, overwrite)
    return
  if storage.listdir(directory) and not overwrite:
    raise ValueError(f"{directory} exists and is not empty; choose another directory or "
                     "pass overwrite=True (--overwrite)")
  if storage.is_remote(directory):
    existed = storage.exists(directory)
    try:
      yield fresh_output_dir(directory, overwrite)
    except BaseException:
      if not existed:
        storage.remove_tree(directory)
      raise
    return
  parent, name = os.path.split(directory)
  os.makedirs(parent, exist_ok=True)
  staged = os.path.join(parent, f".{name}.partial-{uuid.uuid4().hex[:12]}")
  os.mkdir(staged)
  _STAGED[staged] = directory
  try:
    yield staged
    old = None
    if os.path.lexists(directory):
      old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:12]}")
      os.rename(directory, old)
    try:
      os.rename(staged, directory)
    except BaseException:
      if old is not None:
        os.rename(old, directory)
      raise
  except BaseException:
    shutil.rmtree(staged, ignore_errors=True)
    raise
  finally:
    _STAGED.pop(staged, None)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def _comparable(path: str) -> str:
  """`path` as a location to compare, ending in a separator (so a prefix is an ancestor): a
  local path resolved (symlinks and `..`, as far as it exists), a bucket URL normalised."""
  path = os.fspath(path)
  if storage.is_remote(path):
    scheme, rest = path.split("://", 1)
    scheme = "gs" if scheme == "gcs" else scheme  # Two names of one protocol.
    rest = posixpath.normpath("/" + rest).strip("/")  # Doubled slashes, "." and "..".
    return f"{scheme}://{rest}/"
  return os.path.join(os.path.realpath(os.path.abspath(path)), "")


def _shown(path: str, resolved: str) -> str:
  """The path as given (made absolute), and what it resolves to when that differs."""
  given = storage.absolute(os.fspath(path))
  resolved = resolved.rstrip("/" if storage.is_remote(resolved) else os.sep) or resolved
  return given if resolved == given else f"{given} (= {resolved})"


def check_apart(output: str, inputs: Mapping[str, str], output_name: str = "the output") -> None:
  """Refuses an output directory that is one of `inputs` (name -> path: directories or files),
  holds one, or lies inside one: replacing it (--overwrite) would delete the input, and writing
  into an input directory would mix a conversion's files with the originals. Run before
  anything is read or written; the ValueError names both paths."""
  out = _comparable(output)
  for name, path in inputs.items():
    if not path:
      continue
    source = _comparable(path)
    if out == source:
      relation = "is"
    elif source.startswith(out):
      relation = "holds"
    elif out.startswith(source):
      relation = "lies inside"
    else:
      continue
    raise ValueError(f"{output_name} {_shown(output, out)} {relation} {name} "
                     f"{_shown(path, source)}: an output there would delete the input (with "
                     "--overwrite) or mix files with it; choose an output directory apart from "
                     "the input")
