"""`BertForPreTraining` params trees as every weight format hands them over: checks against the
model config, the optional heads (present whole or absent, never invented), and the model config
as a plain dict.

A params tree here is nested dicts of float32 numpy arrays, `{"bert": ..., "mlm": ..., "nsp":
...}` as `BertForPreTraining.init` makes it; the pooler (`bert/pooler`), MLM and NSP heads may
be absent.
"""

import dataclasses
import logging
import warnings
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from bert_jax.models import model as model_lib
from bert_jax.data.vocab import Vocab
from bert_jax.models.model import BertConfig
from bert_jax.weights import hf_bert, layout

logger = logging.getLogger(__name__)

# Optional parts of the params tree: name -> path prefix.
HEADS = {"pooler": ("bert", "pooler"), "mlm": ("mlm",), "nsp": ("nsp",)}
HEAD_TITLES = {"pooler": "pooler", "mlm": "MLM head", "nsp": "NSP head"}
# The top-level subtrees of `BertForPreTraining` params (a fine-tuning model's head is none).
PRETRAINING_SUBTREES = ("bert", "mlm", "nsp")

Path = tuple[str, ...]
_LAYERS = ("bert", "encoder", "layers")  # The stacked [S, ...] layer params.


@dataclasses.dataclass(frozen=True)
class TaskHead:
  """A fine-tuned task head that a weights source holds beside its encoder (a HuggingFace
  BertFor* / ModernBertFor* task directory): the class it was, what its outputs mean, its
  params. Whether a fine-tuning run takes it is the task's call (`FinetuneTask.head_from`)."""
  architecture: str  # HF's class, e.g. "BertForSequenceClassification".
  labels: tuple[str, ...]  # config.json's id2label, in index order.
  problem_type: str | None  # config.json's: "regression", "single_label_classification", None.
  params: dict  # Its top-level subtrees by bert_jax's (= HF's) names: classifier, head, ...
  dropout: float | None = None  # Before the classifier (config.json's classifier_dropout).

  @property
  def regression(self) -> bool:
    return self.problem_type == "regression"


def flatten(params: Mapping, prefix: Path = ()) -> dict[Path, Any]:
  """{("bert", "pooler", "kernel"): array, ...} of a nested params tree."""
  flat = {}
  for key, value in params.items():
    if isinstance(value, Mapping):
      flat.update(flatten(value, prefix + (str(key),)))
    else:
      flat[prefix + (str(key),)] = value
  return flat


def unflatten(flat: Mapping[Path, Any]) -> dict:
  """The nested tree of `flatten`'s output."""
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def head_of(path: Path) -> str | None:
  """The optional head (a `HEADS` key) a parameter belongs to; None for the encoder's own."""
  for head, prefix in HEADS.items():
    if path[:len(prefix)] == prefix:
      return head
  return None


def heads_present(params: Mapping) -> dict[str, bool]:
  """{"pooler": bool, "mlm": bool, "nsp": bool}: which optional parts the params tree holds."""
  present = {head_of(path) for path in flatten(params)}
  return {head: head in present for head in HEADS}


def _check_structure(flat: Mapping[Path, Any], expected: Mapping[Path, tuple[int, ...]],
                     source: str) -> None:
  unknown = sorted("/".join(p) for p in set(flat) - set(expected))
  if unknown:
    raise ValueError(f"{source}: parameters that BertForPreTraining does not have: {unknown[:10]}")
  for head in HEADS:
    names = [p for p in expected if head_of(p) == head]
    have = [p for p in names if p in flat]
    if have and len(have) < len(names):
      missing = next("/".join(p) for p in names if p not in flat)
      raise ValueError(f"{source}: the {HEAD_TITLES[head]} is incomplete (no {missing})")


def _check_layer_count(flat: Mapping[Path, Any], config: BertConfig, source: str) -> None:
  """The tree's stacked encoder layers (the leading dimension under bert/encoder/layers) are
  the config's num_hidden_layers (named as such, rather than as a shape mismatch)."""
  counts = {np.shape(v)[0] for p, v in flat.items() if p[:3] == _LAYERS and np.ndim(v)}
  n = config.num_hidden_layers
  if counts and counts != {n}:
    raise ValueError(f"{source}: the params have {sorted(counts)[0]} encoder layers, the config "
                     f"says num_hidden_layers={n}")


def check_params(params: Mapping, config: BertConfig, source: str) -> dict:
  """float32 numpy copy of `params` after checking it against `config`: every encoder
  parameter present, each head whole or absent, no unknown path, every shape right, every value
  finite. Errors are ValueErrors that start with `source`."""
  # A tree saved before the encoder was scanned (one subtree per layer) is converted first.
  flat = flatten(layout.upgrade(nn.meta.unbox(dict(params))))
  _check_layer_count(flat, config, source)
  expected = model_lib.param_shapes(config)
  _check_structure(flat, expected, source)
  out = {}
  for path, shape in expected.items():
    if path not in flat:
      if head_of(path) is None:
        raise ValueError(f"{source}: missing parameter {'/'.join(path)}")
      continue
    # device_get: jax arrays (maybe sharded) come back to the host.
    array = np.asarray(jax.device_get(flat[path]), dtype=np.float32)
    if array.shape != shape:
      raise ValueError(f"{source}: {'/'.join(path)} has shape {array.shape}, the config "
                       f"expects {shape}")
    if not np.isfinite(array).all():
      raise ValueError(f"{source}: {'/'.join(path)} holds NaN or infinite values")
    out[path] = array
  return unflatten(out)


def fill_missing_heads(params: Mapping, initial_params: Mapping) -> dict:
  """`params` plus the heads it lacks, taken from `initial_params` (e.g. a fresh
  `BertForPreTraining.init`), for continued pretraining of an encoder-only checkpoint. The
  caller decides to initialise them; this logs which ones it took."""
  flat = flatten(params)
  missing = [h for h, present in heads_present(params).items() if not present]
  for path, value in flatten(nn.meta.unbox(initial_params)).items():
    if head_of(path) in missing:
      flat[path] = value
  if missing:
    logger.info("Initialised the %s from the given initial params",
                ", ".join(HEAD_TITLES[h] for h in missing))
  return unflatten(flat)


def warn_missing_heads(params: Mapping, source: str, uses: Sequence[str] = tuple(HEADS)) -> None:
  """A UserWarning naming the heads of `uses` (those the caller reads) that `params` lacks
  (nothing when it has them all: a head nobody reads is no news)."""
  missing = [HEAD_TITLES[h] for h, present in heads_present(params).items()
             if not present and h in uses]
  if missing:
    # stacklevel 3: the warning points at whoever called the public loader.
    warnings.warn(f"{source} has no {', '.join(missing)}: those parameters are absent from the "
                  "params (never invented); initialise them before use, e.g. by fine-tuning",
                  UserWarning, stacklevel=3)


def check_vocab_fits(vocab: Vocab, config: BertConfig, where: str) -> None:
  """Refuses a vocabulary with ids past the embedding table; a smaller one is fine (noted)."""
  if vocab.size > config.vocab_size:
    raise ValueError(f"{where}: the vocabulary has {vocab.size} tokens, more than the model's "
                     f"vocab_size={config.vocab_size}")
  if vocab.size < config.vocab_size:
    logger.info("%s: vocabulary of %d tokens for vocab_size=%d (the extra rows are unused)",
                where, vocab.size, config.vocab_size)


def config_from_dict(values: Mapping[str, Any], source: str) -> BertConfig:
  """HF-named config dict -> float32 BertConfig (dtype fields and unknown fields dropped)."""
  try:
    return hf_bert.config_from_hf(values)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{source}: {e}") from e


def config_dict(config: BertConfig) -> dict[str, Any]:
  """The config's fields as JSON values, without the compute and param dtypes (a saved model is
  float32; the dtype to compute in is the loader's choice)."""
  values = dataclasses.asdict(config)
  values.pop("dtype")
  values.pop("param_dtype")
  return values
