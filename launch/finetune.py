r"""Fine-tunes BERT on a task: `python launch/finetune.py --config=configs/finetune_<task>.py`.

The encoder comes from `--config.init_from` (pretraining workdir, bert_jax pretrained dir,
HuggingFace dir, TF checkpoint) or is trained from scratch (`--config.vocab` then). Overrides as
in pretraining (`--config.train.freeze_encoder=true`, ...; the config is locked). `--workdir`
gets the best checkpoint, metrics.jsonl and final_eval.json; `launch/predict.py` reads it.
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import distributed  # pylint: disable=g-import-not-at-top

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/finetune_qa.py.",
                                lock_config=True)
flags.mark_flags_as_required(["config"])
flags.DEFINE_string("workdir", None, "Checkpoint, metrics and final_eval.json go here "
                    "(default: runs/<config name>).")
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.initialize_from_flags()
  from bert_jax import finetune  # After distributed init: importing may touch the backend.
  config_path = flags.FLAGS["config"].config_filename
  workdir = flags.FLAGS.workdir or os.path.join(
      "runs", os.path.splitext(os.path.basename(config_path))[0])
  finetune.finetune_and_evaluate(flags.FLAGS.config, workdir)


if __name__ == "__main__":
  app.run(main)
