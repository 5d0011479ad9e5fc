r"""Predictions from the command line.

  python launch/predict.py --mode=fill_mask --checkpoint=runs/tiny \
      --text="the [MASK] sat on the mat" --top_k=5
  python launch/predict.py --mode=classify --checkpoint=runs/cls --text="a great film"
  python launch/predict.py --mode=qa --checkpoint=runs/qa --text="who paid?" \
      --text_b="Alice paid the bill."
  python launch/predict.py --mode=tag --checkpoint=runs/ner --input_file=x.jsonl
  python launch/predict.py --mode=embed --checkpoint=runs/embed --input_file=texts.jsonl
  python launch/predict.py --mode=search --checkpoint=runs/embed --corpus_file=docs.jsonl \
      --text="how do I sort a list" --top_k=10
  python launch/predict.py --mode=generate --checkpoint=runs/diffusion_tiny --length=48 \
      --steps=48 --prompt="Return the" --seed=0

fill_mask reads any pretrained checkpoint `weights.load_pretrained` reads (with its MLM head);
classify / tag / qa read a `launch/finetune.py` workdir and print one JSON line per input (qa:
one answer per question, however many windows of max_seq_length its passage takes); an input
longer than the model reads is named in a "note:" line on stderr. embed and search read an
embedding model: an embedding run, a sentence-transformers directory or any encoder
(`predict.load_embedding_model`); embed prints {"embedding": [...]} per input, in input order;
search embeds --corpus_file (records with "text" and an optional "id") and prints, per query,
its --top_k documents by exact search: {"query", "results": [{"id", "score", "text"}]}.
generate samples --num_samples texts of --length pieces after --prompt (or from all-[MASK]) with
the masked-diffusion sampler (bert_jax/generation/diffusion.py) from any checkpoint with an MLM
head, best one trained with objective "diffusion", and prints {"prompt", "text", "ids"} per text;
the same --seed gives the same texts. A diffusion_sft fine-tune (configs/finetune_diffusion_sft.py)
generates the response to --prompt, which it then needs.
"""

import json
import sys

from absl import app, flags

from bert_jax import tasks
from bert_jax.runtime import cli

# fill_mask, then one mode per fine-tuning task of the registry (classify, tag, qa, ...).
_MODE = flags.DEFINE_enum("mode", None, ["fill_mask", *tasks.predict_modes(), "search"],
                          "What to do.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Pretrained checkpoint (fill_mask), "
                                  "fine-tuning workdir (classify, tag, qa), or embedding model "
                                  "(embed, search: an embedding run, a sentence-transformers or "
                                  "HF directory).")
_TEXT = flags.DEFINE_string("text", None, "Input text (the question for qa).")
_TEXT_B = flags.DEFINE_string("text_b", None, "Second text (the passage for qa).")
_INPUT_FILE = flags.DEFINE_string("input_file", None, "JSONL or CSV with text (and text_b).")
_CORPUS_FILE = flags.DEFINE_string("corpus_file", None, "search: JSONL or CSV of the documents "
                                   "(text, and an optional id; default: the line number).")
# lower_bound: a bad value is refused while parsing (one line, exit status 2).
_TOP_K = flags.DEFINE_integer("top_k", 5, "fill_mask: tokens shown per [MASK] (at most the "
                              "vocabulary's size less its special tokens); search: documents "
                              "shown per query.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.",
                                   lower_bound=1)
# generate (bert_jax/generation/diffusion.py); --top_k, when given, keeps the k likeliest tokens.
_PROMPT = flags.DEFINE_string("prompt", None, "generate: the text the generated pieces follow "
                              "(never changed); none: from all-[MASK].")
_LENGTH = flags.DEFINE_integer("length", 32, "generate: pieces to generate.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 32, "generate: sampler steps (model calls).",
                              lower_bound=1)
_SAMPLER = flags.DEFINE_enum("sampler", "ancestral", ["ancestral", "confidence"],
                             "generate: MDLM's ancestral unmasking or LLaDA's low-confidence "
                             "remasking.")
_BLOCK_SIZE = flags.DEFINE_integer("block_size", 0, "generate: semi-autoregressive blocks of "
                                   "this many pieces, left to right (0: one block).",
                                   lower_bound=0)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "generate: logits / temperature (0: the "
                                  "most probable token).", lower_bound=0.0)
_TOP_P = flags.DEFINE_float("top_p", 1.0, "generate: nucleus sampling's probability mass "
                            "(1: all tokens).", lower_bound=0.0, upper_bound=1.0)
_SEED = flags.DEFINE_integer("seed", 0, "generate: the sampler's seed (32 bits, as every seed).",
                             lower_bound=0, upper_bound=2**32 - 1)
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "generate: texts to sample.",
                                    lower_bound=1)
_GENERATE_FLAGS = ("prompt", "length", "steps", "sampler", "block_size", "temperature", "top_p",
                   "seed", "num_samples")
flags.mark_flags_as_required(["mode", "checkpoint"])


def _check_flags() -> None:
  """Refuses what a mode cannot use (silently ignored, it would hide a mistake) and empty text."""
  mode = _MODE.value
  given = {name for name in ("text_b", "input_file", "top_k", "batch_size", "corpus_file",
                             *_GENERATE_FLAGS)
           if flags.FLAGS[name].present}
  if mode != "generate" and given & set(_GENERATE_FLAGS):
    raise app.UsageError(f"{', '.join('--' + n for n in sorted(given & set(_GENERATE_FLAGS)))}: "
                         f"not used by --mode={mode} (only by --mode=generate)")
  if mode == "generate":
    if _PROMPT.value is not None and not _PROMPT.value.strip():
      raise app.UsageError("--prompt is empty (leave it out to generate from all-[MASK])")
    if _TOP_P.value <= 0.0:
      raise app.UsageError(f"--top_p={_TOP_P.value}: it must be in (0, 1]")
    unused = given & {"text", "text_b", "input_file", "batch_size"}
    if _TEXT.value is not None:
      unused.add("text")
    if unused:
      raise app.UsageError(f"{', '.join('--' + n for n in sorted(unused))}: not used by "
                           "--mode=generate (the prompt is --prompt)")
    return
  if mode == "search" and not _CORPUS_FILE.value:
    raise app.UsageError("--mode=search needs --corpus_file (the documents to search)")
  if mode != "search" and "corpus_file" in given:
    raise app.UsageError(f"--corpus_file: not used by --mode={mode} (only by --mode=search)")
  if _TEXT.value is not None and not _TEXT.value.strip():
    raise app.UsageError("--text is empty")
  if _TEXT_B.value is not None and not _TEXT_B.value.strip():
    raise app.UsageError("--text_b is empty")
  if mode == "fill_mask":
    if not _TEXT.value:
      raise app.UsageError("--mode=fill_mask needs --text with [MASK] in it")
    unused = given & {"text_b", "input_file", "batch_size"}
  else:
    if bool(_TEXT.value) == bool(_INPUT_FILE.value):
      raise app.UsageError("Give exactly one of --text and --input_file")
    # "optional", "required" or "unused"; search embeds as the embedding task does.
    text_b = tasks.predict_modes()["embed" if mode == "search" else mode].text_b
    if text_b == "required" and _TEXT.value and not _TEXT_B.value:
      raise app.UsageError(f"--mode={mode} needs --text_b with --text")
    unused = given & ((set() if mode == "search" else {"top_k"})
                      | ({"text_b"} if text_b == "unused" or _INPUT_FILE.value else set()))
  if unused:
    raise app.UsageError(f"{', '.join('--' + n for n in sorted(unused))}: not used by "
                         f"--mode={mode}" + (" with --input_file (the file holds text_b)"
                                             if _INPUT_FILE.value and "text_b" in unused else ""))


def main() -> None:
  _check_flags()
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from bert_jax.data import finetune as finetune_data  # pylint: disable=g-import-not-at-top

  if _MODE.value == "generate":
    from bert_jax.generation import diffusion  # pylint: disable=g-import-not-at-top

    settings = diffusion.SamplerSettings(
        steps=_STEPS.value, rule=_SAMPLER.value, block_size=_BLOCK_SIZE.value,
        temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
        top_k=_TOP_K.value if flags.FLAGS["top_k"].present else 0)
    for sample in predict.generate(_CHECKPOINT.value, _LENGTH.value, settings, _PROMPT.value,
                                   _SEED.value, _NUM_SAMPLES.value):
      print(json.dumps(sample))
    return
  if _MODE.value == "fill_mask":
    for index, candidates in enumerate(predict.fill_mask(_CHECKPOINT.value, _TEXT.value,
                                                         _TOP_K.value)):
      print(f"[MASK] {index + 1}:")
      for token, probability in candidates:
        print(f"  {token}\t{probability:.4f}")
    return
  if _INPUT_FILE.value:  # Read before the checkpoint: a bad file fails fast.
    records = finetune_data.read_records(_INPUT_FILE.value)
    if not records:
      raise ValueError(f"{_INPUT_FILE.value} holds no records")
  else:
    fields = {"text": _TEXT.value, **({"text_b": _TEXT_B.value} if _TEXT_B.value else {})}
    records = [("--text", 1, fields)]
  if _MODE.value in ("embed", "search"):
    model = predict.load_embedding_model(_CHECKPOINT.value)
    for note in predict.truncation_notes(model, records):
      print(f"note: {note}", file=sys.stderr)
    if _MODE.value == "embed":
      for prediction in predict.predict(model, records, _BATCH_SIZE.value):
        print(json.dumps(prediction))
      return
    corpus = finetune_data.read_records(_CORPUS_FILE.value)
    if not corpus:
      raise ValueError(f"{_CORPUS_FILE.value} holds no records")
    for hits in predict.search(model, corpus, records, _TOP_K.value, _BATCH_SIZE.value):
      print(json.dumps(hits))
    return
  finetuned = predict.load_finetuned(_CHECKPOINT.value)
  if finetuned.task.predict_mode != _MODE.value:
    raise app.UsageError(f"{_CHECKPOINT.value} was fine-tuned for {finetuned.task.name} "
                         f"(--mode={finetuned.task.predict_mode}), not for --mode={_MODE.value}")
  # Said before the predictions: what the model does not read of each input.
  for note in predict.truncation_notes(finetuned, records):
    print(f"note: {note}", file=sys.stderr)
  for prediction in predict.predict(finetuned, records, _BATCH_SIZE.value):
    print(json.dumps(prediction))


if __name__ == "__main__":
  cli.run(main)
