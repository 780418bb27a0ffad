"""NCCL's NVLS and NVLSTree all-reduce as tasks for the simulator (sim/dag.py), as NCCL 2.30.7
runs them (all_reduce.h; nccl-spec 3.3-3.4):

- NVLS, one node: every GPU heads one slice of each loop of each channel; it reduces that
  slice in the switch (multimem ld_reduce: every GPU's port sends it, the head's receives the
  sum) and multicasts the sum back (multimem st). A head works its loops in order, and a loop
  waits for the one eight before it to be gathered (eight steps of FIFO).
- NVLSTree, several nodes: head h of each node reduces its slice in the switch, the node
  sends it up rail h's tree of nodes (each channel on one of the two trees of a double binary
  tree), the root's sum comes back down, and each node multicasts it.

NCCL's channels run in lockstep, so each tree's channels are one stream here with their
bytes together: the same bytes on the same ports at the same times. Its scatter and gather
copies are local work (free unless the topology sets a reduce bandwidth).

>>> from hipipe_compiler.topology import Dimension, Topology
>>> topo = Topology((Dimension(8, "switch", 370.8, link="nvlink", nvls={"efficiency": 0.85}),), gpu="H100")
>>> tasks = nvls_tasks(topo, 1 << 20)  # 16 channels of 64 KiB: heads take 16 KiB each, so 4 of 8 work
>>> len(tasks), sum(t.nbytes for t in tasks if t.kind == "reduce") == 1 << 20
(8, True)
"""

from __future__ import annotations

import math

from ..schedule.trees import binary_tree
from ..sim.dag import Task
from ..topology import Topology
from .setup import channels_for, nvls_chunk
from .tuning import System, graphs

#: Steps of FIFO between a head's loops (NCCL_STEPS).
STEPS = 8


def _slices(system: System, algorithm: str, nbytes: int) -> tuple[int, list[list[int]]]:
    """The channels of a call and, per loop of one channel, the bytes each head works on."""
    found = graphs(system)
    channels = channels_for(system, found, algorithm, "Simple", "allreduce", nbytes)
    share = math.ceil(nbytes / channels / 16) * 16
    chunk = nvls_chunk(system, algorithm, share)
    heads = system.ppn
    loops: list[list[int]] = []
    left = share
    while left > 0:
        if left >= heads * chunk:
            loops.append([chunk] * heads)
            left -= heads * chunk
            continue
        # the last loop: each head a 16 KiB-aligned piece (NVLS), or an even 16-byte-aligned one
        piece = math.ceil(math.ceil(left / heads) / (16 << 10)) * (16 << 10) if algorithm == "nvls" else \
            math.ceil(math.ceil(left / heads) / 16) * 16
        row = []
        for _ in range(heads):
            take = min(piece, left)
            row.append(take)
            left -= take
        loops.append(row)
    return channels, loops


def loop_count(topology: Topology, algorithm: str, nbytes: int) -> int:
    """How many loops each channel of NCCL's NVLS or NVLSTree runs for a call of nbytes."""
    return len(_slices(System.of(topology), algorithm, nbytes)[1])


def _keep(loops: list[list[int]], keep: int | None) -> list[list[int]]:
    """The first `keep` full loops and the last one (all of them when keep is None)."""
    return loops if keep is None or len(loops) <= keep + 1 else [*loops[:keep], loops[-1]]


def nvls_tasks(topology: Topology, nbytes: int, keep: int | None = None) -> list[Task]:
    """NCCL's NVLS all-reduce of nbytes on a one-node topology with in-switch reduction
    (only the first `keep` loops of each channel and its last, where given)."""
    system = System.of(topology)
    channels, loops = _slices(system, "nvls", nbytes)
    loops = _keep(loops, keep)
    tasks: list[Task] = []
    stores: dict[int, list[int]] = {h: [] for h in range(system.ppn)}
    last: dict[int, int] = {}
    for row in loops:
        for h, b in enumerate(row):
            if b <= 0:
                continue
            deps = [last[h]] if h in last else []
            if len(stores[h]) >= STEPS:
                deps.append(stores[h][-STEPS])
            tasks.append(Task("reduce", h, dim=0, nbytes=b * channels, deps=tuple(deps)))
            last[h] = len(tasks) - 1
            tasks.append(Task("store", h, dim=0, nbytes=b * channels, deps=(last[h],)))
            stores[h].append(len(tasks) - 1)
    if topology.reduce_bandwidth:  # the scatter and gather copies, before and after
        ends = tuple(s[-1] for s in stores.values() if s)
        tasks.extend(Task("local", r, nbytes=2 * nbytes, deps=ends) for r in range(system.ppn))
    return tasks


def nvlstree_tasks(topology: Topology, nbytes: int, keep: int | None = None) -> list[Task]:
    """NCCL's NVLSTree all-reduce of nbytes: in-switch reduction in each node of dimension 0,
    a double binary tree of nodes per rail across the rest (whose outer dimensions must
    link every pair of nodes: switches); `keep` as for nvls_tasks."""
    system = System.of(topology)
    channels, loops = _slices(system, "nvlstree", nbytes)
    loops = _keep(loops, keep)
    nodes, ppn = system.nodes, system.ppn
    tasks: list[Task] = []

    def rank(node: int, head: int) -> int:
        return node * ppn + head

    for tree in (0, 1):
        share = channels // 2 + (channels % 2 if tree == 0 else 0)
        if share == 0:
            continue
        parent, children = binary_tree(nodes, tree)
        for h in range(ppn):
            last_reduce: dict[int, int] = {}
            ups: dict[int, list[int]] = {k: [] for k in range(nodes)}
            for row in loops:
                b = row[h] * share
                if b <= 0:
                    continue
                reduced: dict[int, int] = {}
                for k in range(nodes):
                    deps = [last_reduce[k]] if k in last_reduce else []
                    if len(ups[k]) >= STEPS:
                        deps.append(ups[k][-STEPS])
                    tasks.append(Task("reduce", rank(k, h), dim=0, nbytes=b, deps=tuple(deps)))
                    reduced[k] = last_reduce[k] = len(tasks) - 1
                up_sent: dict[int, int] = {}
                for k in _post_order(parent, children):
                    deps = (reduced[k], *(up_sent[c] for c in children[k]))
                    if parent[k] >= 0:
                        tasks.append(Task("send", rank(k, h), peer=rank(parent[k], h), nbytes=b, deps=deps))
                        up_sent[k] = len(tasks) - 1
                        ups[k].append(up_sent[k])
                    else:
                        tasks.append(Task("mark", rank(k, h), deps=deps))
                        up_sent[k] = len(tasks) - 1
                down: dict[int, int] = {}
                for k in _pre_order(parent, children):
                    arrived = up_sent[k] if parent[k] < 0 else down[k]
                    tasks.append(Task("store", rank(k, h), dim=0, nbytes=b, deps=(arrived,)))
                    for c in children[k]:
                        tasks.append(Task("send", rank(k, h), peer=rank(c, h), nbytes=b, deps=(arrived,)))
                        down[c] = len(tasks) - 1
    return tasks


def _post_order(parent: tuple[int, ...], children: tuple[tuple[int, ...], ...]) -> list[int]:
    root = parent.index(-1)
    out: list[int] = []

    def visit(k: int) -> None:
        for c in children[k]:
            visit(c)
        out.append(k)
    visit(root)
    return out


def _pre_order(parent: tuple[int, ...], children: tuple[tuple[int, ...], ...]) -> list[int]:
    root = parent.index(-1)
    out, stack = [], [root]
    while stack:
        k = stack.pop()
        out.append(k)
        stack.extend(reversed(children[k]))
    return out
