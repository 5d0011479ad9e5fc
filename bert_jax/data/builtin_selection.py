"""Which installed files the built-in corpus reads: a pinned, versioned selection.

The selection (`NAME`) is Python's standard library and the distributions requirements.txt pins,
each at its pinned version (`PINS`; tests/test_builtin_selection.py checks the table against
requirements.txt). It is read in a fixed order: the standard library first, then each
distribution in the table's order; in each, the `.py` files (for a distribution, those its
installed RECORD lists), tests and vendored copies left out, sorted by path. Nothing else that is
installed is read, so a venv that also holds the test requirements (torch, transformers, pytest,
...) prepares the same corpus, byte for byte, as one from requirements.txt alone.

Each component's fingerprint hashes its files' paths and bytes; the selection's hashes those with
`VERSION`. `REFERENCE` holds every component's fingerprint at its pinned version (a
requirements.txt venv on Python `PINS[0]`), so an environment whose files differ is told which
component differs and how (`differences`): a newer jax, another Python, a package missing. Such an
environment still gets a deterministic corpus of what it has installed (its own fingerprint, its
own cache key), with a warning naming each difference (`warn_if_not_reference`); it is refused
nowhere, since a user with a newer jax expects the quick start to run, and told that it is not
the reference dataset README's quick-start table was measured on.
"""

import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import platform
import sysconfig

from absl import logging

# Bump when which files are read, or how corpus.py turns their docstrings into documents,
# changes: a dataset cached by the fingerprint is then rebuilt. v3: the pinned selection (v2 read
# every installed file).
VERSION = 3
NAME = f"stdlib+requirements-v{VERSION}"

# (component, pinned version): "python" is the standard library of that Python; the others are
# requirements.txt's pins, in its order (numpy and scipy: jax's own dependencies, pinned there for
# this corpus and the local suite, `local_suite.py`, which reads their docstrings).
PINS: tuple[tuple[str, str], ...] = (
    ("python", "3.11.7"),
    ("jax", "0.10.2"),
    ("jaxlib", "0.10.2"),
    ("flax", "0.12.8"),
    ("optax", "0.2.8"),
    ("orbax-checkpoint", "0.12.8"),
    ("tensorflow-datasets", "4.9.10"),
    ("grain", "0.2.18"),
    ("sentencepiece", "0.2.3"),
    ("absl-py", "2.5.1"),
    ("ml_collections", "1.1.0"),
    ("tensorboardX", "2.6.5"),
    ("tokenizers", "0.23.3"),
    ("safetensors", "0.8.0"),
    ("gcsfs", "2026.10.1"),
    ("google-crc32c", "1.9.0"),
    ("cramjam", "2.14.0"),
    ("numpy", "2.4.6"),
    ("scipy", "1.17.1"),
)

# Each component's fingerprint at its pinned version (Linux x86-64; `component_fingerprints()`
# prints them), and the selection's when all of them match.
REFERENCE: dict[str, str] = {
    "python": "d90ed8df5c11fc1d",
    "jax": "7c43fb0de12b950d",
    "jaxlib": "e1ff946c2ce865c6",
    "flax": "c5c606773c546666",
    "optax": "38dd871f8392448a",
    "orbax-checkpoint": "73c7be0a8bb0b06f",
    "tensorflow-datasets": "93150862b73082b2",
    "grain": "ba9fe56231b14efd",
    "sentencepiece": "a531659df44d8019",
    "absl-py": "160ef6aa4d8d161d",
    "ml_collections": "98fd8020be0f95b2",
    "tensorboardX": "a651e3d5d235f900",
    "tokenizers": "df82f6980d077639",
    "safetensors": "2f65b1f6b6ef276c",
    "gcsfs": "650a56236276770e",
    "google-crc32c": "7befe6af6aa2ab86",
    "cramjam": "fc586cae7e8f89f6",
    "numpy": "1b2bd42723212214",
    "scipy": "e587abd7b34a7cc4",
}
REFERENCE_FINGERPRINT = "1f7d4a1e7c3e5b3b"

_SKIP_DIRS = frozenset({"test", "tests", "testing", "idle_test", "__pycache__", "site-packages",
                        "dist-packages", "lib2to3", "turtledemo", "ensurepip", "benchmarks",
                        "_vendor", "vendored"})


@dataclasses.dataclass(frozen=True)
class Component:
  """One part of the selection as installed here."""

  name: str  # "python" (its standard library) or a distribution as requirements.txt names it.
  pinned: str  # The version the selection pins.
  installed: str  # The version installed here; "" when it is not installed.
  files: tuple[tuple[str, str], ...]  # (path in the corpus, absolute path), in reading order.
  fingerprint: str  # Of the files' paths and bytes; "" when not installed.

  def difference(self) -> str | None:
    """How this component differs from the reference, in words; None when it does not."""
    what = "Python's standard library" if self.name == "python" else self.name
    if not self.installed:
      return f"{what} is not installed (the selection pins {self.pinned})"
    if self.fingerprint == REFERENCE.get(self.name):
      return None
    if self.installed != self.pinned:
      return f"{what} {self.installed} is installed, the selection pins {self.pinned}"
    return f"{what} {self.installed}'s files differ from the reference's"


@dataclasses.dataclass(frozen=True)
class Selection:
  """The selection as installed here: its components, and what identifies the corpus."""

  components: tuple[Component, ...]
  fingerprint: str

  @property
  def paths(self) -> list[str]:
    """Every file to read, in order."""
    return [path for c in self.components for _, path in c.files]

  @property
  def differences(self) -> list[str]:
    """How this environment's corpus differs from the reference (empty: it is the reference)."""
    return [d for d in (c.difference() for c in self.components) if d]

  def record(self) -> dict:
    """What `builtin_dataset.json` records of the corpus a run trains on."""
    return {"selection": NAME, "fingerprint": self.fingerprint,
            "reference": self.fingerprint == REFERENCE_FINGERPRINT,
            "versions": {c.name: c.installed for c in self.components},
            "differences": self.differences}


def _skipped(rel: str) -> bool:
  """Tests, vendored copies, caches and hidden directories are not the package's prose."""
  *dirs, filename = rel.split("/")
  return (any(d.lower() in _SKIP_DIRS or d.startswith(".") or d.endswith((".dist-info",
                                                                           ".egg-info"))
              for d in dirs)
          or not filename.endswith(".py") or filename.startswith("test_")
          or filename.endswith("_test.py"))


def _stdlib_files() -> list[tuple[str, str]]:
  """(path under "python/", absolute path) of the standard library's files, sorted."""
  root = os.path.realpath(sysconfig.get_paths()["stdlib"])
  found = []
  for directory, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if not _skipped(f"{d}/x.py")]
    for filename in filenames:
      path = os.path.join(directory, filename)
      rel = os.path.relpath(path, root).replace(os.sep, "/")
      if not _skipped(rel):
        found.append((f"python/{rel}", path))
  return sorted(found)


def _distribution_files(name: str) -> tuple[str, list[tuple[str, str]]]:
  """(installed version, [(path in site-packages, absolute path)] sorted) of a distribution;
  ("", []) when it is not installed or lists no files."""
  try:
    distribution = importlib.metadata.distribution(name)
  except importlib.metadata.PackageNotFoundError:
    return "", []
  if distribution.files is None:  # No RECORD: its files cannot be told from others'.
    return "", []
  found = []
  for entry in distribution.files:
    rel = str(entry).replace(os.sep, "/")
    if rel.startswith("../") or _skipped(rel):
      continue
    path = str(entry.locate())
    if os.path.isfile(path):
      found.append((rel, path))
  return distribution.version, sorted(found)


def _fingerprint(parts: list[str]) -> str:
  digest = hashlib.sha256()
  for part in parts:
    digest.update(part.encode() + b"\n")
  return digest.hexdigest()[:16]


def _component(name: str, pinned: str) -> Component:
  if name == "python":
    installed, files = platform.python_version(), _stdlib_files()
  else:
    installed, files = _distribution_files(name)
  hashes = []
  for rel, path in files:
    with open(path, "rb") as f:
      hashes.append(f"{rel}\t{hashlib.sha256(f.read()).hexdigest()}")
  return Component(name=name, pinned=pinned, installed=installed, files=tuple(files),
                   fingerprint=_fingerprint(hashes) if installed else "")


@functools.cache
def current() -> Selection:
  """The selection as installed in this environment (read once per process: ~1 s)."""
  components = tuple(_component(name, pinned) for name, pinned in PINS)
  return Selection(components, _fingerprint(
      [NAME] + [f"{c.name}\t{c.installed}\t{c.fingerprint}" for c in components]))


def component_fingerprints(selection: Selection) -> str:
  """`REFERENCE` and `REFERENCE_FINGERPRINT` as Python source, for this environment."""
  lines = ["REFERENCE: dict[str, str] = {"]
  lines += [f'    "{c.name}": "{c.fingerprint}",' for c in selection.components]
  return "\n".join(lines + ["}", f'REFERENCE_FINGERPRINT = "{selection.fingerprint}"'])


_warned: set[str] = set()


def warn_if_not_reference(selection: Selection) -> None:
  """One warning per process naming each way this environment's corpus is not the reference."""
  differences = selection.differences
  if not differences or selection.fingerprint in _warned:
    return
  _warned.add(selection.fingerprint)
  logging.warning(
      "The built-in corpus here is not the reference selection %s (fingerprint %s; here %s): "
      "%s. It is read from the files installed here (the same on every start), but it is not "
      "the dataset README's quick-start table was measured on; `pip install -r "
      "requirements.txt` installs the pinned versions.", NAME, REFERENCE_FINGERPRINT,
      selection.fingerprint, "; ".join(differences))

