"""google-research/bert TF1 checkpoints (`bert_model.ckpt` with bert_config.json and vocab.txt
beside it), read without TensorFlow.

The tensors come from `tf_bundle.BundleReader`; `hf_name` renames google-research/bert variables
to HuggingFace BertForPreTraining names, so `bert_jax.weights.hf_bert` stays the one mapping table into
bert_jax params. The checkpoint may be local or in a bucket (gs://).
"""

import os
import re
import warnings

import numpy as np

from bert_jax.runtime import storage
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.weights import files, hf, tf_bundle
from bert_jax.weights import params as params_lib

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"

# Optimizer state and bookkeeping that google-research/bert checkpoints carry.
_IGNORED = re.compile(r"(^|/)(adam_m|adam_v|global_step|beta[12]_power|Momentum)$|"
                      r"^(global_step|good_steps|loss_scale|current_loss_scale)$|"
                      r"AdamWeightDecayOptimizer|/Adam(_1)?$")


def hf_name(tf_name: str) -> tuple[str, bool]:
  """google-research/bert variable name -> (BertForPreTraining name, transpose?).

  bert/encoder/layer_3/attention/self/query/kernel -> bert.encoder.layer.3.attention.self.query
  .weight (transposed: TF dense kernels are [in, out], PyTorch Linear weights [out, in]);
  LayerNorm gamma/beta -> weight/bias; cls/predictions/output_bias -> cls.predictions.bias;
  cls/seq_relationship/output_weights is already [2, H] and keeps its layout.
  """
  if tf_name == "cls/predictions/output_bias":
    return "cls.predictions.bias", False
  if tf_name == "cls/seq_relationship/output_weights":
    return "cls.seq_relationship.weight", False
  if tf_name == "cls/seq_relationship/output_bias":
    return "cls.seq_relationship.bias", False
  parts = tf_name.split("/")
  parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in parts]
  last = parts[-1]
  if last.endswith("_embeddings"):
    return ".".join(parts + ["weight"]), False
  renamed = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}.get(last)
  if renamed is None:
    return ".".join(parts), False
  return ".".join(parts[:-1] + [renamed]), last == "kernel"


def hf_state_dict_from_tf(reader: tf_bundle.BundleReader) -> dict[str, np.ndarray]:
  """The model variables of a google-research/bert checkpoint with HF names, as float32.

  Optimizer slots (adam_m/adam_v) and global_step are skipped; variables outside `bert/` and
  `cls/` (e.g. a fine-tuned classifier's output_weights) are skipped with a warning naming them.
  """
  state, skipped = {}, []
  for name in reader.names():
    if _IGNORED.search(name):
      continue
    if not name.startswith(("bert/", "cls/")):
      skipped.append(name)
      continue
    key, transpose = hf_name(name)
    array = reader.read(name).astype(np.float32)
    state[key] = np.ascontiguousarray(array.T) if transpose else array
  if skipped:
    warnings.warn(f"{reader.index_file}: skipped variables that are not part of BERT's "
                  f"encoder or pretraining heads: {skipped}", stacklevel=2)
  return state


def load_tf(path: str, config_file: str | None = None, vocab_file: str | None = None,
            lowercase: bool | None = None) -> tuple[BertConfig, dict, Vocab]:
  """A google-research/bert checkpoint (`bert_model.ckpt` prefix, or its directory) with
  bert_config.json and vocab.txt beside it (or given) -> (config, float32 params, vocab)."""
  prefix = tf_bundle.resolve_prefix(storage.absolute(path))
  directory = os.path.dirname(prefix)  # (posix dirname: also right for a gs:// URL.)
  with tf_bundle.BundleReader(prefix) as reader:  # Raises naming the missing .index first.
    config_file = config_file or storage.join(directory, CONFIG_FILE)
    if not storage.isfile(config_file):
      raise ValueError(f"{directory}: no {CONFIG_FILE} next to the checkpoint (pass its path)")
    config = params_lib.config_from_dict(files.read_json(config_file), config_file)
    if vocab_file is None:
      if not storage.isfile(storage.join(directory, VOCAB_FILE)):
        raise ValueError(f"{directory}: no vocabulary (expected {VOCAB_FILE}; pass its path)")
      vocab_file = storage.join(directory, VOCAB_FILE)
    vocab = Vocab.load(vocab_file, lowercase)
    state = hf_state_dict_from_tf(reader)
  params = hf.params_from_state(state, config, f"{reader.index_file} (with {config_file})")
  params_lib.check_vocab_fits(vocab, config, directory)
  return config, params, vocab
