"""(A module) what every benchmark row records of where it came from: the checkout's commit."""

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
