r"""The README's first command, measured: `launch/train.py --config=configs/tiny.py` from a fresh
workdir at several seeds and in several environments, and what each run learned.

Each run is `<python> launch/train.py --config=configs/tiny.py --workdir=<work_dir>/<env>_seed<s>
--config.seed=<s>`: the README's command (it prepares the built-in corpus into its workdir, then
trains 2,000 steps), with a seed and a workdir of its own, removed first. --envs names the
interpreters, e.g. a venv from requirements.txt alone and the test venv (requirements-test.txt
too, with torch, transformers, pytest, Beam): the built-in corpus is the same pinned selection in
both (bert_jax/data/builtin_selection.py), so they should prepare the same bytes and train alike.
--parallel runs that many at once (each process then gets fewer cores: compare wall times within
one invocation only).

For each run, from its workdir: the held-out MLM and NSP accuracy and MLM loss at --steps
(metrics.jsonl's validation records), the unigram baseline of its dataset
(benchmarks/unigram_baseline.py, run by the same interpreter: most frequent token, majority NSP
label), the corpus fingerprint builtin_dataset.json records, a hash of the prepared dataset's
files (bert_meta.json without its timing) and the wall time of the whole command (preparation
included). Each run appends a JSON line with the commit to --results; the table printed at the
end says whether every run reached --goal held-out MLM accuracy at the last step, and whether
the environments prepared identical datasets for each seed.

Run (a venv of the README's install first: `python3.11 -m venv <req-venv> && <req-venv>/bin/pip
install -e .`; the runs import this checkout whatever the venv has installed: PYTHONPATH):
  nice -n 10 .venv/bin/python benchmarks/quick_start.py \
      --envs=requirements=<req-venv>/bin/python,test=.venv/bin/python --seeds=0,1,2,3,4 \
      --parallel=2 --work_dir=/tmp/quick_start
  .venv/bin/python benchmarks/quick_start.py --table_only   # the last commit's rows again
  .venv/bin/python benchmarks/quick_start.py --table_only --commits=a47fd58,f3e8b82
"""

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from provenance import commit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "quick_start.jsonl")
COMMAND = ["launch/train.py", "--config=configs/tiny.py"]


def parse_envs(text: str) -> dict[str, str]:
  """"a=/venv/bin/python,b=..." -> {"a": "/venv/bin/python", ...}."""
  envs = {}
  for item in filter(None, text.split(",")):
    name, _, python = item.partition("=")
    if not name or not python or name in envs:
      raise SystemExit(f"--envs: {item!r} is not a new name=python")
    if not os.access(python, os.X_OK):
      raise SystemExit(f"--envs: {python} is not an executable interpreter")
    envs[name] = python
  return envs


def dataset_hash(dataset_dir: str) -> str:
  """A hash of every file of a prepared dataset (bert_meta.json without prepare_seconds)."""
  digest = hashlib.sha256()
  for directory, dirnames, filenames in os.walk(dataset_dir):
    dirnames.sort()
    for filename in sorted(filenames):
      path = os.path.join(directory, filename)
      with open(path, "rb") as f:
        content = f.read()
      if filename == "bert_meta.json":
        meta = json.loads(content)
        meta.pop("prepare_seconds", None)
        content = json.dumps(meta, sort_keys=True).encode()
      digest.update(os.path.relpath(path, dataset_dir).encode() + b"\0" + content + b"\0")
  return digest.hexdigest()[:16]


def read_run(workdir: str, steps: list[int]) -> dict:
  """The validation records at `steps`, the corpus record and the dataset of a finished run."""
  records = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      records.append(json.loads(line))
  validation = {r["step"]: r for r in records if r.get("split") == "validation"}
  train = [r for r in records if r.get("split") == "train"]
  with open(os.path.join(workdir, "builtin_dataset.json")) as f:
    builtin = json.load(f)
  rates = sorted(r["real_tokens_per_sec"] for r in train)
  return {
      "validation": {str(s): {k: validation[s][k] for k in ("mlm_accuracy", "nsp_accuracy",
                                                            "mlm_loss")}
                     for s in steps if s in validation},
      "train_loss": {str(r["step"]): r["loss"] for r in train if r["step"] in steps},
      "real_tokens_per_sec_median": rates[len(rates) // 2] if rates else None,
      "corpus": builtin.get("corpus"),
      "dataset_dir": os.path.join(workdir, "data", builtin["dataset"]),
  }


def baseline(python: str, dataset_dir: str) -> dict:
  out = subprocess.run([python, os.path.join(ROOT, "benchmarks", "unigram_baseline.py"),
                        f"--dataset_dir={dataset_dir}"], cwd=ROOT, capture_output=True,
                       text=True, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def start(python: str, workdir: str, seed: int) -> subprocess.Popen:
  shutil.rmtree(workdir, ignore_errors=True)
  log = open(workdir + ".log", "w")
  return subprocess.Popen([python, *COMMAND, f"--workdir={workdir}", f"--config.seed={seed}"],
                          cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          env={**os.environ, "PYTHONPATH": ROOT})


def finish(env: str, python: str, seed: int, workdir: str, seconds: float, returncode: int,
           args) -> dict:
  row = {"commit": args.commit, "env": env, "python": python, "seed": seed,
         "command": " ".join(["python", *COMMAND, f"--config.seed={seed}"]),
         "returncode": returncode, "wall_s": round(seconds, 1), "parallel": args.parallel,
         "load_avg_1min": round(os.getloadavg()[0], 2), "time": time.time()}
  if returncode == 0:
    run = read_run(workdir, args.steps)
    row.update(run, dataset_hash=dataset_hash(run["dataset_dir"]),
               unigram=baseline(python, run["dataset_dir"]))
    del row["dataset_dir"]
  with open(args.results, "a") as f:
    f.write(json.dumps(row) + "\n")
  if not args.keep and returncode == 0:
    shutil.rmtree(workdir, ignore_errors=True)
  return row


def run_all(args) -> None:
  os.makedirs(args.work_dir, exist_ok=True)
  queue = collections.deque((env, python, seed) for seed in args.seeds
                            for env, python in args.envs.items())
  running = {}
  while queue or running:
    while queue and len(running) < args.parallel:
      env, python, seed = queue.popleft()
      workdir = os.path.join(args.work_dir, f"{env}_seed{seed}")
      running[start(python, workdir, seed)] = (env, python, seed, workdir, time.time())
      print(f"started {env} seed {seed}: {workdir}", flush=True)
    time.sleep(5)
    for process in [p for p in running if p.poll() is not None]:
      env, python, seed, workdir, began = running.pop(process)
      row = finish(env, python, seed, workdir, time.time() - began, process.returncode, args)
      print(f"finished {env} seed {seed}: exit {process.returncode}, "
            f"{row['wall_s'] / 60:.1f} min", flush=True)


def table(rows: list[dict], steps: list[int], goal: float) -> str:
  head = ("| env | seed | commit | " + " | ".join(f"MLM @{s}" for s in steps)
          + f" | NSP @{steps[-1]} | unigram MLM / NSP | minutes | corpus fingerprint |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  short = []
  for row in sorted(rows, key=lambda r: (r["env"], r["seed"])):
    if row["returncode"]:
      lines.append(f"| {row['env']} | {row['seed']} | {row['commit']} | failed (exit "
                   f"{row['returncode']}) |")
      short.append(row)
      continue
    val = row["validation"]
    accuracy = [val.get(str(s), {}).get("mlm_accuracy") for s in steps]
    cells = [f"{a:.1%}" if a is not None else "-" for a in accuracy]
    nsp = val.get(str(steps[-1]), {}).get("nsp_accuracy")
    base = row["unigram"]
    lines.append(
        f"| {row['env']} | {row['seed']} | {row['commit']} | " + " | ".join(cells)
        + f" | {nsp:.1%} | {base['mlm_unigram_accuracy']:.1%} / "
        f"{base['nsp_majority_accuracy']:.1%} | {row['wall_s'] / 60:.1f} | "
        f"{row['corpus']['fingerprint']} |")
    if accuracy[-1] is None or accuracy[-1] < goal:
      short.append(row)
  by_seed = collections.defaultdict(set)
  for row in rows:
    if not row["returncode"]:
      by_seed[row["seed"]].add(row["dataset_hash"])
  same = [seed for seed, hashes in by_seed.items() if len(hashes) == 1]
  lines.append("")
  lines.append(f"{len(rows) - len(short)} of {len(rows)} runs reach {goal:.0%} held-out MLM "
               f"accuracy at step {steps[-1]}"
               + (": below it " + ", ".join(f"{r['env']} seed {r['seed']}" for r in short)
                  if short else "."))
  lines.append(f"Identical prepared datasets across environments for {len(same)} of "
               f"{len(by_seed)} seeds.")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--envs", default=f"current={sys.executable}",
                      help="name=python pairs, comma-separated: the interpreters to run it with")
  parser.add_argument("--seeds", default="0,1,2,3,4", help="config.seed of each run")
  parser.add_argument("--steps", default="500,1000,1500,2000",
                      help="the validation steps to report (configs/tiny.py evaluates every 500)")
  parser.add_argument("--parallel", type=int, default=1, help="runs at once")
  parser.add_argument("--work_dir", default="/tmp/bert_jax_quick_start",
                      help="the runs' workdirs and logs go here")
  parser.add_argument("--keep", action="store_true", help="keep finished workdirs")
  parser.add_argument("--goal", type=float, default=0.12,
                      help="held-out MLM accuracy every run should reach at the last step")
  parser.add_argument("--results", default=RESULTS)
  parser.add_argument("--table_only", action="store_true",
                      help="print the table of the results' last commit, run nothing")
  parser.add_argument("--commits", default="",
                      help="with --table_only: these commits' runs (comma-separated; the "
                           "latest run of each env and seed among them) instead of the last's")
  args = parser.parse_args()
  args.steps = [int(s) for s in args.steps.split(",")]
  if args.table_only:
    with open(args.results) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    commits = args.commits.split(",") if args.commits else [rows[-1]["commit"]]
    latest = {(r["env"], r["seed"]): r for r in rows if r["commit"] in commits}
    print(f"commits {', '.join(commits)}")
    print(table(list(latest.values()), args.steps, args.goal))
    return
  args.envs = parse_envs(args.envs)
  args.seeds = [int(s) for s in args.seeds.split(",")]
  args.commit = commit()
  began = time.time()
  run_all(args)
  with open(args.results) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  rows = [r for r in rows if r["commit"] == args.commit and r["time"] >= began]
  print(f"commit {args.commit}, {len(rows)} runs in {(time.time() - began) / 60:.1f} min, "
        f"{args.parallel} at a time")
  print(table(rows, args.steps, args.goal))


if __name__ == "__main__":
  main()
