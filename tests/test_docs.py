r"""The docs' commands and config fields exist: README.md, docs/*.md, WORKSPACE.md and
benchmarks/README.md are checked against the launchers and configs as they are now, and their
relative links lead to files that exist.

What this pins:
1. Every documented command that runs a script of `launch/` or `benchmarks/` (in ``` blocks, a
   line continued by `\` joined to the next, or in inline `code` spans) parses. A command is a
   simple command (split at `&&`, `||`, `;`, `|`; NAME=value assignments, a `$ ` prompt and
   `# comments` dropped) whose first word is the script, or a runner (`python`, `bash`,
   `sbatch`, ...) with the script later in it.
   - Launchers (`launch/*.py`): the arguments go through absl's own flag parsing, in one
     subprocess per launcher that imports it under another name (its `main` does not run), each
     argv from a clean slate. So an unknown flag, a bad value, an unknown `--config.a.b` field of
     the config the command uses (its `--config=...`, else the launcher's default, the one it
     names in `cli.define_flags`) and a value that ml_collections' locked overrides cannot parse
     are refused as a user would see them.
   - Shell scripts pass their arguments on (`SHELL_SCRIPTS`); `local_multiprocess.py ... --
     launch/X.py ...` is checked as both commands.
   - `benchmarks/*.py`: argparse options rebuilt from the script's `add_argument` calls (names,
     actions, int/float types, literal choices) and parsed; absl flags: their names.
2. Every `config.<section>.<field>` (or `--config....`, or a top-level `config.<name>`) that the
   docs and the docstrings/comments of `configs/*.py` mention is a field of `configs/base.py` or
   `configs/finetune_base.py`. Not mentions: file names (`config.json`) and metavariables whose
   parts are all single letters (`config.x.y`).
Each test lists all offending places at once (file:line, the text, why): a parser stops at the
first bad argument, so a failing command is parsed again one option at a time (`every_error`).

Documentation placeholders cannot be parsed as values; for them only the flag or field's
existence is checked (`is_placeholder`): a value containing `<`, `>`, `$`, `...` or `…`, an
all-caps word (`DIR`, `N`, `OUTPUT_DIR`), or a value starting with `path/to/`; a placeholder
positional (`...`) is dropped. An inline code span is a fragment of a command: there a flag
written without its value (`--workdir`) is a mention (existence only) and required flags may be
missing. A command without `--config` is checked with the launcher's default config.
"""

import argparse
import ast
import dataclasses
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "WORKSPACE.md", "benchmarks/README.md",
        *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))))
CONFIG_FILES_WITH_FIELDS = ("configs/base.py", "configs/finetune_base.py")


@dataclasses.dataclass(frozen=True)
class Forward:
  """What a shell script does with its arguments: all but `own_flags` go to `target` (None:
  the script takes positional arguments only); `config_env` = (variable, default) when the
  script passes `--config=$variable` itself."""
  target: str | None
  own_flags: tuple[str, ...] = ()
  config_env: tuple[str, str] | None = None


# Each shell script a doc may run (a missing one is a failure: add its rule here).
SHELL_SCRIPTS = {
    "launch/tpu_pod.sh": Forward("launch/train.py", ("--dry_run", "--stop"),
                                 ("CONFIG", "configs/base.py")),
    "launch/slurm_gpu.sbatch": Forward("launch/train.py"),
    "benchmarks/device_check.sh": Forward("benchmarks/device_check.py"),
    "benchmarks/device_wheels.sh": Forward(None),  # pip requirement specs
}
# Launchers whose positional arguments after `--` are another launcher's command.
COMMAND_AFTER_DASHDASH = ("launch/local_multiprocess.py",)
# The first word of a command that runs the script named later in it (`sbatch --nodes=4 X`).
RUNNERS = re.compile(r"(python[\d.]*|bash|sh|sbatch|srun|nohup|setsid|exec|timeout|env)")
SCRIPT = re.compile(r"(?:.*/)?((?:launch|benchmarks)/[\w-]+\.(?:py|sh|sbatch))")
_PLACEHOLDER = re.compile(r"[<>$…]|\.\.\.|^[A-Z][A-Z0-9_]*$|^path/to/")


def is_placeholder(value: str) -> bool:
  """A documentation placeholder, not a value: `<slices>`, `$VAR`, `gs://...`, `DIR`, `N`,
  `path/to/x`."""
  return bool(_PLACEHOLDER.search(value))


@dataclasses.dataclass(frozen=True)
class Snippet:
  """Code text of a doc: a logical line of a ``` block (continuations joined) or an inline
  code span (`fragment`)."""
  file: str
  line: int
  text: str
  fragment: bool


@dataclasses.dataclass(frozen=True)
class Invocation:
  """One run of one script, as a doc writes it: `args` after the script's path, `env` the
  NAME=value assignments before the command."""
  file: str
  line: int
  text: str
  script: str
  args: tuple[str, ...]
  fragment: bool
  env: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Failure:
  file: str
  line: int
  text: str
  reason: str

  def __str__(self) -> str:
    return f"{self.file}:{self.line}: {self.text}\n    -> {self.reason}"


def _report(failures: list[Failure], what: str) -> str:
  return f"{len(failures)} {what}:\n" + "\n".join(str(f) for f in failures)


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


# ------------------------------------------------------------------------ markdown extraction

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
# CommonMark code spans: a run of n backticks up to the next run of exactly n, inside one
# paragraph (no blank line in between).
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)


def split_fences(text: str) -> tuple[list[tuple[int, str]], str]:
  """-> (the lines inside fenced blocks as (line number, line), the text with those blocks
  blanked out, line numbers kept)."""
  fenced, prose, fence = [], [], None
  for number, line in enumerate(text.split("\n"), 1):
    match = _FENCE.match(line)
    if fence is None and match:
      fence = match.group(1)
      prose.append("")
    elif fence is not None and match and match.group(1)[0] == fence[0] and (
        len(match.group(1)) >= len(fence)) and not line.strip()[len(match.group(1)):].strip():
      fence = None
      prose.append("")
    elif fence is not None:
      fenced.append((number, line))
      prose.append("")
    else:
      prose.append(line)
  return fenced, "\n".join(prose)


def logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
  """Lines ending in `\\` joined to the next one; a leading `$ ` prompt dropped."""
  joined, start, parts = [], None, []
  for number, line in lines:
    start = number if start is None else start
    if line.rstrip().endswith("\\"):
      parts.append(line.rstrip()[:-1])
      continue
    parts.append(line)
    text = " ".join(p.strip() for p in parts)
    joined.append((start, text[2:] if text.startswith("$ ") else text))
    start, parts = None, []
  if parts:
    joined.append((start, " ".join(p.strip() for p in parts)))
  return joined


def markdown_snippets(name: str, text: str) -> list[Snippet]:
  fenced, prose = split_fences(text)
  snippets = [Snippet(name, number, line, False) for number, line in logical_lines(fenced)
              if line.strip()]
  for match in _CODE_SPAN.finditer(prose):
    code = match.group(2).replace("\n", " ")
    if code.startswith(" ") and code.endswith(" ") and code.strip():
      code = code[1:-1]
    snippets.append(Snippet(name, prose.count("\n", 0, match.start()) + 1, code, True))
  return snippets


def simple_commands(text: str) -> list[list[str]]:
  """Shell words of each simple command (split at `&&`, `||`, `;`, `|`), comments dropped.
  Raises ValueError (unbalanced quotes)."""
  lexer = shlex.shlex(text, posix=True, punctuation_chars="&;|")
  lexer.whitespace_split = True
  commands = [[]]
  for token in lexer:
    if set(token) <= set("&;|"):
      commands.append([])
    else:
      commands[-1].append(token)
  return [c for c in commands if c]


def invocations(snippet: Snippet) -> list[Invocation | Failure]:
  """The script runs in a snippet: a simple command whose first word (after NAME=value
  assignments) is a script path, or a runner (`python`, `bash`, `sbatch`, ...) followed by one."""
  if not re.search(r"(launch|benchmarks)/[\w-]+\.(py|sh|sbatch)", snippet.text):
    return []
  try:
    commands = simple_commands(snippet.text)
  except ValueError as e:
    return [Failure(snippet.file, snippet.line, snippet.text, f"cannot be split as shell: {e}")]
  found = []
  for words in commands:
    env = []
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
      env.append(tuple(words.pop(0).split("=", 1)))
    if not words:
      continue
    first = os.path.basename(words[0])
    if SCRIPT.fullmatch(words[0]):
      at = 0
    elif RUNNERS.fullmatch(first):
      at = next((i for i, w in enumerate(words) if SCRIPT.fullmatch(w)), None)
      if at is None:
        continue
    else:
      continue
    found.append(Invocation(snippet.file, snippet.line, snippet.text,
                            SCRIPT.fullmatch(words[at]).group(1), tuple(words[at + 1:]),
                            snippet.fragment, tuple(env)))
  return found


def resolve(run: Invocation) -> list[Invocation | Failure]:
  """The Python scripts a run ends up parsing arguments with: shell scripts forward theirs,
  `local_multiprocess.py -- launch/X.py ...` runs X with the rest."""
  fail = lambda reason: [Failure(run.file, run.line, run.text, reason)]  # noqa: E731
  if not os.path.isfile(os.path.join(ROOT, run.script)):
    return fail(f"{run.script}: no such file")
  if run.script.endswith(".py"):
    if run.script in COMMAND_AFTER_DASHDASH and "--" in run.args:
      at = run.args.index("--")
      inner = run.args[at + 1:]
      if not inner or not SCRIPT.fullmatch(inner[0]):
        return fail(f"{run.script}: after -- comes a launcher path, got {list(inner)}")
      outer = dataclasses.replace(run, args=run.args[:at])
      return [outer, *resolve(dataclasses.replace(
          run, script=SCRIPT.fullmatch(inner[0]).group(1), args=inner[1:]))]
    return [run]
  forward = SHELL_SCRIPTS.get(run.script)
  if forward is None:
    return fail(f"{run.script}: no rule in tests/test_docs.py SHELL_SCRIPTS for what it does "
                "with its arguments")
  if forward.target is None:
    flagged = [a for a in run.args if a.startswith("-")]
    return fail(f"{run.script} takes no flags, got {flagged}") if flagged else []
  if forward.target not in _read(run.script):
    return fail(f"{run.script} does not run {forward.target} (SHELL_SCRIPTS is out of date)")
  args = tuple(a for a in run.args if a not in forward.own_flags)
  if forward.config_env and not any(a == "--config" or a.startswith("--config=") for a in args):
    variable, default = forward.config_env
    args = (f"--config={dict(run.env).get(variable, default)}", *args)
  return resolve(dataclasses.replace(run, script=forward.target, args=args))


def documented_runs(docs: dict[str, str]) -> list[Invocation | Failure]:
  """docs: {file name: markdown text} -> every resolved run (or why it cannot be)."""
  runs = []
  for name, text in docs.items():
    for snippet in markdown_snippets(name, text):
      for run in invocations(snippet):
        runs += resolve(run) if isinstance(run, Invocation) else [run]
  return runs


# ------------------------------------------------------------------------ argument checks

def split_args(args: list[str]) -> tuple[list[str], list[str]]:
  """-> (the arguments to parse, the names of flags whose value is a placeholder: existence
  only). Placeholder positionals (`...`) are dropped. Arguments after `--` are kept as they are."""
  keep, mentions, i = [], [], 0
  while i < len(args):
    arg = args[i]
    if arg == "--":
      return keep + list(args[i:]), mentions
    if arg.startswith("-") and "=" in arg:
      name, value = arg.lstrip("-").split("=", 1)
      if is_placeholder(value):
        mentions.append(name)
        i += 1
        continue
    elif arg.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-") and (
        is_placeholder(args[i + 1])):
      mentions.append(arg.lstrip("-"))
      i += 2
      continue
    elif not arg.startswith("-") and is_placeholder(arg):
      i += 1
      continue
    keep.append(arg)
    i += 1
  return keep, mentions


def _bare_value_flags(args: list[str], takes_value) -> tuple[list[str], list[str]]:
  """In a fragment, `--name` written without a value (last, or before another flag) for a
  flag that takes one is a mention. takes_value(name) -> bool | None (None: unknown flag)."""
  keep, mentions = [], []
  for i, arg in enumerate(args):
    last = i + 1 == len(args) or args[i + 1].startswith("-")
    if arg.startswith("--") and "=" in arg:
      keep.append(arg)
    elif arg.startswith("--") and arg != "--" and last and takes_value(arg[2:]):
      mentions.append(arg[2:])
    else:
      keep.append(arg)
  return keep, mentions


def arg_units(args: list[str], takes_value) -> list[list[str]]:
  """Arguments grouped as a parser reads them: `--name value` (an option that takes a value,
  written without `=`) is one unit. takes_value(name) -> bool | None (None: unknown)."""
  units, i = [], 0
  while i < len(args):
    arg = args[i]
    pair = (arg.startswith("-") and arg != "--" and "=" not in arg and i + 1 < len(args)
            and takes_value(arg.lstrip("-")))
    units.append(args[i:i + 2] if pair else [arg])
    i += 2 if pair else 1
  return units


def _name(unit: list[str]) -> str:
  return unit[0].lstrip("-").split("=", 1)[0]


def every_error(parse, units: list[list[str]], describe=lambda unit, error: error) -> list[str]:
  """All reasons a command does not parse, where a parser stops at the first: the whole
  command; when it fails, each option alone (required options relaxed), so that every bad one is
  named; then the rest without those (what only the whole shows: a missing required option, an
  override before --config, positional arguments).
  parse(args, relax) -> error or None; relax: option names whose required check is off (None:
  all of them). describe(unit, error) -> the reason given for a bad unit."""
  error = parse([a for u in units for a in u], set())
  if error is None:
    return []
  errors, bad = [], set()
  for index, unit in enumerate(units):
    if not unit[0].startswith("-"):
      continue  # Positional arguments: named together by the parse of the rest.
    alone = parse(unit, None)
    if alone is not None:
      bad.add(index)
      errors.append(f"{' '.join(unit)}: {describe(unit, alone)}")
  if bad:
    rest = [a for index, unit in enumerate(units) if index not in bad for a in unit]
    error = parse(rest, {_name(units[index]) for index in bad})
  if error is not None:
    errors.append(error)
  return errors


class _RaisingParser(argparse.ArgumentParser):
  def error(self, message):
    raise ValueError(message)


def _parser_trees(source: str) -> list[ast.AST]:
  """The script's syntax tree, then those of the functions of sibling benchmark modules it
  takes argparse parents from (`parents=[local_suite.parser()]`: their options are the
  script's)."""
  trees = [ast.parse(source)]
  for node in ast.walk(trees[0]):
    if isinstance(node, ast.keyword) and node.arg == "parents" and isinstance(node.value, ast.List):
      for parent in node.value.elts:
        if (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
            and isinstance(parent.func.value, ast.Name)):
          module = os.path.join(ROOT, "benchmarks", f"{parent.func.value.id}.py")
          if os.path.exists(module):  # That function's options only (not its main()'s).
            trees += [n for n in ast.parse(_read(module)).body
                      if isinstance(n, ast.FunctionDef) and n.name == parent.func.attr]
  return trees


def argparse_parser(source: str, optional: set[str] | None) -> argparse.ArgumentParser | None:
  """The script's argparse options rebuilt from its `add_argument` calls (option strings and the
  literal action / nargs / choices / type int|float|str / required, except for the names in
  `optional`, or for all when it is None). None: the script has no argparse options."""
  calls = [n for tree in _parser_trees(source) for n in sorted(
      (n for n in ast.walk(tree) if isinstance(n, ast.Call)
       and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"),
      key=lambda n: n.lineno)]
  if not calls:
    return None
  parser = _RaisingParser(prog="script", add_help=True)
  for call in calls:
    names = [ast.literal_eval(a) for a in call.args]
    relaxed = optional is None or any(n.lstrip("-") in optional for n in names)
    kwargs = {}
    for keyword in call.keywords:
      if keyword.arg in ("action", "nargs", "choices", "const", "dest") or (
          keyword.arg == "required" and not relaxed):
        try:
          kwargs[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
          pass  # e.g. choices=sorted(WORKERS): not checkable from the source
      elif keyword.arg == "type" and isinstance(keyword.value, ast.Name) and (
          keyword.value.id in ("int", "float", "str")):
        kwargs["type"] = {"int": int, "float": float, "str": str}[keyword.value.id]
    parser.add_argument(*names, **kwargs)
  return parser


def absl_flag_names(source: str) -> set[str]:
  """Names of the absl flags a script defines (`flags.DEFINE_*("name", ...)`; booleans also as
  `noname`), plus absl's own (help, verbosity, ...)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  names = {"help", "helpshort", "helpfull", "helpxml", "flagfile", "undefok"}
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith("absl."):
      names |= {f.name for f in defined} | {f.short_name for f in defined if f.short_name}
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
      function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
          node.func, "id", "")
      if function.startswith("DEFINE_"):
        names.add(node.args[0].value)
        if function in ("DEFINE_bool", "DEFINE_boolean"):
          names.add("no" + node.args[0].value)
  return names


def check_benchmark(run: Invocation) -> list[str]:
  """Why a `benchmarks/*.py` run does not parse ([] if it does)."""
  source = _read(run.script)
  args, mentions = split_args(list(run.args))
  parser = argparse_parser(source, None if run.fragment else set(mentions))
  if parser is not None:
    options = {o: a for a in parser._actions for o in a.option_strings}  # pylint: disable=W0212

    def takes_value(name: str) -> bool | None:
      return options[f"--{name}"].nargs != 0 if f"--{name}" in options else None

    if run.fragment:
      args, more = _bare_value_flags(args, takes_value)
      mentions += more
    errors = [f"--{m}: no such option of {run.script}" for m in mentions
              if f"--{m}" not in options]

    def parse(args: list[str], relax: set[str] | None) -> str | None:
      relaxed = None if relax is None or run.fragment else relax | set(mentions)
      try:
        argparse_parser(source, relaxed).parse_args(args)
      except ValueError as e:
        return f"{run.script}: {e}"
      return None
    return errors + every_error(parse, arg_units(args, takes_value))
  names = absl_flag_names(source) if "DEFINE_" in source else set()
  given = mentions + [a.lstrip("-").split("=", 1)[0] for a in args if a.startswith("-")]
  if not names:
    return [f"{run.script} defines no options, got {given}"] if given else []
  return [f"--{n}: no such flag of {run.script}" for n in given if n not in names]


def check_launchers(runs: list[Invocation]) -> dict[Invocation, list[str]]:
  """Parses every run's arguments with its launcher's real flags, in one process per launcher
  (`_workers`: this file run as a script). -> {run: why it does not parse}."""
  by_launcher: dict[str, list[Invocation]] = {}
  for run in runs:
    by_launcher.setdefault(run.script, []).append(run)
  requests = [{"launcher": launcher,
               "cases": [{"args": list(r.args), "fragment": r.fragment} for r in group]}
              for launcher, group in by_launcher.items()]
  process = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(requests)], cwd=ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=120, check=False)
  assert process.returncode == 0, f"the launcher checker failed:\n{process.stderr[-3000:]}"
  results = {}
  for group, errors in zip(by_launcher.values(), json.loads(process.stdout.splitlines()[-1])):
    results.update(zip(group, errors))
  return results


def check_runs(runs: list[Invocation | Failure]) -> list[Failure]:
  failures = [r for r in runs if isinstance(r, Failure)]
  ok = [r for r in runs if isinstance(r, Invocation)]
  reports = check_launchers([r for r in ok if r.script.startswith("launch/")])
  for run in ok:
    errors = reports[run] if run.script.startswith("launch/") else check_benchmark(run)
    failures += [Failure(run.file, run.line, run.text, e) for e in errors]
  return sorted(set(failures), key=lambda f: (f.file, f.line, f.reason))


# ------------------------------------------------------------ the launcher side (subprocess)

def _one_line(error: BaseException) -> str:
  """The message a user sees (as bert_jax.runtime.cli does: ml_collections wraps a KeyError's text)."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
  return " ".join(text.split()) or type(error).__name__


def _default_config(launcher: str) -> str | None:
  """The config file a launcher names in `cli.define_flags("configs/X.py", ...)`."""
  for node in ast.walk(ast.parse(_read(launcher))):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
        node.func, "id", None)) == "define_flags" and node.args and isinstance(
            node.args[0], ast.Constant):
      return node.args[0].value
  return None


def _config_field(config, path: str):
  """-> (exists, value) of a dotted field path in a ConfigDict."""
  for part in path.split("."):
    try:
      if part not in config:
        return False, None
    except TypeError:  # A leaf: no fields below it.
      return False, None
    config = config[part]
  return True, config


def _parse_once(flag_values, launcher: str, args: list[str], optional: set[str]) -> str | None:
  """absl's parse of ["prog", *args] from a clean slate: flags unparsed, the previous config's
  override flags deleted, sys.argv set (config_flags reads the overrides from it), the required
  check off for `optional`. -> the error a user would see, or None."""
  flag_values.unparse_flags()
  for name in [n for n in flag_values if n.startswith("config.")]:
    delattr(flag_values, name)
  saved = {}
  for name in optional & set(flag_values):
    saved[name] = flag_values[name].validators
    flag_values[name].validators = [
        v for v in saved[name] if v.message != f"Flag --{name} must have a value other than None."]
  sys.argv = ["prog", *args]
  try:
    rest = flag_values(["prog", *args])[1:]
  except Exception as e:  # pylint: disable=broad-except  (whatever parsing raises is the answer)
    return _one_line(e)
  finally:
    for name, validators in saved.items():
      flag_values[name].validators = validators
  if rest:
    return (f"unexpected positional arguments {rest} ({launcher} takes flags only"
            + ("; its command goes after --)" if launcher in COMMAND_AFTER_DASHDASH else ")"))
  return None


def _with_config(args: list[str], launcher: str, has_config: bool) -> list[str]:
  """`--config X` as `--config=X`; the launcher's default config when none is given or the given
  one is a placeholder (`configs/finetune_<task>.py`: the fields of the default are checked)."""
  if not has_config:
    return args
  default = f"--config={_default_config(launcher)}"
  at = next((i for i, a in enumerate(args) if a == "--config" or a.startswith("--config=")),
            None)
  if at is None:
    return [default, *args]
  if args[at] == "--config" and at + 1 < len(args):
    args = [*args[:at], f"--config={args[at + 1]}", *args[at + 2:]]
  if "=" in args[at] and is_placeholder(args[at].split("=", 1)[1]):
    args = [*args[:at], default, *args[at + 1:]]
  return args


def _parse_case(flag_values, launcher: str, case: dict) -> list[str]:
  """Every reason one documented argv does not parse, through absl (`every_error`; each
  option alone gets the command's --config)."""
  has_config = "config" in flag_values
  args, mentions = split_args(_with_config(list(case["args"]), launcher, has_config))
  config_arg = next((a for a in args if a.startswith("--config=")), None)
  config_path = config_arg.split("=", 1)[1] if config_arg else None
  errors, config = [], None
  if config_path and not os.path.isfile(os.path.join(ROOT, config_path)):
    return [f"{config_arg}: no such config file"]
  if config_path:
    config = flag_values["config"].parser.parse(config_path)

  def takes_value(name: str) -> bool | None:
    if name.startswith("config.") and config is not None:
      exists, value = _config_field(config, name[len("config."):])
      return (not isinstance(value, bool)) if exists else None
    return (not flag_values[name].boolean) if name in flag_values else None

  if case["fragment"]:
    args, more = _bare_value_flags(args, takes_value)
    mentions += more
  for name in mentions:  # Placeholders and bare mentions: the name only.
    if name.startswith("config."):
      if config is not None and not _config_field(config, name[len("config."):])[0]:
        errors.append(f"--{name}: no such field in {config_path}")
    elif not (name in flag_values or (name.startswith("no") and name[2:] in flag_values
                                      and flag_values[name[2:]].boolean)):
      errors.append(f"--{name}: no such flag of {launcher}")

  # Fragments may leave out required flags; a placeholder's flag is not given.
  optional = set(flag_values) if case["fragment"] else set(mentions)

  def parse(args: list[str], relax: set[str] | None) -> str | None:
    with_config = args if config_arg in args or not has_config else [config_arg, *args]
    return _parse_once(flag_values, launcher, with_config,
                       set(flag_values) if relax is None else optional | relax)

  def describe(unit: list[str], error: str) -> str:
    name = _name(unit)
    if name.startswith("config.") and config is not None and not _config_field(
        config, name[len("config."):])[0]:
      return f"no such field in {config_path} ({error})"
    return error

  return errors + every_error(parse, arg_units(args, takes_value), describe)


def _worker(request: dict) -> list[list[str]]:
  """request: {"launcher": path, "cases": [{"args": [...], "fragment": bool}]} -> per case, the
  errors. Imports the launcher (its flags go into this process's global FLAGS)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from absl import app, flags  # pylint: disable=g-import-not-at-top

  launcher = request["launcher"]
  sys.argv = [launcher]
  spec = importlib.util.spec_from_file_location(
      "doc_check_" + os.path.splitext(os.path.basename(launcher))[0],
      os.path.join(ROOT, launcher))
  spec.loader.exec_module(importlib.util.module_from_spec(spec))  # Defines its flags.
  app.define_help_flags()  # As app.run does.
  return [_parse_case(flags.FLAGS, launcher, case) for case in request["cases"]]


def _workers(requests: list[dict]) -> None:
  """Each request in a process of its own (absl's FLAGS is global, and launchers define flags
  of the same names), forked from this one after jax is imported: the launchers import it (via
  bert_jax.runtime.cli), and importing it once instead of once per launcher is most of this test's
  time. stdout, last line: JSON list (per request) of `_worker`'s answers."""
  import jax  # pylint: disable=g-import-not-at-top,unused-import

  children = []
  for request in requests:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # The child: answer, and leave without the parent's exit handlers.
      os.close(read)
      status = 0
      try:
        answer = json.dumps(_worker(request))
      except BaseException:  # pylint: disable=broad-except
        import traceback  # pylint: disable=g-import-not-at-top
        answer, status = json.dumps({"error": traceback.format_exc()}), 1
      with os.fdopen(write, "w") as out:
        out.write(answer)
      os._exit(status)  # pylint: disable=protected-access
    os.close(write)
    children.append((request["launcher"], pid, read))
  answers = []
  for launcher, pid, read in children:
    with os.fdopen(read) as answer:
      text = answer.read()
    _, status = os.waitpid(pid, 0)
    if status:
      sys.exit(f"checking {launcher} failed:\n{json.loads(text)['error']}")
    answers.append(json.loads(text))
  print(json.dumps(answers))


# ------------------------------------------------------------------------ config field mentions

_MENTION = re.compile(r"(?<![\w./-])(?:--)?config\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_FILE_EXTENSIONS = {"json", "py", "txt", "yaml", "yml", "toml", "cfg", "ini"}


def config_mentions(name: str, text: str, first_line: int = 1) -> list[tuple[int, str, str]]:
  """-> (line, the line's text, field path) of each `config.a.b` in text. Not mentions: file
  names (`config.json`) and metavariables whose parts are all single letters (`config.x.y`)."""
  found = []
  lines = text.split("\n")
  for match in _MENTION.finditer(text):
    path = match.group(1)
    parts = path.split(".")
    if parts[0] in _FILE_EXTENSIONS or all(len(p) == 1 for p in parts):
      continue
    line = text.count("\n", 0, match.start())
    found.append((first_line + line, lines[line].strip(), path))
  return found


def python_prose(source: str) -> list[tuple[int, str]]:
  """-> (first line, text) of each comment and docstring of a Python source."""
  docstrings = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and (
          isinstance(body[0].value.value, str)):
        docstrings.add((body[0].lineno, body[0].col_offset))
  prose = []
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT or (token.type == tokenize.STRING
                                          and token.start in docstrings):
      prose.append((token.start[0], token.string))
  return prose


def config_fields() -> set[str]:
  """Every field path (sections too) of configs/base.py and configs/finetune_base.py."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from configs import base, finetune_base  # pylint: disable=g-import-not-at-top

  def walk(config, prefix: str):
    for key, value in config.items():
      yield prefix + key
      if isinstance(value, ml_collections.ConfigDict):
        yield from walk(value, prefix + key + ".")
  return set(walk(base.get_config(), "")) | set(walk(finetune_base.get_config(), ""))


def mention_failures(places: list[tuple[str, int, str, str]], fields: set[str]) -> list[Failure]:
  return [Failure(file, line, text, f"config.{path}: no such field in "
                  f"{' or '.join(CONFIG_FILES_WITH_FIELDS)}")
          for file, line, text, path in places if path not in fields]


def documented_mentions() -> list[tuple[str, int, str, str]]:
  """(file, line, text, field path) of every config field the docs and configs/*.py prose name."""
  places = [(name, *m) for name in DOCS for m in config_mentions(name, _read(name))]
  for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    if name.endswith(".py"):
      path = f"configs/{name}"
      for line, text in python_prose(_read(path)):
        places += [(path, *m) for m in config_mentions(path, text, line)]
  return places


# ------------------------------------------------------------------------------ the tests

# A snippet with one mistake of each kind (and placeholders that are no mistake): the checker
# must report exactly the mistakes.
SELF_TEST_DOC = """\
```
FOO=1 .venv/bin/python launch/train.py --config=configs/tiny.py --made_up_flag=1 \\
    --config.train.made_up_field=3 --workdir=DIR --config.data.dataset_dir=<dir>  # a comment
.venv/bin/python launch/train.py --config.train.batch_size=many
.venv/bin/python benchmarks/mesh_sweep.py --sizes=reduced --made_up_option=2
```
Prose: `config.train.made_up_prose_field`, `config.train.batch_size` and `config.x.y`.
"""


@pytest.fixture(scope="module")
def doc_runs() -> list[Invocation | Failure]:
  return documented_runs({name: _read(name) for name in DOCS})


@pytest.fixture(scope="module")
def checked(doc_runs) -> list[Failure]:
  """Why the docs' and the self-test's commands do not parse (one checker run for both)."""
  return check_runs(doc_runs + documented_runs({"<self-test>": SELF_TEST_DOC}))


def test_extraction_finds_the_documented_commands(doc_runs):
  """The extraction sees what the docs hold (a checker that finds nothing passes anything)."""
  scripts = {r.script for r in doc_runs if isinstance(r, Invocation)}
  assert {"launch/train.py", "launch/prepare_data.py", "launch/convert.py", "launch/finetune.py",
          "launch/predict.py", "launch/local_multiprocess.py", "benchmarks/mesh_sweep.py",
          "benchmarks/train_step.py", "benchmarks/device_check.py"} <= scripts, scripts
  assert len(doc_runs) >= 25, doc_runs


def test_documented_commands_parse(checked):
  failures = [f for f in checked if f.file != "<self-test>"]
  assert not failures, _report(failures, "documented commands do not parse")


def test_documented_config_fields_exist():
  failures = mention_failures(documented_mentions(), config_fields())
  assert not failures, _report(failures, "mentions of config fields that do not exist")


def test_checker_reports_made_up_flags_and_fields(checked):
  failures = [f for f in checked if f.file == "<self-test>"]
  reasons = [f.reason for f in failures]
  assert len(failures) == 4, _report(failures, "self-test failures")
  assert any("made_up_flag" in r for r in reasons), reasons
  assert any("made_up_field" in r for r in reasons), reasons
  assert any("many" in r for r in reasons), reasons
  assert any("made_up_option" in r for r in reasons), reasons
  mentions = mention_failures(
      [("<self-test>", *m) for m in config_mentions("<self-test>", SELF_TEST_DOC)],
      config_fields())
  assert [m.reason.split(":")[0] for m in mentions] == [
      "config.train.made_up_field", "config.train.made_up_prose_field"]


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
  _workers(json.loads(sys.argv[2]))


# ------------------------------------------------------------------- every flag is documented

_DEFINED_FLAG = re.compile(r"DEFINE_\w+\(\s*\"(\w+)\"")
# Where the flags of launch/*.py are defined: the launcher itself, and what every training
# launcher shares (`cli.define_flags`, `distributed.define_flags`).
_SHARED_FLAG_SOURCES = ("bert_jax/runtime/cli.py", "bert_jax/runtime/distributed.py")
_FLAG_SOURCES = {"launch/train.py": _SHARED_FLAG_SOURCES, "launch/finetune.py": _SHARED_FLAG_SOURCES}


def defined_flags(launcher: str) -> set[str]:
  """The names of the flags `launcher` defines (absl's own left out)."""
  names = set()
  for path in (launcher, *_FLAG_SOURCES.get(launcher, ())):
    source = _read(os.path.join(ROOT, path))
    names |= set(_DEFINED_FLAG.findall(source))
    # distributed.py names its first three through constants.
    names |= {value for value in re.findall(r"^_[A-Z_]+ = \"(\w+)\"", source, flags=re.M)}
  return names


def test_every_launcher_flag_is_in_the_docs():
  readme = "\n".join(_read(os.path.join(ROOT, name)) for name in DOCS if name != "WORKSPACE.md")
  launchers = sorted(os.path.relpath(path, ROOT)
                     for path in glob.glob(os.path.join(ROOT, "launch", "*.py")))
  missing = [f"{launcher}: --{name}" for launcher in launchers
             for name in sorted(defined_flags(launcher))
             if not re.search(rf"--{name}\b", readme)]
  assert not missing, "flags README.md and docs/ do not name:\n" + "\n".join(missing)


# ------------------------------------------------------------------- links between the docs

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_lead_to_files():
  broken = []
  for name in DOCS:
    for number, line in enumerate(_read(os.path.join(ROOT, name)).splitlines(), 1):
      for target in _LINK.findall(line):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
          continue
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(name), target.split("#")[0]))
        if not os.path.exists(path):
          broken.append(f"{name}:{number}: {target}")
  assert not broken, "links to files that do not exist:\n" + "\n".join(broken)
