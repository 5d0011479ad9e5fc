"""The house rules of bert_jax/, read from the code: no module imports one that imports it back
(deferred imports and package `__init__`s included), no function over 60 code lines, a
trainer that only runs the loop (at most 300 lines, no task or metric name in it), and roles in
folders: at most 6 modules at the top of bert_jax/ (the drivers), the rest in role packages."""

import ast
import os

from bert_jax import tasks
from bert_jax.objectives import losses

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "bert_jax")


def _modules() -> dict[str, str]:
  """Dotted module name -> file, for every module of bert_jax/ (a package is its __init__)."""
  found = {}
  for directory, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        found[dotted.removesuffix(".__init__")] = path
  return found


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
  """The bert_jax modules a file imports anywhere in it, with the packages they run first
  (importing bert_jax.weights.layout runs bert_jax/weights/__init__.py), except the packages
  the module itself is in (their __init__ has run before it, whatever it imports)."""
  imported = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_jax"):
      for alias in node.names:
        target = f"{node.module}.{alias.name}"
        imported.add(target if target in modules else node.module)
    elif isinstance(node, ast.Import):
      imported |= {alias.name for alias in node.names if alias.name.startswith("bert_jax.")}
  own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
  with_parents = set()
  for target in imported:
    parts = target.split(".")
    with_parents |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
  return (with_parents - own_packages) & set(modules)


def test_no_module_imports_one_that_imports_it_back():
  modules = _modules()
  graph = {name: _imports(name, path, modules) - {name} for name, path in modules.items()}

  def cycle_from(start: str) -> list[str] | None:
    stack = [(start, [start])]
    seen = set()
    while stack:
      node, path = stack.pop()
      for nxt in graph[node]:
        if nxt == start:
          return path + [start]
        if nxt not in seen:
          seen.add(nxt)
          stack.append((nxt, path + [nxt]))
    return None

  cycles = [" -> ".join(c) for c in map(cycle_from, sorted(graph)) if c]
  assert not cycles, "\n".join(cycles)


def _code_lines(node: ast.FunctionDef, source: list[str]) -> int:
  """Lines of a function that hold code: not blank, not comments, not its docstring."""
  body = node.body
  first = body[1].lineno if (len(body) > 1 and isinstance(body[0], ast.Expr)
                             and isinstance(body[0].value, ast.Constant)) else body[0].lineno
  lines = source[first - 1:node.end_lineno]
  return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def test_no_function_is_over_60_code_lines():
  long = []
  for name, path in _modules().items():
    source = open(path).read()
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        count = _code_lines(node, source.splitlines())
        if count > 60:
          long.append(f"{name}.{node.name}: {count} code lines")
  assert not long, "\n".join(long)


def test_the_trainer_only_runs_the_loop():
  path = os.path.join(PACKAGE, "training", "trainer.py")
  text = open(path).read()
  assert len(text.splitlines()) <= 300
  strings = {node.value for node in ast.walk(ast.parse(text))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)}
  task_names = {"pretraining", *tasks.FINETUNE_TASKS}
  metric_names = {"loss", "examples", "windows", "grad_norm", "mfu", *losses.means({
      "mlm_count": 1, "nsp_count": 1, "mlm_loss_sum": 0, "mlm_correct_sum": 0,
      "nsp_loss_sum": 0, "nsp_correct_sum": 0})}
  for task in tasks.FINETUNE_TASKS.values():
    metric_names |= set(task.log_keys) | {name for name, _ in task.loss_terms}
  assert not strings & (task_names | metric_names)


def test_the_top_level_holds_the_drivers_and_packages_hold_the_roles():
  top = sorted(n for n in os.listdir(PACKAGE) if n.endswith(".py"))
  assert len(top) <= 6, top
  packages = {n for n in os.listdir(PACKAGE)
              if os.path.isfile(os.path.join(PACKAGE, n, "__init__.py"))}
  assert {"models", "training", "objectives", "checkpoints", "runtime", "data", "tasks",
          "weights", "downstream"} <= packages, packages


def test_the_config_dict_stops_at_the_drivers():
  """Below the drivers the settings are typed: the training loop, the compiled programs and the
  checkpoints never see a ConfigDict (training/settings.py is what they read), and the launchers
  import the installed package (pyproject.toml), with no sys.path inserts."""
  for package in ("training", "checkpoints"):
    for directory, _, files in os.walk(os.path.join(PACKAGE, package)):
      for name in files:
        if name.endswith(".py"):
          text = open(os.path.join(directory, name)).read()
          assert "ml_collections" not in text, f"{package}/{name} reads a ConfigDict"
  launchers = os.path.join(ROOT, "launch")
  for name in os.listdir(launchers):
    if name.endswith(".py"):
      assert "sys.path" not in open(os.path.join(launchers, name)).read(), name


def test_a_built_wheel_holds_and_imports_every_module(tmp_path):
  """The package list was kept by hand and left out bert_jax.generation: an editable install
  hid it, a built wheel could not import bert_jax.predict. The wheel is built from a copy of the
  sources (no build/ leftovers), and every module imports from it alone."""
  import shutil  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import zipfile  # pylint: disable=import-outside-toplevel
  source = tmp_path / "source"
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("bert_jax", "configs"):
    shutil.copytree(os.path.join(ROOT, name), source / name, ignore=ignore)
  for name in os.listdir(ROOT):
    if name == "pyproject.toml" or (name.startswith("requirements") and name.endswith(".txt")):
      shutil.copy(os.path.join(ROOT, name), source / name)
  built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
                         capture_output=True, text=True, timeout=300)
  assert built.returncode == 0, built.stderr[-3000:]
  (wheel,) = (tmp_path / "wheel").iterdir()
  with zipfile.ZipFile(wheel) as archive:
    held = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in archive.namelist()
            if n.endswith(".py")}
    archive.extractall(tmp_path / "site")
  expected = {os.path.relpath(os.path.join(root, n), ROOT)[:-3].replace(os.sep, ".")
              .removesuffix(".__init__")
              for top in ("bert_jax", "configs") for root, _, names in
              os.walk(os.path.join(ROOT, top)) for n in names if n.endswith(".py")}
  assert held == expected, (sorted(expected - held), sorted(held - expected))
  site = str(tmp_path / "site")
  imported = subprocess.run(
      [sys.executable, "-c",
       "import importlib, sys\n"
       f"for name in {sorted(held)!r}:\n"
       "  module = importlib.import_module(name)\n"
       f"  assert module.__file__.startswith({site!r}), module.__file__\n"
       "print(len(sys.modules))"],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": site, "JAX_PLATFORMS": "cpu"})
  assert imported.returncode == 0, imported.stderr[-3000:]
