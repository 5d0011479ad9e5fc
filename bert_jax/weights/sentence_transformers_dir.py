"""sentence-transformers directories, both ways.

Reading (`config.init_from` of an embedding run): the directory's top is a HuggingFace encoder
(`weights.load_pretrained` reads it), and `pooling_of` reads its modules: the Transformer, a
Pooling (cls, mean or max) and an optional Normalize; any other module (a Dense layer, ...) is
refused naming it, as bert_jax would compute other vectors than sentence-transformers.

Writing: a fine-tuned embedding model as a sentence-transformers directory (`launch/convert.py
--from_bert_jax=WORKDIR --to_sentence_transformers=OUT`), which `SentenceTransformer(OUT)` loads
with no remote code:
- the HuggingFace encoder (BertModel or ModernBertModel weights, config.json) and its tokenizer
  at the top (`hf.save_hf`), read by sentence-transformers' Transformer module (path "");
- `1_Pooling/config.json`: the task's pooling ("mean", "cls" or "max" over the attention mask;
  the per-mode flags every sentence-transformers version reads);
- `2_Normalize` when the embeddings are L2-normalised;
- `modules.json`, `sentence_bert_config.json` (max_seq_length: the run's, so a longer text is cut
  where bert_jax cuts it; do_lower_case: the vocabulary's `lower_text`, which reading such a
  directory sets from it) and `config_sentence_transformers.json` (cosine similarity).
Its vectors are `predict.predict`'s for --mode=embed (tests/test_sentence_transformers.py);
`hf_export.export_sentence_transformers` writes it.
"""

import json

from bert_jax.runtime import storage

MODULES = "sentence_transformers.models"  # The module path its modules.json names.
POOLING_DIR, NORMALIZE_DIR = "1_Pooling", "2_Normalize"


def is_sentence_transformers(path: str) -> bool:
  return bool(path) and storage.isfile(storage.join(path, "modules.json"))


def pooling_of(path: str) -> tuple[str, bool]:
  """(pooling, normalize) of the sentence-transformers directory at `path`."""
  modules = json.loads(storage.read_text(storage.join(path, "modules.json")))
  kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
  unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
  if unknown or kinds[:2] != ["Transformer", "Pooling"]:
    raise ValueError(f"{path}: its modules are {kinds}; bert_jax computes Transformer, Pooling "
                     f"and an optional Normalize only" + (f" (not {unknown})" if unknown else ""))
  pooling_dir = modules[1]["path"]
  config = json.loads(storage.read_text(storage.join(path, pooling_dir, "config.json")))
  if isinstance(config.get("pooling_mode"), str):  # sentence-transformers >= 6: one name.
    modes = [name for name in ("cls", "mean", "max") if config["pooling_mode"] == name]
    others = [] if modes else [config["pooling_mode"]]
  else:  # The flags of earlier versions (and of `pooling_config`).
    modes = [name for name, flag in (("cls", "pooling_mode_cls_token"),
                                     ("mean", "pooling_mode_mean_tokens"),
                                     ("max", "pooling_mode_max_tokens")) if config.get(flag)]
    others = [k for k, v in config.items() if k.startswith("pooling_mode") and v
              and k not in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                            "pooling_mode_max_tokens")]
  if len(modes) != 1 or others:
    raise ValueError(f"{path}: its pooling ({pooling_dir}/config.json) combines "
                     f"{modes + others}; bert_jax pools with exactly one of cls, mean or max")
  return modes[0], "Normalize" in kinds


def lowercases(path: str) -> bool:
  """`do_lower_case` of the sentence-transformers directory at `path` (its Transformer module
  lowercases each text with `str.lower` before tokenizing); False when it does not say."""
  config_path = storage.join(path, "sentence_bert_config.json")
  if not storage.isfile(config_path):
    return False
  value = json.loads(storage.read_text(config_path)).get("do_lower_case", False)
  if not isinstance(value, bool):
    raise ValueError(f"{config_path}: do_lower_case is {value!r}; sentence-transformers reads "
                     "true or false")
  return value


def pooling_config(pooling: str, width: int) -> dict:
  """1_Pooling/config.json for one of the embedding task's poolings."""
  modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
           "max": "pooling_mode_max_tokens"}
  return {"word_embedding_dimension": width,
          **{flag: name == pooling for name, flag in modes.items()},
          "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
          "pooling_mode_lasttoken": False, "include_prompt": True}
