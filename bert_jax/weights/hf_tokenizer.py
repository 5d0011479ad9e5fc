"""The HuggingFace tokenizer files of a bert_jax vocabulary, so that an exported directory
tokenizes in `transformers.AutoTokenizer.from_pretrained` (offline, no remote code) with the ids
bert_jax uses.

- sentencepiece (`train_sentencepiece`'s unigram and BPE models): `tokenizer.json` built with
  the `tokenizers` library from the model's own settings, as transformers'
  `SpmConverter.build_tokenizer_from_spm_proto` does: the precompiled normalisation (nmt_nfkc)
  and sentencepiece's whitespace handling (extra spaces removed, "▁" escaping, the dummy prefix
  of every text), the unigram pieces and scores, or BPE merges ranked by piece score, and byte
  fallback. Ids equal `SentencePieceProcessor.encode`'s (tests), with one exception: a unigram
  text whose best segmentations tie exactly (runs of one repeated character, e.g. "-----")
  may be cut into the same pieces in another order. The `sentencepiece.model` is written beside
  it, so bert_jax reads the vocabulary back exactly (`hf.read_vocab`).
- WordPiece: `vocab.txt` (BertTokenizer) and `tokenizer.json`, the vocabulary's own pipeline
  (BERT's normaliser and pre-tokeniser, `Vocab.from_wordpiece`). transformers needs the latter
  for a ModernBERT directory: its AutoTokenizer ignores tokenizer_class for model_type
  "modernbert" and reads tokenizer.json only.

Either way `tokenizer_config.json` and `special_tokens_map.json` name [PAD], [UNK], [CLS], [SEP],
[MASK], and the tokenizer adds [CLS] A [SEP] (B [SEP]) with BERT's token types, as
`data.encoding.encode_pair`. Unlike bert_jax's sentencepiece encoding (where [CLS], [SEP] and
[MASK] are control symbols), HF matches the special tokens' text: "[MASK]" in a text is the mask,
as a fill-mask pipeline needs.
"""

import json
import re
import struct
import types
from collections.abc import Iterator
from typing import Any, Sequence

import tokenizers
from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors

from bert_jax.data.vocab import SENTENCEPIECE_FILE, SPECIAL_PIECES, TOKENIZER_JSON_FILE, Vocab

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
_WORD_START = "\u2581"  # "▁", sentencepiece's whitespace marker.
# sentencepiece_model.proto: ModelType UNIGRAM = 1, BPE = 2; piece types NORMAL = 1,
# UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4.
_UNIGRAM, _BPE = 1, 2
_NORMAL, _USER_DEFINED = 1, 4
# HF's names of the special tokens, in SPECIAL_PIECES' order.
_HF_NAMES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
  """(field number, wire type, value) of a protobuf message's bytes: varints as ints, 32-bit
  fields as their 4 bytes, length-delimited ones as bytes (64-bit ones skipped)."""
  position = 0

  def varint() -> int:
    nonlocal position
    value = shift = 0
    while True:
      byte = data[position]
      position += 1
      value |= (byte & 0x7F) << shift
      shift += 7
      if byte < 0x80:
        return value

  while position < len(data):
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      yield number, wire, varint()
    elif wire == 1:
      position += 8
    elif wire == 2:
      length = varint()
      yield number, wire, data[position:position + length]
      position += length
    elif wire == 5:
      yield number, wire, data[position:position + 4]
      position += 4
    else:
      raise ValueError(f"not a sentencepiece model: protobuf wire type {wire}")


def _message(data: bytes, schema: dict[int, tuple[str, Any]]) -> types.SimpleNamespace:
  """The fields of `schema` ({number: (name, default)}) of a message; the default's type says
  how to read one (bool, int, float, str, bytes); later occurrences win, as in protobuf."""
  values = {name: default for name, default in schema.values()}
  for number, _, value in _fields(data):
    if number in schema:
      name, default = schema[number]
      if isinstance(default, bool):
        value = bool(value)
      elif isinstance(default, float):
        value = struct.unpack("<f", value)[0]
      elif isinstance(default, str):
        value = value.decode("utf-8")
      values[name] = value
  return types.SimpleNamespace(**values)


# The fields of sentencepiece_model.proto read here, with their proto2 defaults.
_PIECE = {1: ("piece", ""), 2: ("score", 0.0), 3: ("type", _NORMAL)}
_TRAINER_SPEC = {3: ("model_type", _UNIGRAM), 35: ("byte_fallback", False), 40: ("unk_id", 0),
                 45: ("unk_piece", "<unk>")}
_NORMALIZER_SPEC = {2: ("precompiled_charsmap", b""), 3: ("add_dummy_prefix", True),
                    4: ("remove_extra_whitespaces", True), 5: ("escape_whitespaces", True)}


def _parse_model(model_proto: bytes) -> types.SimpleNamespace:
  """The parts of a sentencepiece ModelProto the HF tokenizer needs (pieces, trainer_spec,
  normalizer_spec), decoded here: sentencepiece's generated protobuf module requires the
  protobuf runtime it was generated with (7.36 for sentencepiece 0.2.3), which Apache Beam's
  pin (6.33) does not meet."""
  pieces, trainer, normalizer = [], b"", b""
  for number, wire, value in _fields(model_proto):
    if wire != 2:
      continue
    if number == 1:
      pieces.append(_message(value, _PIECE))
    elif number == 2:
      trainer += value  # A message given twice merges.
    elif number == 3:
      normalizer += value
  return types.SimpleNamespace(pieces=pieces, trainer_spec=_message(trainer, _TRAINER_SPEC),
                               normalizer_spec=_message(normalizer, _NORMALIZER_SPEC))


def _bpe_merges(model) -> list[tuple[str, str]]:
  """BPE merges of a sentencepiece BPE model: every split of a normal piece into two normal
  pieces, ranked by the merged piece's score (then id), as sentencepiece merges the pair whose
  result scores highest."""
  normal = {p.piece: (p.score, i) for i, p in enumerate(model.pieces) if p.type == _NORMAL}
  ranked = []
  for piece, (score, index) in normal.items():
    for cut in range(1, len(piece)):
      left, right = piece[:cut], piece[cut:]
      if left in normal and right in normal:
        ranked.append((-score, index, left, right))
  return [(left, right) for _, _, left, right in sorted(ranked)]


def _spm_model(model) -> tokenizers.models.Model:
  spec = model.trainer_spec
  if spec.model_type == _UNIGRAM:
    return tokenizers.models.Unigram([(p.piece, p.score) for p in model.pieces],
                                     unk_id=spec.unk_id, byte_fallback=spec.byte_fallback)
  if spec.model_type == _BPE:
    user_defined = any(p.type == _USER_DEFINED for p in model.pieces)
    return tokenizers.models.BPE(
        {p.piece: i for i, p in enumerate(model.pieces)}, _bpe_merges(model),
        unk_token=spec.unk_piece, fuse_unk=True, byte_fallback=spec.byte_fallback,
        ignore_merges=user_defined)
  raise ValueError(f"the sentencepiece model's type is {spec.model_type} (trainer_spec."
                   "model_type); HF tokenizers are written for unigram (1) and bpe (2) only")


def sentencepiece_tokenizer(model_proto: bytes) -> tokenizers.Tokenizer:
  """A `tokenizers.Tokenizer` that encodes like the sentencepiece model `model_proto` (no
  special tokens or post-processor yet)."""
  model = _parse_model(model_proto)
  spec = model.normalizer_spec
  tokenizer = tokenizers.Tokenizer(_spm_model(model))
  steps = []  # sentencepiece's order: charsmap, whitespace clean-up, escaping, dummy prefix.
  if spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
  if spec.remove_extra_whitespaces:  # Spaces only: other whitespace is the charsmap's.
    steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""),
              normalizers.Replace(Regex(" {2,}"), " ")]
  if spec.escape_whitespaces:
    steps.append(normalizers.Replace(" ", _WORD_START))
  pre = []
  if spec.add_dummy_prefix:
    # Metaspace adds no prefix to a text that starts with "▁"; sentencepiece does.
    steps.append(normalizers.Replace(Regex(rf"\A{_WORD_START}"), _WORD_START * 2))
    # "always": every text between special tokens gets its prefix, as sentencepiece gives
    # each text it encodes (bert_jax encodes the text around a [MASK] apart: predict.py).
    pre.append(pre_tokenizers.Metaspace(replacement=_WORD_START, prepend_scheme="always",
                                        split=False))
  user_defined = [p.piece for p in model.pieces if p.type == _USER_DEFINED]
  if user_defined:  # Emitted whole by sentencepiece, never merged.
    pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
    pre.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
  tokenizer.normalizer = normalizers.Sequence(steps)
  if pre:
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(pre)
  steps = [decoders.Replace(_WORD_START, " ")]
  if model.trainer_spec.byte_fallback:
    steps.append(decoders.ByteFallback())
  steps.append(decoders.Fuse())
  if spec.add_dummy_prefix:
    steps.append(decoders.Strip(content=" ", left=1))
  tokenizer.decoder = decoders.Sequence(steps)
  return tokenizer


def hf_tokenizer(vocab: Vocab) -> tokenizers.Tokenizer:
  """The vocabulary as a `tokenizers.Tokenizer` with its special tokens and BERT's [CLS] A [SEP]
  (B [SEP]) post-processor (token types 0 for A, 1 for B)."""
  if vocab.kind == "sentencepiece":
    tokenizer = sentencepiece_tokenizer(vocab.model_file()[1])
  else:
    tokenizer = vocab.wordpiece_tokenizer()
  tokenizer.add_special_tokens([tokenizers.AddedToken(piece, special=True, normalized=False)
                                for piece in SPECIAL_PIECES])
  tokenizer.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", vocab.cls_id), ("[SEP]", vocab.sep_id)])
  return tokenizer


def _tokenizer_config(vocab: Vocab, max_length: int,
                      input_names: Sequence[str]) -> dict[str, Any]:
  config: dict[str, Any] = {
      # BertTokenizer rebuilds BERT's WordPiece pipeline from vocab.txt; any other vocabulary
      # is exactly its tokenizer.json (PreTrainedTokenizerFast, TokenizersBackend in v5).
      "tokenizer_class": ("BertTokenizer" if vocab.kind == "wordpiece"
                          else "PreTrainedTokenizerFast"),
      "model_max_length": max_length, "model_input_names": list(input_names),
      **dict(zip(_HF_NAMES, SPECIAL_PIECES))}
  if vocab.lowercase is not None:
    config["do_lower_case"] = bool(vocab.lowercase)
  return config


def tokenizer_files(vocab: Vocab, max_length: int,
                    input_names: Sequence[str]) -> dict[str, bytes]:
  """File name -> content of the vocabulary's HF tokenizer: tokenizer.json, with
  sentencepiece.model or vocab.txt beside it, tokenizer_config.json and
  special_tokens_map.json. `input_names`: what the model's forward takes (ModernBERT has no
  token_type_ids)."""
  out = {TOKENIZER_JSON_FILE: hf_tokenizer(vocab).to_str(pretty=True).encode("utf-8")}
  if vocab.kind == "sentencepiece":
    out[SENTENCEPIECE_FILE] = vocab.model_file()[1]
  elif vocab.kind == "wordpiece":
    out["vocab.txt"] = "".join(vocab.id_to_piece(i) + "\n"
                               for i in range(vocab.size)).encode("utf-8")
  dump = lambda value: json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8")
  out[TOKENIZER_CONFIG_FILE] = dump(_tokenizer_config(vocab, max_length, input_names))
  out[SPECIAL_TOKENS_FILE] = dump(dict(zip(_HF_NAMES, SPECIAL_PIECES)))
  return out
