"""An offline downstream suite to compare pretraining recipes on any machine: fine-tuning tasks
built from the docstrings of numpy and scipy, which every install of requirements.txt has (jax
requires both), so nothing is downloaded.

`build(output_dir)` writes each task's train / validation JSONL (the layouts of
`bert_jax/tasks/`) and returns them as `LocalTask`s (`launch/downstream.py --suite=local`,
`benchmarks/local_suite.py`):
- `scipy_topic` (classification, one text): which scipy subpackage (stats, optimize, signal,
  ...) a docstring sentence comes from; accuracy, 7 balanced classes.
- `param_match` (classification, a pair): whether a description (its first sentence) is the
  one of the parameter of `text` (its entry line "axis : int, optional") in a numpy / scipy
  function's docstring, or that of a parameter of another function; accuracy, balanced.
- `code_tags` (tagging): which words of a docstring sentence are code (the reST markup
  ``x``, `x`, :func:`x` that marked them is removed); token F1 of tag "CODE". The markup is
  the authors', so unmarked code counts as words: no model reaches 1.0.

The same installed files give the same bytes on every call: files are read in sorted order,
every draw is seeded, and every split is by source file (a module's text is all in train or
all in validation); text found in both is dropped from validation. The pretraining corpus
(`corpus.iter_builtin_docstrings`: numpy and scipy are in its selection, at requirements.txt's
pins) holds these docstrings too, markup stripped, without labels: pretraining sees the text of
the tasks, as BERT's Wikipedia held that of many benchmarks.
"""

import ast
import collections
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import random
import re
import sysconfig
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from bert_jax.runtime import storage
from bert_jax.data import corpus

# Bump when what build() writes changes for the same installed files.
SUITE_VERSION = 1
PACKAGES = ("numpy", "scipy")
SUMMARY_FILE = "suite.json"
_SKIP_DIRS = frozenset({"tests", "test", "testing", "__pycache__", "_vendor", "vendored",
                        "benchmarks"})
# scipy subpackages of `scipy_topic`: large enough for a split by module, and some close in
# subject (integrate / interpolate / optimize), so that it does not saturate.
TOPICS = ("integrate", "interpolate", "linalg", "optimize", "signal", "spatial", "stats")


@dataclasses.dataclass(frozen=True)
class LocalTask:
  """One task of the suite: files and how to score them."""
  name: str
  task: str  # "classification" | "tagging" | "qa" | "embedding" (config.task).
  train_file: str
  validation_file: str
  metric: str  # The main score in final_eval.json's scores (the task's main_metric()).
  max_seq_length: int
  chance: float = 0.0  # `metric` of the majority prediction on validation (tagging: all "O").


@dataclasses.dataclass(frozen=True)
class Sentence:
  """A docstring sentence with its markup removed, and the code spans the markup marked."""
  text: str
  code: tuple[tuple[int, int], ...]  # Character [start, end) of each marked span in `text`.

  @functools.cached_property
  def _words(self) -> tuple[tuple[str, bool], ...]:
    if not self.code:  # Most sentences: no scan needed.
      return tuple((word, False) for word in self.text.split())
    in_code = bytearray(len(self.text))  # 1 on the characters of a marked span.
    for start, end in self.code:
      in_code[start:end] = b"\x01" * (end - start)
    return tuple((m.group(), any(in_code[m.start():m.end()]))
                 for m in re.finditer(r"\S+", self.text))

  def words(self) -> list[tuple[str, bool]]:
    """(word, is code) of each whitespace word: code when it overlaps a marked span."""
    return list(self._words)


@dataclasses.dataclass
class SourceFile:
  """What the tasks take from one installed module."""
  package: str  # "numpy" | "scipy"
  path: str  # Relative to the package's parent ("scipy/stats/_stats_py.py").
  sentences: list[Sentence]
  parameters: list[dict[str, str]]  # Per function: entry line -> first description sentence.
  # Per function with both: (its one-line summary, its parameters' descriptions), for the
  # retrieval suite (`bert_jax/data/local_retrieval.py`).
  functions: list[tuple[str, dict[str, str]]] = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------------------------ markup

# Sphinx roles that name code; others (math, ref, doc, cite, term) drop their sentence.
_CODE_ROLES = frozenset({"func", "meth", "class", "attr", "obj", "mod", "data", "exc", "const",
                         "py:func", "py:meth", "py:class", "py:attr", "py:obj", "py:mod",
                         "py:data", "py:exc", "py:const"})
_MARKUP = re.compile(
    r":(?P<role>[\w:.+-]+):`~?(?P<role_text>[^`<]*?)(\s*<[^>]*>)?`"  # :func:`~np.sum`
    r"|``(?P<literal>[^`]+)``"  # ``axis=None``
    r"|`(?P<link>[^`<]+?)\s*<[^>]*>`_{1,2}"  # `text <url>`_ : prose, not code.
    r"|`(?P<ref>[^`]+)`_{1,2}"  # `Name`_ : a reference, prose.
    r"|`~?(?P<default>[^`]+)`")  # `x`: the default role, numpydoc's parameter names.


def parse_markup(raw: str) -> Sentence | None:
  """`raw` without its markup, with the code spans marked; None for a sentence with math,
  cross-document references or stray backticks."""
  text, code, cursor = "", [], 0
  for match in _MARKUP.finditer(raw):
    text += raw[cursor:match.start()]
    cursor = match.end()
    role = match.group("role")
    if role is not None and role not in _CODE_ROLES:
      return None
    inner = next(match.group(g) for g in ("role_text", "literal", "link", "ref", "default")
                 if match.group(g) is not None).strip()
    if not inner:
      return None
    if match.group("link") is None and match.group("ref") is None:
      code.append((len(text), len(text) + len(inner)))
    text += inner
  text += raw[cursor:]
  if "`" in text or "\\" in text or "$" in text:
    return None
  return Sentence(text, tuple(code))


def _is_prose(sentence: Sentence, min_words: int, max_words: int) -> bool:
  """Between the word bounds, and words outside code mostly letters (no formulas, tables)."""
  words = sentence.words()
  if not min_words <= len(words) <= max_words:
    return False
  prose = [w.strip(".,;:()'\"") for w, is_code in words if not is_code]
  letters = sum(w.isalpha() for w in prose)
  return len(prose) >= 3 and letters >= 0.8 * len(prose) and sentence.text[0].isupper()


# ---------------------------------------------------------------------------- docstrings

_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
# numpydoc sections whose entries start at the margin ("axis : int, optional"), with an
# indented prose description; and sections that hold no prose.
_ENTRY_SECTIONS = frozenset({"Parameters", "Other Parameters", "Returns", "Yields", "Receives",
                             "Raises", "Warns", "Attributes"})
_SKIP_SECTIONS = frozenset({"See Also", "References", "Examples", "Methods"})
_ENTRY = re.compile(r"^(?P<name>\*{0,2}[A-Za-z_]\w*)\s*(:.*)?$")


def _sections(docstring: str) -> Iterator[tuple[str, list[str]]]:
  """(section title, its lines) of a cleaned numpydoc docstring; "Summary" before the first."""
  lines = docstring.expandtabs().splitlines()
  title, body, i = "Summary", [], 0
  while i < len(lines):
    if i + 1 < len(lines) and lines[i].strip() and _UNDERLINE.match(lines[i + 1]):
      yield title, body
      title, body, i = lines[i].strip(), [], i + 2
      continue
    body.append(lines[i])
    i += 1
  yield title, body


def _prose_blocks(title: str, lines: list[str]) -> Iterator[str]:
  """Paragraphs of prose in a section: doctests, directives, literal blocks and entry lines
  ("axis : int") left out."""
  block: list[str] = []
  skip_deeper_than, in_doctest = -1, False
  for line in lines + [""]:
    stripped, indent = line.strip(), len(line) - len(line.lstrip())
    if not stripped:
      in_doctest = False
    if in_doctest or (stripped and skip_deeper_than >= 0 and indent > skip_deeper_than):
      continue
    skip_deeper_than = -1
    starts_other = stripped.startswith((">>>", ".. ")) or (title in _ENTRY_SECTIONS
                                                            and indent == 0)
    if not stripped or starts_other or stripped.endswith("::"):
      if stripped.endswith("::") and stripped[:-2].strip():
        block.append(stripped[:-2].rstrip() + ":")
      if block:
        yield " ".join(block)
      block = []
      in_doctest = stripped.startswith(">>>")
      if stripped.startswith(".. ") or stripped.endswith("::"):
        skip_deeper_than = indent
      continue
    block.append(stripped)


def docstring_sentences(docstring: str) -> list[Sentence]:
  """The prose sentences (6 to 50 words) of a numpydoc docstring, markup parsed."""
  sentences = []
  for title, lines in _sections(docstring):
    if title in _SKIP_SECTIONS:
      continue
    for block in _prose_blocks(title, lines):
      for raw in corpus.split_sentences(block):
        sentence = parse_markup(raw)
        if sentence is not None and _is_prose(sentence, 6, 50):
          sentences.append(sentence)
  return sentences


def parameter_descriptions(docstring: str, names: Sequence[str]) -> dict[str, str]:
  """Documented parameter, as its entry line ("axis : int, optional"; markup removed) -> the
  first sentence of its description (3 to 30 words), for the parameters of the signature
  (`names`) only."""
  found: dict[str, tuple[str, list[str]]] = {}
  for title, lines in _sections(docstring):
    if title not in ("Parameters", "Other Parameters"):
      continue
    current = None
    for line in lines:
      if line.strip() and not line[0].isspace():
        entry = _ENTRY.match(line.strip())
        current = entry.group("name").lstrip("*") if entry else None
        if current is not None:
          header = parse_markup(line.strip())
          found[current] = (" ".join(header.text.split()) if header else current, [])
      elif current is not None and line.strip():
        found[current][1].append(line.strip())
  descriptions = {}
  for name, (header, text) in found.items():
    sentences = corpus.split_sentences(" ".join(text))
    sentence = parse_markup(sentences[0]) if sentences and name in names else None
    # Pair and entry line short enough for a row of 64 pieces.
    if sentence is not None and 3 <= len(sentence.words()) <= 30 and len(header.split()) <= 8:
      descriptions[header] = sentence.text
  return descriptions


# -------------------------------------------------------------------------------- sources


def _signature_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
  args = node.args
  names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
  return names + [a.arg for a in (args.vararg, args.kwarg) if a is not None]


def _documented_nodes(tree: ast.Module) -> Iterator[ast.AST]:
  """The module, its classes and functions (nested ones too), in source order; expressions
  are never visited (ast.walk would: several times slower)."""
  stack: list[ast.AST] = [tree]
  while stack:
    node = stack.pop()
    yield node
    body = getattr(node, "body", [])
    stack.extend(reversed([n for n in body if isinstance(
        n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]))


def read_source(package: str, path: str, absolute: str) -> SourceFile:
  """The sentences and parameter descriptions of one installed module (parsed, never imported)."""
  source = SourceFile(package, path, [], [])
  try:
    with open(absolute, "rb") as f:
      code = f.read()
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # SyntaxWarnings of old escape sequences.
      tree = ast.parse(code)
  except (SyntaxError, ValueError, UnicodeDecodeError, OSError, RecursionError):
    return source
  for node in _documented_nodes(tree):
    docstring = ast.get_docstring(node, clean=True)
    if not docstring:
      continue
    source.sentences.extend(docstring_sentences(docstring))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      names = [n for n in _signature_names(node) if n not in ("self", "cls")]
      descriptions = parameter_descriptions(docstring, names)
      if len(descriptions) >= 2:
        source.parameters.append(descriptions)
        summary = parse_markup(docstring.strip().splitlines()[0].strip())
        if summary is not None and 3 <= len(summary.words()) <= 30:
          source.functions.append((summary.text, descriptions))
  return source


def installed_sources(packages: Sequence[str] = PACKAGES) -> list[SourceFile]:
  """Every .py module of `packages` in the running interpreter's site-packages, in sorted
  order (tests and vendored code left out)."""
  paths = sysconfig.get_paths()
  roots = sorted({os.path.realpath(paths[k]) for k in ("purelib", "platlib")})
  sources = []
  for package in packages:
    root = next((r for r in roots if os.path.isdir(os.path.join(r, package))), None)
    if root is None:
      raise ValueError(f"{package} is not installed in {roots}: the local suite reads its "
                       "docstrings (pip install -e . installs them)")
    found = []
    for directory, dirnames, filenames in os.walk(os.path.join(root, package)):
      dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
      found.extend(os.path.join(directory, f) for f in filenames
                   if f.endswith(".py") and not f.startswith("test_"))
    for absolute in sorted(found):
      relative = os.path.relpath(absolute, root).replace(os.sep, "/")
      sources.append(read_source(package, relative, absolute))
  return sources


def _versions(packages: Sequence[str]) -> dict[str, str]:
  return {p: importlib.metadata.version(p) for p in packages}


# ------------------------------------------------------------------------------ splitting


def _file_order(path: str) -> str:
  """A fixed pseudo-random order of files (for the split) that does not follow their names."""
  return hashlib.sha256(f"local_suite:{path}".encode()).hexdigest()


def validation_files(counts: dict[str, int], fraction: float) -> set[str]:
  """Files (by their item counts) for validation: in a hashed order until they hold `fraction`
  of the items; a file over twice the target stays in train (one file is not a split)."""
  target = fraction * sum(counts.values())
  chosen, held = set(), 0
  for path in sorted(counts, key=_file_order):
    if held < target and counts[path] <= 2 * target:
      chosen.add(path)
      held += counts[path]
  return chosen


def _sample(items: list, n: int, seed: str) -> list:
  """n items drawn without replacement (all of them, shuffled, if fewer), seeded by a string."""
  items = list(items)
  random.Random(seed).shuffle(items)
  return items[:n]


# ----------------------------------------------------------------------------------- tasks


def _topic_records(sources: list[SourceFile], sizes: dict[str, int]) -> dict[str, list[dict]]:
  """scipy_topic: sentence -> its scipy subpackage, split by module, balanced per class."""
  by_topic: dict[str, dict[str, list[str]]] = collections.defaultdict(dict)
  for source in sources:
    parts = source.path.split("/")
    if source.package == "scipy" and len(parts) > 2 and parts[1] in TOPICS:
      # At most 35 words: ~60 pieces, a row of 64 (whole sentences, and 3x faster than 128).
      by_topic[parts[1]][source.path] = [s.text for s in source.sentences
                                         if len(s.words()) <= 35]
  owners = collections.defaultdict(set)  # Sentence -> topics: one in several is ambiguous.
  for topic, files in by_topic.items():
    for texts in files.values():
      for text in texts:
        owners[text.lower()].add(topic)
  records: dict[str, list[dict]] = {"train": [], "validation": []}
  for topic in TOPICS:
    files = by_topic[topic]
    held_out = validation_files({p: len(t) for p, t in files.items()}, 0.25)
    pools = {split: sorted({t for p, texts in files.items() if (p in held_out) == is_val
                            for t in texts if len(owners[t.lower()]) == 1})
             for split, is_val in (("train", False), ("validation", True))}
    train_keys = {t.lower() for t in pools["train"]}
    pools["validation"] = [t for t in pools["validation"] if t.lower() not in train_keys]
    for split, pool in pools.items():
      chosen = _sample(pool, sizes[split], f"scipy_topic:{split}:{topic}")
      records[split].extend({"text": t, "label": topic} for t in chosen)
  return {split: _sample(rows, len(rows), f"scipy_topic:{split}")
          for split, rows in records.items()}


def _param_examples(functions: list[dict[str, str]], n: int, seed: str) -> list[dict]:
  """Per drawn (function, parameter): its entry line with its own description (label "1") and
  with the description of a parameter of another function of the split ("0"), so the label is
  half and half. (Negatives from the same function left a tiny encoder at chance after the
  suite's 3 epochs, from scratch and pretrained alike.)"""
  candidates = sorted({(entry, json.dumps(descriptions, sort_keys=True))
                       for descriptions in functions for entry in descriptions})
  pool = sorted({d for descriptions in functions for d in descriptions.values()})
  rng, rows, seen = random.Random(seed), [], set()
  for entry, encoded in _sample(candidates, len(candidates), seed):
    descriptions = json.loads(encoded)
    own = descriptions[entry]
    if (entry, own) in seen:
      continue
    seen.add((entry, own))
    other = rng.choice(pool)
    while other in descriptions.values():
      other = rng.choice(pool)
    pair = [{"text": entry, "text_b": own, "label": "1"},
            {"text": entry, "text_b": other, "label": "0"}]
    rows.extend(pair if rng.random() < 0.5 else pair[::-1])
    if len(rows) >= n:
      break
  return rows


def _param_records(sources: list[SourceFile], sizes: dict[str, int]) -> dict[str, list[dict]]:
  """param_match: (entry line, description) pairs of numpy and scipy functions, split by
  module; a description also found in train is not used in validation."""
  counts = {s.path: len(s.parameters) for s in sources if s.parameters}
  held_out = validation_files(counts, 0.2)
  train = [d for s in sources if s.parameters and s.path not in held_out for d in s.parameters]
  train_rows = _param_examples(train, sizes["train"], "param_match:train")
  train_texts = {d.lower() for f in train for d in f.values()}
  validation = []
  for source in sources:
    if source.path in held_out:
      for descriptions in source.parameters:
        kept = {p: d for p, d in descriptions.items() if d.lower() not in train_texts}
        if len(kept) >= 2:
          validation.append(kept)
  return {"train": train_rows,
          "validation": _param_examples(validation, sizes["validation"],
                                        "param_match:validation")}


def _tag_records(sources: list[SourceFile], sizes: dict[str, int]) -> dict[str, list[dict]]:
  """code_tags: sentences with at least one marked code word (at most 60% code), each word
  tagged CODE or O; split by module."""
  def usable(sentence: Sentence) -> bool:
    flags = [is_code for _, is_code in sentence.words()]
    return 0 < sum(flags) <= 0.6 * len(flags)

  per_file = {s.path: sorted({x.text: x for x in s.sentences if usable(x)}.values(),
                             key=lambda x: x.text) for s in sources}
  per_file = {p: x for p, x in per_file.items() if x}
  held_out = validation_files({p: len(x) for p, x in per_file.items()}, 0.2)
  train_texts = {x.text.lower() for p, xs in per_file.items() if p not in held_out for x in xs}
  records = {}
  for split, is_val in (("train", False), ("validation", True)):
    pool = {x.text: x for p, xs in per_file.items() if (p in held_out) == is_val for x in xs
            if not (is_val and x.text.lower() in train_texts)}
    chosen = _sample(sorted(pool), sizes[split], f"code_tags:{split}")
    records[split] = [{"text": " ".join(w for w, _ in pool[t].words()),
                       "tags": ["CODE" if c else "O" for _, c in pool[t].words()]}
                      for t in chosen]
  return records


# ------------------------------------------------------------------------------- building

# name -> (task, metric, max_seq_length, train size, validation size (scipy_topic: per class),
# builder). Sizes keep the suite at a few minutes per encoder on 2 CPU cores with a tiny model
# (benchmarks/local_suite.py); lengths hold all but ~0.1% of the examples in the pieces of the
# built-in vocabulary (8k unigram; a sentence has ~20 on average, a pair ~16).
_TASKS = {
    "scipy_topic": ("classification", "accuracy", 64, 300, 80, _topic_records),
    "param_match": ("classification", "accuracy", 64, 2400, 600, _param_records),
    "code_tags": ("tagging", "token_f1", 96, 2400, 600, _tag_records),
}


def label_counts(rows: list[dict]) -> dict[str, int]:
  """How often each label (tagging: each tag) occurs."""
  counter = collections.Counter()
  for row in rows:
    counter.update(row["tags"] if "tags" in row else [row["label"]])
  return dict(sorted(counter.items()))


def majority_score(rows: list[dict], metric: str) -> float:
  """`metric` of predicting the most frequent label (tagging: "O" everywhere, token F1 0)."""
  if metric == "token_f1":
    return 0.0
  counts = label_counts(rows)
  return max(counts.values()) / sum(counts.values())


def _write_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
  storage.write_text(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n"
                                   for r in rows))


def claim_suite_dir(output_dir: str, names: list[str], suite: str) -> None:
  """Refuses to build `suite` into `output_dir` when that would replace something the suite
  did not write: one of `names` there, without the `suite.json` of an earlier build (the red
  team's data loss: a user's own train.jsonl replaced without a word)."""
  marker = storage.join(output_dir, SUMMARY_FILE)
  if storage.isfile(marker):
    try:
      if {"version", "packages"} <= set(json.loads(storage.read_text(marker))):
        return  # An earlier build of a suite: rebuilt in place, byte for byte.
    except (ValueError, AttributeError, TypeError):
      pass
  taken = [n for n in names if storage.exists(storage.join(output_dir, n))]
  if taken:
    raise ValueError(f"{storage.join(output_dir, taken[0])} exists and {output_dir} is not a "
                     f"directory the {suite} suite built (no {SUMMARY_FILE} of it): the build "
                     "would replace it; move it, or give another --output_dir")


def build(output_dir: str) -> list[LocalTask]:
  """Writes every task's `<name>/train.jsonl` and `<name>/validation.jsonl` (and `suite.json`:
  sizes, label counts, majority rates, package versions) under `output_dir`; same installed
  files, same bytes."""
  claim_suite_dir(output_dir, [*_TASKS, SUMMARY_FILE], "local")
  sources = installed_sources()
  storage.makedirs(output_dir)
  built, summary = [], {"version": SUITE_VERSION, "packages": _versions(PACKAGES), "tasks": {}}
  for name, (task, metric, length, n_train, n_validation, builder) in _TASKS.items():
    records = builder(sources, {"train": n_train, "validation": n_validation})
    directory = storage.join(output_dir, name)
    storage.makedirs(directory)
    files = {}
    for split, rows in records.items():
      if not rows:
        raise ValueError(f"local suite task {name}: no {split} examples from {PACKAGES}")
      files[split] = storage.join(directory, f"{split}.jsonl")
      _write_jsonl(files[split], rows)
    chance = majority_score(records["validation"], metric)
    built.append(LocalTask(name, task, files["train"], files["validation"], metric, length,
                           chance))
    summary["tasks"][name] = {
        "task": task, "metric": metric, "max_seq_length": length, "chance": chance,
        **{f"{split}_examples": len(rows) for split, rows in records.items()},
        **{f"{split}_labels": label_counts(rows) for split, rows in records.items()}}
  storage.write_text(storage.join(output_dir, SUMMARY_FILE),
                     json.dumps(summary, indent=1, sort_keys=True) + "\n")
  return built
