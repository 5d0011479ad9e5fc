"""The built-in corpus's selection (bert_jax/data/builtin_selection.py): requirements.txt's pins,
no other installed package read, the reference fingerprints, and what an environment with other
versions is told."""

import importlib.metadata
import logging
import os
import re

import pytest

from bert_jax.data import builtin_selection

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _normalized(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture
def fresh_selection(monkeypatch):
  """`current()` read again from what is installed (and once more after the test)."""
  builtin_selection.current.cache_clear()
  monkeypatch.setattr(builtin_selection, "_warned", set())
  yield
  builtin_selection.current.cache_clear()


def test_pins_are_requirements_txt():
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    pins = re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)", f.read(), flags=re.M)
  assert builtin_selection.PINS[0][0] == "python"
  assert list(builtin_selection.PINS[1:]) == pins  # Same names, versions and order.
  assert list(builtin_selection.REFERENCE) == [name for name, _ in builtin_selection.PINS]


def test_other_installed_packages_are_not_read():
  selection = builtin_selection.current()
  read = set(selection.paths)
  assert len(read) == len(selection.paths)  # No file twice.
  pinned = {_normalized(name) for name, _ in builtin_selection.PINS}
  others = {_normalized(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
  others = {name: d for name, d in others.items() if name not in pinned}
  # The test requirements (pytest, torch, transformers, ...) are installed here, and read never.
  assert "pytest" in others
  for distribution in others.values():
    for entry in distribution.files or []:
      assert str(entry.locate()) not in read, (distribution.metadata["Name"], str(entry))
  for component in selection.components:
    assert [rel for rel, _ in component.files] == sorted(rel for rel, _ in component.files)
    assert not any(re.search(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*$", rel)
                   for rel, _ in component.files)


def test_reference_fingerprints():
  """At its pinned version, each component's files are the reference's (the venv of
  requirements.txt has the same: README, "Quick start")."""
  selection = builtin_selection.current()
  at_pin = [c for c in selection.components if c.installed == c.pinned]
  if not at_pin:
    pytest.skip("no component is installed at its pinned version here")
  table = builtin_selection.component_fingerprints(selection)
  for component in at_pin:
    assert component.fingerprint == builtin_selection.REFERENCE[component.name], table
  if len(at_pin) == len(selection.components):
    assert selection.fingerprint == builtin_selection.REFERENCE_FINGERPRINT, table
    assert selection.differences == [] and selection.record()["reference"]


def test_another_version_is_named_with_both_versions(tmp_path, monkeypatch, caplog,
                                                     fresh_selection):
  """A newer jax ahead of the pinned one on sys.path: its files are read instead, the corpus
  gets another fingerprint, and the warning names jax and both versions."""
  reference = builtin_selection.current()
  builtin_selection.current.cache_clear()
  (tmp_path / "jax").mkdir()
  (tmp_path / "jax" / "__init__.py").write_text('"""A newer jax. It has other docs."""\n')
  info = tmp_path / "jax-99.0.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 99.0\n")
  (info / "RECORD").write_text("jax/__init__.py,,\njax-99.0.dist-info/METADATA,,\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  other = builtin_selection.current()
  jax = next(c for c in other.components if c.name == "jax")
  assert jax.installed == "99.0" and [rel for rel, _ in jax.files] == ["jax/__init__.py"]
  assert other.fingerprint != reference.fingerprint
  assert "jax 99.0 is installed, the selection pins 0.10.2" in other.differences
  assert other.record()["versions"]["jax"] == "99.0" and not other.record()["reference"]
  # Everything else is read as before.
  assert [c.fingerprint for c in other.components if c.name != "jax"] == [
      c.fingerprint for c in reference.components if c.name != "jax"]
  with caplog.at_level(logging.WARNING):
    builtin_selection.warn_if_not_reference(other)
    builtin_selection.warn_if_not_reference(other)  # Once per process.
  warnings = [r.getMessage() for r in caplog.records if "reference selection" in r.getMessage()]
  assert len(warnings) == 1
  assert "jax 99.0 is installed, the selection pins 0.10.2" in warnings[0]
  assert builtin_selection.NAME in warnings[0] and other.fingerprint in warnings[0]
