r"""Converts pretrained BERTs between HuggingFace, TensorFlow (google-research/bert) and bert_jax.

  # HuggingFace directory -> bert_jax pretrained directory
  python launch/convert.py --from_hf=path/to/bert-base-uncased --output_dir=pretrained/base
  # google-research/bert TF checkpoint (bert_config.json and vocab.txt beside it)
  python launch/convert.py --from_tf=uncased_L-12_H-768_A-12/bert_model.ckpt \
      --output_dir=pretrained/base
  # bert_jax pretrained directory or training/fine-tuning workdir -> HuggingFace directory
  # (a fine-tuned run exports its encoder; the task head is left out)
  python launch/convert.py --from_bert_jax=runs/tiny --to_hf=export/tiny

The output of --from_hf/--from_tf is what `bert_jax.load_pretrained` (and so fine-tuning and
continued pretraining) starts from. TensorFlow is not needed: its checkpoint format is read
directly. Every input and output may be in a bucket (gs://...):

  python launch/convert.py --from_hf=gs://bucket/hf/bert-base-uncased \
      --output_dir=gs://bucket/pretrained/base
"""

import os
import sys

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import cli, storage  # pylint: disable=g-import-not-at-top

flags.DEFINE_string("from_hf", None, "HuggingFace directory (config.json, model.safetensors or "
                    "pytorch_model.bin, vocab.txt or tokenizer.json).")
flags.DEFINE_string("from_tf", None, "google-research/bert checkpoint prefix "
                    "(.../bert_model.ckpt) or its directory.")
flags.DEFINE_string("output_dir", None, "bert_jax pretrained directory to write "
                    "(with --from_hf/--from_tf).")
flags.DEFINE_string("from_bert_jax", None, "bert_jax pretrained directory, or training or "
                    "fine-tuning workdir (its encoder and pretraining heads), to export (with "
                    "--to_hf).")
flags.DEFINE_string("to_hf", None, "HuggingFace directory to write (with --from_bert_jax).")
flags.DEFINE_string("bert_config", None, "bert_config.json for --from_tf (default: beside the "
                    "checkpoint).")
flags.DEFINE_string("vocab", None, "vocab.txt for --from_tf (default: beside the checkpoint).")
flags.DEFINE_enum("lowercase", "auto", ["auto", "true", "false"], "WordPiece casing for "
                  "--from_tf/--from_hf; auto: tokenizer_config.json, else an uncased vocab.txt "
                  "has no uppercase token.")
flags.DEFINE_string("note", "", "Where the weights come from, recorded in the output.")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty output directory.")


def _convert(flag_values) -> str:
  from bert_jax import weights  # After flag parsing: importing pulls in jax.

  lowercase = {"auto": None, "true": True, "false": False}[flag_values.lowercase]
  modes = [name for name in ("from_hf", "from_tf", "from_bert_jax") if flag_values[name].value]
  if len(modes) != 1:
    raise app.UsageError("Give exactly one of --from_hf, --from_tf, --from_bert_jax")
  if modes[0] == "from_bert_jax":
    if not flag_values.to_hf:
      raise app.UsageError("--from_bert_jax needs --to_hf=OUTPUT_DIR")
    config, params, vocab = weights.load_pretrained(flag_values.from_bert_jax)
    architecture = weights.save_hf(flag_values.to_hf, params, config, vocab,
                                   overwrite=flag_values.overwrite)
    return f"Wrote {architecture} to {flag_values.to_hf}"
  if not flag_values.output_dir or flag_values.to_hf:
    raise app.UsageError(f"--{modes[0]} needs --output_dir=OUTPUT_DIR (and no --to_hf)")
  if modes[0] == "from_hf":
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
