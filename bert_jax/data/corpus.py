"""Corpus readers: each yields documents, a document being a list of sentences.

A document is `list[str]` of non-empty, stripped sentences. Every reader streams (a generator),
so a corpus never has to fit in memory. Sources:
- `iter_bert_format`: google-research/bert's input format (one sentence per line, a blank line
  between documents).
- `iter_paragraph_text`: plain text, blank-line-separated documents, split into sentences here.
- `iter_tfds_text`: a TFDS text dataset (e.g. `wikipedia/20230601.en`), read through
  `tfds.data_source` (ArrayRecord; no TensorFlow needed).
- `iter_builtin_docstrings`: the docstrings of a pinned selection of installed files (Python's
  standard library and requirements.txt's packages, `builtin_selection.py`), a default corpus
  available offline on every machine, the same wherever the pinned versions are installed.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import glob
import hashlib
import logging
import os
import re
import threading
import warnings
from typing import Iterable, Iterator, Sequence

from bert_jax.runtime import storage
from bert_jax.data import builtin_selection

logger = logging.getLogger(__name__)

Document = list[str]

# ---------------------------------------------------------------------------------------------
# Reading files


@dataclasses.dataclass
class CorpusStats:
  """Counters a reader fills while it streams (pass one in, read it after iterating)."""

  files: int = 0
  documents: int = 0
  sentences: int = 0
  bytes: int = 0  # Raw bytes read from the files (before decoding).
  invalid_bytes: int = 0  # Bytes that were not valid UTF-8 (each run decoded as U+FFFD).
  records: int = 0  # Record files (`inputs`): records read, ...
  empty_records: int = 0  # ... and those whose text field was null or blank (no document).
  # Documents dropped as repeats of another's text (`shuffle.distinct`; counted there).
  duplicate_documents: int = 0


def expand_paths(patterns: str | Sequence[str]) -> list[str]:
  """Files named by `patterns` (paths or globs; a comma-separated string works too), sorted.

  Raises ValueError naming the pattern when a path is missing or a glob matches nothing, so a
  typo in a flag fails before any work starts.
  """
  if isinstance(patterns, (str, os.PathLike)):
    patterns = [p for p in str(patterns).split(",") if p.strip()]
  if not patterns:
    raise ValueError("No input paths given (the corpus flag is empty).")
  paths: set[str] = set()
  for pattern in patterns:
    pattern = os.path.expanduser(str(pattern).strip())
    if storage.is_remote(pattern):  # A bucket's files (read through `storage`).
      matches = storage.glob(pattern) if glob.has_magic(pattern) else (
          [pattern] if storage.isfile(pattern) else [])
      if not matches:
        raise ValueError(f"Input pattern {pattern!r} matches no files." if glob.has_magic(
            pattern) else f"Input path {pattern!r} does not exist.")
      paths.update(matches)
    elif glob.has_magic(pattern):
      matches = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
      if not matches:
        raise ValueError(f"Input pattern {pattern!r} matches no files.")
      paths.update(matches)
    elif os.path.isdir(pattern):
      raise ValueError(f"Input path {pattern!r} is a directory; pass files or a glob "
                       f"(e.g. {os.path.join(pattern, '*.txt')!r}).")
    elif not os.path.isfile(pattern):
      raise ValueError(f"Input path {pattern!r} does not exist.")
    else:
      paths.add(pattern)
  return sorted(paths)


# The error handler is registered once, process-wide; each thread counts into its own slot so
# concurrent readers don't mix their counts.
_COUNTER = threading.local()
_ERROR_HANDLER = "bert_jax_count_replace"


def _count_and_replace(error: UnicodeError) -> tuple[str, int]:
  """Like errors="replace" (one U+FFFD per invalid run) but counts the invalid bytes."""
  if not isinstance(error, UnicodeDecodeError):
    raise error
  _COUNTER.invalid = getattr(_COUNTER, "invalid", 0) + (error.end - error.start)
  return "\ufffd", error.end


codecs.register_error(_ERROR_HANDLER, _count_and_replace)


def decode_utf8(raw: bytes) -> tuple[str, int]:
  """(text, invalid byte count) of UTF-8 `raw`; each invalid run becomes one U+FFFD."""
  try:
    return raw.decode("utf-8"), 0  # The common case, at C speed.
  except UnicodeDecodeError:
    pass
  _COUNTER.invalid = 0
  text = raw.decode("utf-8", errors=_ERROR_HANDLER)
  return text, _COUNTER.invalid


# How much of each input file `check_text_files` reads, and the share of it that may be invalid
# UTF-8 in a text file (a Latin-1 file of accented prose stays far below; random bytes, images
# and archives are above half).
SNIFF_BYTES = 64 * 1024
MAX_INVALID_SHARE = 0.1


def check_text_files(paths: Sequence[str]) -> None:
  """Refuses, before any work, an input file that is not text: NUL bytes, or more than
  `MAX_INVALID_SHARE` of its first `SNIFF_BYTES` not UTF-8 (random bytes became a pretraining
  dataset with one UTF-8 warning)."""
  for path in paths:
    with storage.open_binary(path) as f:
      head = f.read(SNIFF_BYTES)
    if len(head) == SNIFF_BYTES:
      head = head[:-3]  # A character the sample cut in two is not invalid.
    if b"\x00" in head:
      why = "it holds NUL bytes"
    else:
      invalid = decode_utf8(head)[1]
      if invalid <= MAX_INVALID_SHARE * len(head):
        continue
      why = f"{invalid / len(head):.0%} of its first {len(head):,} bytes are not UTF-8"
    raise ValueError(f"Input file {path} is not text ({why}): --input takes UTF-8 text files "
                     "(one sentence per line, or paragraphs)")


def _read_lines(path: str, stats: CorpusStats) -> Iterator[str]:
  """Yields the decoded, stripped lines of `path` (UTF-8; invalid bytes counted and replaced).

  Splitting on b"\\n" before decoding is safe because UTF-8 never uses 0x0A inside a multi-byte
  character.
  """
  stats.files += 1
  invalid = 0
  with storage.open_binary(path) as f:
    for i, raw in enumerate(f):
      stats.bytes += len(raw)
      if i == 0 and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
      line, line_invalid = decode_utf8(raw)
      if line_invalid:
        invalid += line_invalid
        stats.invalid_bytes += line_invalid
      yield line.strip()
  if invalid:
    logger.warning("%s: %d bytes are not valid UTF-8 (replaced by U+FFFD).", path, invalid)


def _count(doc: Document, stats: CorpusStats) -> Document:
  stats.documents += 1
  stats.sentences += len(doc)
  return doc


def empty_corpus_error(paths: Sequence[str]) -> ValueError:
  shown = ", ".join(paths[:5]) + (f" (and {len(paths) - 5} more)" if len(paths) > 5 else "")
  return ValueError(f"The corpus has no documents (no non-blank lines) in: {shown}.")


def file_documents(path: str, input_format: str, stats: CorpusStats) -> Iterator[Document]:
  """The documents of one file of `input_format` ("bert": a sentence a line, blank line between
  documents; "paragraphs": plain text, blank-line-separated blocks split into sentences),
  counted into `stats`. A file's end ends its document: files are read independently (the
  Beam pipeline reads each on its own worker)."""
  if input_format not in ("bert", "paragraphs"):
    raise ValueError(f"input_format={input_format!r} is not one of 'bert', 'paragraphs'")
  block: list[str] = []

  def finish() -> Iterator[Document]:
    doc = block if input_format == "bert" else split_sentences(" ".join(block))
    if doc:
      yield _count(doc, stats)

  for line in _read_lines(path, stats):
    if line:
      block.append(line)
    elif block:
      yield from finish()
      block = []
  if block:
    yield from finish()


def _iter_files(paths: str | Sequence[str], input_format: str,
                stats: CorpusStats | None) -> Iterator[Document]:
  stats = CorpusStats() if stats is None else stats
  files = expand_paths(paths)
  found = stats.documents
  for path in files:
    yield from file_documents(path, input_format, stats)
  if stats.documents == found:
    raise empty_corpus_error(files)


def iter_bert_format(paths: str | Sequence[str],
                     stats: CorpusStats | None = None) -> Iterator[Document]:
  """Documents of google-research/bert's format: one sentence per line, blank line between docs.

  Unlike the original, the end of a file also ends a document (the original lets a document run
  on into the next file, which mixes unrelated text). Raises ValueError naming the paths if the
  whole corpus holds no document.
  """
  return _iter_files(paths, "bert", stats)


def iter_paragraph_text(paths: str | Sequence[str],
                        stats: CorpusStats | None = None) -> Iterator[Document]:
  """Documents of plain text: blank-line-separated blocks, each split into sentences.

  Lines of a block are joined with spaces (text wrapped at a fixed width reads as one paragraph).
  """
  return _iter_files(paths, "paragraphs", stats)


# ---------------------------------------------------------------------------------------------
# Sentence splitting

# Lower-cased words that end with a period without ending a sentence.
ABBREVIATIONS = frozenset("""
  mr mrs ms dr prof sr jr st mt ft rev hon gen col lt capt sgt gov pres rep sen
  e.g eg i.e ie etc cf vs viz al approx ca resp esp incl ed eds
  inc ltd co corp dept univ est
  jan feb mar apr jun jul aug sep sept oct nov dec
  u.s u.k u.n a.m p.m ph.d b.sc m.sc
""".split())
# Abbreviations only before a number ("No. 5", "Fig. 3"); "No. The" ends a sentence.
NUMBER_ABBREVIATIONS = frozenset("""
  no nos fig figs eq eqs vol vols pp ch chap sec sect art ref refs op
""".split())

# A candidate boundary: sentence-final punctuation (and closing quotes/brackets), whitespace, then
# an optional opening quote or bracket and the character checked by `_opens_sentence`.
_BOUNDARY = re.compile(r"""([.!?]+['"\u2019\u201d)\]]*)\s+['"\u2018\u201c(\[]?(\w)""")
_WHITESPACE = re.compile(r"\s+")
_INITIALS = re.compile(r"[a-z]|([a-z]\.)+[a-z]")  # "J" of "J. Smith", "U.S.A", "e.g".


def _is_abbreviation(text: str, start: int, end: int) -> bool:
  """Whether the word of `text` ending at `end` (a period; the sentence began at `start`) is an
  abbreviation."""
  word = text[max(text.rfind(" ", start, end) + 1, start):end]
  word = word.lstrip("([\"'\u2018\u201c").lower()
  if word in ABBREVIATIONS or _INITIALS.fullmatch(word):
    return True
  return word in NUMBER_ABBREVIATIONS and text[end + 2:end + 3].isdigit()


def split_sentences(text: str) -> list[str]:
  """Splits `text` into sentences with a rule-based splitter (no model needed, runs offline).

  Splits after . ! ? (plus closing quotes/brackets) followed by whitespace and an uppercase
  letter (any script), digit or opening quote; not after abbreviations ("e.g.", "Mr.", "etc."), initials or
  inside decimals ("3.14" has no whitespace after the period). Whitespace is normalised.
  """
  text = _WHITESPACE.sub(" ", text).strip()
  if not text:
    return []
  sentences = []
  start = 0
  for match in _BOUNDARY.finditer(text):
    opener = match.group(2)  # Uppercase in any script ("Über") or a digit opens a sentence.
    if not (opener.isupper() or opener.isdigit()):
      continue
    if match.group(1) == "." and _is_abbreviation(text, start, match.start()):
      continue
    sentences.append(text[start:match.end(1)])
    start = match.end(1) + 1  # Past the single space left by whitespace normalisation.
  sentences.append(text[start:])
  return [s.strip() for s in sentences if s.strip()]


# ---------------------------------------------------------------------------------------------
# TFDS text datasets


def text_to_document(text: str) -> Document:
  """Splits a whole article into sentences, paragraph by paragraph (paragraphs are lines)."""
  doc: Document = []
  for paragraph in text.split("\n"):
    doc.extend(split_sentences(paragraph))
  return doc


def iter_tfds_text(name: str, split: str = "train", field: str = "text",
                   data_dir: str | None = None, download: bool = True,
                   stats: CorpusStats | None = None) -> Iterator[Document]:
  """Documents of a TFDS text dataset: each record's `field` split into sentences.

  Reads through `tfds.data_source` (ArrayRecord, random access, no TensorFlow); `download=True`
  downloads and prepares the dataset into `data_dir` first if it is not there. Records are read in
  index order, so the order is deterministic for a given prepared dataset.
  """
  import tensorflow_datasets as tfds  # Deferred: importing TFDS takes seconds.

  stats = CorpusStats() if stats is None else stats
  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
  except Exception as e:  # TFDS raises many types (not found, bad split, failed download).
    raise ValueError(f"TFDS dataset {name!r} split {split!r} (data_dir={data_dir!r}) could not "
                     f"be loaded: {type(e).__name__}: {e}") from e
  found = stats.documents
  for index in range(len(source)):
    record = source[index]
    if field not in record:
      raise ValueError(f"TFDS dataset {name!r} has no field {field!r} (fields: "
                       f"{sorted(record)}); set the text field flag.")
    text = record[field]
    if isinstance(text, bytes):
      stats.bytes += len(text)
      text, invalid = decode_utf8(text)
      stats.invalid_bytes += invalid
    else:
      stats.bytes += len(text.encode("utf-8"))
    doc = text_to_document(text)
    if doc:
      yield _count(doc, stats)
  if stats.documents == found:
    raise ValueError(f"TFDS dataset {name!r} split {split!r} field {field!r} has no documents.")


# ---------------------------------------------------------------------------------------------
# Built-in corpus: docstrings of the pinned selection of installed files (builtin_selection.py)

_MIN_DOC_CHARS = 80
_MIN_DOC_SENTENCES = 2


_DOCTEST = re.compile(r"^\s*(>>>|\.\.\.\s)")
_DIRECTIVE = re.compile(r"^\s*\.\.(\s|$)")
_UNDERLINE = re.compile(r"^\s*([-=~^*#+`'\"])\1{2,}\s*$")
_HEADER = re.compile(r"^\s*[A-Z][A-Za-z ]{0,30}:\s*$")  # "Args:", "Returns:", "Example:".
_FIELD = re.compile(r"^\s*:(param|type|returns?|rtype|raises?|var|ivar|cvar)\b")
_CODE = re.compile(
    r"^\s*((def|class|return|raise|elif|else|for|while|with|try|except|print|"
    r"assert|lambda|yield|async|await)\b[^.]*$"  # A statement (not prose starting "For ...").
    r"|(from\s+[\w.]+\s+)?import\s+[\w.*]+(\s+as\s+\w+)?(\s*,\s*[\w.]+)*\s*$"  # An import.
    r"|[\w.\[\]'\"]+\s*[-+*/|&]?=\s*\S"  # An assignment.
    r"|[$%#]\s"  # A shell prompt or comment.
    r"|\w+\(.*\)\s*$"  # A call on its own line.
    r"|.*(\s#\s|==|!=|->|\{|\}|;\s*$|\)\.)"  # Inline comment, operators, braces.
    r")")
_CODE_CHARS = re.compile(r"[\[\]()=<>_*/\\|@#$%^&~`]")
_NOT_PROSE = re.compile(r"[^\w ]|[\d_]")
_ROLES = re.compile(r":[a-z]+(:[a-z]+)?:`~?([^`<]*?)(\s*<[^>]*>)?`")  # :func:`name` -> name
_LITERAL = re.compile(r"``([^`]*)``")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")  # reST link `text <url>`_ -> text


def _is_code_line(line: str) -> bool:
  """A heuristic for lines of code, tables or signatures inside docstrings."""
  if _CODE.match(line):
    return True
  stripped = line.strip()
  symbols = len(_CODE_CHARS.findall(stripped))
  not_prose = len(_NOT_PROSE.findall(stripped))
  return symbols > 0.08 * len(stripped) or not_prose > 0.3 * len(stripped)


def _is_prose_sentence(sentence: str) -> bool:
  """At least three words and mostly letters: drops stray fragments like "x : int"."""
  return (sentence.count(" ") >= 2
          and len(_NOT_PROSE.findall(sentence)) <= 0.3 * len(sentence))


def _docstring_to_document(docstring: str) -> Document:
  """Prose sentences of a docstring; doctests, directives, headers and code-ish lines dropped."""
  lines = docstring.expandtabs().splitlines()
  # Dedent as inspect.cleandoc does: the first line has no indentation of its own.
  indents = [len(l) - len(l.lstrip()) for l in lines[1:] if l.strip()]
  margin = min(indents) if indents else 0
  lines = [lines[0].strip()] + [l[margin:] for l in lines[1:]]
  paragraphs: list[list[str]] = [[]]
  skipping = ""  # "doctest": until a blank line; "indented": while indented past block_indent.
  block_indent = 0
  for line in lines:
    stripped = line.strip()
    if not stripped:
      paragraphs.append([])
      if skipping == "doctest":
        skipping = ""
      continue
    indent = len(line) - len(line.lstrip())
    if skipping == "indented" and indent > block_indent:
      continue
    if skipping == "doctest":
      continue  # Expected output of the example.
    skipping = ""
    if _DOCTEST.match(line):
      skipping = "doctest"
      paragraphs.append([])
      continue
    if _DIRECTIVE.match(line) or stripped.endswith("::"):
      # A directive or a literal block: skip its indented body; keep prose before a "::".
      text = "" if _DIRECTIVE.match(line) else stripped[:-2].rstrip()
      if text and not _is_code_line(text):
        paragraphs[-1].append(text if text.endswith((".", ":")) else text + ":")
      skipping, block_indent = "indented", indent
      paragraphs.append([])
      continue
    if (_UNDERLINE.match(line) or _HEADER.match(line) or _FIELD.match(line)
        or _is_code_line(line)):
      paragraphs.append([])
      continue
    paragraphs[-1].append(stripped)
  doc: Document = []
  for paragraph in paragraphs:
    if paragraph:
      text = _LINK.sub(r"\1", " ".join(paragraph))
      text = _LITERAL.sub(r"\1", _ROLES.sub(r"\2", text))
      doc.extend(s for s in split_sentences(text) if _is_prose_sentence(s))
  return doc


def _docstrings(tree: ast.Module) -> Iterator[str]:
  """Docstrings of the module, its classes and functions, in source order."""
  stack: list[ast.AST] = [tree]
  while stack:
    node = stack.pop()
    docstring = ast.get_docstring(node, clean=False)
    if docstring:
      yield docstring
    children = [n for n in ast.iter_child_nodes(node)
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    stack.extend(reversed(children))


def _file_documents(path: str) -> tuple[int, list[Document]]:
  """(source bytes, documents) of one .py file; (0, []) if it does not parse."""
  try:
    with open(path, "rb") as f:
      source = f.read()
    if b'"""' not in source and b"'''" not in source:
      return len(source), []  # No long docstring possible; skip the (slow) parse.
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # SyntaxWarnings of old escape sequences.
      tree = ast.parse(source)
  except (SyntaxError, ValueError, UnicodeDecodeError, OSError, RecursionError, MemoryError):
    return 0, []
  docs = []
  for docstring in _docstrings(tree):
    if len(docstring) < _MIN_DOC_CHARS:
      continue
    doc = _docstring_to_document(docstring)
    if len(doc) >= _MIN_DOC_SENTENCES and sum(len(s) for s in doc) >= _MIN_DOC_CHARS:
      docs.append(doc)
  return len(source), docs


def iter_builtin_docstrings(max_bytes: int = 0, stats: CorpusStats | None = None,
                            num_workers: int = 0) -> Iterator[Document]:
  """Documents from the docstrings of the built-in selection's files (`builtin_selection`).

  Each module, class and function docstring with at least two prose sentences and 80 characters
  is a document. Files are parsed with `ast` (never imported) in the selection's order, and
  repeated documents (copied docstrings) are kept once, so the same files yield the same corpus
  on every machine (`builtin_selection.current().fingerprint` identifies them). `max_bytes` > 0
  stops once that many UTF-8 bytes of sentences (one newline each) have been yielded.
  `num_workers` > 1 parses in that many spawned processes (the calling script needs an
  `if __name__ == "__main__":` guard, as for any multiprocessing); the output is the same,
  results are taken in file order.
  """
  stats = CorpusStats() if stats is None else stats
  paths = builtin_selection.current().paths
  seen: set[bytes] = set()
  total = 0
  pool = None
  if num_workers > 1:
    from bert_jax.data import workers  # pylint: disable=g-import-not-at-top  (numpy)

    pool = workers.spawn_pool(num_workers)  # Spawned, ignoring Ctrl-C (the parent reacts).
    results: Iterable[tuple[int, list[Document]]] = pool.imap(_file_documents, paths,
                                                              chunksize=16)
  else:
    results = map(_file_documents, paths)
  try:
    for size, docs in results:
      if not size:
        continue
      stats.files += 1
      stats.bytes += size
      for doc in docs:
        key = hashlib.blake2b("\n".join(doc).encode(), digest_size=16).digest()
        if key in seen:
          continue
        seen.add(key)
        yield _count(doc, stats)
        total += sum(len(s.encode("utf-8")) + 1 for s in doc)
        if max_bytes and total >= max_bytes:
          return
  finally:
    if pool is not None:
      pool.terminate()
      pool.join()


def iter_sentences(documents: Iterable[Document]) -> Iterator[str]:
  """The sentences of `documents`, in order (e.g. to train a vocabulary)."""
  for doc in documents:
    yield from doc
