"""Weights of bert_jax's own runs: a pretraining or fine-tuning workdir, its `checkpoints/` or
`best/` directory, or one step directory, read through `bert_jax.checkpoints.checkpointing` (which
owns the layout). Only the params are read, never the optimizer state.

A fine-tuning run's params are a head model's (`{"bert": encoder, "classifier": ...}`): the
`BertForPreTraining` parts it has are kept and the task head is left out, so a fine-tuned
encoder loads, and exports to HuggingFace, like a pretrained one.

Runs train with the vocabulary padded (`config.model.vocab_pad_multiple`); the params read here
leave that layout (`layout.unpad_vocab`): like every format's, they hold the real vocabulary.
"""

import logging
from typing import Mapping

from bert_jax.checkpoints import checkpointing
from bert_jax.data.vocab import Vocab
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


def load(path: str) -> tuple[BertConfig, dict, Vocab | None]:
  """(float32 config, float32 numpy params, vocab or None) of the checkpoint `path` means (see
  `checkpointing.find_step_dir`: a fine-tuning workdir's best export before its newest training
  checkpoint), over the real vocabulary (vocab_pad_multiple 1)."""
  step_dir = checkpointing.find_step_dir(path)
  if step_dir is None:
    raise ValueError(f"{path}: no complete bert_jax checkpoint (checkpoints/<step>/ or "
                     "best/<step>/)")
  meta = checkpointing.read_meta(step_dir)
  if "model_config" not in meta:
    raise ValueError(f"{step_dir}: its meta has no model_config")
  task = meta.get("task")
  if isinstance(task, dict) and task.get("name") == "rtd":
    raise ValueError(f"{step_dir} was pretrained by replaced-token detection (a generator and "
                     "a discriminator): reading its discriminator as an encoder is not "
                     "supported yet (issue #40)")
  config = params_lib.config_from_dict(meta["model_config"], f"{step_dir} meta model_config")
  params = _pretraining_parts(checkpointing.restore_params(step_dir), step_dir)
  params = params_lib.check_params(params, config, step_dir)
  config, params = unpad_vocab(config, params)
  return config, params, checkpointing.read_vocab(step_dir)
