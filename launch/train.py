r"""Pretrains BERT (MLM + NSP): `python launch/train.py --config=configs/tiny.py`.

Overrides: `--config.train.batch_size=32`, `--config.data.source=synthetic`, ... (the config is
locked: a mistyped field fails). `--workdir` defaults to runs/<config name>; a second start in the
same workdir resumes from its latest checkpoint. Multi-host: see docs/scale_out.md.

Before paying for a slice: `--compile_only --topology=v5e:4x4` compiles the run for it from this
host and prints what it costs per chip (docs/tpu.md).
"""

from absl import flags

from bert_jax.runtime import cli

cli.define_flags("configs/tiny.py", "Checkpoints, metrics and prepared data go here")
cli.define_compile_flags()


def main() -> None:
  import jax  # After distributed init.
  from bert_jax import config_checks, train
  from bert_jax.runtime import workdir_lock
  from bert_jax.training import aot
  config_checks.check_overrides_read(flags.FLAGS.config, cli.config_overrides(), False)
  if cli.compile_only_requested():
    target = aot.target(flags.FLAGS.topology, flags.FLAGS.num_slices)
    cli.stop_at_once_on_signals("--compile_only")  # After libtpu's own handlers.
    report = train.compile_report(flags.FLAGS.config, target, cli.compile_steps())
    cli.print_report(report)
    aot.check_fits(report)
    return
  train.check(flags.FLAGS.config)  # Before the workdir is touched: a bad value writes nothing.
  with workdir_lock.hold(cli.workdir()):  # One run per workdir.
    cli.log_to_file(cli.workdir(), jax.process_index())
    train.train_and_evaluate(flags.FLAGS.config, cli.workdir())


if __name__ == "__main__":
  cli.run(main, multi_host=True,
          after_interrupt="a restart resumes from the last complete checkpoint")
