"""The model's params layout at the boundaries of bert_jax: vocabulary padding, parameter counts,
and the conversion of the per-layer layout saved before the encoder's params were stacked.

Vocabulary padding: a model's word-embedding table and MLM bias hold
`BertConfig.padded_vocab_size` rows (`vocab_pad_multiple`); exchange formats (HuggingFace, TF,
pretrained directories, the params `weights.load_pretrained` returns) hold the real `vocab_size`
rows. `pad_vocab` enters the padded layout, `unpad_vocab` leaves it.

Layouts: layout 2 (today's) stacks the S encoder layers, `bert/encoder/layers/...` with a
leading [S] dimension, and names every norm `*norm`. Layout 1 (checkpoints and pretrained
directories written before) had one subtree per layer, `bert/layer_<i>/...`, with BERT's
`LayerNorm` names. `upgrade` turns layout 1 into layout 2 and `downgrade` the reverse; both
rewrite every params-shaped dict in any pytree (a TrainState's params and the optimizer moments
that mirror them alike), so a training checkpoint of layout 1 restores into today's model.
"""

import dataclasses
import re
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models.model import BertConfig

# Params with one row per vocabulary entry (the tied decoder reuses the word embeddings).
VOCAB_PARAMS = (("bert", "embeddings", "word_embeddings", "embedding"), ("mlm", "bias"))
LAYOUT = 2  # What this bert_jax writes.


def _at(tree, path: tuple[str, ...]):
  """The leaf of a nested params dict at `path`, or None when a part of the path is absent."""
  for key in path:
    if not hasattr(tree, "keys") or key not in tree:
      return None
    tree = tree[key]
  return tree


def _replace_at(tree, path: tuple[str, ...], fn) -> dict:
  """Copy of a nested dict with `fn` applied to the leaf at `path` (the nodes along the path are
  copied, the rest shared); `tree` itself when the path is absent."""
  if path[0] not in tree:
    return tree
  value = tree[path[0]]
  return {**tree, path[0]: fn(value) if len(path) == 1 else _replace_at(value, path[1:], fn)}


def _with_vocab_rows(params, vocab_size: int, rows: int) -> dict:
  """Copy of a params tree whose `VOCAB_PARAMS` hold `rows` rows: their first `vocab_size`
  rows, then zeros. Parts absent from `params` (e.g. the MLM head) stay absent. numpy leaves
  stay numpy, jax arrays stay jax arrays."""
  def resize(path, table):
    if table.shape[0] < vocab_size:
      raise ValueError(f"{'/'.join(path)} has {table.shape[0]} rows, fewer than "
                       f"vocab_size={vocab_size}")
    xp = jnp if isinstance(table, jax.Array) else np
    padding = xp.zeros((rows - vocab_size, *table.shape[1:]), table.dtype)
    return xp.concatenate([table[:vocab_size], padding])

  for path in VOCAB_PARAMS:
    params = _replace_at(params, path, lambda table, path=path: resize(path, table))
  return dict(params)


def pad_vocab(params, config: BertConfig) -> dict:
  """Params of the same model at any vocabulary padding (e.g. the V real rows of a HuggingFace
  import) -> the layout of `config`: `config.padded_vocab_size` rows, zeros after the real V."""
  return _with_vocab_rows(params, config.vocab_size, config.padded_vocab_size)


def unpad_vocab(config: BertConfig, params) -> tuple[BertConfig, dict]:
  """(config, params) of a padded model -> the real-vocabulary model (vocab_pad_multiple 1,
  V rows), as exchange formats hold it."""
  real = dataclasses.replace(config, vocab_pad_multiple=1)
  return real, _with_vocab_rows(params, config.vocab_size, config.vocab_size)


def num_params(params, config: BertConfig) -> int:
  """Parameters of a params tree (arrays or shape structs) over the real vocabulary: the padded
  rows are layout, not model, so BERT-Base counts HuggingFace's 110,106,428 at any padding.
  Boxed (logically partitioned) leaves, as `init` returns them, count as their values."""
  params = nn.meta.unbox(params)
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  for path in VOCAB_PARAMS:
    table = _at(params, path)
    if table is not None:
      total -= (table.shape[0] - config.vocab_size) * int(np.prod(table.shape[1:]))
  return total


# --------------------------------------------------------------------- layout 1 <-> layout 2

# Renamed subtrees: (layout 1 path, layout 2 path), inside `bert/layer_<i>` -> inside
# `bert/encoder/layers`, and outside the layers.
_LAYER_RENAMES = (("attention_LayerNorm", "attention_norm"), ("intermediate", "mlp/intermediate"),
                  ("output", "mlp/output"), ("output_LayerNorm", "mlp_norm"))
_OTHER_RENAMES = (("bert/embeddings/LayerNorm", "bert/embeddings/norm"),
                  ("mlm/transform_LayerNorm", "mlm/transform_norm"))
_LAYER_KEY = re.compile(r"layer_(\d+)")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f"{prefix}/{key}" if prefix else str(key)
    out.update(_flat(value, path) if isinstance(value, dict) else {path: value})
  return out


def _nested(flat: dict[str, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    *parents, last = path.split("/")
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[last] = value
  return tree


def _rename(path: str, renames, forward: bool) -> str:
  for old, new in renames:
    source, target = (old, new) if forward else (new, old)
    if path == source or path.startswith(source + "/"):
      return target + path[len(source):]
  return path


def is_layout_1(params: dict) -> bool:
  """Whether a params dict (with a `bert` subtree) has one subtree per layer."""
  return isinstance(params.get("bert"), dict) and "layer_0" in params["bert"]


def _upgrade_params(params: dict, stack: Callable) -> dict:
  """One layout-1 params dict -> layout 2 (`stack` joins the per-layer leaves)."""
  per_layer: dict[str, dict[int, Any]] = {}
  out = {}
  for path, value in _flat(params).items():
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "bert" and _LAYER_KEY.fullmatch(parts[1]):
      inner = _rename("/".join(parts[2:]), _LAYER_RENAMES, forward=True)
      per_layer.setdefault(inner, {})[int(parts[1][len("layer_"):])] = value
    else:
      out[_rename(path, _OTHER_RENAMES, forward=True)] = value
  for inner, layers in per_layer.items():
    if sorted(layers) != list(range(len(layers))):
      raise ValueError(f"layout-1 params have layers {sorted(layers)} of {inner}, not 0..n-1")
    out[f"bert/encoder/layers/{inner}"] = stack([layers[i] for i in range(len(layers))])
  return _nested(out)


def _downgrade_params(params: dict, unstack: Callable) -> dict:
  """One layout-2 params dict -> layout 1 (`unstack` splits a stacked leaf into its layers)."""
  out = {}
  prefix = "bert/encoder/layers/"
  flat = _flat(params)
  layers = next((v.shape[0] for p, v in flat.items() if p.startswith(prefix)
                 and hasattr(v, "shape")), 0)
  for path, value in flat.items():
    if path.startswith(prefix):
      inner = _rename(path[len(prefix):], _LAYER_RENAMES, forward=False)
      for index, layer_value in enumerate(unstack(value, layers)):
        out[f"bert/layer_{index}/{inner}"] = layer_value
    else:
      out[_rename(path, _OTHER_RENAMES, forward=False)] = value
  return _nested(out)


def _is_params(node) -> bool:
  return isinstance(node, dict) and isinstance(node.get("bert"), dict)


def _stack(leaves: list):
  if not hasattr(leaves[0], "shape"):  # Not an array (an optimizer's placeholder): one of them.
    return leaves[0]
  if isinstance(leaves[0], jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((len(leaves), *leaves[0].shape), leaves[0].dtype)
  return (jnp if isinstance(leaves[0], jax.Array) else np).stack(leaves)


def _unstack(leaf, layers: int) -> list:
  if not hasattr(leaf, "shape"):
    return [leaf] * layers
  if isinstance(leaf, jax.ShapeDtypeStruct):
    sharding = leaf.sharding
    if sharding is not None:  # The layer dimension is never split (config.mesh rule "layers").
      sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(
          *tuple(sharding.spec)[1:]))
    return [jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype, sharding=sharding)
            for _ in range(leaf.shape[0])]
  return [leaf[i] for i in range(leaf.shape[0])]


def upgrade(tree):
  """`tree` with every layout-1 params dict in it (see `is_layout_1`) in layout 2; arrays,
  numpy arrays and ShapeDtypeStructs alike. A tree without one comes back unchanged."""
  return jax.tree.map(lambda node: _upgrade_params(node, _stack) if _is_params(node)
                      and is_layout_1(node) else node, tree, is_leaf=_is_params)


def downgrade(tree):
  """`tree` with every layout-2 params dict in it in layout 1 (what older bert_jax wrote)."""
  return jax.tree.map(lambda node: _downgrade_params(node, _unstack) if _is_params(node)
                      and not is_layout_1(node) else node, tree, is_leaf=_is_params)


def holds_layout_1(tree) -> bool:
  """Whether any params dict of `tree` is in layout 1."""
  found = []
  jax.tree.map(lambda node: found.append(_is_params(node) and is_layout_1(node)), tree,
               is_leaf=_is_params)
  return any(found)

