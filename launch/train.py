r"""Pretrains BERT (MLM + NSP): `python launch/train.py --config=configs/tiny.py`.

Overrides: `--config.train.batch_size=32`, `--config.data.source=synthetic`, ... (the config is
locked: a mistyped field fails). `--workdir` defaults to runs/<config name>; a second start in the
same workdir resumes from its latest checkpoint. Multi-host: see README.md ("Scale-out").
"""

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax import distributed  # pylint: disable=g-import-not-at-top

config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/tiny.py.",
                                lock_config=True)
flags.mark_flags_as_required(["config"])
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and prepared data go here "
                    "(default: runs/<config name>).")
flags.DEFINE_bool("compile_only", False, "Compile the train step against abstract shapes, print "
                  "its per-device memory and FLOPs, and exit (no data, no training).")
distributed.define_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.initialize_from_flags()
  from bert_jax import train  # After distributed init: importing may touch the backend.
  if flags.FLAGS.compile_only:
    print(json.dumps(train.compile_report(flags.FLAGS.config), indent=1))
    return
  config_path = flags.FLAGS["config"].config_filename
  workdir = flags.FLAGS.workdir or os.path.join(
      "runs", os.path.splitext(os.path.basename(config_path))[0])
  train.train_and_evaluate(flags.FLAGS.config, workdir)


if __name__ == "__main__":
  app.run(main)
