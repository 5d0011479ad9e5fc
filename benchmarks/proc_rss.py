"""Resident memory of a process tree, read from /proc (benchmarks/data.py, prepare_shuffle.py,
prepare_formats.py)."""

import os
import subprocess
import threading
import time


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


def run_with_peak_rss(command: list[str], cwd: str, every: float = 0.05
                      ) -> tuple[subprocess.CompletedProcess, float, int]:
  """Runs `command` -> (its completed process, text output; wall seconds; the peak of the
  summed VmRSS of it and its descendants, sampled every `every` s)."""
  start = time.time()
  process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=cwd)
  peak = [0]

  def sample() -> None:
    while process.poll() is None:
      peak[0] = max(peak[0], tree_rss_bytes(process.pid)[0])
      time.sleep(every)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  stdout, stderr = process.communicate()
  seconds = time.time() - start
  sampler.join()
  return (subprocess.CompletedProcess(command, process.returncode, stdout, stderr), seconds,
          peak[0])
