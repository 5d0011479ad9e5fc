"""(A module) what every benchmark row records of where it came from: the checkout's commit and
the machine."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit(repo: str = REPO) -> str:
  """HEAD's short hash, "+dirty" when the tree has uncommitted changes to tracked files
  ("unknown" outside a git checkout)."""
  head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                        text=True).stdout.strip() or "unknown"
  dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                         capture_output=True, text=True).stdout.strip()
  return head + ("+dirty" if dirty else "")


def machine() -> str:
  """The CPU's model name and core count (ratios against PyTorch depend on the CPU)."""
  model = "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return f"{model}, {os.cpu_count()} cores"
