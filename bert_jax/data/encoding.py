"""BERT's model input for one text or a pair: [CLS] A [SEP] (B [SEP]), padded, with the token
types and attention mask, truncated as HuggingFace's tokenizers do (fine-tuning and prediction
inputs then match what a HuggingFace pipeline would feed the same model)."""

import numpy as np

from bert_jax.data.vocab import Vocab


def _truncation_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """HF tokenizers' "longest_first" for a pair: the shorter keeps what it can, the longer gets
  the rest; when both exceed half, A gets floor(budget/2) and B the other ceil."""
  if len_a + len_b <= budget:
    return len_a, len_b
  swap = len_a > len_b
  short, long_ = (len_b, len_a) if swap else (len_a, len_b)
  long_ = short if short > budget else max(short, budget - short)
  if short + long_ > budget:
    short = budget // 2
    long_ = short + budget % 2
  return (long_, short) if swap else (short, long_)


def encode_pair(vocab: Vocab, text_a: str, text_b: str | None = None,
                max_length: int = 128) -> dict[str, np.ndarray]:
  """[CLS] A [SEP] (B [SEP]) padded to `max_length`: {input_ids, token_type_ids,
  attention_mask}, each int32 [max_length]. Truncation is longest-first and matches
  `BertTokenizerFast(text_a, text_b, truncation=True, max_length=..., padding="max_length")`
  (an empty `text_b` counts as none, as there)."""
  ids_a = vocab.encode(text_a)
  ids_b = vocab.encode(text_b) if text_b else None
  specials = 3 if ids_b is not None else 2
  if max_length < specials:
    raise ValueError(f"max_length={max_length} cannot hold the {specials} special tokens")
  budget = max_length - specials
  if ids_b is None:
    ids_a = ids_a[:budget]
    tokens = [vocab.cls_id, *ids_a, vocab.sep_id]
    types = [0] * len(tokens)
  else:
    len_a, len_b = _truncation_lengths(len(ids_a), len(ids_b), budget)
    ids_a, ids_b = ids_a[:len_a], ids_b[:len_b]
    tokens = [vocab.cls_id, *ids_a, vocab.sep_id, *ids_b, vocab.sep_id]
    types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
  padding = max_length - len(tokens)
  return {
      "input_ids": np.asarray(tokens + [vocab.pad_id] * padding, dtype=np.int32),  # [max_length]
      "token_type_ids": np.asarray(types + [0] * padding, dtype=np.int32),
      "attention_mask": np.asarray([1] * len(tokens) + [0] * padding, dtype=np.int32),
  }
