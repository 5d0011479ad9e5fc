"""A replaced-token-detection run as HuggingFace models (`launch/convert.py --from_bert_jax=W
--to_hf=OUT` of an objective "rtd" / "rtd_nsp" workdir).

Classic BERT blocks: the discriminator as `ElectraForPreTraining` in OUT and the generator as
`ElectraForMaskedLM` in OUT/generator, each with the tokenizer. ELECTRA's encoder is BERT's with
`embeddings_project` (E -> H) when the embeddings are narrower, so the names are
`hf_bert`'s table under `electra.` plus the two heads:
- `discriminator_predictions`: dense H -> H, `hidden_act`, `dense_prediction` H -> 1 (one
  logit per token; > 0 means replaced);
- `generator_predictions` (dense H -> E, GELU, LayerNorm) and `generator_lm_head` (the word
  embeddings, tied, with its own bias).
The embeddings each side reads are written into its directory: shared ("electra") twice,
GDES's discriminator as the generator's table plus the delta.

The modern encoder: ELECTRA has no rotary, GeGLU or pre-LN blocks, so the discriminator's
encoder is written as `ModernBertModel` and its head beside it in `HEAD_FILE` (ELECTRA's
`discriminator_predictions` names and PyTorch layouts) with `HEAD_CONFIG` saying how to apply
it: `logits = dense_prediction(act(dense(last_hidden_state))).squeeze(-1)`. The generator is
not written: with shared embeddings it is narrower than they are, which ModernBERT (no
embeddings projection) cannot represent.
"""

import logging

import numpy as np

from bert_jax.models.model import BertConfig
from bert_jax.runtime import storage
from bert_jax.weights import files, hf, hf_bert, training

logger = logging.getLogger(__name__)

GENERATOR_DIR = "generator"
HEAD_FILE = "discriminator_head.safetensors"
HEAD_CONFIG = "discriminator_head.json"
# BertForPreTraining's MLM head names -> ElectraForMaskedLM's.
_GENERATOR_HEAD = {
    "cls.predictions.transform.dense.weight": "generator_predictions.dense.weight",
    "cls.predictions.transform.dense.bias": "generator_predictions.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "generator_predictions.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias": "generator_predictions.LayerNorm.bias",
    "cls.predictions.bias": "generator_lm_head.bias",
}


def _linear(prefix: str, dense: dict) -> dict[str, np.ndarray]:
  """A flax Dense's {kernel [in, out], bias} as PyTorch Linear's `prefix.weight` [out, in]."""
  return {f"{prefix}.weight": np.ascontiguousarray(np.asarray(dense["kernel"]).T),
          f"{prefix}.bias": np.asarray(dense["bias"])}


def _electra_state(tree: dict, config: BertConfig,
                   head_names: dict[str, str]) -> dict[str, np.ndarray]:
  """The ElectraModel part (`electra.`) of a BertForPreTraining `tree`, plus the BERT head keys
  renamed by `head_names` (the rest of BERT's heads, pooler included, left out)."""
  state = hf_bert.params_to_hf(hf.filled(tree, config), config)
  out = {f"electra.{k[len('bert.'):]}": v for k, v in state.items()
         if k.startswith(("bert.embeddings.", "bert.encoder."))}
  out.update({theirs: state[ours] for ours, theirs in head_names.items()})
  if "embeddings_project" in tree["bert"]:
    out.update(_linear("electra.embeddings_project", tree["bert"]["embeddings_project"]))
  return out


def _head_state(head: dict) -> dict[str, np.ndarray]:
  """`discriminator_head` as ElectraDiscriminatorPredictions' parameters (no prefix)."""
  return {**_linear("dense", head["dense"]), **_linear("dense_prediction", head["prediction"])}


def _electra_config(config: BertConfig, architecture: str, vocab) -> dict:
  return {**hf.bert_config_json(config, architecture, vocab), "model_type": "electra",
          "embedding_size": config.embedding_width}


def _export_electra(run: training.RtdRun, output_dir: str, overwrite: bool) -> str:
  if run.generator.hidden_act != "gelu":
    raise ValueError(f"hidden_act={run.generator.hidden_act!r}: ElectraForMaskedLM's generator "
                     "head computes GELU, so the generator cannot be exported")
  disc, gen = run.discriminator, run.generator
  state = {**_electra_state(run.discriminator_params, disc, {}),
           **{f"discriminator_predictions.{k}": v for k, v in _head_state(run.head).items()}}
  output_dir = hf.write_directory(output_dir, _electra_config(disc, "ElectraForPreTraining",
                                                              run.vocab),
                                  state, run.vocab, disc.max_position_embeddings, "bert",
                                  overwrite)
  if "nsp" in run.discriminator_params:
    logger.info("%s: ElectraForPreTraining has no pooler or NSP head; the discriminator's are "
                "left out", files.shown(output_dir))
  # The decoder weight is tied to the word embeddings: left out, as save_pretrained does.
  hf.write_directory(storage.join(output_dir, GENERATOR_DIR),
                     _electra_config(gen, "ElectraForMaskedLM", run.vocab),
                     _electra_state(run.generator_params, gen, _GENERATOR_HEAD), run.vocab,
                     gen.max_position_embeddings, "bert", False)
  return (f"ElectraForPreTraining (the discriminator) and ElectraForMaskedLM (the generator, "
          f"in {GENERATOR_DIR}/)")


def _export_modern(run: training.RtdRun, output_dir: str, overwrite: bool) -> str:
  encoder = {"bert": run.discriminator_params["bert"]}
  architecture = hf.save_hf(output_dir, encoder, run.discriminator, run.vocab, overwrite)
  hf.save_safetensors(storage.join(output_dir, HEAD_FILE), _head_state(run.head))
  files.write_json(storage.join(output_dir, HEAD_CONFIG), {
      "head": "ELECTRA discriminator_predictions (replaced-token detection)",
      "input": f"{architecture}'s last_hidden_state [batch, length, {run.discriminator.hidden_size}]",
      "computation": "logits = dense_prediction(activation(dense(last_hidden_state)))"
                     ".squeeze(-1)",
      "activation": run.discriminator.hidden_act,
      "weights": f"{HEAD_FILE}: dense.weight [H, H], dense.bias [H], dense_prediction.weight "
                 "[1, H], dense_prediction.bias [1] (torch.nn.Linear layouts)",
      "output": "one logit per token: > 0 means the token was replaced",
  })
  logger.info("%s: the discriminator only; the generator is not exported for the modern "
              "encoder", files.shown(output_dir))
  return f"{architecture} (the discriminator) with its head in {HEAD_FILE}"


def export(path: str, output_dir: str, overwrite: bool = False) -> str:
  """Writes the RTD run at `path` as HF models (module docstring); -> what was written."""
  run = training.load_rtd(path)
  export_fn = _export_modern if hf.hf_family(run.discriminator) == "modernbert" else _export_electra
  final = files.check_output_dir(output_dir)
  with files.output_dir_in_place(final, overwrite) as staged:  # Whole or nothing.
    return export_fn(run, staged, overwrite)
