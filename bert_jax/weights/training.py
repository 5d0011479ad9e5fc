"""Weights of bert_jax's own runs: a pretraining or fine-tuning workdir, its `checkpoints/` or
`best/` directory, or one step directory, read through `bert_jax.checkpoints.checkpointing` (which
owns the layout). Only the params are read, never the optimizer state.

A fine-tuning run's params are a head model's (`{"bert": encoder, "classifier": ...}`): the
`BertForPreTraining` parts it has are kept and the task head is left out, so a fine-tuned
encoder loads, and exports to HuggingFace, like a pretrained one. A replaced-token-detection run
(objective "rtd") loads as its discriminator (`load`), or as both encoders (`load_rtd`, for
`hf_electra`'s export).

Runs train with the vocabulary padded (`config.model.vocab_pad_multiple`); the params read here
leave that layout (`layout.unpad_vocab`): like every format's, they hold the real vocabulary.
"""

import dataclasses
import logging
from typing import Mapping

import jax
import numpy as np

from bert_jax.checkpoints import checkpointing
from bert_jax.data.vocab import Vocab
from bert_jax.models import rtd as rtd_model
from bert_jax.models.model import BertConfig
from bert_jax.weights.layout import unpad_vocab
from bert_jax.weights import params as params_lib

logger = logging.getLogger(__name__)


def _pretraining_parts(params: Mapping, source: str) -> dict:
  """The `BertForPreTraining` subtrees of `params`; anything else is a fine-tuning head."""
  dropped = sorted(set(params) - set(params_lib.PRETRAINING_SUBTREES))
  if dropped:
    logger.warning("%s: left out the fine-tuning head %s (not part of BertForPreTraining)", source,
                   ", ".join(dropped))
  return {k: v for k, v in params.items() if k in params_lib.PRETRAINING_SUBTREES}


def _read(path: str) -> tuple[str, dict, BertConfig, dict]:
  """(step dir, meta, its model config, raw params) of the checkpoint `path` means (see
  `checkpointing.find_step_dir`: a fine-tuning workdir's best export before its newest training
  checkpoint)."""
  step_dir = checkpointing.find_step_dir(path)
  if step_dir is None:
    raise ValueError(f"{path}: no complete bert_jax checkpoint (checkpoints/<step>/ or "
                     "best/<step>/)")
  meta = checkpointing.read_meta(step_dir)
  if "model_config" not in meta:
    raise ValueError(f"{step_dir}: its meta has no model_config")
  config = params_lib.config_from_dict(meta["model_config"], f"{step_dir} meta model_config")
  return step_dir, meta, config, checkpointing.restore_params(step_dir)


def _rtd_meta(meta: dict) -> dict | None:
  """The `rtd` part of a checkpoint's meta (its sharing, generator sizes), None if not RTD."""
  task = meta.get("task")
  return task.get("rtd") if isinstance(task, dict) and task.get("name") == "rtd" else None


def rtd_settings(path: str) -> dict | None:
  """The `rtd` meta of a replaced-token-detection run at `path`, or None for any other
  checkpoint."""
  step_dir = checkpointing.find_step_dir(path)
  return None if step_dir is None else _rtd_meta(checkpointing.read_meta(step_dir))


def _checked(params: dict, config: BertConfig, source: str) -> tuple[BertConfig, dict]:
  return unpad_vocab(config, params_lib.check_params(params, config, source))


def load(path: str) -> tuple[BertConfig, dict, Vocab | None]:
  """(float32 config, float32 numpy params, vocab or None) of the checkpoint at `path`, over the
  real vocabulary (vocab_pad_multiple 1). A replaced-token-detection run gives its
  discriminator (`models.rtd.discriminator_params`: the encoder, with the pooler and NSP head
  when it trained NSP): the encoder ELECTRA fine-tunes."""
  step_dir, meta, config, params = _read(path)
  rtd = _rtd_meta(meta)
  if rtd is not None:
    logger.info("%s: replaced-token detection; its discriminator is the encoder", step_dir)
    params = rtd_model.discriminator_params(params, rtd["embedding_sharing"])
  else:
    params = _pretraining_parts(params, step_dir)
  config, params = _checked(params, config, step_dir)
  return config, params, checkpointing.read_vocab(step_dir)


@dataclasses.dataclass(frozen=True)
class RtdRun:
  """Both encoders of a replaced-token-detection checkpoint, over the real vocabulary."""
  discriminator: BertConfig
  discriminator_params: dict  # A BertForPreTraining tree (no MLM head).
  head: dict  # `discriminator_head`: {"dense": {kernel, bias}, "prediction": {kernel, bias}}.
  generator: BertConfig
  generator_params: dict  # A BertForPreTraining tree with the MLM head.
  vocab: Vocab | None


def load_rtd(path: str) -> RtdRun:
  """The generator and discriminator of the RTD checkpoint at `path` (`convert.py --to_hf`)."""
  step_dir, meta, config, params = _read(path)
  rtd = _rtd_meta(meta)
  if rtd is None:
    raise ValueError(f"{step_dir} was not pretrained by replaced-token detection")
  sharing = rtd["embedding_sharing"]
  generator = dataclasses.replace(config, **rtd["generator"])
  disc_config, disc = _checked(rtd_model.discriminator_params(params, sharing), config,
                               f"{step_dir} (discriminator)")
  gen_config, gen = _checked(rtd_model.generator_params(params, sharing), generator,
                             f"{step_dir} (generator)")
  head = jax.tree.map(lambda x: np.asarray(x, np.float32), params["discriminator_head"])
  return RtdRun(disc_config, disc, head, gen_config, gen, checkpointing.read_vocab(step_dir))
