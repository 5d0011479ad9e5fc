"""What every launcher shares: flags, a quiet console, a log file, and one-line errors.

- Training launchers: the locked `--config` file with overrides, `--workdir` (default
  runs/<config name>) and the multi-host flags; JAX's distributed runtime starts before anything
  touches the backend; the full log (every library's INFO lines) goes to `<workdir>/train.log`.
- The console shows progress lines, warnings and errors; library INFO logs (orbax, TFDS, grain)
  only when verbosity is raised (`-v 0` / `--verbosity=0`).
- Expected failures (bad config, bad data, non-finite loss, checkpoint mismatch, a failed save)
  end with one line on stderr, `error: ...`, and exit status 1 (2 for a bad flag); `--debug`
  shows the traceback, which the log file of a training launcher (train, finetune) holds.
"""

import atexit
import gc
import logging as std_logging
import os
import signal
import sys
import threading
import warnings
from typing import Callable

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax.runtime import distributed, stop_signals, storage

# Failures a user can fix, reported in one line; anything else keeps its traceback (a bug).
# OSError covers missing files, permissions, a full disk and `CheckpointSaveError`.
EXPECTED_ERRORS = (ValueError, FloatingPointError, OSError)
PROGRESS_LOGGER = "bert_jax.progress"  # Console progress lines, copied to the log file.

flags.DEFINE_bool("debug", False, "On an error, show its full traceback instead of one line.")


def define_flags(example_config: str, workdir_help: str) -> None:
  """--config (locked: a mistyped override fails), --workdir and the multi-host flags."""
  config_flags.DEFINE_config_file("config", None, f"Config file, e.g. {example_config}.",
                                  lock_config=True)
  flags.mark_flags_as_required(["config"])
  flags.DEFINE_string("workdir", None, f"{workdir_help} (default: runs/<config name>).")
  distributed.define_flags()


def define_compile_flags() -> None:
  """--compile_only and the target it compiles for (--topology, --num_slices)."""
  flags.DEFINE_bool("compile_only", False, "Compile the init, train and eval steps against "
                    "abstract shapes, print one JSON report (memory per chip, fits, FLOPs, "
                    "collectives, a step-time bound) and exit: no data, no training, nothing "
                    "allocated. Exit status 1 when the config does not fit.")
  flags.DEFINE_string("topology", "", "With --compile_only: compile for this TPU slice with the "
                      "TPU compiler (libtpu, the tpu extra), e.g. v5e:4x4, v5p:2x2x1, v4:2x2x1, "
                      "v6e:2x2; empty: this process's devices.")
  flags.DEFINE_integer("num_slices", 1, "With --topology: that many slices joined over DCN "
                       "(multi-slice; config.mesh.dcn_data must match).")
  flags.DEFINE_list("compile_steps", ["init", "train", "eval"], "With --compile_only: the steps "
                    "to compile, train among them (train alone: the quickest check of a batch "
                    "size; the eval step at the same batch needs less memory).")
  if "--compile_only" in sys.argv and any(a.startswith("--topology=") for a in sys.argv):
    # Before jax starts its backend: the slice's devices are abstract, this host's accelerator
    # is not used, so the check runs beside a training on the same TPU VM (libtpu's lock file
    # would refuse it) and on a host without one.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def compile_only_requested() -> bool:
  """--compile_only, with its target flags checked (a flag that needs it, without it: refused)."""
  steps_given = any(a.startswith("--compile_steps") for a in sys.argv)
  if not flags.FLAGS.compile_only and (flags.FLAGS.topology or flags.FLAGS.num_slices != 1
                                       or steps_given):
    raise app.UsageError("--topology, --num_slices and --compile_steps need --compile_only (a "
                         "run trains on the devices it is on)")
  if flags.FLAGS.compile_only:
    compile_steps()
  return flags.FLAGS.compile_only


def compile_steps() -> tuple[str, ...]:
  """--compile_steps, checked: a subset of init, train, eval that holds train."""
  from bert_jax.training import aot  # pylint: disable=import-outside-toplevel
  steps = tuple(s.strip() for s in flags.FLAGS.compile_steps)
  unknown = [s for s in steps if s not in aot.STEPS]
  if unknown or "train" not in steps or len(set(steps)) != len(steps):
    raise app.UsageError(f"--compile_steps={','.join(steps)}: give some of "
                         f"{','.join(aot.STEPS)}, each once, train among them")
  return tuple(s for s in aot.STEPS if s in steps)


def stop_at_once_on_signals(what: str) -> None:
  """SIGTERM and SIGINT end the process at once, with one line, while `what` runs in C++ (a
  compile holds the main thread for minutes, so Python's own handlers would wait for it, and
  libtpu's handler printed a stack trace on SIGTERM). The signals' handlers here only wake a
  thread (Python writes each signal's number to the wakeup fd from its C-level handler, in any
  thread), and that thread reports and exits. For a process that writes nothing: nothing is
  lost. Main thread only."""
  read, write = os.pipe()
  os.set_blocking(write, False)
  signal.set_wakeup_fd(write, warn_on_full_buffer=False)
  for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, lambda *_: None)

  def watch() -> None:
    while True:
      for number in os.read(read, 64):
        if number in (signal.SIGTERM, signal.SIGINT):
          name = signal.Signals(number).name
          _report(f"stopped by {name} during {what}; nothing was written")
          _exit_at_once(128 + number)

  threading.Thread(target=watch, name="stop_at_once", daemon=True).start()


def config_overrides() -> list[str]:
  """The command line's `--config.<section>.<field>` overrides, as given."""
  return [a for a in sys.argv[1:] if a.startswith("--config.")]


def print_report(report: dict) -> None:
  """The compile report as JSON on stdout."""
  import json  # pylint: disable=import-outside-toplevel
  print(json.dumps(report, indent=1), flush=True)


def workdir() -> str:
  """--workdir, or runs/<config file name without .py>."""
  config_path = flags.FLAGS["config"].config_filename
  return flags.FLAGS.workdir or os.path.join(
      "runs", os.path.splitext(os.path.basename(config_path))[0])


class _AppenderHandler(std_logging.Handler):
  """Log records into a `storage.Appender` (a bucket's train.log is uploaded every 30 s and at
  exit: object stores cannot append)."""

  # Loggers of the libraries that do the uploading: their records would come back into this
  # handler from their I/O threads while it holds its lock (a deadlock), so they stay out.
  _IO_LOGGERS = ("gcsfs", "fsspec", "google", "urllib3", "aiohttp", "asyncio")

  def __init__(self, path: str):
    super().__init__()
    self.appender = storage.Appender(path, flush_seconds=30.0)
    self.baseFilename = path
    self.addFilter(lambda record: not record.name.startswith(self._IO_LOGGERS))

  def emit(self, record: std_logging.LogRecord) -> None:
    try:
      self.appender.write(self.format(record) + "\n")
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)

  def close(self) -> None:
    self.appender.close()
    super().close()


def log_to_file(directory: str, process_index: int) -> str:
  """Every log record at INFO and above, and the progress lines, into `directory`/train.log
  (train.<process>.log on processes other than 0). -> the file's path."""
  name = "train.log" if process_index == 0 else f"train.{process_index}.log"
  handler = _AppenderHandler(storage.join(storage.absolute(directory), name))
  handler.setLevel(std_logging.INFO)
  handler.setFormatter(std_logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
  std_logging.getLogger().addHandler(handler)
  progress = std_logging.getLogger(PROGRESS_LOGGER)
  progress.propagate = False  # The console has them already (printed).
  progress.setLevel(std_logging.INFO)
  progress.addHandler(handler)
  # Written out before the interpreter shuts down: by logging's own shutdown a bucket's client
  # is closed already. `run` calls it when main() ends; atexit (last in, first out) otherwise.
  atexit.register(close_log_file, handler)
  return handler.baseFilename


def close_log_file(handler: std_logging.Handler | None = None) -> None:
  """Uploads and closes the log file(s) `log_to_file` opened (all of them without `handler`)."""
  for logger in (std_logging.getLogger(), std_logging.getLogger(PROGRESS_LOGGER)):
    for found in list(logger.handlers):
      if isinstance(found, _AppenderHandler) and handler in (None, found):
        logger.removeHandler(found)
        try:
          found.close()
        except Exception:  # pylint: disable=broad-except  (e.g. the disk is full: nothing to do)
          pass


def _quiet_console() -> None:
  """Library INFO lines off the console unless verbosity was asked for; the root logger stays
  at INFO so the log file still gets them."""
  if flags.FLAGS["verbosity"].present:
    return
  handler = logging.get_absl_handler()
  handler.setLevel(std_logging.WARNING)
  handler.addFilter(_not_orbax)
  warnings.showwarning = _show_warning
  sys.unraisablehook = _unraisablehook
  std_logging.raiseExceptions = False  # A full disk must not print a traceback per log line.


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
  """A Python warning (a library's UserWarning, bert_jax's own) as one log line saying what it
  is, not Python's two lines of file, line and source code."""
  del file, line
  logging.warning("%s: %s", category.__name__, message)
  logging.debug("(warned at %s:%d)", filename, lineno)


def _unraisablehook(unraisable) -> None:
  """After a failed save, tensorstore's write callbacks hit orbax's closed event loop, and each
  pending write reports "Event loop is closed" as an unraisable error; after a failed restore,
  each of orbax's pending reads is a coroutine garbage-collected with its error (the red team:
  hundreds of traceback lines under a one-line refusal). Log those (the failure itself is
  reported once), print any other."""
  value = unraisable.exc_value
  if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
    logging.info("After a failed checkpoint write: %s", value)
    return
  code = getattr(unraisable.object, "cr_code", None)  # A coroutine's.
  if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
    logging.info("After a failed checkpoint read, orbax's %s: %s", code.co_name,
                 _one_line(value) if value is not None else "")
    return
  sys.__unraisablehook__(unraisable)


def _not_orbax(record: std_logging.LogRecord) -> bool:
  """Off the console: orbax's own records (a failed save logs its traceback from several
  threads; bert_jax reports the failure itself in one line) and asyncio's "exception was never
  retrieved" for the other writes of that save, whenever they are garbage-collected. The log
  file keeps them."""
  if record.name == "asyncio" and "exception was never retrieved" in record.getMessage():
    return False
  return f"{os.sep}orbax{os.sep}" not in record.pathname


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split()) or type(error).__name__


# Config fields that were renamed: old override -> the field to use now.
RENAMED_FIELDS = {"config.checkpoint.init_from": "config.init_from"}


def _renamed(argv: list[str]) -> str | None:
  """The one-line hint for an override of a renamed field, or None."""
  for arg in argv[1:]:
    name = arg.lstrip("-").split("=", 1)[0]
    if name in RENAMED_FIELDS:
      return (f"--{name} is now --{RENAMED_FIELDS[name]} (one name for pretraining and "
              "fine-tuning)")
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag or override reported in one line."""
  renamed = _renamed(argv)
  if renamed:
    print(f"error: bad flag or config override: {renamed}", file=sys.stderr)
    sys.exit(2)
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    # An unknown config field surfaces from ml_collections as AttributeError(KeyError(text)).
    while isinstance(e, BaseException) and e.args and not isinstance(e.args[0], str):
      e = e.args[0]
    message = " ".join((e.args[0] if isinstance(e, BaseException) and e.args else str(e)).split())
    print(f"error: bad flag or config override: {message}", file=sys.stderr)
    sys.exit(2)


def _report(message: str) -> None:
  """The one `error:` line; the console then falls silent: what the interpreter's teardown
  logs (threads and tasks of the failed operation) is a consequence of the error just reported
  and goes to the log file only."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  logging.get_absl_handler().setLevel(std_logging.CRITICAL + 1)
  std_logging.captureWarnings(True)  # e.g. "coroutine ... was never awaited" at exit.


def _exit_at_once(status: int) -> None:
  """Ends the process without joining its threads or tearing the interpreter down: a signal
  stopped a write that is stuck in storage (the interpreter's exit would wait for it), or a
  compile whose threads are still running. The log file gets 2 s."""
  closer = threading.Thread(target=close_log_file, daemon=True)
  closer.start()
  closer.join(2.0)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def _on_sigint(signum, frame) -> None:
  """Ctrl-C as KeyboardInterrupt, except inside a garbage-collection callback or a __del__
  (e.g. jax's buffer collection), where Python prints such an exception and drops it: then the
  signal is sent again a moment later, when the run is back in its own code."""
  del signum
  dropping = {getattr(callback, "__code__", None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code in dropping or frame.f_code.co_name == "__del__":
      threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
      return
    frame = frame.f_back
  raise KeyboardInterrupt


def _shared_flags_in_help() -> None:
  """absl's --help lists the key flags of the launcher's own module only: the flags bert_jax's
  modules define for it (--config, --workdir, --debug, the multi-host flags, a suite's flags)
  become its key flags too, so --help shows them with their defaults (not only --helpfull)."""
  for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith("bert_jax."):
      for flag in module_flags:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run(main: Callable[..., None], *, multi_host: bool = False, after_interrupt: str = "",
        arguments: bool = False) -> None:
  """`app.run` for a launcher's `main()`: flags (a bad one: one line; --help shows the shared
  ones), quiet console, the multi-host runtime when `multi_host`, expected errors as one line
  with exit status 1, and SIGINT / a signal that stopped a wait as one line with exit status
  128 + the signal (`after_interrupt`: what the launcher's next start does, said after SIGINT's
  line). With `arguments`, `main(args)` gets the positional arguments (after `--`); without,
  any is refused."""
  def absl_main(argv: list[str]) -> None:
    if len(argv) > 1 and not arguments:
      _report(f"unexpected arguments: {argv[1:]} (flags are written --name=value)")
      sys.exit(2)
    _quiet_console()
    signal.signal(signal.SIGINT, _on_sigint)
    try:
      if multi_host:
        distributed.initialize_from_flags()
      main(argv[1:]) if arguments else main()
      close_log_file()
    except app.UsageError as e:  # A wrong combination of flags: one line, not absl's usage page.
      if flags.FLAGS.debug:
        raise
      _report(_one_line(e))
      close_log_file()
      sys.exit(2)
    except EXPECTED_ERRORS as e:
      if flags.FLAGS.debug:
        raise
      logging.info("Stopped by an error:", exc_info=True)  # The log file keeps the traceback.
      _report(_one_line(e))
      close_log_file()
      sys.exit(1)
    except (KeyboardInterrupt, stop_signals.Interrupted) as e:
      if flags.FLAGS.debug:
        raise
      logging.info("Stopped by a signal:", exc_info=True)
      if isinstance(e, KeyboardInterrupt):  # The cleanup it ran on its way up is done.
        _report("interrupted (SIGINT); what was being written is not kept"
                + (f" ({after_interrupt})" if after_interrupt else ""))
      else:
        _report(_one_line(e))
      # Not the interpreter's teardown: a SIGINT during a compile leaves XLA's compile threads
      # running, and tearing down the modules under them segfaulted (exit 139 after this line).
      _exit_at_once(128 + signal.SIGINT if isinstance(e, KeyboardInterrupt) else e.exit_status)
  _shared_flags_in_help()
  app.run(absl_main, flags_parser=_parse_flags)
