r"""Predictions from the command line.

  python launch/predict.py --mode=fill_mask --checkpoint=runs/tiny \
      --text="the [MASK] sat on the mat" --top_k=5
  python launch/predict.py --mode=classify --checkpoint=runs/cls --text="a great film"
  python launch/predict.py --mode=qa --checkpoint=runs/qa --text="who paid?" \
      --text_b="Alice paid the bill."
  python launch/predict.py --mode=tag --checkpoint=runs/ner --input_file=x.jsonl

fill_mask reads any pretrained checkpoint `weights.load_pretrained` reads (with its MLM head);
classify / tag / qa read a `launch/finetune.py` workdir and print one JSON line per input (qa:
one answer per question, however many windows of max_seq_length its passage takes).
"""

import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import cli  # pylint: disable=g-import-not-at-top

_MODE = flags.DEFINE_enum("mode", None, ["fill_mask", "classify", "tag", "qa"], "What to do.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Pretrained checkpoint (fill_mask) or "
                                  "fine-tuning workdir (classify, tag, qa).")
_TEXT = flags.DEFINE_string("text", None, "Input text (the question for qa).")
_TEXT_B = flags.DEFINE_string("text_b", None, "Second text (the passage for qa).")
_INPUT_FILE = flags.DEFINE_string("input_file", None, "JSONL or CSV with text (and text_b).")
_TOP_K = flags.DEFINE_integer("top_k", 5, "fill_mask: tokens shown per [MASK].")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
flags.mark_flags_as_required(["mode", "checkpoint"])

_TASK_OF_MODE = {"classify": "classification", "tag": "tagging", "qa": "qa"}


def main() -> None:
  from bert_jax import finetune_data, predict  # pylint: disable=g-import-not-at-top

  if _MODE.value == "fill_mask":
    if not _TEXT.value:
      raise app.UsageError("--mode=fill_mask needs --text with [MASK] in it")
    for index, candidates in enumerate(predict.fill_mask(_CHECKPOINT.value, _TEXT.value,
                                                         _TOP_K.value)):
      print(f"[MASK] {index + 1}:")
      for token, probability in candidates:
        print(f"  {token}\t{probability:.4f}")
    return
  if bool(_TEXT.value) == bool(_INPUT_FILE.value):
    raise app.UsageError("Give exactly one of --text and --input_file")
  finetuned = predict.load_finetuned(_CHECKPOINT.value)
  if finetuned.task.name != _TASK_OF_MODE[_MODE.value]:
    raise app.UsageError(f"{_CHECKPOINT.value} was fine-tuned for {finetuned.task.name}, not for "
                         f"--mode={_MODE.value}")
  if _INPUT_FILE.value:
    records = finetune_data.read_records(_INPUT_FILE.value)
  else:
    fields = {"text": _TEXT.value, **({"text_b": _TEXT_B.value} if _TEXT_B.value else {})}
    records = [("--text", 1, fields)]
  for prediction in predict.predict(finetuned, records, _BATCH_SIZE.value):
    print(json.dumps(prediction))


if __name__ == "__main__":
  cli.run(main)
