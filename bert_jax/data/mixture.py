"""Weighted mixtures of prepared datasets (`config.data.source="mixture"`), as modern encoders
pretrain (ModernBERT, mmBERT, EuroBERT): each row of each global batch is drawn from one source.

The config (configs/base.py, data section):
- `data.mixture="DIR_A:0.7,DIR_B:0.3"`: the sources and their weights (normalised). Without
  weights (`"DIR_A,DIR_B"`) each source weighs its train rows ^ `data.mixture_temperature`
  (mmBERT's and XLM-R's temperature sampling: 1 is the plain concatenation's proportions, lower
  flattens them).
- `data.mixture_phases="0.9:0.5,0.5"`: other weights from a fraction of
  `train.num_train_steps` on (annealing), `;` between phases.

The sources share the vocabulary (the same files), the row format (objective, length, examples
per row); a directory's name names it (`mixture_rows`, the evaluation's per-source lines).

The draw: global batch t's source per row is a categorical draw with the weights of step t's
phase, from a generator seeded by (seed, t) alone; source s's k-th row drawn is the k-th of its
own endless order (its rows shuffled by the seed, reshuffled every epoch: `pipeline`'s order).
So the whole sequence is a function of the seed, and the iterator's state is the step and the
rows drawn from each source: a resume continues it exactly. Host p of P reads rows
[p * B/P, (p+1) * B/P) of each global batch, as `pipeline.make_train_iterator`'s hosts do.
"""

import dataclasses
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from bert_jax.data import batching
from bert_jax.data import blocks
from bert_jax.data import pipeline
from bert_jax.data import prepare
from bert_jax.data import tfds_builder
from bert_jax.runtime import storage


@dataclasses.dataclass(frozen=True)
class MixtureSpec:
  """The sources and the weights of each phase, as the config gives them (unchecked)."""

  dirs: tuple[str, ...]
  weights: tuple[float, ...] | None  # None: from the sizes and the temperature.
  temperature: float
  phases: tuple[tuple[float, tuple[float, ...]], ...]  # (fraction of the run, weights).

  @classmethod
  def parse(cls, mixture: str, temperature: float = 1.0, phases: str = "") -> "MixtureSpec":
    """`data.mixture`, `data.mixture_temperature`, `data.mixture_phases`; raises on syntax."""
    entries = [e.strip() for e in mixture.split(",") if e.strip()]
    if len(entries) < 2:
      raise ValueError(f"config.data.mixture={mixture!r} names {len(entries)} dataset(s): give "
                       "two or more, as 'DIR_A:0.7,DIR_B:0.3' (or 'DIR_A,DIR_B' to weigh by "
                       "size)")
    dirs, weights = [], []
    for entry in entries:
      head, _, tail = entry.rpartition(":")
      weight = _number(tail) if head else None
      dirs.append(head if weight is not None else entry)
      weights.append(weight)
    given = [w is not None for w in weights]
    if any(given) and not all(given):
      raise ValueError(f"config.data.mixture={mixture!r}: give every dataset a weight, or none "
                       "(then each weighs its size ^ config.data.mixture_temperature)")
    if all(given):
      _check_weights(weights, f"config.data.mixture={mixture!r}")
      if temperature != 1.0:
        raise ValueError(f"config.data.mixture_temperature={temperature} applies to a mixture "
                         "without weights (weights ∝ size ^ temperature): drop it or the "
                         "weights")
    if not temperature > 0:
      raise ValueError(f"config.data.mixture_temperature={temperature} must be > 0")
    names = [name_of(d) for d in dirs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
      raise ValueError(f"config.data.mixture: two datasets named {twice[0]!r}; a directory's "
                       "name names its source (in mixture_rows and per-source evaluation)")
    parsed = []
    for phase in (p.strip() for p in phases.split(";") if p.strip()):
      start, _, values = phase.partition(":")
      fraction = _number(start)
      phase_weights = [_number(v) for v in values.split(",")]
      where = f"config.data.mixture_phases phase {phase!r}"
      if fraction is None or not 0 < fraction < 1 or None in phase_weights:
        raise ValueError(f"{where}: write FRACTION:W1,W2,... with 0 < FRACTION < 1, as "
                         "'0.9:0.5,0.5'")
      if len(phase_weights) != len(dirs):
        raise ValueError(f"{where} gives {len(phase_weights)} weights for {len(dirs)} datasets")
      _check_weights(phase_weights, where)
      if parsed and fraction <= parsed[-1][0]:
        raise ValueError(f"{where} starts at or before the phase before it: give phases in "
                         "increasing order")
      parsed.append((fraction, tuple(phase_weights)))
    return cls(tuple(dirs), tuple(weights) if all(given) else None, float(temperature),
               tuple(parsed))


def _number(text: str) -> float | None:
  try:
    value = float(text)
  except ValueError:
    return None
  return value if np.isfinite(value) else None


def _check_weights(weights: Sequence[float], where: str) -> None:
  if any(w < 0 for w in weights) or not sum(weights) > 0:
    raise ValueError(f"{where}: weights must be >= 0 with a positive sum")


def name_of(dataset_dir: str) -> str:
  """A source's name: its directory's."""
  return os.path.basename(os.path.normpath(dataset_dir))


def vocab_digest(dataset_dir: str, meta: dict) -> str:
  """A hash of the files of the dataset's vocabulary (sources must share one)."""
  vocab = prepare.vocab_dir(dataset_dir, meta)
  digest = hashlib.sha256()
  for name in sorted(storage.listdir(vocab)):
    digest.update(name.encode() + b"\0" + storage.read_bytes(storage.join(vocab, name)))
  return digest.hexdigest()[:16]


_ROW_FORMAT = ("objective", "max_seq_length", "max_examples_per_row")


def check_sources(dirs: Sequence[str], metas: Sequence[dict]) -> None:
  """Refuses sources whose vocabulary or row format differ from the first's, naming the one."""
  first_digest = vocab_digest(dirs[0], metas[0])
  for directory, meta in zip(dirs[1:], metas[1:]):
    if vocab_digest(directory, meta) != first_digest:
      raise ValueError(f"config.data.mixture: {directory} was prepared with another vocabulary "
                       f"than {dirs[0]}; the sources of a mixture share one (prepare with the "
                       f"same --vocab={prepare.vocab_dir(dirs[0], metas[0])})")
    for field in _ROW_FORMAT:
      if meta[field] != metas[0][field]:
        raise ValueError(f"config.data.mixture: {directory} has {field} {meta[field]!r} where "
                         f"{dirs[0]} has {metas[0][field]!r}; the sources of a mixture share "
                         "their row format (prepare them with the same settings)")


def phase_weights(spec: MixtureSpec, rows: Sequence[int], num_train_steps: int
                  ) -> tuple[tuple[int, np.ndarray], ...]:
  """(first step, normalised weights [S]) of each phase: the first from step 0."""
  base = (np.asarray(spec.weights, np.float64) if spec.weights is not None
          else np.asarray(rows, np.float64) ** spec.temperature)
  phases = [(0, base)] + [(int(round(f * num_train_steps)), np.asarray(w, np.float64))
                          for f, w in spec.phases]
  return tuple((step, w / w.sum()) for step, w in phases)


class MixtureIterator:
  """Endless per-host train batches of a mixture (module docstring); `get_state()` /
  `set_state()` as grain's iterators (a JSON-able dict: the step, the rows drawn from each
  source), and `report` of a state: what the train record carries (`mixture_rows`)."""

  def __init__(self, dirs: Sequence[str], phases: Sequence[tuple[int, np.ndarray]], *,
               global_batch_size: int, seed: int, process_index: int, process_count: int,
               log: Callable[[str], None] = print):
    self._dirs, self._phases, self._seed, self._log = list(dirs), phases, seed, log
    self.names = [name_of(d) for d in dirs]
    self._sources = [pipeline.split_source(d, blocks.TRAIN) for d in dirs]
    # Each source's endless order: its rows shuffled, every epoch anew (pipeline's order).
    self._orders = [grain.MapDataset.range(len(s)).shuffle(seed=seed + 7919 * (i + 1))
                    .repeat(None) for i, s in enumerate(self._sources)]
    self._batch = global_batch_size
    rows = batching.per_host_batch_size(global_batch_size, process_count)
    self._host = slice(process_index * rows, (process_index + 1) * rows)
    self._step, self._drawn = 0, [0] * len(dirs)

  def weights(self, step: int) -> np.ndarray:
    return next(w for start, w in reversed(self._phases) if start <= step)

  def __iter__(self):
    return self

  def __next__(self) -> pipeline.Batch:
    rng = np.random.default_rng([self._seed, 0x6D6978, self._step])
    choice = rng.choice(len(self._sources), size=self._batch, p=self.weights(self._step))  # [B]
    picks = []  # (source, row) of each global row.
    for s in choice.tolist():
      k = self._drawn[s]
      if k and k % len(self._sources[s]) == 0:
        self._log(f"mixture: {self.names[s]} starts epoch {k // len(self._sources[s]) + 1} "
                  f"(all {len(self._sources[s])} of its rows drawn; reshuffled)")
      picks.append((s, self._orders[s][k]))
      self._drawn[s] = k + 1
    self._step += 1
    mine = picks[self._host]
    parts = {}
    for s in sorted({s for s, _ in mine}):
      positions = [i for i, (t, _) in enumerate(mine) if t == s]
      batch = pipeline.read_rows(self._sources[s], [mine[i][1] for i in positions],
                                 self._dirs[s], blocks.TRAIN)
      parts[s] = (positions, batch)
    order = np.argsort(np.concatenate([positions for positions, _ in parts.values()]),
                       kind="stable")
    return {name: np.concatenate([b[name] for _, b in parts.values()])[order]
            for name in next(iter(parts.values()))[1]}

  def get_state(self) -> dict[str, Any]:
    return {"step": self._step, "mixture_rows": dict(zip(self.names, self._drawn))}

  def set_state(self, state: dict[str, Any]) -> None:
    if sorted(state.get("mixture_rows", {})) != sorted(self.names):
      raise ValueError(f"The checkpoint's data position is not one of this mixture (its "
                       f"sources: {', '.join(sorted(state.get('mixture_rows', {}))) or 'none'}; "
                       f"this run's: {', '.join(self.names)}): resume with the same "
                       "config.data.mixture")
    self._step = int(state["step"])
    self._drawn = [int(state["mixture_rows"][n]) for n in self.names]

  @staticmethod
  def report(state: dict[str, Any]) -> dict[str, Any]:
    """What a train record carries of the state after its step: the rows drawn so far from each
    source (all processes', global)."""
    return {"mixture_rows": state["mixture_rows"]}


def sizes(dirs: Sequence[str]) -> list[int]:
  """Each source's train rows."""
  return [tfds_builder.num_rows(d, blocks.TRAIN) for d in dirs]


def resolve(spec: MixtureSpec, data: pipeline.DataSpec) -> tuple[list[str], list[dict]]:
  """(dataset dirs, their bert_meta.json) of the sources, each checked as a prepared dataset
  against the model (`pipeline.resolve_dataset`) and all against the first (`check_sources`).
  Only reads."""
  resolved = []
  for directory in spec.dirs:
    try:
      resolved.append(pipeline.resolve_dataset(
          dataclasses.replace(data, source="prepared", dataset_dir=directory), workdir=""))
    except ValueError as e:
      raise ValueError(f"config.data.mixture: {directory}: {e}") from None
  dirs, metas = [d for d, _ in resolved], [m for _, m in resolved]
  check_sources(dirs, metas)
  return dirs, metas
