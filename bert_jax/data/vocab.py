"""Vocabularies with BERT's special tokens: sentencepiece models and WordPiece `vocab.txt`.

`Vocab` is the one interface the rest of bert_jax uses: ids of the special tokens (never
hard-coded elsewhere), `encode`, `encode_with_word_starts` (for whole-word masking), `decode`.
- sentencepiece (trained here by `train_sentencepiece`): [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
  [MASK]=4. A word starts at a piece beginning with "▁" (sentencepiece's words are
  whitespace-delimited, so "word," is one word).
- byte-level BPE (a HuggingFace `tokenizer.json` of a BPE model with BERT's special tokens, as
  ModernBERT's): a word starts at a piece beginning with "Ġ" (the encoded space), the text's
  first piece included; encoded and decoded by the `tokenizers` pipeline the file describes.
- WordPiece (`vocab.txt` or a HuggingFace `tokenizer.json` of imported checkpoints), through HF
  `tokenizers` with BERT's normalisation; ids equal `transformers.BertTokenizerFast`, except
  that a vocab.txt's longest word is google-research/bert's 200 characters (HF's is 100: a word
  of 101-200 characters gets pieces here, [UNK] there). A piece beginning with "##" continues a
  word; punctuation is its own word (BERT's pre-tokeniser). Special-token text ("[MASK]") is
  matched as the special token, as HF does, unless `split_special_tokens` (pretraining text).

Vocabularies load from and save to local paths or buckets (gs://, through
`bert_jax.runtime.storage`): the files are read into memory and written from it, never through local
copies.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import os
import re
import tempfile
import threading
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from bert_jax.runtime import storage

logger = logging.getLogger(__name__)

SPECIAL_PIECES = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SENTENCEPIECE_FILE = "sentencepiece.model"
WORDPIECE_FILE = "vocab.txt"
TOKENIZER_JSON_FILE = "tokenizer.json"
CONFIG_FILE = "vocab_config.json"  # Written by `save`: kind, file name and options.

_SP_WORD_START = "\u2581"  # "▁", sentencepiece's whitespace marker.
_BPE_WORD_START = "\u0120"  # "Ġ", byte-level BPE's space.
_WORDPIECE_CONTINUATION = "##"
# A longer word is [UNK]: google-research/bert's WordpieceTokenizer (max_input_chars_per_word);
# HF's tokenizers and transformers use 100.
WORDPIECE_MAX_WORD_CHARS = 200


class Vocab:
  """A vocabulary: special token ids, encoding to ids (with word starts) and decoding.

  Build one with `train_sentencepiece`, `Vocab.load(path)` or `Vocab.from_sentencepiece` /
  `Vocab.from_wordpiece`.
  """

  def __init__(self, kind: str, path: str, processor, lowercase: bool | None = None):
    """Use the constructors; `processor` is a SentencePieceProcessor or a tokenizers.Tokenizer."""
    self.kind = kind
    self.path = path
    self.lowercase = lowercase
    # sentence-transformers' do_lower_case: `str.lower()` of every text before it is tokenized
    # (its Transformer module's step, apart from the tokenizer's own normaliser). Set by
    # `with_lower_text`, saved with the vocabulary.
    self.lower_text = False
    self._processor = processor
    if kind == "sentencepiece":
      self.size = int(processor.get_piece_size())
      pieces = [processor.id_to_piece(i) for i in range(self.size)]
    else:
      self.size = int(processor.get_vocab_size(with_added_tokens=True))
      pieces = [processor.id_to_token(i) for i in range(self.size)]
      if any(p is None for p in pieces):
        raise ValueError(f"{path}: token ids are not contiguous in 0..{self.size - 1}.")
    self._pieces = pieces
    self._text_processor = None  # WordPiece with special-token text as text (`encode`).
    ids = {}
    for piece in SPECIAL_PIECES:
      found = self._lookup(piece)
      if found is None:
        raise ValueError(f"{path}: the vocabulary has no {piece} token (it needs all of "
                         f"{', '.join(SPECIAL_PIECES)}).")
      ids[piece] = found
    self.pad_id: int = ids["[PAD]"]
    self.unk_id: int = ids["[UNK]"]
    self.cls_id: int = ids["[CLS]"]
    self.sep_id: int = ids["[SEP]"]
    self.mask_id: int = ids["[MASK]"]
    self.special_ids: tuple[int, ...] = tuple(ids[p] for p in SPECIAL_PIECES)
    # Per-id flag: does this piece begin a word? Looked up per token when encoding.
    if kind == "sentencepiece":
      starts = [p.startswith(_SP_WORD_START) for p in pieces]
    elif kind == "bpe":
      starts = [p.startswith(_BPE_WORD_START) for p in pieces]
    else:
      starts = [not p.startswith(_WORDPIECE_CONTINUATION) for p in pieces]
    self._word_start = np.asarray(starts, dtype=np.int32)
    for i in (self.pad_id, self.cls_id, self.sep_id, self.mask_id):
      self._word_start[i] = 0  # [UNK] keeps its flag: it stands for (part of) a real word.

  def __getstate__(self) -> dict:
    """Pickles the model itself (not just its path): worker processes get a working copy."""
    if self.kind == "sentencepiece":
      model = self._processor.serialized_model_proto()
    else:
      model = self._processor.to_str().encode("utf-8")
    return {"kind": self.kind, "path": self.path, "lowercase": self.lowercase, "model": model,
            "lower_text": self.lower_text}

  def __setstate__(self, state: dict) -> None:
    if state["kind"] == "sentencepiece":
      import sentencepiece as spm

      processor = spm.SentencePieceProcessor(model_proto=state["model"])
    else:
      import tokenizers

      processor = tokenizers.Tokenizer.from_str(state["model"].decode("utf-8"))
    self.__init__(state["kind"], state["path"], processor, state["lowercase"])
    self.lower_text = bool(state.get("lower_text", False))

  def with_lower_text(self, lower_text: bool = True) -> "Vocab":
    """This vocabulary, lowercasing each text (`str.lower`) before it is tokenized, as a
    sentence-transformers model with `do_lower_case` does; the tokens are unchanged."""
    vocab = copy.copy(self)
    vocab.lower_text = bool(lower_text)
    return vocab

  # ------------------------------------------------------------------------- constructors
  @classmethod
  def from_sentencepiece(cls, model_file: str) -> "Vocab":
    """A sentencepiece `.model` file with [PAD], [UNK], [CLS], [SEP], [MASK] pieces."""
    import sentencepiece as spm

    _require_file(model_file)
    try:
      # From the bytes rather than the path: sentencepiece opens local files only.
      processor = spm.SentencePieceProcessor(model_proto=storage.read_bytes(model_file))
    except (OSError, RuntimeError) as e:
      raise ValueError(f"{model_file}: not a sentencepiece model ({e}).") from e
    return cls("sentencepiece", model_file, processor)

  @classmethod
  def from_wordpiece(cls, vocab_file: str, lowercase: bool | None = None) -> "Vocab":
    """A WordPiece `vocab.txt` (one token per line, id = line number) or a `tokenizer.json`
    (WordPiece, or byte-level BPE: kind "bpe").

    `lowercase=None` detects it from a vocab.txt: no uppercase letter in any non-special token
    means an uncased vocabulary (lowercase and strip accents, as BERT-uncased).
    """
    import tokenizers

    _require_file(vocab_file)
    if vocab_file.endswith(".json"):
      try:
        tokenizer = tokenizers.Tokenizer.from_str(storage.read_text(vocab_file))
      except Exception as e:  # tokenizers raises a bare Exception on bad JSON.
        raise ValueError(f"{vocab_file}: not a HuggingFace tokenizer.json ({e}).") from e
      model = type(tokenizer.model).__name__
      if model not in ("WordPiece", "BPE"):
        raise ValueError(f"{vocab_file}: tokenizer.json model is {model}, expected WordPiece "
                         f"or BPE (a sentencepiece vocabulary loads from its "
                         f"{SENTENCEPIECE_FILE}).")
      tokenizer.no_truncation()
      tokenizer.no_padding()
      return cls("wordpiece" if model == "WordPiece" else "bpe", vocab_file, tokenizer,
                 lowercase if model == "WordPiece" else None)
    tokens = _read_vocab_txt(vocab_file)
    missing = [p for p in SPECIAL_PIECES if p not in tokens]
    if missing:
      raise ValueError(f"{vocab_file}: the vocabulary has no {', '.join(missing)} token(s) "
                       f"(a BERT vocab.txt needs all of {', '.join(SPECIAL_PIECES)}).")
    duplicates = len(tokens) - len(set(tokens))
    if duplicates:
      raise ValueError(f"{vocab_file}: {duplicates} token(s) appear twice; ids would not be "
                       f"line numbers.")
    if lowercase is None:
      lowercase = not any(c.isupper() for t in tokens
                          if not (t.startswith("[") and t.endswith("]")) for c in t)
    # The same pipeline as transformers' BertTokenizerFast: BERT normaliser (accents stripped
    # when lowercasing), BERT pre-tokeniser, WordPiece; specials matched in raw text.
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordPiece(
        {t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
        max_input_chars_per_word=WORDPIECE_MAX_WORD_CHARS))
    tokenizer.normalizer = tokenizers.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = tokenizers.decoders.WordPiece(prefix=_WORDPIECE_CONTINUATION)
    tokenizer.add_special_tokens(list(SPECIAL_PIECES))
    return cls("wordpiece", vocab_file, tokenizer, lowercase)

  @classmethod
  def load(cls, path: str, lowercase: bool | None = None) -> "Vocab":
    """A vocabulary from a file (`.model`, `vocab.txt`, `tokenizer.json`) or a saved directory,
    local or in a bucket."""
    path = os.fspath(path)
    if storage.isdir(path):
      config_path = storage.join(path, CONFIG_FILE)
      if storage.isfile(config_path):
        config = json.loads(storage.read_text(config_path))
        file = storage.join(path, config["file"])
        if config["kind"] == "sentencepiece":
          vocab = cls.from_sentencepiece(file)
        else:
          vocab = cls.from_wordpiece(file, config.get("lowercase") if lowercase is None
                                     else lowercase)
        return vocab.with_lower_text(config.get("lower_text", False))
      names = storage.listdir(path)
      for name in (SENTENCEPIECE_FILE, TOKENIZER_JSON_FILE, WORDPIECE_FILE):
        if name in names and storage.isfile(storage.join(path, name)):
          return cls.load(storage.join(path, name), lowercase)
      models = [n for n in names if n.endswith(".model")]
      if len(models) == 1:
        return cls.from_sentencepiece(storage.join(path, models[0]))
      raise ValueError(f"{path}: no vocabulary found (expected {SENTENCEPIECE_FILE}, "
                       f"{WORDPIECE_FILE} or {TOKENIZER_JSON_FILE}).")
    _require_file(path)
    if path.endswith(".model"):
      return cls.from_sentencepiece(path)
    if path.endswith((".json", ".txt")):
      return cls.from_wordpiece(path, lowercase)
    try:  # No telling extension: try sentencepiece, then a vocab.txt.
      return cls.from_sentencepiece(path)
    except ValueError:
      pass
    if _looks_like_vocab_txt(path):
      return cls.from_wordpiece(path, lowercase)
    raise ValueError(f"{path}: unknown vocabulary format (expected a sentencepiece .model, a "
                     f"WordPiece vocab.txt or a tokenizer.json).")

  def model_file(self) -> tuple[str, bytes]:
    """(name, content) of the vocabulary's own file as `save` writes it: sentencepiece.model,
    tokenizer.json (a vocabulary loaded from one) or vocab.txt (line i holds the piece of id i).
    Made from memory, so a vocabulary whose source file is gone still has it."""
    if self.kind == "sentencepiece":
      return SENTENCEPIECE_FILE, self._processor.serialized_model_proto()
    if self.path.endswith(".json"):
      # pretty=True: the layout `Tokenizer.save` writes.
      return TOKENIZER_JSON_FILE, self._processor.to_str(pretty=True).encode("utf-8")
    return WORDPIECE_FILE, "".join(piece + "\n" for piece in self._pieces).encode("utf-8")

  def wordpiece_tokenizer(self):
    """A copy of a WordPiece (or BPE) vocabulary's `tokenizers.Tokenizer` (normaliser,
    pre-tokeniser, model, specials), for exports that add their own post-processor."""
    import tokenizers

    if self.kind == "sentencepiece":
      raise ValueError(f"{self.path}: a {self.kind} vocabulary has no tokenizers pipeline")
    return tokenizers.Tokenizer.from_str(self._processor.to_str())

  def save(self, directory: str) -> None:
    """Writes the vocabulary into `directory` (local or in a bucket), plus vocab_config.json,
    for `Vocab.load(dir)`.

    Written from memory, so a vocabulary whose source file is gone (unpickled, or trained in a
    temporary directory) still saves.
    """
    directory = os.fspath(directory)
    storage.makedirs(directory)
    name, content = self.model_file()
    storage.write_bytes(storage.join(directory, name), content)
    if self.kind == "sentencepiece":  # Human-readable, as spm's .vocab file.
      storage.write_text(storage.join(directory, "sentencepiece.vocab"),
                         self.sentencepiece_vocab_text())
    config = {"kind": self.kind, "file": name, "lowercase": self.lowercase,
              "lower_text": self.lower_text, "size": self.size,
              "special_ids": dict(zip(SPECIAL_PIECES, self.special_ids))}
    storage.write_text(storage.join(directory, CONFIG_FILE), json.dumps(config, indent=2))

  def sentencepiece_vocab_text(self) -> str:
    """spm's `.vocab` file: a line per piece, its score after a tab."""
    return "".join(f"{piece}\t{self._processor.get_score(i):g}\n"
                   for i, piece in enumerate(self._pieces))

  # ------------------------------------------------------------------------- encoding
  def encode(self, text: str, split_special_tokens: bool = False) -> list[int]:
    """Ids of `text`, without [CLS]/[SEP].

    A WordPiece vocabulary matches special-token text ("[MASK]", "[SEP]") as the special token,
    as HuggingFace does (fine-tuning inputs equal its); `split_special_tokens=True` encodes it
    as the text it is ("[", "mask", "]"), as google-research/bert's tokenizer (pretraining
    text). A sentencepiece vocabulary always does the latter (its specials are control pieces).
    """
    if self.lower_text:
      text = text.lower()
    if self.kind == "sentencepiece":
      return self._processor.encode(text, out_type=int)
    return self._wordpiece(split_special_tokens).encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str],
                   split_special_tokens: bool = False) -> list[list[int]]:
    """`encode` of each text (batched in the backend: faster for many short sentences)."""
    if self.lower_text:
      texts = [text.lower() for text in texts]
    if self.kind == "sentencepiece":
      return self._processor.encode(list(texts), out_type=int)
    encodings = self._wordpiece(split_special_tokens).encode_batch(list(texts),
                                                                   add_special_tokens=False)
    return [e.ids for e in encodings]

  def _wordpiece(self, split_special_tokens: bool):
    """The WordPiece tokenizer that matches special-token text, or a copy that does not."""
    if not split_special_tokens:
      return self._processor
    if self._text_processor is None:  # A copy: the flag is the tokenizer's state.
      self._text_processor = self.wordpiece_tokenizer()
      self._text_processor.encode_special_tokens = True
    return self._text_processor

  def word_starts(self, ids: Sequence[int]) -> list[int]:
    """1 at the first piece of each word, 0 on continuation pieces and specials but [UNK]."""
    if not len(ids):
      return []
    starts = self._word_start[np.asarray(ids, dtype=np.int64)]
    if starts[0] == 0 and (ids[0] == self.unk_id or ids[0] not in self.special_ids):
      starts[0] = 1  # A text's first piece starts a word even without a "▁".
    return starts.tolist()

  def encode_with_word_starts(self, text: str,
                              split_special_tokens: bool = False) -> tuple[list[int], list[int]]:
    """(ids, word_starts) of `text`: word_starts is 1 at the first piece of each word."""
    ids = self.encode(text, split_special_tokens)
    return ids, self.word_starts(ids)

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids`; special tokens are shown as "[MASK]" etc. unless skipped."""
    ids = [int(i) for i in ids]
    if self.kind != "sentencepiece":
      return self._processor.decode(ids, skip_special_tokens=skip_special_tokens)
    # sentencepiece drops control pieces when decoding; put their names back between runs.
    parts, run = [], []
    for i in ids:
      if i in self.special_ids and i != self.unk_id:
        if run:
          parts.append(self._processor.decode(run))
          run = []
        if not skip_special_tokens:
          parts.append(self._pieces[i])
      else:
        run.append(i)
    if run:
      parts.append(self._processor.decode(run))
    return " ".join(p for p in parts if p)

  def id_to_piece(self, i: int) -> str:
    """The piece (token string) of id `i`."""
    if not 0 <= int(i) < self.size:
      raise IndexError(f"id {i} out of range for a vocabulary of {self.size}.")
    return self._pieces[int(i)]

  def piece_to_id(self, piece: str) -> int:
    """The id of `piece`, or `unk_id` if it is not in the vocabulary."""
    found = self._lookup(piece)
    return self.unk_id if found is None else found

  def _lookup(self, piece: str) -> int | None:
    if self.kind == "sentencepiece":
      i = self._processor.piece_to_id(piece)
      return i if self._processor.id_to_piece(i) == piece else None
    return self._processor.token_to_id(piece)

  def __len__(self) -> int:
    return self.size

  def __repr__(self) -> str:
    return f"Vocab(kind={self.kind!r}, size={self.size}, path={self.path!r})"


# ---------------------------------------------------------------------------------------------
# Training a sentencepiece vocabulary

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def train_sentencepiece(sentences: Iterable[str], model_prefix: str, vocab_size: int,
                        model_type: str = "unigram", *, character_coverage: float = 0.9995,
                        byte_fallback: bool = True, input_sentence_size: int = 2_000_000,
                        max_sentence_length: int = 8192, num_threads: int = 1, seed: int = 0,
                        allow_smaller_vocab: bool = False, source: str = "the corpus") -> Vocab:
  """Trains a sentencepiece model on streamed `sentences`; writes `<model_prefix>.model/.vocab`.

  BERT's special tokens get fixed ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4 ([CLS],
  [SEP], [MASK] are control symbols: text "[MASK]" is never encoded to them). No BOS/EOS.
  Sentences are spooled to a temporary file (streamed, never held in a list) so training can be
  retried; at most `input_sentence_size` of them (a seeded random sample) are used.

  Training is deterministic for the same sentences, `seed` and `num_threads` (1 by default, as
  sentencepiece's multi-threaded sums may order differently with another thread count).

  sentencepiece silently skips a sentence longer than `max_sentence_length` bytes (a corpus of
  one long line without sentence breaks would leave it nothing: `[!sentences_.empty()]`) and
  any sentence holding U+2585, its reserved unknown-character marker. So such sentences are cut
  here, at spaces where possible, into pieces it accepts, and U+2585 becomes a space: all the
  text still trains the vocabulary. A corpus with no text sentencepiece keeps raises ValueError
  naming `source` (what the sentences came from, e.g. the input flag).

  If the corpus cannot support `vocab_size` (sentencepiece's "Vocabulary size too high"), raises
  ValueError naming `--vocab_size` and the maximum, or with `allow_smaller_vocab=True` trains
  with that maximum and logs a warning.

  Training runs in a helper thread (sentencepiece releases the GIL while it trains): this thread
  waits, so a Ctrl-C stops the call at once instead of after the whole training.
  """
  import sentencepiece as spm

  if model_type not in ("unigram", "bpe"):
    raise ValueError(f"--vocab_model_type must be 'unigram' or 'bpe', got {model_type!r}.")
  min_size = len(SPECIAL_PIECES) + (256 if byte_fallback else 0) + 1
  if vocab_size < min_size:
    raise ValueError(f"--vocab_size={vocab_size} is too small: at least {min_size} with "
                     f"byte_fallback={byte_fallback}.")
  directory = os.path.dirname(os.path.abspath(model_prefix))
  os.makedirs(directory, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=directory) as tmp:
    spool = os.path.join(tmp, "sentences.txt")
    count = 0
    with open(spool, "w", encoding="utf-8") as f:
      for sentence in sentences:
        # One line per sentence, whatever it held; sentencepiece's reserved mark as a space.
        sentence = " ".join(sentence.replace(_SP_RESERVED, " ").split())
        for piece in _pieces_within(sentence, max_sentence_length):
          f.write(piece + "\n")
          count += 1
    if not count:
      raise ValueError(f"No sentences to train the sentencepiece vocabulary on in {source} "
                       "(empty corpus): give text with --input / --tfds_name / --builtin.")

    def spooled() -> Iterator[str]:
      with open(spool, encoding="utf-8") as f:
        for line in f:
          yield line.rstrip("\n")

    def train(size: int) -> None:
      # An iterator rather than input=spool, and the model's bytes rather than model_prefix:
      # the model file would record the temporary path or the prefix (a temporary directory
      # when the built-in corpus is prepared), and the same text would give other bytes.
      spm.set_random_generator_seed(seed)
      model = io.BytesIO()
      spm.SentencePieceTrainer.train(
          sentence_iterator=spooled(), model_writer=model, vocab_size=size, model_type=model_type,
          character_coverage=character_coverage, byte_fallback=byte_fallback,
          normalization_rule_name="nmt_nfkc", input_sentence_size=input_sentence_size,
          shuffle_input_sentence=True, max_sentence_length=max_sentence_length,
          num_threads=num_threads, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
          pad_piece="[PAD]", unk_piece="[UNK]", control_symbols="[CLS],[SEP],[MASK]",
          hard_vocab_limit=True, minloglevel=2)
      with open(model_prefix + ".model", "wb") as f:
        f.write(model.getvalue())

    try:
      _in_thread(lambda: train(vocab_size))
    except RuntimeError as e:
      maximum = _supported_size(e, vocab_size, count, source, allow_smaller_vocab)
      logger.warning("--vocab_size=%d is too large for this corpus; training a vocabulary of "
                      "%d (the maximum sentencepiece supports) instead.", vocab_size, maximum)
      _in_thread(lambda: train(maximum))
  vocab = Vocab.from_sentencepiece(model_prefix + ".model")
  with open(model_prefix + ".vocab", "w", encoding="utf-8") as f:
    f.write(vocab.sentencepiece_vocab_text())
  return vocab


def _supported_size(error: RuntimeError, vocab_size: int, count: int, source: str,
                    allow_smaller_vocab: bool) -> int:
  """The vocabulary size to train again with after sentencepiece's `error` (its maximum, when
  `vocab_size` was too high and a smaller one is allowed); raises ValueError saying what is
  wrong otherwise, or `error` itself when it is none of those."""
  too_high = _TOO_HIGH.search(str(error))
  too_small = _TOO_SMALL.search(str(error))
  if _NO_TEXT.search(str(error)):
    raise ValueError(f"No text to train the sentencepiece vocabulary on in {source}: "
                     f"none of its {count} sentences has a character sentencepiece keeps "
                     "after its NFKC normalisation (only control or zero-width "
                     "characters?).") from error
  if too_small:
    raise ValueError(f"--vocab_size={vocab_size} is smaller than the {too_small.group(2)} "
                     f"characters the corpus needs; raise it.") from error
  if not too_high:
    raise error
  maximum = int(too_high.group(2))
  if not allow_smaller_vocab:
    raise ValueError(
        f"--vocab_size={vocab_size} is too large for this corpus ({count} sentences): "
        f"sentencepiece supports at most {maximum}. Set --vocab_size<={maximum}, use more "
        f"text, or allow the smaller vocabulary (allow_smaller_vocab).") from error
  return maximum


_SP_RESERVED = "\u2585"  # sentencepiece's kUNKChar: it skips any training sentence holding it.
# Every sentence skipped, or no character left after normalisation.
_NO_TEXT = re.compile(r"sentences_\.empty\(\)|all_chars_count")


def _pieces_within(sentence: str, max_bytes: int) -> Iterator[str]:
  """`sentence` cut into pieces of at most `max_bytes` UTF-8 bytes (what sentencepiece's
  max_sentence_length counts), at the last space before the limit, or inside a word too long
  for it (at a character boundary); nothing for an empty sentence. Linear in its length."""
  if len(sentence) * 4 <= max_bytes or len(sentence.encode("utf-8")) <= max_bytes:
    if sentence:
      yield sentence
    return
  rest = sentence.encode("utf-8")
  while len(rest) > max_bytes:
    cut = rest.rfind(b" ", 0, max_bytes + 1)
    if cut <= 0:
      cut = max_bytes
      while rest[cut] & 0xC0 == 0x80:  # A UTF-8 continuation byte: back to the character.
        cut -= 1
    yield rest[:cut].decode("utf-8")
    rest = rest[cut:].lstrip(b" ")
  if rest:
    yield rest.decode("utf-8")


def _in_thread(work: Callable[[], None]) -> None:
  """Runs `work` in a daemon thread and waits for it here, where signals arrive: a C++ call that
  releases the GIL (sentencepiece training) is then interruptible by Ctrl-C. Its exception, if
  any, is raised here; an interrupted call is abandoned (it ends with the process)."""
  outcome: list[BaseException] = []

  def target() -> None:
    try:
      work()
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the caller)
      outcome.append(e)

  thread = threading.Thread(target=target, name="sentencepiece-train", daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.2)  # A bounded wait: Python runs signal handlers between the waits.
  if outcome:
    raise outcome[0]


# ---------------------------------------------------------------------------------------------
# Helpers


def _require_file(path: str) -> None:
  if not storage.exists(path):
    raise ValueError(f"Vocabulary file {path!r} does not exist.")
  if not storage.isfile(path):
    raise ValueError(f"Vocabulary path {path!r} is not a file.")


def _read_vocab_txt(path: str) -> list[str]:
  # newline=None: universal newlines, as a text-mode open() splits the lines.
  lines = io.StringIO(storage.read_bytes(path).decode("utf-8"), newline=None)
  return [line.rstrip("\n").rstrip("\r") for line in lines]


def _looks_like_vocab_txt(path: str) -> bool:
  with storage.open_binary(path) as f:
    head = f.read(4096)
  try:
    text = head.decode("utf-8")
  except UnicodeDecodeError:
    return False
  return "[UNK]" in text or "[PAD]" in text
