"""A downstream suite in one command (`launch/downstream.py`): GLUE, SQuAD v1.1 / v2.0 or the
local suite fine-tuned from one pretrained encoder over a grid of learning rates and seeds, with
the original recipe, and one table of dev scores.

- Plan: every (task, learning rate, seed) is one fine-tuning run in its own workdir,
  `<output_dir>/runs/<task>/lr<lr>_seed<seed>/`, with `config.seed = seed` (`plan`,
  `run_config`). The recipe (BERT's): batch 32, 3 epochs, warmup 10% of the steps, one
  evaluation at the end, max_seq_length 128 (GLUE) or 384 with doc_stride 128 (SQuAD).
  `--config.*` overrides apply to every run and win over the recipe.
- Run: `bert_jax.finetune.finetune_and_evaluate` (the trainer resumes an interrupted run from
  its checkpoint), then the run's scores (`downstream_scores.json`): GLUE from the predictions
  of its best export (the final model, with the recipe's one evaluation) on each dev split
  (MNLI: matched, then mismatched), with the official metrics of `downstream_tasks`; the other
  tasks' from final_eval.json. A run whose final_eval.json is there is never trained again, and
  one whose scores are there is skipped: a killed suite restarts at its first unfinished run.
  Each run records the settings it learns from (`downstream_settings.json`: every field of
  `SETTINGS_SECTIONS`, and the encoder by its content: `encoder_identity`); a restart whose
  settings differ for any run is refused in one line before anything runs (`check_settings`),
  so no table mixes runs of two settings, and runs made from another encoder at the same
  --checkpoint path (trained further) are kept under another name and run again
  (`set_aside_other_encoders`).
- Devices: with `--devices_per_run=N` the local devices are split into groups of N
  (`device_groups`) and the runs spread over them, longest first onto the least loaded group
  (`assign_runs`); each group runs its share in a process that sees only its devices
  (`group_env`: CUDA_VISIBLE_DEVICES, TPU chip bounds, or simulated CPU devices). Otherwise
  (the default) the runs go one after another in this process, on all devices.
- Table: the learning rate whose median main metric over the seeds is highest, and the
  medians of every metric at it (`summarize`); `results.json` (every run's scores, steps and
  workdir) and `results.md` (one row per task, BERT's GLUE average) in the output directory.
"""

import copy
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from typing import Any, Sequence

import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax.runtime import storage
from bert_jax.downstream import tasks as suites
from bert_jax.downstream.tasks import TaskSpec

SCORES_FILE = "downstream_scores.json"
# What a run learns from (written into its workdir before it trains): a restart with other
# settings in the same --output_dir is refused instead of reusing runs made with the old ones.
SETTINGS_FILE = "downstream_settings.json"
# The config sections that decide a run's scores (mesh, checkpoint and logging say where and
# how it runs, and may change between restarts).
SETTINGS_SECTIONS = ("seed", "task", "init_from", "vocab", "model", "head", "data", "train")
RESULTS_JSON, RESULTS_MD = "results.json", "results.md"
DEFAULT_LEARNING_RATES = "2e-5,3e-5,4e-5,5e-5"  # BERT's GLUE grid (paper, Appendix A.3).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Config fields each run gets from the suite's own flags, so an override would be overwritten.
SUITE_FIELDS = {
    "seed": "--seeds", "task": "--suite / --tasks", "init_from": "--checkpoint",
    "train.learning_rate": "--learning_rates", "data.tfds_name": "--suite / --tasks",
    "data.tfds_train_split": "--suite", "data.tfds_validation_split": "--suite",
    "data.train_file": "--suite", "data.validation_file": "--suite",
    "data.labels": "--suite", "data.regression": "--suite",
    "data.version_2_with_negative": "--suite (squad2)"}


def _say(message: str) -> None:
  """A console line (also in the log), without touching the JAX backend: a parent that hands
  runs to device groups must leave every device to them."""
  print(message, flush=True)
  logging.info(message)


# ----------------------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True)
class Options:
  checkpoint: str
  suite: str
  tasks: tuple[str, ...]  # () = every task of the suite.
  learning_rates: tuple[float, ...]
  seeds: int
  output_dir: str
  devices_per_run: int = 0  # 0: every run on all devices, one after another, in this process.
  run_group: tuple[int, int] | None = None  # (index, count): a device group's share only.


@dataclasses.dataclass(frozen=True)
class Run:
  task: str
  learning_rate: float
  seed: int

  @property
  def name(self) -> str:
    return f"lr{self.learning_rate:g}_seed{self.seed}"

  def workdir(self, output_dir: str) -> str:
    return storage.join(output_dir, "runs", self.task, self.name)


def parse_learning_rates(text: str) -> tuple[float, ...]:
  try:
    values = tuple(float(x) for x in text.split(","))
  except ValueError:
    values = ()
  if not values or not all(0 < v < 1 for v in values) or len(set(values)) != len(values):
    raise ValueError(f"--learning_rates={text}: expected distinct numbers in (0, 1) separated "
                     "by commas, e.g. 2e-5,3e-5,5e-5")
  return values


def check_checkpoint(path: str) -> str:
  """The encoder's absolute path; a missing, empty or unknown one named with its flag."""
  from bert_jax import weights  # pylint: disable=g-import-not-at-top
  if not path:
    raise ValueError("--checkpoint is empty: give the pretrained encoder (a bert_jax workdir or "
                     "pretrained directory, a HuggingFace directory or a TF checkpoint)")
  path = storage.absolute(path)
  if not storage.exists(path) and not storage.exists(path + ".index"):
    raise ValueError(f"--checkpoint={path} does not exist")
  if storage.isdir(path) and not storage.listdir(path):
    raise ValueError(f"--checkpoint={path} is an empty directory")
  try:
    weights.detect_format(path)
  except ValueError as e:
    raise ValueError(f"--checkpoint={e}") from e
  return path


def parse_options(checkpoint: str, suite: str, tasks: Sequence[str], learning_rates: str,
                  seeds: int, output_dir: str, devices_per_run: int = 0,
                  run_group: str = "") -> Options:
  """The suite's flags, checked: an error names the flag."""
  if suite not in suites.SUITES:
    raise ValueError(f"--suite={suite}: unknown suite; one of {', '.join(suites.SUITES)}")
  known = {"glue": (*suites.GLUE, *suites.GLUE_LEFT_OUT), "squad1": ("squad1",),
           "squad2": ("squad2",)}.get(suite)
  tasks = tuple(t.strip() for t in tasks if t.strip())
  for task in tasks:
    if task in suites.GLUE_LEFT_OUT:
      raise ValueError(f"--tasks={','.join(tasks)}: {task} is left out of GLUE, as BERT did")
    if known is not None and task not in known:
      raise ValueError(f"--tasks={','.join(tasks)}: {task} is not a task of --suite={suite} "
                       f"(one of {', '.join(t for t in known if t not in suites.GLUE_LEFT_OUT)})")
  if len(set(tasks)) != len(tasks):
    raise ValueError(f"--tasks={','.join(tasks)}: a task is named twice")
  if seeds < 1:
    raise ValueError(f"--seeds={seeds}: the number of seeds per learning rate must be >= 1")
  if devices_per_run < 0:
    raise ValueError(f"--devices_per_run={devices_per_run}: must be >= 0 (0: all devices)")
  if not output_dir:
    raise ValueError("--output_dir is empty: where the runs and the results go")
  checkpoint = check_checkpoint(checkpoint)
  from bert_jax.weights import files  # pylint: disable=g-import-not-at-top
  files.check_apart(storage.absolute(output_dir), {"the encoder's workdir (--checkpoint)":
                                                   encoder_root(checkpoint)}, "--output_dir")
  return Options(checkpoint, suite, tasks, parse_learning_rates(learning_rates), seeds,
                 storage.absolute(output_dir), devices_per_run, parse_run_group(run_group))


def encoder_root(checkpoint: str) -> str:
  """The directory that holds the encoder: its workdir for a checkpoint's step directory
  (`<workdir>/checkpoints/<step>`, `<workdir>/best/<step>`), the directory of a TF checkpoint
  prefix, else the path itself. The suite's output never goes there: the encoder's own run
  would rotate or overwrite it, and it the encoder's files."""
  from bert_jax.checkpoints import checkpointing  # pylint: disable=g-import-not-at-top
  parent = os.path.dirname(checkpoint.rstrip("/"))
  if storage.isdir(storage.join(checkpoint, "meta")) and storage.basename(parent) in (
      checkpointing.CHECKPOINTS_DIR, checkpointing.BEST_DIR):
    return os.path.dirname(parent)
  return checkpoint if storage.isdir(checkpoint) else parent


def parse_run_group(text: str) -> tuple[int, int] | None:
  """--run_group=index/count (set by the suite for a device group's process), or None."""
  if not text:
    return None
  parts = text.split("/")
  if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts) or not (
      0 <= int(parts[0]) < int(parts[1])):
    raise ValueError(f"--run_group={text}: expected index/count with 0 <= index < count, e.g. "
                     "0/2 (the suite sets it for its device groups' processes)")
  return int(parts[0]), int(parts[1])


def select_tasks(options: Options) -> list[TaskSpec]:
  """The suite's tasks that run, in --tasks order (else the suite's); the local suite's files
  are built here (under <output_dir>/data/local)."""
  specs = {spec.name: spec for spec in suites.suite_specs(
      options.suite, storage.join(options.output_dir, "data", "local"))}
  unknown = [t for t in options.tasks if t not in specs]
  if unknown:
    raise ValueError(f"--tasks={','.join(options.tasks)}: {', '.join(unknown)} not in "
                     f"--suite={options.suite} (one of {', '.join(specs)})")
  return [specs[t] for t in options.tasks] if options.tasks else list(specs.values())


def plan(specs: Sequence[TaskSpec], learning_rates: Sequence[float], seeds: int) -> list[Run]:
  """Every run, task by task, then learning rate, then seed (0 .. seeds - 1)."""
  return [Run(spec.name, lr, seed) for spec in specs for lr in learning_rates
          for seed in range(seeds)]


# ------------------------------------------------------------------------------ configs


def given_overrides(flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
  """The `--config.a.b=value` overrides on the command line: field path -> parsed value. A field
  the suite sets per run is refused (its own flag says it)."""
  found = {}
  for name in flag_values:
    if name.startswith("config.") and flag_values[name].present:
      path = name[len("config."):]
      if path in SUITE_FIELDS:
        raise ValueError(f"--config.{path}: the suite sets it for every run; use "
                         f"{SUITE_FIELDS[path]}")
      found[path] = _get(flag_values["config"].value, path)
  return found


def _get(config, path: str) -> Any:
  for part in path.split("."):
    config = config[part]
  return config


def _set(config, path: str, value: Any) -> None:
  *parents, leaf = path.split(".")
  for part in parents:
    config = config[part]
  config[leaf] = value


def run_config(base, overrides: dict[str, Any], spec: TaskSpec, run: Run, checkpoint: str):
  """`base` with the recipe of `spec` and `run`, then `overrides` (the command line wins)."""
  config = copy.deepcopy(base)
  config.seed, config.task, config.init_from = run.seed, spec.task, checkpoint
  config.data.update(
      tfds_name=spec.tfds_name, tfds_train_split="train",
      tfds_validation_split=spec.eval_splits[0][1], train_file=spec.train_file,
      validation_file=spec.validation_file, labels=spec.labels, regression=spec.regression,
      max_seq_length=spec.max_seq_length, doc_stride=spec.doc_stride,
      version_2_with_negative=spec.version_2_with_negative)
  # BERT's fine-tuning recipe; one evaluation, at the end, so the best export is the final model.
  config.train.update(learning_rate=run.learning_rate, batch_size=32, num_train_steps=0,
                      num_train_epochs=3.0, warmup_steps=0, warmup_proportion=0.1,
                      eval_every_steps=0, best_metric="")
  for path, value in overrides.items():
    _set(config, path, value)
  return config


# --------------------------------------------------------------------------------- runs


def _read_json(path: str) -> dict[str, Any] | None:
  return json.loads(storage.read_text(path)) if storage.isfile(path) else None


def finished(run_dir: str) -> dict[str, Any] | None:
  """The run's final_eval.json when it trained to the end (not when it stopped on a signal)."""
  from bert_jax.finetune import FINAL_EVAL_FILE  # pylint: disable=g-import-not-at-top
  summary = _read_json(storage.join(run_dir, FINAL_EVAL_FILE))
  return summary if summary is not None and "preempted_at" not in summary else None


def run_settings(config) -> dict[str, Any]:
  """The fields of `config` that decide a run's scores, flattened: {"train.learning_rate": ...},
  as JSON gives them back (tuples as lists)."""
  flat = {}

  def walk(prefix: str, value: Any) -> None:
    if isinstance(value, dict):
      for key, item in value.items():
        walk(f"{prefix}.{key}" if prefix else key, item)
    else:
      flat[prefix] = value

  config = config.to_dict()
  for section in SETTINGS_SECTIONS:
    walk(section, config[section])
  return json.loads(json.dumps(flat))


def encoder_identity(path: str) -> dict[str, Any]:
  """The encoder at `path` by its content, which runs are keyed by (an encoder trained further
  at the same path is another encoder): {"encoder.step": its checkpoint's step (None for a
  directory of weights), "encoder.fingerprint": SHA-256 of its files' sizes and checksums (of a
  training checkpoint's verification record, when it has one: nothing more is read)}."""
  # pylint: disable-next=g-import-not-at-top
  from bert_jax import weights
  from bert_jax.checkpoints import integrity as checkpoint_integrity, checkpointing
  step, files = None, None
  if storage.isdir(path):
    if weights.detect_format(path) == "training":  # The checkpoint `config.init_from` reads.
      step_dir = checkpointing.find_step_dir(path)
      step, path = checkpointing.step_of(storage.basename(step_dir)), step_dir
      record = storage.join(step_dir, checkpoint_integrity.MANIFEST_FILE)
      if storage.isfile(record):
        files = json.loads(storage.read_text(record))["files"]
    if files is None:
      files = storage.describe_files(path)
  else:  # A TF checkpoint prefix: <prefix>.index, <prefix>.data-*.
    parent, prefix = os.path.dirname(path), os.path.basename(path) + "."
    files = {name: found for name, found in storage.describe_files(parent).items()
             if name.startswith(prefix) and "/" not in name}
  digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
  return {"encoder.step": step, "encoder.fingerprint": digest}


def set_aside_other_encoders(runs: Sequence[Run], output_dir: str,
                             encoder: dict[str, Any]) -> None:
  """Runs of --output_dir made from another encoder (another checkpoint at the same
  --checkpoint path: trained further, replaced) are kept under another name
  (`<run>.encoder-step<s>-<fingerprint>`) and run again, not tabulated as this encoder's."""
  for run in runs:
    run_dir = run.workdir(output_dir)
    recorded = _read_json(storage.join(run_dir, SETTINGS_FILE))
    old = {key: (recorded or {}).get(key) for key in encoder}
    if recorded is None or old["encoder.fingerprint"] in (None, encoder["encoder.fingerprint"]):
      continue  # (Runs recorded before encoders were: compared by their settings alone.)
    aside = (f"{run_dir}.encoder-step{old['encoder.step']}-"
             f"{old['encoder.fingerprint'][:12]}")
    _say(f"{run.task} {run.name}: made from another encoder at {run_dir} (step "
         f"{old['encoder.step']}, this one's {encoder['encoder.step']}); kept as "
         f"{storage.basename(aside)}, and run again")
    storage.rename(run_dir, aside)


def check_settings(runs: Sequence[Run], configs: dict[Run, Any], output_dir: str) -> None:
  """Refuses (one line, before anything runs) an --output_dir whose runs were made with other
  settings: their scores would be tabulated as this command's. (The encoder's identity is
  `set_aside_other_encoders`'.)"""
  for run in runs:
    run_dir = run.workdir(output_dir)
    recorded = _read_json(storage.join(run_dir, SETTINGS_FILE))
    if recorded is None:
      continue
    recorded = {k: v for k, v in recorded.items() if not k.startswith("encoder.")}
    current = run_settings(configs[run])
    changed = [f"{k}={recorded.get(k, '(unset)')!r} there, {current.get(k, '(unset)')!r} now"
               for k in sorted(set(recorded) | set(current)) if recorded.get(k) != current.get(k)]
    if changed:
      more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
      raise ValueError(
          f"--output_dir={output_dir} holds runs made with other settings ({run.task} "
          f"{run.name}: {'; '.join(changed[:3])}{more}); give another --output_dir, or remove "
          f"{run_dir} to redo that run")


def glue_run_scores(spec: TaskSpec, run_dir: str, config) -> dict[str, float]:
  """The official metrics of the run's best export on each dev split of `spec`."""
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from bert_jax.data import finetune as finetune_data  # pylint: disable=g-import-not-at-top
  finetuned = predict.load_finetuned(run_dir)
  scores = {}
  for suffix, split in spec.eval_splits:
    records = finetune_data.read_tfds(spec.tfds_name, split, config.data.tfds_data_dir or None)
    outputs = predict.predict(finetuned, records, batch_size=config.train.eval_batch_size)
    if spec.regression:
      predicted, gold = [p["score"] for p in outputs], [float(r[2]["label"]) for r in records]
    else:
      predicted = [p["label_index"] for p in outputs]
      gold = [finetune_data.label_index(r, r[2]["label"], spec.labels) for r in records]
    for name, value in suites.glue_scores(spec, predicted, gold).items():
      scores[f"{name}_{suffix}" if suffix else name] = value
  return scores


def task_run_scores(summary: dict[str, Any]) -> dict[str, float]:
  """The task's own scores of the best export (final_eval.json)."""
  best = summary.get("best") or summary["final"]
  return {k: v for k, v in best.items() if k != "step" and isinstance(v, (int, float))}


def run_one(spec: TaskSpec, run: Run, config, output_dir: str, position: str,
            encoder: dict[str, Any]) -> bool:
  """Trains (or resumes) and scores one run, unless done. -> False when a signal stopped it.
  `encoder`: its identity (`encoder_identity`), recorded with the run's settings."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.runtime import cli, workdir_lock
  run_dir = run.workdir(output_dir)
  label = f"{position} {run.task} lr {run.learning_rate:g} seed {run.seed}"
  if storage.isfile(storage.join(run_dir, SCORES_FILE)):
    _say(f"{label}: finished already ({run_dir})")
    return True
  with workdir_lock.hold(run_dir):  # One run per workdir, here or in another group.
    settings = storage.join(run_dir, SETTINGS_FILE)
    if not storage.isfile(settings):
      storage.write_text(settings, json.dumps({**run_settings(config), **encoder}, indent=2))
    summary = finished(run_dir)
    if summary is None:
      _say(f"{label}: fine-tuning in {run_dir}")
      cli.log_to_file(run_dir, jax.process_index())
      try:
        result = finetune.finetune_and_evaluate(config, run_dir)
      finally:
        cli.close_log_file()
      if "preempted_at" in result:
        return False
      summary = finished(run_dir)
    else:
      _say(f"{label}: trained already; scoring")
    scores = (glue_run_scores(spec, run_dir, config) if spec.scored_by_glue_metrics
              else task_run_scores(summary))
    record = {"scores": scores, "steps": summary["final"]["step"], "workdir": run_dir}
    storage.write_text(storage.join(run_dir, SCORES_FILE), json.dumps(record, indent=2))
  shown = " ".join(f"{m} {scores[m]:.4f}" for m in spec.metrics if m in scores)
  _say(f"{label}: {shown}")
  return True


def execute(specs: Sequence[TaskSpec], runs: Sequence[Run], configs: dict[Run, Any],
            output_dir: str, encoder: dict[str, Any]) -> bool:
  """`runs` one after another in this process. -> False when a signal stopped one."""
  by_name = {spec.name: spec for spec in specs}
  if any(spec.tfds_name.startswith("glue/") for spec in specs):
    suites.register_tfds_builders()
  for i, run in enumerate(runs):
    if not run_one(by_name[run.task], run, configs[run], output_dir, f"[{i + 1}/{len(runs)}]",
                   encoder):
      _say(f"{run.task} {run.name}: stopped by a signal; the suite stops here (a restart "
           "resumes it from this run's checkpoint)")
      return False
  return True


# ------------------------------------------------------------------------------ devices


def device_groups(num_devices: int, devices_per_run: int) -> list[tuple[int, ...]]:
  """The local devices (0 .. num_devices - 1) in groups of `devices_per_run` consecutive ones
  (0: one group of all)."""
  if devices_per_run == 0:
    return [tuple(range(num_devices))]
  if devices_per_run > num_devices or num_devices % devices_per_run:
    raise ValueError(f"--devices_per_run={devices_per_run} does not divide the {num_devices} "
                     "local devices into equal groups")
  return [tuple(range(start, start + devices_per_run))
          for start in range(0, num_devices, devices_per_run)]


def assign_runs(costs: Sequence[float], num_groups: int) -> list[list[int]]:
  """Run indices per group: the costliest run first onto the least loaded group (ties: the
  lower group), each group's share then in plan order (so it resumes in that order too)."""
  loads, shares = [0.0] * num_groups, [[] for _ in range(num_groups)]
  for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
    group = min(range(num_groups), key=lambda g: (loads[g], g))
    loads[group] += costs[index]
    shares[group].append(index)
  return [sorted(share) for share in shares]


# TPU chips a process sees (TPU_CHIPS_PER_PROCESS_BOUNDS) for groups of 1, 2 and 4 chips.
_TPU_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1"}
_TPU_BASE_PORT = 8476


def group_env(platform: str, devices: Sequence[int], index: int,
              env: dict[str, str]) -> dict[str, str]:
  """The environment of the process that runs device group `index` (`devices` of this host):
  it sees those devices only."""
  env = dict(env)
  ids = ",".join(str(d) for d in devices)
  if platform in ("gpu", "cuda"):
    env["CUDA_VISIBLE_DEVICES"] = ids
  elif platform == "rocm":
    env["HIP_VISIBLE_DEVICES"] = ids
  elif platform == "tpu":
    if len(devices) not in _TPU_CHIP_BOUNDS:
      raise ValueError(f"--devices_per_run={len(devices)}: TPU groups of 1, 2 or 4 chips")
    port = _TPU_BASE_PORT + index
    env.update(TPU_VISIBLE_CHIPS=ids, TPU_CHIPS_PER_PROCESS_BOUNDS=_TPU_CHIP_BOUNDS[len(devices)],
               TPU_PROCESS_BOUNDS="1,1,1", TPU_PROCESS_PORT=str(port),
               TPU_PROCESS_ADDRESSES=f"localhost:{port}", CLOUD_TPU_TASK_ID="0")
  elif platform == "cpu":  # Simulated devices: as many as the group has.
    kept = [f for f in env.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(kept + [f"--xla_force_host_platform_device_count={len(devices)}"])
  else:
    raise ValueError(f"--devices_per_run: device groups on platform {platform!r} are not "
                     "supported (gpu, rocm, tpu, cpu)")
  return env


def probe_devices() -> tuple[str, int]:
  """(platform, local device count), asked in a short child process: the parent of device
  groups must not hold any device (JAX takes all of a GPU's memory when it starts)."""
  probe = subprocess.run(
      [sys.executable, "-c", "import jax; print(jax.default_backend(), jax.local_device_count())"],
      env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, capture_output=True,
      text=True, check=False)
  if probe.returncode != 0:
    raise OSError(f"could not list the devices: {probe.stderr.strip()[-500:]}")
  platform, count = probe.stdout.split()[-2:]
  return platform, int(count)


def run_cost(spec: TaskSpec, config) -> float:
  """Training examples x sequence length: what a run's time grows with (for `assign_runs`)."""
  if spec.tfds_name:
    from bert_jax.data import finetune as finetune_data  # pylint: disable=g-import-not-at-top
    examples = len(finetune_data.tfds_data_source(spec.tfds_name, "train",
                                                  config.data.tfds_data_dir or None))
  else:
    examples = storage.read_text(spec.train_file).count("\n")
  return float(examples * config.data.max_seq_length)


def spread(specs: Sequence[TaskSpec], runs: Sequence[Run], configs: dict[Run, Any],
           num_groups: int) -> list[list[Run]]:
  """Each device group's runs (`assign_runs` by `run_cost`)."""
  by_name = {spec.name: spec for spec in specs}
  if any(spec.tfds_name.startswith("glue/") for spec in specs):
    suites.register_tfds_builders()
  costs = {}
  for run in runs:
    if run.task not in costs:
      costs[run.task] = run_cost(by_name[run.task], configs[run])
  shares = assign_runs([costs[run.task] for run in runs], num_groups)
  return [[runs[i] for i in share] for share in shares]


def run_groups(groups: list[tuple[int, ...]], platform: str, argv: Sequence[str]) -> list[str]:
  """One process per device group, each `argv` + --run_group=i/n; waits for all. -> a line per
  group that failed."""
  processes = []
  for index, devices in enumerate(groups):
    _say(f"device group {index}: devices {','.join(map(str, devices))}")
    processes.append(subprocess.Popen(
        [sys.executable, *argv, f"--run_group={index}/{len(groups)}"],
        env=group_env(platform, devices, index, dict(os.environ))))
  failed = []
  for index, process in enumerate(processes):
    if process.wait() != 0:
      failed.append(f"device group {index} stopped with exit status {process.returncode}")
  return failed


# -------------------------------------------------------------------------------- table


def choose_learning_rate(scores: dict[float, list[float]]) -> float:
  """The learning rate with the highest median over seeds (ties: the first given)."""
  return max(scores, key=lambda lr: float(np.median(scores[lr])))


def _task_summary(spec: TaskSpec, records: dict[Run, dict], learning_rates: Sequence[float],
                  seeds: int) -> dict[str, Any]:
  runs = {lr: [r for s in range(seeds) if (r := records.get(Run(spec.name, lr, s)))]
          for lr in learning_rates}
  main = {lr: [r["scores"][spec.main_metric] for r in rs if spec.main_metric in r["scores"]]
          for lr, rs in runs.items()}
  main = {lr: values for lr, values in main.items() if values}
  summary = {"metrics": list(spec.metrics), "main_metric": spec.main_metric,
             "runs": {f"{lr:g}": {str(r_seed): record for r_seed, record in (
                 (s, records.get(Run(spec.name, lr, s))) for s in range(seeds)) if record}
                      for lr in learning_rates},
             "median_main_by_lr": {f"{lr:g}": float(np.median(v)) for lr, v in main.items()}}
  if not main:
    return {**summary, "chosen_lr": None, "median": {}, "seeds": 0}
  chosen = choose_learning_rate(main)
  chosen_runs = runs[chosen]
  median = {m: float(np.median([r["scores"][m] for r in chosen_runs if m in r["scores"]]))
            for m in spec.metrics if any(m in r["scores"] for r in chosen_runs)}
  return {**summary, "chosen_lr": chosen, "median": median, "seeds": len(chosen_runs)}


def summarize(suite: str, checkpoint: str, specs: Sequence[TaskSpec],
              records: dict[Run, dict], learning_rates: Sequence[float],
              seeds: int) -> dict[str, Any]:
  """results.json: per task the runs (lr -> seed -> scores, steps, workdir), the chosen
  learning rate and the medians at it; for GLUE, BERT's average over the tasks that ran."""
  results = {"suite": suite, "checkpoint": checkpoint,
             "learning_rates": list(learning_rates), "seeds": list(range(seeds)),
             "tasks": {spec.name: _task_summary(spec, records, learning_rates, seeds)
                       for spec in specs}}
  if suite == "glue":
    parts = [(task, metric, results["tasks"][task]["median"].get(metric))
             for task, metric in suites.GLUE_AVERAGE if task in results["tasks"]]
    values = [value for _, _, value in parts if value is not None]
    results["glue_average"] = {
        "value": float(np.mean(values)) if values else None,
        "over": [f"{task} {metric}" for task, metric, value in parts if value is not None],
        "complete": len(values) == len(suites.GLUE_AVERAGE),
        "left_out": list(suites.GLUE_LEFT_OUT)}
  return results


def _percent(value: float | None) -> str:
  return "–" if value is None else f"{100 * value:.1f}"


def markdown(results: dict[str, Any]) -> str:
  """results.md: one row per task (dev scores x 100, medians over seeds at the chosen lr)."""
  rates = ", ".join(f"{lr:g}" for lr in results["learning_rates"])
  lines = [f"# {results['suite']} dev results", "",
           f"Encoder: `{results['checkpoint']}`. Learning rates {rates}, {len(results['seeds'])} "
           "seed(s) each; the chosen learning rate has the highest median main metric (the "
           "first listed) over the seeds, and every metric is the median over the seeds at it. "
           "Scores x 100.", "",
           "| task | metric(s) | chosen lr | median | seeds | main metric by lr |",
           "| --- | --- | --- | --- | --- | --- |"]
  for name, task in results["tasks"].items():
    chosen = "–" if task["chosen_lr"] is None else f"{task['chosen_lr']:g}"
    medians = " / ".join(_percent(task["median"].get(m)) for m in task["metrics"])
    by_lr = ", ".join(f"{lr}: {_percent(v)}" for lr, v in task["median_main_by_lr"].items())
    names = " / ".join(suites.METRIC_NAMES.get(m, m) for m in task["metrics"])
    lines.append(f"| {name} | {names} | {chosen} | {medians} | "
                 f"{task['seeds']} | {by_lr} |")
  average = results.get("glue_average")
  if average:
    lines += ["", f"GLUE average: {_percent(average['value'])} — as BERT's Table 1, the mean of "
              "MNLI-m and MNLI-mm accuracy, QQP F1, QNLI accuracy, SST-2 accuracy, CoLA MCC, "
              "STS-B Spearman, MRPC F1 and RTE accuracy"
              + ("" if average["complete"] else
                 f"; partial: over {', '.join(average['over']) or 'nothing yet'} only") + ". "
              f"Left out: {', '.join(average['left_out']).upper()}, as BERT did."]
  return "\n".join(lines) + "\n"


def collect(runs: Sequence[Run], output_dir: str) -> dict[Run, dict]:
  """The scores of every finished run."""
  records = {}
  for run in runs:
    record = _read_json(storage.join(run.workdir(output_dir), SCORES_FILE))
    if record is not None:
      records[run] = record
  return records


def write_results(options: Options, specs: Sequence[TaskSpec], runs: Sequence[Run],
                  encoder: dict[str, Any]) -> dict:
  results = summarize(options.suite, options.checkpoint, specs, collect(runs, options.output_dir),
                      options.learning_rates, options.seeds)
  results["encoder"] = encoder
  storage.write_text(storage.join(options.output_dir, RESULTS_JSON), json.dumps(results, indent=2))
  table = markdown(results)
  storage.write_text(storage.join(options.output_dir, RESULTS_MD), table)
  _say(table)
  return results


# ---------------------------------------------------------------------------- the suite


def run_suite(options: Options, base_config, overrides: dict[str, Any],
              argv: Sequence[str]) -> dict[str, Any] | None:
  """Plans, runs (here or on device groups) and tabulates the suite; -> results.json's
  content (None for a device group's process, or when a signal stopped a run)."""
  from bert_jax import config_checks  # pylint: disable=g-import-not-at-top
  specs = select_tasks(options)
  runs = plan(specs, options.learning_rates, options.seeds)
  by_name = {spec.name: spec for spec in specs}
  configs = {run: run_config(base_config, overrides, by_name[run.task], run, options.checkpoint)
             for run in runs}
  for run in runs:  # Every run's config, before anything is written.
    config_checks.check_finetuning(configs[run])
    # An override of a section this run's task never reads (--config.embedding.* on GLUE).
    config_checks.check_overrides_read(configs[run], [f"--config.{p}" for p in overrides], True)
  encoder = encoder_identity(options.checkpoint)
  if options.run_group is None:  # (A group's process: its parent has done it.)
    set_aside_other_encoders(runs, options.output_dir, encoder)
  check_settings(runs, configs, options.output_dir)
  if options.run_group is not None:
    index, count = options.run_group
    share = spread(specs, runs, configs, count)[index]
    execute(specs, share, configs, options.output_dir, encoder)
    return None
  groups, platform = [()], ""
  if options.devices_per_run:
    platform, count = probe_devices()
    groups = device_groups(count, options.devices_per_run)
  _say(f"{options.suite}: {len(runs)} runs ({len(specs)} tasks x {len(options.learning_rates)} "
       f"learning rates x {options.seeds} seeds) in {options.output_dir}"
       + (f" on {len(groups)} device groups" if len(groups) > 1 else ""))
  failed = []
  if len(groups) > 1:
    failed = run_groups(groups, platform, argv)
  elif not execute(specs, runs, configs, options.output_dir, encoder):
    return None
  results = write_results(options, specs, runs, encoder)
  if failed:
    raise ValueError("; ".join(failed) + " (the finished runs are kept and tabulated; a "
                     "restart runs the others)")
  return results


# ------------------------------------------------------------------------------- flags


def define_flags(default_config: str) -> None:
  """The launcher's flags; `--config` defaults to `default_config` (`with_default_config`)."""
  global _DEFAULT_CONFIG  # pylint: disable=global-statement
  _DEFAULT_CONFIG = default_config
  config_flags.DEFINE_config_file(
      "config", None, f"Base fine-tuning config of every run (default {default_config}); its "
      "--config.a.b=value overrides apply to every run and win over the suite's recipe.",
      lock_config=True)
  flags.DEFINE_string("checkpoint", None, "The pretrained encoder: anything config.init_from "
                      "takes (bert_jax workdir or pretrained dir, HuggingFace dir, TF checkpoint).")
  flags.DEFINE_string("suite", None, f"One of {', '.join(suites.SUITES)}, or beir / "
                      "local_retrieval (zero-shot retrieval of an embedding model on --data_dir "
                      "/ on the offline retrieval suite).")
  flags.DEFINE_string("data_dir", "", "--suite=beir: a task in BEIR's layout (corpus.jsonl, "
                      "queries.jsonl, qrels/test.tsv), or a directory of such tasks.")
  flags.DEFINE_list("tasks", [], "Tasks of the suite to run (default: all), e.g. cola,sst2.")
  flags.DEFINE_string("learning_rates", DEFAULT_LEARNING_RATES, "Learning rates to try.")
  flags.DEFINE_integer("seeds", 5, "Seeds per learning rate (0 .. seeds - 1).")
  flags.DEFINE_string("output_dir", None, "Runs, results.json and results.md go here.")
  flags.DEFINE_integer("devices_per_run", 0, "Devices of one run; the local devices run that "
                       "many at once, in groups (0: each run on all devices, one at a time).")
  flags.DEFINE_string("run_group", "", "Internal: index/count of the device group this "
                      "process runs (set by the suite for its group processes).")
  flags.mark_flags_as_required(["checkpoint", "suite", "output_dir"])


_DEFAULT_CONFIG = "configs/finetune_base.py"


def with_default_config(argv: Sequence[str]) -> list[str]:
  """`argv` with --config=<the default, in this repository> when it has none (config_flags
  parses `--config.*` overrides only after a --config argument)."""
  argv = list(argv)
  if not any(a == "--config" or a.startswith("--config=") for a in argv[1:]):
    argv.insert(1, f"--config={os.path.join(_ROOT, _DEFAULT_CONFIG)}")
  return argv


def _run_beir(f) -> dict[str, Any]:
  """--suite=beir: zero-shot retrieval (`downstream/beir.py`) of --data_dir's tasks;
  --suite=local_retrieval: of the offline suite (`data/local_retrieval.py`), built into
  <output_dir>/data first. The fine-tuning flags are refused."""
  from bert_jax.downstream import beir  # pylint: disable=import-outside-toplevel
  data_dir = f.data_dir
  if f.suite == "local_retrieval":
    if data_dir:
      raise app.UsageError("--data_dir is for --suite=beir: --suite=local_retrieval builds its "
                           "data in <output_dir>/data")
    from bert_jax.data import local_retrieval  # pylint: disable=import-outside-toplevel
    data_dir = local_retrieval.build(os.path.join(f.output_dir, "data"))["beir_dir"]
  elif not data_dir:
    raise app.UsageError("--suite=beir needs --data_dir (a task in BEIR's layout, or a "
                         "directory of them)")
  changed = [f"--{name}" for name in ("learning_rates", "seeds", "devices_per_run")
             if f[name].present]
  changed += [f"--config.{path}" for path in given_overrides(f)]
  if changed:
    raise app.UsageError(f"{', '.join(changed)}: not used by --suite={f.suite} (zero-shot: "
                         "nothing is fine-tuned)")
  return beir.run(f.checkpoint, data_dir, f.output_dir, f.tasks)


def run_from_flags(argv: Sequence[str]) -> dict[str, Any] | None:
  """The launcher's main: the flags checked (a bad one: app.UsageError naming it), then
  `run_suite`. `argv` starts a device group's process (the launcher and its arguments)."""
  f = flags.FLAGS
  from bert_jax.weights import files  # pylint: disable=g-import-not-at-top
  try:
    files.check_output_dir(f.output_dir or "", "--output_dir")
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  if f.suite in ("beir", "local_retrieval"):
    return _run_beir(f)
  if f.data_dir:
    raise app.UsageError(f"--data_dir is for --suite=beir, not --suite={f.suite}")
  try:
    options = parse_options(f.checkpoint, f.suite, f.tasks, f.learning_rates, f.seeds,
                            f.output_dir, f.devices_per_run, f.run_group)
    overrides = given_overrides(f)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  return run_suite(options, f.config, overrides, argv)
