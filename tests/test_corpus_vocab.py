"""Corpus readers (BERT format, paragraphs, TFDS, built-in docstrings) and vocabularies.

WordPiece ids are checked against `transformers.BertTokenizerFast` on the same vocab.txt;
sentencepiece vocabularies are trained here on a slice of the built-in corpus (no downloads).
"""

import logging
import os
import pickle
import shutil

import pytest

from bert_jax.data import corpus
from bert_jax.data import vocab as vocab_lib

# ----------------------------------------------------------------------------------- helpers


def write(path, text: str | bytes) -> str:
  mode = "wb" if isinstance(text, bytes) else "w"
  with open(path, mode, **({} if isinstance(text, bytes) else {"encoding": "utf-8"})) as f:
    f.write(text)
  return str(path)


@pytest.fixture(scope="module")
def builtin_sentences() -> list[str]:
  """Sentences of the first ~300 KB of the built-in corpus: enough for small vocabularies."""
  return list(corpus.iter_sentences(corpus.iter_builtin_docstrings(max_bytes=300_000)))


@pytest.fixture(scope="module")
def sp_vocab(builtin_sentences, tmp_path_factory) -> vocab_lib.Vocab:
  prefix = str(tmp_path_factory.mktemp("sp") / "spm")
  return vocab_lib.train_sentencepiece(iter(builtin_sentences), prefix, 1000, "unigram")


# ----------------------------------------------------------------------------------- sentences


@pytest.mark.parametrize("text, expected", [
    ("One sentence. Another one! A third? Yes.",
     ["One sentence.", "Another one!", "A third?", "Yes."]),
    ("Use e.g. this or i.e. that. Then stop.", ["Use e.g. this or i.e. that.", "Then stop."]),
    ("Mr. Smith met Dr. Jones at 3.30 p.m. yesterday. They talked.",
     ["Mr. Smith met Dr. Jones at 3.30 p.m. yesterday.", "They talked."]),
    ("Apples, pears, etc. Are fruit. Pi is 3.14159 and e is 2.718. Fine.",
     ["Apples, pears, etc. Are fruit.", "Pi is 3.14159 and e is 2.718.", "Fine."]),
    ('He said "Stop." Then he left. J. R. R. Tolkien wrote it. See Fig. 3 and ch. 2 now.',
     ['He said "Stop."', "Then he left.", "J. R. R. Tolkien wrote it.",
      "See Fig. 3 and ch. 2 now."]),
    ("See No. 5 and eq. 2. No. The end.", ["See No. 5 and eq. 2.", "No.", "The end."]),
    ("Version 2. The next. (Quoted.) Done.", ["Version 2.", "The next.", "(Quoted.)", "Done."]),
    ("lower case. after period stays. Wrapped\n  over   lines.",
     ["lower case. after period stays.", "Wrapped over lines."]),
    ("In the U.S. Army? No. In 1999. It ended.", ["In the U.S. Army?", "No.", "In 1999.",
                                                 "It ended."]),
    ("Er kam. Über Nacht blieb er. École fermée.",
     ["Er kam.", "Über Nacht blieb er.", "École fermée."]),
    ("Ends with a number 42. 7 more follow. x. y.", ["Ends with a number 42.", "7 more follow. x. y."]),
    ("   ", []),
])
def test_split_sentences(text, expected):
  assert corpus.split_sentences(text) == expected


# ----------------------------------------------------------------------------------- files


def test_bert_format_documents_and_stats(tmp_path):
  a = write(tmp_path / "a.txt",
            "\ufeffFirst doc, line one.\r\n  Line two.  \n\n\n\nSecond doc.\n   \nThird doc.\n")
  b = write(tmp_path / "b.txt", "Fourth doc runs to the end of the file.")
  stats = corpus.CorpusStats()
  docs = list(corpus.iter_bert_format([b, a], stats))  # Files are read in sorted order.
  assert docs == [["First doc, line one.", "Line two."], ["Second doc."], ["Third doc."],
                  ["Fourth doc runs to the end of the file."]]
  assert (stats.files, stats.documents, stats.sentences, stats.invalid_bytes) == (2, 4, 5, 0)
  assert stats.bytes == os.path.getsize(a) + os.path.getsize(b)
  # A glob and a comma-separated string name the same files.
  assert list(corpus.iter_bert_format(str(tmp_path / "*.txt"))) == docs
  assert list(corpus.iter_bert_format(f"{a},{b}")) == docs


def test_paragraph_text(tmp_path):
  path = write(tmp_path / "p.txt",
               "The first paragraph is wrapped\nover two lines. It has e.g. two sentences.\n"
               "\n\nSecond paragraph. Mr. Brown wrote 2.5 pages! Really?\n")
  stats = corpus.CorpusStats()
  docs = list(corpus.iter_paragraph_text(path, stats))
  assert docs == [["The first paragraph is wrapped over two lines.",
                   "It has e.g. two sentences."],
                  ["Second paragraph.", "Mr. Brown wrote 2.5 pages!", "Really?"]]
  assert (stats.documents, stats.sentences) == (2, 5)


def test_invalid_utf8_is_replaced_and_counted(tmp_path, caplog):
  # \xff and \xfe are never valid; \xe2\x82 is a truncated 3-byte sequence (one run of 2 bytes).
  bad = write(tmp_path / "bad.txt", b"Caf\xc3\xa9 ok \xff\xfe here.\nCut \xe2\x82 off.\n")
  good = write(tmp_path / "good.txt", "Fine text.\n")
  stats = corpus.CorpusStats()
  with caplog.at_level(logging.WARNING):
    docs = list(corpus.iter_bert_format([bad, good], stats))
  assert docs == [["Caf\u00e9 ok \ufffd\ufffd here.", "Cut \ufffd off."], ["Fine text."]]
  assert stats.invalid_bytes == 4
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and bad in warnings[0] and "4 bytes" in warnings[0]


def test_expand_paths_and_errors(tmp_path):
  paths = [write(tmp_path / name, "x\n") for name in ("b.txt", "a.txt", "c.md")]
  assert corpus.expand_paths(str(tmp_path / "*.txt")) == sorted(paths[:2])
  assert corpus.expand_paths([paths[2], str(tmp_path / "*.txt"), paths[0]]) == sorted(paths)
  missing = str(tmp_path / "missing.txt")
  with pytest.raises(ValueError, match="missing.txt.*does not exist"):
    corpus.expand_paths([paths[0], missing])
  with pytest.raises(ValueError, match=r"\*\.json.*matches no files"):
    corpus.expand_paths(str(tmp_path / "*.json"))
  with pytest.raises(ValueError, match="is a directory"):
    corpus.expand_paths(str(tmp_path))
  with pytest.raises(ValueError, match="No input paths"):
    corpus.expand_paths("")
  with pytest.raises(ValueError, match="missing.txt"):
    list(corpus.iter_paragraph_text(missing))


@pytest.mark.parametrize("reader", [corpus.iter_bert_format, corpus.iter_paragraph_text])
def test_empty_corpus_errors(tmp_path, reader):
  empty = write(tmp_path / "empty.txt", "")
  blank = write(tmp_path / "blank.txt", "\n  \n\t\n\n")
  with pytest.raises(ValueError, match="no documents.*empty.txt"):
    list(reader(empty))
  with pytest.raises(ValueError, match="no documents.*blank.txt"):
    list(reader([blank]))
  # A blank file next to a real one just contributes nothing.
  real = write(tmp_path / "real.txt", "Some text. More text.\n")
  assert len(list(reader([blank, empty, real]))) == 1


# ----------------------------------------------------------------------------------- TFDS


def test_tfds_text_from_local_array_record(tmp_path):
  import tensorflow_datasets as tfds

  articles = [f"Title {i}\n\nArticle {i} starts here. It has e.g. two sentences.\n"
              f"Next paragraph {i}. Done." for i in range(4)] + ["\n\n"]

  class TinyWiki(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, text in enumerate(articles):
        yield i, {"text": text, "title": f"t{i}"}

  TinyWiki(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  stats = corpus.CorpusStats()
  docs = list(corpus.iter_tfds_text("tiny_wiki", "train", "text", data_dir=str(tmp_path),
                                    stats=stats))
  expected = sorted([f"Title {i}", f"Article {i} starts here.", "It has e.g. two sentences.",
                     f"Next paragraph {i}.", "Done."] for i in range(4))
  assert sorted(docs) == expected  # The empty article yields no document.
  assert stats.documents == 4
  assert docs == list(corpus.iter_tfds_text("tiny_wiki", "train", "text", str(tmp_path)))
  with pytest.raises(ValueError, match="no field 'body'"):
    list(corpus.iter_tfds_text("tiny_wiki", "train", "body", data_dir=str(tmp_path)))


# ----------------------------------------------------------------------------------- built-in


def test_builtin_docstrings_are_deterministic():
  first = list(corpus.iter_builtin_docstrings(max_bytes=200_000))
  second = list(corpus.iter_builtin_docstrings(max_bytes=200_000))
  assert first == second
  assert len(first) > 50
  total = sum(len(s.encode("utf-8")) + 1 for doc in first for s in doc)
  assert 200_000 <= total < 220_000
  for doc in first:
    assert len(doc) >= 2 and all(s and s == s.strip() and "\n" not in s for s in doc)
    assert not any(s.startswith(">>>") for s in doc)
  # Parsing in worker processes gives the same documents in the same order.
  assert list(corpus.iter_builtin_docstrings(max_bytes=100_000, num_workers=2)) == [
      d for d in first[:len(list(corpus.iter_builtin_docstrings(max_bytes=100_000)))]]


def test_docstring_cleaning():
  docstring = """Compute the frobnication of a widget.

    The widget is frobnicated in place, e.g. by the
    default method. Results are cached.

    Args:
      widget: The widget to frobnicate, which must be mounted.

    Example::

        w = Widget()
        frobnicate(w)

    >>> frobnicate(Widget())
    Frobnicated(widget=1)

    .. note::
       This directive body is dropped.

    Returns
    -------
    result = {"a": 1}
    """
  assert corpus._docstring_to_document(docstring) == [
      "Compute the frobnication of a widget.",
      "The widget is frobnicated in place, e.g. by the default method.",
      "Results are cached.",
      "widget: The widget to frobnicate, which must be mounted.",
  ]


# ----------------------------------------------------------------------------------- sentencepiece


def test_sentencepiece_specials_and_round_trip(sp_vocab, tmp_path):
  v = sp_vocab
  assert v.kind == "sentencepiece" and v.size == 1000
  assert (v.pad_id, v.unk_id, v.cls_id, v.sep_id, v.mask_id) == (0, 1, 2, 3, 4)
  assert v.special_ids == (0, 1, 2, 3, 4)
  assert [v.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert v.piece_to_id("[MASK]") == 4 and v.piece_to_id("no-such-piece-xyz") == v.unk_id
  text = "Return the number of items in the list, e.g. 3.5 or 42 (café, 東京)."
  ids = v.encode(text)
  assert v.decode(ids) == text  # byte_fallback: even characters never seen round-trip.
  assert v.unk_id not in ids and not set(ids) & {v.pad_id, v.cls_id, v.sep_id, v.mask_id}
  # "[MASK]" in text is ordinary text, never the control token.
  assert v.mask_id not in v.encode("a [MASK] b [CLS]")
  assert v.decode([v.cls_id] + ids + [v.sep_id]) == f"[CLS] {text} [SEP]"
  assert v.decode([v.cls_id] + ids, skip_special_tokens=True) == text
  assert v.encode_batch([text, "x y"]) == [ids, v.encode("x y")]
  # Saving and loading (directory or file) and pickling keep the same vocabulary.
  pickle.loads(pickle.dumps(v)).save(str(tmp_path / "saved"))  # Saves from memory.
  with open(v.path, "rb") as original, open(tmp_path / "saved" / "sentencepiece.model",
                                            "rb") as saved:
    assert original.read() == saved.read()
  assert sorted(os.listdir(tmp_path / "saved")) == [
      "sentencepiece.model", "sentencepiece.vocab", "vocab_config.json"]
  os.makedirs(tmp_path / "other")
  shutil.copyfile(v.path, tmp_path / "other" / "my.model")  # A lone .model in a directory.
  shutil.copyfile(v.path, tmp_path / "spm_no_extension")
  for loaded in (vocab_lib.Vocab.load(str(tmp_path / "saved")),
                 vocab_lib.Vocab.load(str(tmp_path / "saved" / vocab_lib.SENTENCEPIECE_FILE)),
                 vocab_lib.Vocab.load(str(tmp_path / "other")),
                 vocab_lib.Vocab.load(str(tmp_path / "spm_no_extension")),
                 pickle.loads(pickle.dumps(v))):
    assert loaded.kind == "sentencepiece" and loaded.size == v.size
    assert loaded.encode(text) == ids and loaded.special_ids == v.special_ids


def test_sentencepiece_word_starts(sp_vocab):
  v = sp_vocab
  text = "Return the frobnicated widgets, please."
  ids, starts = v.encode_with_word_starts(text)
  pieces = [v.id_to_piece(i) for i in ids]
  assert len(starts) == len(ids) and starts[0] == 1
  assert starts == [int(i == 0 or p.startswith("\u2581")) for i, p in enumerate(pieces)]
  assert sum(starts) == len(text.split())  # One start per whitespace-delimited word.
  assert v.word_starts(ids) == starts
  assert v.encode_with_word_starts("") == ([], [])
  # A word made of bytes: the lone "▁" starts it, the byte pieces continue it.
  ids, starts = v.encode_with_word_starts("a \u2603\u2603")
  assert sum(starts) == 2


def test_sentencepiece_is_deterministic(builtin_sentences, tmp_path):
  sentences = builtin_sentences[:1500]
  a = vocab_lib.train_sentencepiece(iter(sentences), str(tmp_path / "a" / "m"), 600, "bpe")
  b = vocab_lib.train_sentencepiece(iter(sentences), str(tmp_path / "b" / "m"), 600, "bpe")
  assert [a.id_to_piece(i) for i in range(a.size)] == [b.id_to_piece(i) for i in range(b.size)]
  assert a.id_to_piece(5) == "<0x00>"  # byte_fallback pieces follow the specials.
  # Byte-identical files wherever they are trained (the model records no path).
  for suffix in (".model", ".vocab"):
    with open(tmp_path / "a" / f"m{suffix}", "rb") as f, open(tmp_path / "b" / f"m{suffix}",
                                                               "rb") as g:
      assert f.read() == g.read()


def test_sentencepiece_vocab_too_large(builtin_sentences, tmp_path, caplog):
  sentences = builtin_sentences[:300]
  with pytest.raises(ValueError, match=r"--vocab_size=30522 is too large.*at most (\d+)") as e:
    vocab_lib.train_sentencepiece(iter(sentences), str(tmp_path / "x"), 30522, "unigram")
  maximum = int(str(e.value).split("at most ")[1].split(".")[0])
  assert 300 < maximum < 30522
  with caplog.at_level(logging.WARNING):
    v = vocab_lib.train_sentencepiece(iter(sentences), str(tmp_path / "y"), 30522, "unigram",
                                      allow_smaller_vocab=True)
  assert v.size == maximum
  assert any(f"vocabulary of {maximum}" in r.getMessage() for r in caplog.records)
  with pytest.raises(ValueError, match="--vocab_size=100 is too small"):
    vocab_lib.train_sentencepiece(iter(sentences), str(tmp_path / "z"), 100)
  with pytest.raises(ValueError, match="No sentences"):
    vocab_lib.train_sentencepiece(iter([]), str(tmp_path / "w"), 1000)


# ----------------------------------------------------------------------------------- WordPiece

_WORDS = ("the a of is and to in it was he she they new york city john ##s ##ed ##ing ##ly "
          "run play walk talk cafe café naive naïve resume résumé über uber world hello "
          "un ##know ##n ##believ ##able 東 京 北 我 爱 ! , . ? ' \" ( ) - : ; é e i ü u "
          "##é ##e ##i ##a ##o ##r ##t ##n ##c ##f").split()
_SENTENCES = [
    "Hello, world! The café in New York was naïve.",
    "Résumé über-cool: unbelievable walking (talked) to John's city?",
    "我爱北京 and 東京 are cities.",
    "An unknownword xylophone appears; ünïcödé accents vs UPPER case.",
    "  Extra   spaces\tand\ttabs, plus [MASK] and [CLS] tokens.",
]


def hf_tokenizer(vocab_txt: str, **kwargs):
  """transformers' BertTokenizerFast on `vocab_txt` (a directory holding it, as from_pretrained).

  In transformers 5, `BertTokenizerFast(vocab_file=...)` silently ignores the file and builds a
  5-token vocabulary; `from_pretrained(dir)` (or `vocab=path`) reads it.
  """
  from transformers import BertTokenizerFast

  tokenizer = BertTokenizerFast.from_pretrained(os.path.dirname(vocab_txt), **kwargs)
  with open(vocab_txt, encoding="utf-8") as f:
    assert tokenizer.vocab_size == len(f.read().splitlines())
  return tokenizer


def make_vocab_txt(path, cased: bool) -> str:
  specials = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  words = list(dict.fromkeys(_WORDS))
  if cased:
    words += ["Hello", "The", "New", "York", "John", "R", "##é", "Ü", "An", "UP", "##PER"]
    words = list(dict.fromkeys(words))
  return write(path, "\n".join(specials + words) + "\n")


@pytest.mark.parametrize("cased", [False, True])
def test_wordpiece_matches_hf_bert_tokenizer(tmp_path, cased):
  path = make_vocab_txt(tmp_path / "vocab.txt", cased)
  v = vocab_lib.Vocab.load(path)  # Lowercasing detected from the vocabulary.
  assert v.kind == "wordpiece" and v.lowercase == (not cased)
  hf = hf_tokenizer(path, do_lower_case=not cased)
  assert v.size == hf.vocab_size
  assert (v.pad_id, v.unk_id, v.cls_id, v.sep_id, v.mask_id) == (
      hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id)
  assert (v.pad_id, v.unk_id, v.cls_id) == (0, 2, 3)  # The file's own ids, not sentencepiece's.
  for sentence in _SENTENCES:
    ids = v.encode(sentence)
    assert ids == hf(sentence, add_special_tokens=False)["input_ids"], sentence
    ids2, starts = v.encode_with_word_starts(sentence)
    assert ids2 == ids
    # Specials in the text ("[MASK]", as HF encodes it) are not word starts; [UNK] is a word.
    control = set(v.special_ids) - {v.unk_id}
    assert starts == [int(not v.id_to_piece(i).startswith("##") and i not in control)
                      for i in ids]
    assert v.decode(ids) == hf.decode(ids)
  assert v.encode_batch(_SENTENCES) == [v.encode(s) for s in _SENTENCES]
  assert v.unk_id in v.encode("xylophone")
  # tokenizer.json (HF's serialised tokenizer) gives the same ids; save/load/pickle keep them.
  hf.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
  v.save(str(tmp_path / "saved"))
  with open(path, "rb") as original, open(tmp_path / "saved" / "vocab.txt", "rb") as saved:
    assert original.read() == saved.read()
  shutil.copyfile(path, tmp_path / "vocab_no_extension")
  vocab_lib.Vocab.load(str(tmp_path / "tokenizer.json")).save(str(tmp_path / "saved_json"))
  for other in (vocab_lib.Vocab.load(str(tmp_path / "tokenizer.json")),
                vocab_lib.Vocab.load(str(tmp_path / "saved_json")),
                vocab_lib.Vocab.load(str(tmp_path / "vocab_no_extension")),
                vocab_lib.Vocab.load(str(tmp_path / "saved")),
                pickle.loads(pickle.dumps(v))):
    assert other.kind == "wordpiece" and other.special_ids == v.special_ids
    assert [other.encode(s) for s in _SENTENCES] == [v.encode(s) for s in _SENTENCES]


def test_wordpiece_explicit_lowercase(tmp_path):
  path = make_vocab_txt(tmp_path / "vocab.txt", cased=True)
  v = vocab_lib.Vocab.load(path, lowercase=True)
  hf = hf_tokenizer(path)  # HF's default: lowercase.
  assert v.lowercase
  assert [v.encode(s) for s in _SENTENCES] == [
      hf(s, add_special_tokens=False)["input_ids"] for s in _SENTENCES]


def test_vocab_errors(tmp_path):
  missing = str(tmp_path / "nope" / "vocab.txt")
  with pytest.raises(ValueError, match="nope/vocab.txt.*does not exist"):
    vocab_lib.Vocab.load(missing)
  no_mask = write(tmp_path / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
  with pytest.raises(ValueError, match=r"vocab.txt.*no \[MASK\]"):
    vocab_lib.Vocab.load(no_mask)
  unknown = write(tmp_path / "weights.bin", bytes(range(256)))
  with pytest.raises(ValueError, match="weights.bin: unknown vocabulary format"):
    vocab_lib.Vocab.load(unknown)
  bad_model = write(tmp_path / "bad.model", b"not a model")
  with pytest.raises(ValueError, match="bad.model: not a sentencepiece model"):
    vocab_lib.Vocab.load(bad_model)
  bad_json = write(tmp_path / "tokenizer.json", "{not json")
  with pytest.raises(ValueError, match="tokenizer.json: not a HuggingFace tokenizer.json"):
    vocab_lib.Vocab.load(bad_json)
  os.makedirs(tmp_path / "emptydir")
  with pytest.raises(ValueError, match="emptydir: no vocabulary found"):
    vocab_lib.Vocab.load(str(tmp_path / "emptydir"))


def test_wordpiece_special_token_text_stays_text_in_pretraining(tmp_path):
  from bert_jax.data import blocks

  path = write(tmp_path / "vocab.txt", "\n".join(
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[", "]", "mask", "sep", "cls", "pad",
       "unk", "hello", "world", "the"]) + "\n")
  v = vocab_lib.Vocab.load(path)
  text = "Hello [MASK] world [SEP] the [CLS][PAD] [UNK]"
  controls = {v.pad_id, v.cls_id, v.sep_id, v.mask_id}
  # As HuggingFace (fine-tuning inputs, `test_wordpiece_matches_hf_bert_tokenizer`): the tokens.
  assert controls <= set(v.encode(text))
  # As google-research/bert's tokenizer: "[", "mask", "]", the text it is.
  spelled = v.encode("Hello [ MASK ] world [ SEP ] the [ CLS ] [ PAD ] [ UNK ]")
  assert not controls & set(spelled) and v.unk_id not in spelled
  assert v.encode(text, split_special_tokens=True) == spelled
  assert v.encode_batch([text, "the"], split_special_tokens=True) == [spelled, v.encode("the")]
  # Pretraining tokenizes its text that way; the vocabulary's own behaviour is unchanged after.
  (document,) = blocks.tokenize_documents([[text, "the world"]], v)
  assert document[0] == (spelled, v.word_starts(spelled))
  assert controls <= set(v.encode(text))
  hf_json = str(tmp_path / "tokenizer.json")
  with open(hf_json, "w") as f:
    f.write(v.wordpiece_tokenizer().to_str())
  for other in (pickle.loads(pickle.dumps(v)), vocab_lib.Vocab.load(hf_json)):
    assert other.encode(text, split_special_tokens=True) == spelled
    assert other.encode(text) == v.encode(text)


def test_wordpiece_longest_word_is_200_characters(tmp_path):
  path = write(tmp_path / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n##a\n")
  v = vocab_lib.Vocab.load(path)
  a, continued = v.piece_to_id("a"), v.piece_to_id("##a")
  # google-research/bert's max_input_chars_per_word; HF's BertTokenizerFast stops at 100.
  assert v.encode("a" * 200) == [a] + [continued] * 199
  assert v.encode("a" * 201) == [v.unk_id]
  assert hf_tokenizer(path)("a" * 150, add_special_tokens=False)["input_ids"] == [v.unk_id]
  # Kept through pickling (worker processes) and in the exported tokenizer.json.
  assert pickle.loads(pickle.dumps(v)).encode("a" * 150) == [a] + [continued] * 149
  assert v.wordpiece_tokenizer().model.max_input_chars_per_word == 200
