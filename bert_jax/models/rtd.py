"""The two encoders of replaced-token detection (ELECTRA; DeBERTa-v3's gradient-disentangled
embedding sharing), as one flax module so that one jitted step trains both under the same
logical axis rules.

Params (top level):
- `embeddings`: the token, position and segment tables and their norm, E = the discriminator's
  `embedding_width` wide. "electra": shared, both losses reach them (ELECTRA's tied embeddings:
  its generator and discriminator read one `electra/embeddings` scope). "gdes": the generator's;
  the discriminator reads `stop_gradient(embeddings) + embeddings_delta`, so its loss reaches
  the delta only (He et al. 2021, DeBERTa-v3, section 3.2; applied here to every embedding
  parameter, the token table included). "none": the discriminator's; the generator has its own
  `generator_embeddings`.
- `embeddings_delta` ("gdes" only): the same tree, initialised to zero.
- `generator`: a `BertModel` without pooler (an `embeddings_project` E -> its width when they
  differ) and `generator_mlm`, its MLM head whose decoder is the embeddings it reads (tied).
- `discriminator`: a `BertModel` (its pooler with NSP), `discriminator_head` (ELECTRA's
  discriminator_predictions: dense H -> H, the activation, dense H -> 1) and `nsp` with NSP.
"""

import dataclasses

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models import model as model_lib
from bert_jax.models.model import BertConfig, BertModel, Embeddings, MaskedLMHead

SHARINGS = ("electra", "gdes", "none")


def generator_config(config: BertConfig, hidden_fraction: float, layers: int, heads: int,
                     sharing: str) -> BertConfig:
  """The generator of discriminator `config`: width round(H x hidden_fraction) (ELECTRA: 1/4
  small, 1/3 base), MLP width scaled alike, `layers` (0: the discriminator's), `heads` (0: one
  per 64 of width, at least 1, as ELECTRA's `get_generator_config`). Its embeddings are the
  discriminator's E wide when shared ("electra", "gdes"), its own width when not ("none",
  ELECTRA's untied generator)."""
  hidden = int(round(config.hidden_size * hidden_fraction))
  heads = heads or max(1, hidden // 64)
  return dataclasses.replace(
      config, hidden_size=hidden, num_attention_heads=heads,
      num_hidden_layers=layers or config.num_hidden_layers,
      intermediate_size=max(1, int(round(config.intermediate_size * hidden_fraction))),
      embedding_size=0 if sharing == "none" else config.embedding_width)


def _zeros_like_boxed(tree):
  """The params `tree` with every array zero (logical-axis boxes kept)."""
  boxed = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree.map(lambda x: x.replace_boxed(jnp.zeros_like(x.unbox())) if boxed(x)
                      else jnp.zeros_like(x), tree, is_leaf=boxed)


class DiscriminatorHead(nn.Module):
  """ELECTRA's discriminator_predictions: [B, L, H] -> one logit per token [B, L] f32."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    h = model_lib.ACTIVATIONS[c.hidden_act](
        model_lib._dense(c, c.hidden_size, (model_lib.EMBED, None), "dense")(x))  # pylint: disable=protected-access
    c32 = dataclasses.replace(c, dtype=jnp.float32)
    return model_lib._dense(c32, 1, (model_lib.EMBED, None), "prediction")(h)[..., 0]  # pylint: disable=protected-access


class ReplacedTokenDetection(nn.Module):
  """Generator and discriminator (module docstring). `generate` and `discriminate` are the two
  passes the step runs, with the sampling between them (`objectives/rtd.py`); `__call__` runs
  both once (init)."""
  config: BertConfig  # The discriminator.
  generator: BertConfig
  sharing: str
  nsp: bool

  def setup(self):
    if self.sharing not in SHARINGS:
      raise ValueError(f"rtd.embedding_sharing={self.sharing!r} is not one of {SHARINGS}")
    self.embeddings = Embeddings(self.config, name="embeddings")
    if self.sharing == "none":
      self.generator_embeddings = Embeddings(self.generator, name="generator_embeddings")
    if self.sharing == "gdes":
      self.embeddings_delta = self.param("embeddings_delta", self._zero_embeddings)
    self.generator_encoder = BertModel(self.generator, add_pooling_layer=False, name="generator")
    self.generator_mlm = MaskedLMHead(self.generator, name="generator_mlm")
    self.discriminator = BertModel(self.config, add_pooling_layer=self.nsp, name="discriminator")
    self.discriminator_head = DiscriminatorHead(self.config, name="discriminator_head")
    if self.nsp:
      self.nsp_head = model_lib._dense(  # pylint: disable=protected-access
          dataclasses.replace(self.config, dtype=jnp.float32), 2, (model_lib.EMBED, None), "nsp")

  def _generator_table(self) -> Embeddings:
    return self.generator_embeddings if self.sharing == "none" else self.embeddings

  def generate(self, input_ids, token_type_ids, segment_ids, masked_lm_positions,
               deterministic: bool = True, *, position_ids=None):
    """The generator's MLM logits at the target slots [B, P, V] f32 (inputs as `BertModel`'s;
    input_ids masked)."""
    table = self._generator_table()
    position_ids = _positions(input_ids, position_ids)
    embedded = table(input_ids, _types(input_ids, token_type_ids), position_ids, deterministic)
    sequence, _ = self.generator_encoder(input_ids, token_type_ids, segment_ids, deterministic,
                                         position_ids=position_ids, embedded=embedded)
    return self.generator_mlm(model_lib.gather_positions(sequence, masked_lm_positions), table)

  def discriminate(self, input_ids, token_type_ids, segment_ids, deterministic: bool = True, *,
                   position_ids=None, cls_positions=None):
    """{"disc_logits": [B, L] f32 (replaced vs original, per token), "nsp_logits" with NSP
    ([B, 2], or [B, K, 2] with cls_positions)}."""
    position_ids = _positions(input_ids, position_ids)
    types = _types(input_ids, token_type_ids)
    if self.sharing == "gdes":
      embedded = self._disentangled(input_ids, types, position_ids, deterministic)
    else:
      embedded = self.embeddings(input_ids, types, position_ids, deterministic)
    sequence, pooled = self.discriminator(input_ids, token_type_ids, segment_ids, deterministic,
                                          position_ids=position_ids, cls_positions=cls_positions,
                                          embedded=embedded)
    outputs = {"disc_logits": self.discriminator_head(sequence)}
    if self.nsp:
      outputs["nsp_logits"] = self.nsp_head(pooled)
    return outputs

  def _zero_embeddings(self, rng):
    """The `embeddings` params' tree (boxes, shapes) with every array 0."""
    ids = jnp.zeros((1, 1), jnp.int32)
    fresh = Embeddings(self.config, parent=None).init(rng, ids, ids, ids, True)["params"]
    return _zeros_like_boxed(fresh)

  def _disentangled(self, input_ids, types, position_ids, deterministic: bool):
    """GDES: the embeddings' computation with params stop_gradient(embeddings) + delta."""
    shared = flax.core.unfreeze(nn.meta.unbox(self.embeddings.variables["params"]))
    delta = flax.core.unfreeze(self.embeddings_delta)
    merged = jax.tree.map(lambda e, d: jax.lax.stop_gradient(e) + d, shared, delta)
    rngs = None if deterministic else {"dropout": self.make_rng("dropout")}
    return Embeddings(self.config, parent=None).apply(
        {"params": merged}, input_ids, types, position_ids, deterministic, rngs=rngs)

  def __call__(self, input_ids, token_type_ids, segment_ids, masked_lm_positions,
               deterministic: bool = True, *, position_ids=None, cls_positions=None):
    """Both passes on the same ids (init; the step samples between them)."""
    logits = self.generate(input_ids, token_type_ids, segment_ids, masked_lm_positions,
                           deterministic, position_ids=position_ids)
    return {"mlm_logits": logits,
            **self.discriminate(input_ids, token_type_ids, segment_ids, deterministic,
                                position_ids=position_ids, cls_positions=cls_positions)}


def _positions(input_ids, position_ids):
  return (jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
          if position_ids is None else position_ids)


def _types(input_ids, token_type_ids):
  return jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids


# ------------------------------------------------- the two encoders as BertForPreTraining trees


def _as_numpy(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float32), nn.meta.unbox(dict(tree)))


def discriminator_params(params, sharing: str) -> dict:
  """The discriminator of RTD `params` as a `BertForPreTraining` tree (float32 numpy): `bert`
  with the embeddings it reads ("gdes": the generator's plus the delta, as `_disentangled`
  computes them) and, with NSP, its pooler and `nsp`. No MLM head: ELECTRA's discriminator
  has none."""
  params = _as_numpy(params)
  embeddings = params["embeddings"]
  if sharing == "gdes":
    embeddings = jax.tree.map(np.add, embeddings, params["embeddings_delta"])
  tree = {"bert": {**params["discriminator"], "embeddings": embeddings}}
  if "nsp" in params:
    tree["nsp"] = params["nsp"]
  return tree


def generator_params(params, sharing: str) -> dict:
  """The generator of RTD `params` as a `BertForPreTraining` tree of `generator_config`
  (float32 numpy): `bert` with the embeddings it reads and `mlm`, its tied MLM head."""
  params = _as_numpy(params)
  embeddings = params["generator_embeddings" if sharing == "none" else "embeddings"]
  return {"bert": {**params["generator"], "embeddings": embeddings},
          "mlm": params["generator_mlm"]}
