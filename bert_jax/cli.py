"""What the training launchers share: the locked `--config` file with overrides, `--workdir`
(default runs/<config name>), the multi-host flags, and the main that initialises JAX's
distributed runtime before anything touches the backend."""

import os
from typing import Callable

from absl import app, flags
from ml_collections import config_flags

from bert_jax import distributed


def define_flags(example_config: str, workdir_help: str) -> None:
  """--config (locked: a mistyped override fails), --workdir and the multi-host flags."""
  config_flags.DEFINE_config_file("config", None, f"Config file, e.g. {example_config}.",
                                  lock_config=True)
  flags.mark_flags_as_required(["config"])
  flags.DEFINE_string("workdir", None, f"{workdir_help} (default: runs/<config name>).")
  distributed.define_flags()


def workdir() -> str:
  """--workdir, or runs/<config file name without .py>."""
  config_path = flags.FLAGS["config"].config_filename
  return flags.FLAGS.workdir or os.path.join(
      "runs", os.path.splitext(os.path.basename(config_path))[0])


def main(run: Callable[[], None]) -> Callable[[list[str]], None]:
  """An absl main that rejects stray arguments, initialises the multi-host runtime when asked
  to, then calls `run()` (which imports the library: importing may touch the backend)."""
  def absl_main(argv: list[str]) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    distributed.initialize_from_flags()
    run()
  return absl_main
