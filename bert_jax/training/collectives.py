"""The collectives of a compiled program, read from its HLO text (`compiled.as_text()`): count and
bytes per step for each kind, and what each chip sends for them.

A collective inside a loop runs once per iteration: the encoder's layer scan all-reduces or
all-gathers each layer's weights in its body, so its ops count `trip count` times. The trip count
of a `while` is read from its condition, the form every `lax.scan` / `fori_loop` lowers to
(`counter < constant`, the counter from 0); a loop of another form counts once and is named in
`unknown_trip_counts`.

Bytes per op are the logical size of the data it reduces or moves (layout padding not counted):
the result for all-reduce, all-gather, all-to-all and collective-permute, the operand (the result
x group size) for reduce-scatter. What a chip sends is the ring algorithm's share of that: 2(n-1)/n
of it for an all-reduce over n chips, (n-1)/n for all-gather, reduce-scatter and all-to-all, all of
it for a collective-permute. A group whose chips lie in different slices crosses the data-center
network (DCN) instead of the chips' own links (ICI); so does what the compiler hands the
multi-slice runtime (a `send` tagged `_xla_megascale_transfer_type`), a collective among the
slices, each chip with its peer in every other slice.
"""

import dataclasses
import math
import re
from typing import Sequence

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
# "%name = <shape> <op>(" with the op one of the kinds, sync or the -start half of an async pair
# (where its groups are written; the -done half is not counted again).
_OP = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s(" + "|".join(KINDS)
                 + r")(-start)?\(")
# Across slices the TPU compiler hands a collective to the multi-slice (MegaScale) runtime as a
# host-transfer send of the data (with a recv of the result), tagged with the collective's kind.
_DCN_SEND = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\ssend\(.*"
                       r"_xla_megascale_transfer_type=\"([A-Z_]+)\"")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%(\S+)\s*\(.*\{\s*$")
_CALLED = re.compile(r"(?:body|calls|to_apply|branch_computations|called_computations)="
                     r"(\{[^}]*\}|%[\w.\-]+)")
_WHILE = re.compile(r"\swhile\(.*condition=%([\w.\-]+),\s*body=%([\w.\-]+)")


@dataclasses.dataclass
class Op:
  kind: str
  data_bytes: int  # The logical size of what it reduces or moves (see the module docstring).
  group_size: int
  crosses_slices: bool

  @property
  def sent_bytes(self) -> float:
    """What each chip of the group sends, by the ring algorithm."""
    n = self.group_size
    if n <= 1:
      return 0.0
    if self.kind == "all-reduce":
      return 2 * (n - 1) / n * self.data_bytes
    if self.kind == "collective-permute":
      return float(self.data_bytes)
    return (n - 1) / n * self.data_bytes


def _arrays(shape_text: str, scalars: bool = True) -> list[int]:
  """Bytes of each array of a (tuple) shape, e.g. "(f32[8,128]{1,0}, bf16[4])" -> [4096, 8]."""
  sizes = []
  for dtype, dims in _ARRAY.findall(shape_text):
    size = _BYTES.get(dtype, 1 if dtype.startswith("f8") else None)
    if size is not None and (dims or scalars):
      sizes.append(size * math.prod(int(d) for d in dims.split(",") if d))
  return sizes


def _data_bytes(kind: str, started: bool, shape_text: str) -> int:
  """The op's data size from its result shape. The -start half of an async op returns
  (operands, outputs[, scalar contexts]): the outputs are the second half of its arrays."""
  if not started or kind == "all-reduce":
    return sum(_arrays(shape_text))
  sizes = _arrays(shape_text, scalars=False)
  return sum(sizes[len(sizes) // 2:])


def replica_groups(line: str, num_partitions: int) -> list[list[int]]:
  """The device groups of a collective, in any of HLO's notations: explicit `{{0,1},{2,3}}`,
  iota `[2,2]<=[4]` / `[2,2]<=[2,2]T(1,0)`, mesh `mesh['a'=2,'b'=2] {'a'}`, or none (all)."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
  if mesh:
    axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))]
    grouped = re.findall(r"'([^']+)'", mesh.group(2))
    ids = np.arange(math.prod(size for _, size in axes)).reshape([size for _, size in axes])
    names = [name for name, _ in axes]
    order = [i for i, n in enumerate(names) if n not in grouped] + [names.index(n)
                                                                    for n in grouped]
    size = math.prod(dict(axes)[n] for n in grouped)
    return np.transpose(ids, order).reshape(-1, size).tolist()
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if iota:
    shape = [int(x) for x in iota.group(1).split(",")]
    dims = [int(x) for x in iota.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(3):
      ids = np.transpose(ids, [int(x) for x in iota.group(3).split(",")])
    return ids.reshape(shape[0], -1).tolist()
  explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
  if explicit and explicit.group(1):
    return [[int(x) for x in group.split(",") if x]
            for group in re.findall(r"\{([\d,]*)\}", explicit.group(1))]
  pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
  if pairs:  # collective-permute: each pair is a group of two.
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
  return [list(range(num_partitions))]


def _computations(text: str) -> dict[str, list[str]]:
  """Computation name -> its instruction lines; the entry computation under "ENTRY"."""
  computations, name = {}, None
  for line in text.splitlines():
    match = _COMPUTATION.match(line)
    if match:
      name = "ENTRY" if line.startswith("ENTRY") else match.group(1)
      computations[name] = []
    elif line.rstrip() == "}":  # Not "}}, ...": a Mosaic kernel's config spans lines.
      name = None
    elif name is not None:
      computations[name].append(line)
  return computations


def _trip_count(condition: list[str]) -> int | None:
  """N of a loop whose condition is `counter < N` (a constant), the form of every scan."""
  constants = dict(re.findall(r"%(\S+)\s*=\s*s32\[\]\S*\s+constant\((-?\d+)\)",
                              "\n".join(condition)))
  for line in condition:
    if "ROOT" in line and "compare(" in line and "direction=LT" in line:
      operands = re.search(r"compare\(([^)]*)\)", line).group(1)
      for operand in operands.split(","):
        name = operand.strip().lstrip("%")
        if name in constants:
          return int(constants[name])
  return None


def collectives(hlo_text: str, partition_slices: Sequence[int]) -> dict:
  """{kind: {"count", "bytes", "sent_bytes_per_chip", "dcn_sent_bytes_per_chip"}} per step, plus
  "unknown_trip_counts" (loops counted once). `partition_slices[p]`: the slice of the chip that
  runs partition p (all 0 on one slice)."""
  computations = _computations(hlo_text)
  totals = {kind: {"count": 0, "bytes": 0, "sent_bytes_per_chip": 0.0,
                   "dcn_sent_bytes_per_chip": 0.0} for kind in KINDS}
  unknown: list[str] = []
  num = len(partition_slices)

  def visit(name: str, times: int, seen: tuple[str, ...]) -> None:
    if name not in computations or name in seen:
      return
    for line in computations[name]:
      op = _OP.match(line)
      if op:
        kind = op.group(2)
        groups = [g for g in replica_groups(line, num) if len(set(g)) > 1]  # Self-pairs: none.
        crosses = any(len({partition_slices[p] for p in group if p < num}) > 1
                      for group in groups)
        found = Op(kind, _data_bytes(kind, bool(op.group(3)), op.group(1)),
                   len(groups[0]) if groups else 1, crosses)
        if found.kind == "reduce-scatter":
          found.data_bytes *= found.group_size
        total = totals[found.kind]
        total["count"] += times
        total["bytes"] += times * found.data_bytes
        key = "dcn_sent_bytes_per_chip" if crosses else "sent_bytes_per_chip"
        total[key] += times * found.sent_bytes
      dcn = _DCN_SEND.match(line)
      if dcn:
        kind = dcn.group(2).lower().replace("_", "-")
        slices = len(set(partition_slices))
        found = Op(kind if kind in totals else "collective-permute",
                   sum(_arrays(dcn.group(1), scalars=False)[:1]), slices, True)
        total = totals[found.kind]
        total["count"] += times
        total["bytes"] += times * found.data_bytes
        total["dcn_sent_bytes_per_chip"] += times * found.sent_bytes
      loop = _WHILE.search(line)
      if loop:
        trips = _trip_count(computations.get(loop.group(1), []))
        if trips is None:
          unknown.append(loop.group(2))
        visit(loop.group(2), times * (trips or 1), seen + (name,))
        continue
      for called in _CALLED.findall(line):
        for callee in re.findall(r"%([\w.\-]+)", called):
          visit(callee, times, seen + (name,))

  visit("ENTRY", 1, ())
  return {**totals, "unknown_trip_counts": unknown}
