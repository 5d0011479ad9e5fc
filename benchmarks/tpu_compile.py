r"""What fits where: every shipped pretraining config (and Base fine-tuning) compiled for real TPU
slices by the TPU compiler from this CPU host (`launch/train.py --compile_only --topology=...`,
one subprocess per compile: the user's own command), with

- the report at the config's own batch (memory per chip, fits, compile time, collective bytes,
  the estimated step-time bound and MFU ceiling);
- the largest per-chip train batch that fits (a search, compiling the train step alone
  (`--compile_steps=train`: the eval step at the same batch needs less, and the init step does
  not grow with the batch; `train_step_fits` also reads an earlier search's compiles of all
  three steps). Memory is close to linear in the batch, so the
  own-batch report (its state against the rest) or two compiles give a line, its crossing of the
  chip's HBM a candidate, and compiles at and one step above the candidate confirm it; the step
  is 1/8 of the candidate's power of two, so the answer is the largest that fits to within that
  step; on a second slice of the same chip the first slice's answer is the first candidate);
- `--variants`: the mesh layouts (data / fsdp / tensor) and bf16 compute that change the answer,
  on the first target; `--multislice`: one config on two slices over DCN.

Rows go to --output as JSON lines, one per compile, and a second start skips the compiles it
already holds (this takes hours on 2 cores). `--table` prints docs/scale_out.md's tables from
the rows. Compile-only: nothing here is a measured speed (docs/tpu.md, "estimates").

Run:
  .venv/bin/pip install -e '.[tpu]'
  .venv/bin/python benchmarks/tpu_compile.py --output=benchmarks/results/tpu_compile.jsonl
  .venv/bin/python benchmarks/tpu_compile.py --variants --multislice --examples \
      --output=benchmarks/results/tpu_compile.jsonl
  .venv/bin/python benchmarks/tpu_compile.py --table --output=benchmarks/results/tpu_compile.jsonl
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import commit, machine  # noqa: E402  (benchmarks/ is this script's directory)

CONFIGS = ("base", "base_phase2", "large", "modern_base", "modern_large", "electra_base",
           "diffusion_base", "finetune_classification")
TARGETS = ("v5e:4x4", "v5p:2x2x1", "v6e:2x2", "v4:2x2x1", "v5e:16x16")
# Fine-tuning a Base encoder from scratch: its vocabulary's size stands for the checkpoint.
EXTRA = {"finetune_classification": ("--config.model.vocab_size=30522",
                                     "--config.data.labels=neg,pos")}
# (name, overrides) of the layouts and dtypes that change what fits, tried on the first target.
VARIANTS = (
    ("fsdp", ("--config.mesh.data=1", "--config.mesh.fsdp=-1")),
    ("fsdp_tensor2", ("--config.mesh.data=1", "--config.mesh.fsdp=-1", "--config.mesh.tensor=2")),
    ("bf16", ("--config.model.dtype=bfloat16",)),
    ("bf16_fsdp", ("--config.model.dtype=bfloat16", "--config.mesh.data=1",
                   "--config.mesh.fsdp=-1")),
)
MULTISLICE = ("base", "v5e:4x4", 2)  # Config, slice, slices: the data axis across them.
# The slices and batches the docs' own examples name: launch/tpu_pod.sh (a v4-32 is v4:2x2x4),
# docs/tpu.md (a v5e-16), and the ModernBERT recipe's 4608 x 1024 on a pod in two microbatches.
EXAMPLES = (("base", "v4:2x2x4", ("--config.train.batch_size=1024",)),
            ("base", "v5e:4x4", ("--config.train.batch_size=1024",)),
            ("modern_base", "v5e:16x16", ("--config.train.grad_accum_steps=2",)))
TIMEOUT = 3600


def launcher(config: str) -> str:
  return "launch/finetune.py" if config.startswith("finetune") else "launch/train.py"


def compile_once(config: str, topology: str, overrides: tuple[str, ...], slices: int = 1) -> dict:
  """One `--compile_only` run: its JSON report (also when it does not fit), or the error."""
  command = [sys.executable, launcher(config), f"--config=configs/{config}.py", "--compile_only",
             f"--topology={topology}", "--config.data.source=synthetic",
             *EXTRA.get(config, ()), *overrides]
  if config.startswith("finetune"):
    command.remove("--config.data.source=synthetic")
  if slices > 1:
    command.append(f"--num_slices={slices}")
  start = time.time()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  row = {"seconds": round(time.time() - start, 1), "returncode": done.returncode}
  if "{" in done.stdout:
    row["report"] = json.loads(done.stdout[done.stdout.index("{"):])
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  if errors:
    row["error"] = errors[-1]
  elif done.returncode:
    row["error"] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
  return row


class Rows:
  """The JSON lines of --output, keyed by what was compiled; a compile already there is read,
  not run again."""

  def __init__(self, path: str):
    self.path, self.rows = path, []
    if os.path.exists(path):
      with open(path) as f:
        self.rows = [json.loads(line) for line in f if line.strip()]

  @staticmethod
  def key(config, topology, overrides, slices) -> str:
    return json.dumps([config, topology, list(overrides), slices])

  def get(self, config: str, topology: str, overrides: tuple[str, ...], slices: int = 1,
          purpose: str = "") -> dict:
    key = self.key(config, topology, overrides, slices)
    for row in self.rows:
      if row["key"] == key:
        return row
    row = {"benchmark": "tpu_compile", "commit": commit(), "machine": machine(), "key": key,
           "config": config, "topology": topology, "overrides": list(overrides),
           "num_slices": slices, "purpose": purpose,
           **compile_once(config, topology, overrides, slices)}
    self.rows.append(row)
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
    report = row.get("report", {})
    print(f"{config} {topology} {' '.join(overrides)}: fits {report.get('fits')} "
          f"{report.get('per_device_gib')} GiB, {row['seconds']} s"
          + (f" ({row['error']})" if "error" in row and not report else ""), flush=True)
    return row


def _fits(row: dict) -> bool | None:
  return row.get("report", {}).get("fits")


def _gib(row: dict) -> float | None:
  return row.get("report", {}).get("per_device_gib")


def step_of(batch: int, divisor: int) -> int:
  """The search's resolution at a per-chip batch: 1/8 of its power of two (at least 1), a
  multiple of `divisor`."""
  return math.lcm(max(1, 2 ** (max(1, batch).bit_length() - 1 - 3)), divisor)


def first_guess(report: dict, per_chip: int) -> float:
  """The per-chip batch where memory would reach the chip's HBM, from one report: the state (the
  train step's arguments) stays, the rest grows with the batch. A refused compile gives its
  temporaries alone (a lower bound), so its guess is scaled down."""
  hbm, total = report["hbm_gib"], report["per_device_gib"]
  if not report["fits"] and "train_arguments_gib" not in report:
    return per_chip * hbm / total * 0.85
  state = report["train_arguments_gib"]
  return per_chip * (hbm - state) / max(total - state, 1e-9)


def search(rows: Rows, config: str, topology: str, base: tuple[str, ...], chips: int,
           divisor: int, start: int, own: dict | None = None, hint: int | None = None,
           max_compiles: int = 8) -> dict:
  """The largest per-chip batch b (train = eval batch = b x chips) that fits. Memory is close
  to linear in the batch: the first candidate comes from the own-batch report (`first_guess`)
  or from `hint` (the answer on another slice of the same chip), then the line through the two
  measured points nearest the chip's HBM; it ends when b fits and b + step does not (step:
  `step_of`). -> {"max_batch_per_chip", "step", "per_device_gib", "compiles"}."""
  measured: dict[int, dict] = {}

  def measure(per_chip: int) -> None:
    batch = per_chip * chips
    measured[per_chip] = rows.get(  # The train step alone (its eval step needs less).
        config, topology, (*base, f"--config.train.batch_size={batch}", "--compile_steps=train"),
        purpose="search")

  def on_grid(value: float) -> int:
    value = max(divisor, int(value))
    step = step_of(value, divisor)
    return max(divisor, value // step * step)

  if hint:
    measure(hint)
  else:
    guess = first_guess(own["report"], start) if own and own.get("report") else start
    measure(on_grid(guess))
  while len(measured) < max_compiles:
    if any(_fits(r) is None for r in measured.values()):
      bad = next(r for r in measured.values() if _fits(r) is None)
      return {"max_batch_per_chip": None, "error": bad.get("error"), "compiles": len(measured)}
    low = max((b for b, r in measured.items() if _fits(r)), default=None)
    high = min((b for b, r in measured.items() if not _fits(r)), default=None)
    if low is None and high == divisor:  # Not even the smallest batch fits.
      return {"max_batch_per_chip": 0, "step": divisor, "per_device_gib": None,
              "compiles": len(measured)}
    if low is not None and high is not None and high - low <= step_of(low, divisor):
      return {"max_batch_per_chip": low, "step": step_of(low, divisor),
              "per_device_gib": _gib(measured[low]), "compiles": len(measured)}
    if low is not None and high is None and len(measured) == 1:
      candidate = low + step_of(low, divisor)  # Confirm the guess: one step above.
    else:
      hbm = next(iter(measured.values()))["report"]["hbm_gib"]
      points = sorted(measured.items(), key=lambda item: abs(_gib(item[1]) - hbm))[:2]
      guess = None
      if len(points) == 2:
        (b1, r1), (b2, r2) = points
        slope = (_gib(r2) - _gib(r1)) / (b2 - b1)
        if slope > 0:
          guess = b1 + (hbm - _gib(r1)) / slope
      if guess is None:  # No line: from the nearest point's report.
        b1, r1 = points[0]
        guess = first_guess(r1["report"], b1)
      candidate = on_grid(guess)
      if low is not None:
        candidate = max(candidate, low + step_of(low, divisor))
      if high is not None and candidate >= high:
        candidate = on_grid(((low or 0) + high) / 2)
        if low is not None and candidate <= low:
          candidate = low + step_of(low, divisor)
    if candidate in measured or (low is not None and candidate <= low):
      break
    measure(candidate)
  low = max((b for b, r in measured.items() if _fits(r)), default=None)
  return {"max_batch_per_chip": low, "step": None, "compiles": len(measured),
          "per_device_gib": _gib(measured[low]) if low else None, "unconfirmed": True}


def pair(rows: Rows, config: str, topology: str, base: tuple[str, ...] = (),
         do_search: bool = True, hint: int | None = None) -> dict:
  """The report at the config's own batch and, with `do_search`, the largest batch."""
  own = rows.get(config, topology, base, purpose="own")
  report = own.get("report", {})
  summary = {"config": config, "topology": topology, "variant": base, "own": own}
  if not report or not do_search:
    return summary
  chips = report["devices"]  # A per-chip batch b is b x chips rows: whole for any layout.
  start = max(1, report["batch_size"] // chips)
  summary["search"] = search(rows, config, topology, base, chips, 1, start, own, hint)
  return summary


def train_step_fits(report: dict) -> bool | None:
  """Whether the train step fits, from a report of the train step alone or of all three steps
  (earlier searches): all three fit, or the train step's total is within the HBM, or the
  compiler refused the train step; None when a report does not say (init refused first)."""
  if report.get("fits"):
    return True
  if report.get("train_total_gib") is not None:
    return report["train_total_gib"] <= report["hbm_gib"]
  if report.get("refused_by_compiler", "").startswith("the train step"):
    return False
  return None


def table(rows: Rows) -> None:
  """docs/scale_out.md's tables from the rows."""
  def fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"
  def order(r):  # TARGETS then CONFIGS; variants, examples and multi-slice after.
    target = TARGETS.index(r["topology"]) if r["topology"] in TARGETS else len(TARGETS)
    config = CONFIGS.index(r["config"]) if r["config"] in CONFIGS else len(CONFIGS)
    return (bool(r["overrides"]) or r["num_slices"] > 1, target, config, r["overrides"])
  own = sorted((r for r in rows.rows if r["purpose"] == "own"), key=order)
  tried: dict[tuple, dict[int, bool]] = {}  # (config, topology, variant) -> {per chip: fits}
  for r in rows.rows:
    if r["purpose"] == "search" and "report" in r:
      base = [o for o in r["overrides"] if "batch_size" not in o and "compile_steps" not in o]
      key = (r["config"], r["topology"], json.dumps(base))
      fits = train_step_fits(r["report"])
      if fits is not None:
        tried.setdefault(key, {})[int(r["report"]["batch_per_chip"])] = fits

  def largest(key) -> str:
    """The search's answer: b when b fits and b + step does not; ">= b" before that is shown."""
    if key not in tried:
      return "not searched"
    fit = [b for b, ok in tried[key].items() if ok]
    if not fit:  # Every compile refused: 0 when 1 row was, else below the smallest tried.
      return ("0" if tried[key].get(1) is False
              else f"< {min(tried[key])} (search stopped)")
    best = max(fit)
    confirmed = any(not ok and best < b <= best + step_of(best, 1) for b, ok in tried[key].items())
    return str(best) if confirmed else f">= {best}"
  print("| config | target | mesh | batch (per chip) | GiB per chip / HBM | fits | largest batch "
        "per chip that fits | compile s | collective GB per step (ICI sent / chip) | "
        "est. step bound ms (by) | est. MFU ceiling |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for r in own:
    rep = r.get("report")
    variant = " ".join(o.replace("--config.", "") for o in r["overrides"])
    name = r["config"] + (f" ({variant})" if variant else "") + (
        f" x {r['num_slices']} slices" if r["num_slices"] > 1 else "")
    if not rep:
      print(f"| {name} | {r['topology']} | - | - | - | error: {r.get('error', '').removeprefix('error: ')[:110]} |"
            " - | - | - | - | - |")
      continue
    mesh = "x".join(str(rep["mesh"][a]) for a in ("data", "fsdp", "tensor"))
    best = largest((r["config"], r["topology"], json.dumps(r["overrides"])))
    total = sum(v["bytes"] for v in rep.get("collectives", {}).values()) / 1e9
    sent = (rep.get("estimated_ici_bytes_per_chip") or 0) / 1e9
    bound = rep.get("estimated_step_seconds_lower_bound")
    print(f"| {name} | {r['topology']} | {mesh} | {rep['batch_size']} ({rep['batch_per_chip']:g}) "
          f"| {fmt(rep['per_device_gib'])} / {fmt(rep['hbm_gib'])} | {rep['fits']} | "
          f"{best} | {fmt(rep.get('compile_seconds'), 0)} | "
          f"{fmt(total if rep.get('collectives') else None)} ({fmt(sent if bound else None)}) | "
          f"{fmt(bound * 1e3 if bound else None, 1)} ({rep.get('estimated_bound_by', '-')}) | "
          f"{fmt(rep.get('estimated_mfu_ceiling'))} |")


def earlier_answers(rows: Rows) -> dict[tuple[str, str], int]:
  """(config, chip family) -> the largest per-chip batch that an earlier search (all three
  steps compiled, no variant) found to fit: the first candidate of the train-step search."""
  answers: dict[tuple[str, str], int] = {}
  for r in rows.rows:
    base = [o for o in r["overrides"] if "batch_size" not in o]
    if r["purpose"] == "search" and not base and r.get("report", {}).get("fits"):
      key = (r["config"], r["topology"].split(":")[0])
      answers[key] = max(answers.get(key, 0), int(r["report"]["batch_per_chip"]))
  return answers


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default=",".join(CONFIGS))
  parser.add_argument("--targets", default=",".join(TARGETS))
  parser.add_argument("--no_search", action="store_true", help="The own batch only.")
  parser.add_argument("--variants", action="store_true",
                      help="VARIANTS of each config on the first target (with the search).")
  parser.add_argument("--multislice", action="store_true", help="The MULTISLICE row.")
  parser.add_argument("--examples", action="store_true", help="The EXAMPLES rows.")
  parser.add_argument("--table", action="store_true", help="Print the tables from --output.")
  parser.add_argument("--output", default=os.path.join(REPO, "benchmarks", "results",
                                                       "tpu_compile.jsonl"))
  args = parser.parse_args()
  rows = Rows(args.output)
  if args.table:
    table(rows)
    return
  configs, targets = args.configs.split(","), args.targets.split(",")
  # Data parallel on one chip kind: a per-chip batch costs the same memory on any slice, so an
  # answer on one slice is the first candidate on the next slice of that chip (then confirmed).
  answers = earlier_answers(rows)
  for topology in targets:
    for config in configs:
      found = pair(rows, config, topology, do_search=not args.no_search,
                   hint=answers.get((config, topology.split(":")[0])))
      best = found.get("search", {}).get("max_batch_per_chip")
      if best:
        answers[(config, topology.split(":")[0])] = best
  if args.variants:
    for config in configs:
      for _, overrides in VARIANTS:
        pair(rows, config, targets[0], overrides, do_search=not args.no_search)
  if args.multislice:
    config, topology, slices = MULTISLICE
    rows.get(config, topology, ("--config.mesh.dcn_data=2",), slices, purpose="own")
  if args.examples:
    for config, topology, overrides in EXAMPLES:
      rows.get(config, topology, overrides, purpose="own")


if __name__ == "__main__":
  main()
