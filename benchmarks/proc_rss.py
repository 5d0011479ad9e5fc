"""Resident memory of a process tree, read from /proc (benchmarks/data.py, prepare_shuffle.py)."""

import os


def tree_rss_bytes(root_pid: int) -> tuple[int, int]:
  """(sum, max) of VmRSS over `root_pid` and its descendants."""
  children: dict[int, list[int]] = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(ppid, []).append(int(name))
  total, largest, stack = 0, 0, [root_pid]
  while stack:
    pid = stack.pop()
    stack.extend(children.get(pid, []))
    try:
      with open(f"/proc/{pid}/status") as f:
        for line in f:
          if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
            total += rss
            largest = max(largest, rss)
    except OSError:
      pass
  return total, largest
