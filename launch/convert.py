r"""Converts pretrained BERTs between HuggingFace, TensorFlow (google-research/bert) and bert_jax.

  # HuggingFace directory -> bert_jax pretrained directory
  python launch/convert.py --from_hf=path/to/bert-base-uncased --output_dir=pretrained/base
  # google-research/bert TF checkpoint (bert_config.json and vocab.txt beside it)
  python launch/convert.py --from_tf=uncased_L-12_H-768_A-12/bert_model.ckpt \
      --output_dir=pretrained/base
  # bert_jax pretrained directory or training workdir -> HuggingFace directory
  python launch/convert.py --from_bert_jax=runs/tiny --to_hf=export/tiny
  # fine-tuning workdir -> HF's task model (BertForSequenceClassification, ...) with its labels;
  # --encoder_only: the encoder alone, the task head left out
  python launch/convert.py --from_bert_jax=runs/sst --to_hf=export/sst
  python launch/convert.py --from_bert_jax=runs/embed --to_sentence_transformers=export/embed
  # replaced-token detection workdir -> ElectraForPreTraining (the discriminator) in OUT and
  # ElectraForMaskedLM (the generator) in OUT/generator; the modern encoder's discriminator as
  # ModernBertModel with its head file (`bert_jax/weights/hf_electra.py`); --encoder_only: the
  # discriminator's encoder alone, as BERT / ModernBERT
  python launch/convert.py --from_bert_jax=runs/electra_tiny --to_hf=export/electra_tiny

HuggingFace means BERT (model_type "bert") or ModernBERT (model_type "modernbert": bert_jax's
modern encoder, rotary / GeGLU / pre-LN / local attention), both ways; --to_hf picks the one
that computes the model, and writes the tokenizer (tokenizer.json and its config: AutoTokenizer
gives bert_jax's ids, sentencepiece vocabularies included). A fine-tuned run exports as HF's
task model of its task and family (`bert_jax/weights/hf_export.py`:
AutoModelForSequenceClassification, ...ForTokenClassification, ...ForQuestionAnswering load it,
id2label / label2id in config.json);
--from_hf of such a task model converts its encoder. A ModernBERT config bert_jax cannot
represent is refused naming the field.

The output of --from_hf/--from_tf is what `bert_jax.load_pretrained` (and so fine-tuning and
continued pretraining) starts from. TensorFlow is not needed: its checkpoint format is read
directly. An output directory that is, holds or lies inside an input is refused before anything
is read, --overwrite or not. Every input and output may be in a bucket (gs://...):

  python launch/convert.py --from_hf=gs://bucket/hf/bert-base-uncased \
      --output_dir=gs://bucket/pretrained/base
"""

import os

from absl import app, flags, logging

from bert_jax.runtime import cli, storage

flags.DEFINE_string("from_hf", None, "HuggingFace BERT or ModernBERT directory (config.json, "
                    "model.safetensors or pytorch_model.bin, and sentencepiece.model, "
                    "tokenizer.json or vocab.txt).")
flags.DEFINE_string("from_tf", None, "google-research/bert checkpoint prefix "
                    "(.../bert_model.ckpt) or its directory.")
flags.DEFINE_string("output_dir", None, "bert_jax pretrained directory to write "
                    "(with --from_hf/--from_tf).")
flags.DEFINE_string("from_bert_jax", None, "bert_jax pretrained directory, or training or "
                    "fine-tuning workdir, to export (with --to_hf): its encoder and pretraining "
                    "heads, or a fine-tuned run's task model.")
flags.DEFINE_bool("encoder_only", False, "With --from_bert_jax of a fine-tuning workdir: export "
                  "its encoder alone (the task head left out), not the task model.")
flags.DEFINE_string("to_hf", None, "HuggingFace directory to write (with --from_bert_jax): "
                    "BERT, or ModernBERT for the modern encoder.")
flags.DEFINE_string("to_sentence_transformers", None, "sentence-transformers directory to write "
                    "(with --from_bert_jax of an embedding run: config.task='embedding').")
flags.DEFINE_string("bert_config", None, "bert_config.json for --from_tf (default: beside the "
                    "checkpoint).")
flags.DEFINE_string("vocab", None, "vocab.txt for --from_tf (default: beside the checkpoint).")
flags.DEFINE_enum("lowercase", "auto", ["auto", "true", "false"], "WordPiece casing for "
                  "--from_tf/--from_hf; auto: tokenizer_config.json, else an uncased vocab.txt "
                  "has no uppercase token.")
flags.DEFINE_string("note", "", "Where the weights come from, recorded in the output.")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty output directory.")


def _check_flags(flag_values) -> str:
  """The mode (from_hf, from_tf or from_bert_jax), after refusing flag combinations that would
  fail later or be silently ignored."""
  modes = [name for name in ("from_hf", "from_tf", "from_bert_jax") if flag_values[name].value]
  if len(modes) != 1:
    raise app.UsageError("Give exactly one of --from_hf, --from_tf, --from_bert_jax")
  mode = modes[0]
  if mode == "from_bert_jax":
    outputs = [f"--{name}" for name in ("to_hf", "to_sentence_transformers", "output_dir")
               if flag_values[name].value]
    if outputs not in (["--to_hf"], ["--to_sentence_transformers"]):
      raise app.UsageError("--from_bert_jax needs one of --to_hf=OUTPUT_DIR or "
                           "--to_sentence_transformers=OUTPUT_DIR (and no --output_dir)")
    if flag_values.to_sentence_transformers and flag_values.encoder_only:
      raise app.UsageError("--encoder_only is for --to_hf")
    ignored = [f"--{name}" for name in ("bert_config", "vocab", "note")
               if flag_values[name].value] + (
                   ["--lowercase"] if flag_values.lowercase != "auto" else [])
    if ignored:
      raise app.UsageError(f"{', '.join(ignored)}: not used with --from_bert_jax (the export "
                           "keeps the checkpoint's config and vocabulary)")
    return mode
  if not flag_values.output_dir or flag_values.to_hf or flag_values.to_sentence_transformers:
    raise app.UsageError(f"--{mode} needs --output_dir=OUTPUT_DIR (and no --to_hf or "
                         "--to_sentence_transformers)")
  if flag_values.encoder_only:
    raise app.UsageError("--encoder_only is for --from_bert_jax (a fine-tuning workdir)")
  if mode == "from_hf" and (flag_values.bert_config or flag_values.vocab):
    raise app.UsageError("--bert_config and --vocab are for --from_tf (a HuggingFace directory "
                         "holds its own config.json and vocabulary)")
  return mode


def _inputs(flag_values, mode: str) -> dict[str, str]:
  """What the conversion reads, named for the error that keeps the output apart from it."""
  from bert_jax.weights import tf_bundle  # pylint: disable=g-import-not-at-top

  source = flag_values[mode].value
  if mode == "from_hf":
    return {"the --from_hf directory": source}
  if mode == "from_bert_jax":
    # A directory (pretrained or workdir); a TF checkpoint prefix stands for its directory.
    directory = source if storage.isdir(source) else os.path.dirname(storage.absolute(source))
    return {"--from_bert_jax": source, "the --from_bert_jax directory": directory}
  inputs = {"--from_tf": source}
  # The checkpoint's directory (its `checkpoint` file may point elsewhere), and the config and
  # vocabulary files, beside it or given.
  inputs["the --from_tf checkpoint's directory"] = os.path.dirname(
      tf_bundle.resolve_prefix(storage.absolute(source)))
  inputs["--bert_config"] = flag_values.bert_config
  inputs["--vocab"] = flag_values.vocab
  return inputs


def _convert(flag_values) -> str:
  mode = _check_flags(flag_values)
  # After flag parsing: importing pulls in jax.
  from bert_jax import weights  # pylint: disable=g-import-not-at-top
  from bert_jax.weights import files  # pylint: disable=g-import-not-at-top

  # Before anything is read or written: an output that is, holds or lies inside an input would
  # delete it (--overwrite) or mix the conversion's files with it.
  output_flag = ("--output_dir" if mode != "from_bert_jax" else
                 "--to_sentence_transformers" if flag_values.to_sentence_transformers else
                 "--to_hf")
  output = ((flag_values.to_hf or flag_values.to_sentence_transformers)
            if mode == "from_bert_jax" else flag_values.output_dir)
  files.check_apart(output, _inputs(flag_values, mode), output_flag)
  lowercase = {"auto": None, "true": True, "false": False}[flag_values.lowercase]
  if mode == "from_bert_jax":
    from bert_jax.weights import hf_electra, hf_export, training  # pylint: disable=g-import-not-at-top

    if flag_values.to_sentence_transformers:
      written = hf_export.export_sentence_transformers(
          flag_values.from_bert_jax, flag_values.to_sentence_transformers, flag_values.overwrite)
      return f"Wrote {written} to {flag_values.to_sentence_transformers}"
    if not flag_values.encoder_only and training.rtd_settings(flag_values.from_bert_jax):
      written = hf_electra.export(flag_values.from_bert_jax, flag_values.to_hf,
                                  flag_values.overwrite)
      return f"Wrote {written} to {flag_values.to_hf}"
    if not flag_values.encoder_only and hf_export.is_finetuned(flag_values.from_bert_jax):
      architecture = hf_export.export(flag_values.from_bert_jax, flag_values.to_hf,
                                      flag_values.overwrite)
      return f"Wrote {architecture} to {flag_values.to_hf}"
    # A conversion copies the heads there are (save_hf says what HF will initialise): no
    # "initialise them before use" warning about the ones it does not have.
    config, params, vocab = weights.load_pretrained(flag_values.from_bert_jax, uses=())
    architecture = weights.save_hf(flag_values.to_hf, params, config, vocab,
                                   overwrite=flag_values.overwrite)
    return f"Wrote {architecture} to {flag_values.to_hf}"
  if mode == "from_hf":
    source = flag_values.from_hf
    config, params, vocab = weights.load_hf(source, lowercase)
    note = flag_values.note or f"HuggingFace {storage.absolute(source)}"
  else:
    source = flag_values.from_tf
    config, params, vocab = weights.load_tf(source, flag_values.bert_config, flag_values.vocab,
                                            lowercase)
    note = flag_values.note or f"TensorFlow {storage.absolute(source)}"
  heads = weights.heads_present(params)
  missing = [name for name, present in heads.items() if not present]
  if missing:
    logging.warning("%s has no %s: the output lacks them too (never invented)", source,
                    ", ".join(missing))
  weights.save_pretrained(flag_values.output_dir, params, config, vocab, note=note,
                          overwrite=flag_values.overwrite)
  return (f"Wrote {flag_values.output_dir} (heads: "
          f"{', '.join(n for n, p in heads.items() if p) or 'none'})")


def main() -> None:
  message = _convert(flags.FLAGS)
  logging.info("%s", message)
  print(message)


if __name__ == "__main__":
  cli.run(main)
