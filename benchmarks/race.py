"""Pretraining variants raced side by side on the built-in corpus: the machinery of
benchmarks/packing.py and benchmarks/recipes.py.

A `Variant` is one pretraining config with its prepared data (the built-in corpus, cached
under a workdir), task, compiled program, state and iterator, in this process on one device.
`race` trains the variants in alternating slices of wall-clock time, so that the machine's
load hits all alike, and evaluates each on the same held-out batches at its checkpoints
(evaluation time is not counted as training time). `plot` draws the learning curves.
"""

import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
sys.path.insert(0, REPO)


class Variant:
  """One config: its dataset (prepared on first use), task, compiled program, state, data."""

  def __init__(self, name: str, config, workdir: str):
    import jax
    import flax.linen as nn
    from bert_jax import config_checks, train
    from bert_jax.training import programs, sharding
    from bert_jax.data import builtin, pipeline
    from bert_jax.models.model import BertConfig
    from bert_jax.training.settings import TrainSettings
    config_checks.check_pretraining(config)
    self.name, self.config = name, config
    prepared = builtin.ensure_builtin(workdir, builtin.BuiltinSettings.from_config(config))
    self.dataset_dir, self.meta = pipeline.resolve_dataset(
        pipeline.DataSpec.from_config(config), workdir, prepared)
    self.task = train.pretraining_task(config, BertConfig.from_config(config.model), self.meta)
    self.mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    self.rules = sharding.logical_rules(config.mesh)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      self.program = programs.make_program(TrainSettings.from_config(config), self.task,
                                           self.mesh)
    self.key = jax.random.fold_in(jax.random.key(config.seed), 2)
    self.reset()

  def reset(self) -> None:
    """A fresh start: initial params, the data from its first batch, no time spent."""
    import jax
    from bert_jax.data import pipeline
    with jax.set_mesh(self.mesh):
      self.state = self.program.init(jax.random.key(self.config.seed))
    self.iterator = pipeline.make_train_iterator(
        self.dataset_dir, global_batch_size=self.config.train.batch_size, seed=self.config.seed,
        process_index=0, process_count=1)
    self.train_seconds, self.steps, self.curve = 0.0, 0, []

  @property
  def num_params(self) -> int:
    import jax
    return sum(x.size for x in jax.tree.leaves(self.state.params))

  def run(self, seconds: float, max_steps: int | None = None) -> tuple[int, int, float]:
    """Steps for about `seconds` (at most `max_steps`) -> (steps, real tokens, seconds)."""
    import jax
    from bert_jax.training import sharding
    steps, real, start, previous = 0, 0, time.perf_counter(), None
    with jax.set_mesh(self.mesh):
      while time.perf_counter() - start < seconds and (max_steps is None or steps < max_steps):
        local = next(self.iterator)
        real += int((local["segment_ids"] > 0).sum())
        batch = sharding.global_batch_from_local(local, self.mesh)
        self.state, metrics = self.program.train_step(self.state, batch, self.key)
        steps += 1
        if previous is not None:  # One step in flight: input overlaps compute, and the
          jax.block_until_ready(previous)  # clock measures finished steps.
        previous = metrics["loss"]
      if previous is not None:
        jax.block_until_ready(previous)
    elapsed = time.perf_counter() - start
    self.steps += steps
    self.train_seconds += elapsed
    return steps, real, elapsed

  def save(self, directory: str) -> str:
    """Writes the params as a bert_jax pretrained directory (config.init_from takes it), with
    the dataset's vocabulary; an RTD variant's discriminator."""
    import jax
    import numpy as np
    from bert_jax.models import rtd
    from bert_jax.weights import bert_jax_dir
    from bert_jax.weights.layout import unpad_vocab
    params = jax.tree.map(np.asarray, self.state.params)
    if getattr(self.task, "rtd", None) is not None:  # What fine-tuning takes from an RTD run.
      params = rtd.discriminator_params(params, self.task.rtd.embedding_sharing)
    config, params = unpad_vocab(self.task.model_config, params)
    return bert_jax_dir.save_pretrained(directory, params, config,
                                        os.path.join(self.dataset_dir, "vocab"),
                                        note=f"benchmarks: {self.name} after {self.steps} steps",
                                        overwrite=True)

  def step_seconds(self, seconds: float) -> float:
    """Seconds per training step measured over about `seconds` (a warm, compiled step; the
    variant's steps and clock are left as they were)."""
    steps, clock = self.steps, self.train_seconds
    self.run(1.0)  # Warm: the first step after a pause pays for caches.
    done, _, elapsed = self.run(seconds)
    self.steps, self.train_seconds = steps, clock
    return elapsed / max(done, 1)

  def evaluate(self, eval_batches) -> dict:
    """Held-out metrics of the variant's params on `eval_batches()` (the same rows for all),
    masked by the variant's evaluation policy."""
    import jax
    import flax.linen as nn
    from bert_jax.training import evaluation
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      outputs, sums = evaluation.evaluate(self.state.params, self.program.eval_step,
                                          eval_batches(), self.mesh, self.config.seed,
                                          keep_outputs=False)
    return self.task.scores(outputs, sums, None).metrics

  def checkpoint(self, eval_batches) -> dict:
    """Evaluates now and records the point (minutes of training, steps, metrics)."""
    report = self.evaluate(eval_batches)
    point = {"minutes": self.train_seconds / 60, "steps": self.steps, **report}
    self.curve.append(point)
    print(f"{self.name}: {point['minutes']:.1f} min, {self.steps} steps, mlm_acc "
          f"{report['mlm_accuracy']:.4f}", flush=True)
    return point


def race(variants, eval_batches, slice_seconds: float, *, budget_seconds: float | None = None,
         every_seconds: float | None = None, every_steps: int | None = None) -> list[dict]:
  """Alternating slices of training. Each variant stops at its budget (`budget_seconds` of its
  own training time) or, without one, at its config's num_train_steps; it is evaluated at
  every multiple of `every_seconds` of its training time or of `every_steps` steps, and at the
  end. Returns one curve per variant."""
  for variant in variants:
    variant.reset()
    variant.checkpoint(eval_batches)

  def done(v) -> bool:
    if budget_seconds is not None:
      return v.train_seconds >= budget_seconds
    return v.steps >= v.config.train.num_train_steps

  while not all(done(v) for v in variants):
    for variant in variants:
      if done(variant):
        continue
      if every_seconds is not None:
        next_eval = every_seconds * len(variant.curve)
        left = min(next_eval, budget_seconds or next_eval) - variant.train_seconds
        variant.run(min(slice_seconds, left))
        due = variant.train_seconds >= next_eval - 1e-6
      else:
        next_eval = min(every_steps * len(variant.curve), variant.config.train.num_train_steps)
        variant.run(slice_seconds, max_steps=next_eval - variant.steps)
        due = variant.steps >= next_eval
      if due or done(variant):
        variant.checkpoint(eval_batches)
  return [{"kind": "curve", "variant": v.name, "points": v.curve} for v in variants]


def quiet_step_seconds(variants, seconds: float, rounds: int) -> dict[str, float]:
  """Each variant's seconds per step, measured `rounds` times in turn for `seconds` each (the
  median): run when nothing else loads the machine, to turn a raced curve's steps into
  minutes that other work on the machine during the race cannot have inflated."""
  import statistics
  times = {v.name: [] for v in variants}
  for _ in range(rounds):
    for variant in variants:
      times[variant.name].append(variant.step_seconds(seconds))
  return {name: statistics.median(values) for name, values in times.items()}


def retimed(curves: list[dict], step_seconds: dict[str, float]) -> list[dict]:
  """Curves with minutes = steps x the variant's quiet step time (the raced clock kept as
  minutes_raced): a step's cost does not change during training (the same shapes and program),
  so the quiet time is the time each point would have taken alone on the machine."""
  out = []
  for curve in curves:
    seconds = step_seconds[curve["variant"]]
    points = [{**p, "minutes_raced": p.get("minutes_raced", p["minutes"]),
               "minutes": p["steps"] * seconds / 60} for p in curve["points"]]
    out.append({**curve, "points": points, "step_seconds": seconds})
  return out


def check_plotting() -> None:
  """Stops in one line, before any racing, when `plot` could not draw at the end."""
  try:
    import matplotlib  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise SystemExit("error: the race's plot needs matplotlib, which is not installed: "
                     "<venv>/bin/pip install -r requirements-bench.txt") from None


def plot(curves, path: str, title: str) -> None:
  """Held-out MLM accuracy against training minutes, one line per curve (matplotlib:
  requirements-bench.txt; `check_plotting` first)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, axis = plt.subplots(figsize=(7, 4.5))
  for curve in curves:
    axis.plot([p["minutes"] for p in curve["points"]],
              [p["mlm_accuracy"] for p in curve["points"]], marker="o", markersize=3,
              label=curve["variant"])
  axis.set_xlabel("training time (minutes, evaluation excluded)")
  axis.set_ylabel("held-out MLM accuracy")
  axis.set_title(title)
  axis.grid(alpha=0.3)
  axis.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
