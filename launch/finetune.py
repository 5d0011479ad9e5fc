r"""Fine-tunes BERT on a task: `python launch/finetune.py --config=configs/finetune_<task>.py`.

The encoder comes from `--config.init_from` (pretraining workdir, bert_jax pretrained dir,
HuggingFace dir, TF checkpoint) or is trained from scratch (`--config.vocab` then). Overrides as
in pretraining (`--config.train.freeze_encoder=true`, ...; the config is locked). A second start
in the same `--workdir` resumes from its latest checkpoint. The workdir gets the best params
(best/), metrics.jsonl and final_eval.json; `launch/predict.py` reads it.

`--compile_only [--topology=v5p:2x2x1]` compiles the run for the devices (or TPU slice) and
prints what it costs per chip, reading no training data (docs/tpu.md).
"""

from absl import flags

from bert_jax.runtime import cli

cli.define_flags("configs/finetune_qa.py", "Checkpoints, best params, metrics and "
                 "final_eval.json go here")
cli.define_compile_flags()


def main() -> None:
  import jax  # After distributed init.
  from bert_jax import config_checks, finetune
  from bert_jax.runtime import workdir_lock
  from bert_jax.training import aot
  config_checks.check_overrides_read(flags.FLAGS.config, cli.config_overrides(), True)
  if cli.compile_only_requested():
    target = aot.target(flags.FLAGS.topology, flags.FLAGS.num_slices)
    cli.stop_at_once_on_signals("--compile_only")  # After libtpu's own handlers.
    report = finetune.compile_report(flags.FLAGS.config, target, cli.compile_steps())
    cli.print_report(report)
    aot.check_fits(report)
    return
  finetune.check(flags.FLAGS.config)  # Before the workdir is touched: a bad value writes nothing.
  with workdir_lock.hold(cli.workdir()):  # One run per workdir.
    cli.log_to_file(cli.workdir(), jax.process_index())
    finetune.finetune_and_evaluate(flags.FLAGS.config, cli.workdir())


if __name__ == "__main__":
  cli.run(main, multi_host=True,
          after_interrupt="a restart resumes from the last complete checkpoint")
