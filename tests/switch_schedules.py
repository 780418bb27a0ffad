"""Every schedule of a family of all-reduces, with and without in-switch stages, as task
programs for sim/dag.py: the oracle that the in-switch limit (switch_bound.py) is tested
against.

A schedule reduce-scatters through the dimensions in one order and all-gathers back in the
reverse order. On each dimension it picks how: point to point (every peer at once on a
switch, the ring algorithm on a ring) or, where the dimension has `nvls`, switch reduces
and multicast stores. The message is cut into chunks that run through the stages
one after another through the stages: a rank issues a stage's messages for a chunk after it
issued them for the chunk before (as one threadblock per stage would), so the stages of
consecutive chunks overlap. `split` runs half of every chunk in the reverse order, so that
both orders use their dimensions at once.
"""

from __future__ import annotations

import itertools
from typing import Iterator

from hipipe_compiler.sim.dag import Task
from hipipe_compiler.topology import Topology


class _Builder:
    """Appends tasks; `ready[r]` holds the tasks rank r's current segment waits for."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.tasks: list[Task] = []
        self.issued: dict[tuple, list[int]] = {}  # (stream, rank) -> its tasks in the current chunk
        self.before: dict[tuple, list[int]] = {}  # the same, in the chunk before
        self.stream: tuple = ()

    def add(self, task: Task) -> int:
        """Append a task, after the tasks its rank issued in the same stage of the chunk before."""
        key = (self.stream, task.rank)
        self.tasks.append(Task(task.kind, task.rank, task.peer, task.dim, task.nbytes,
                               (*task.deps, *self.before.get(key, ())), task.protocol))
        self.issued.setdefault(key, []).append(len(self.tasks) - 1)
        return len(self.tasks) - 1

    def next_chunk(self) -> None:
        self.before, self.issued = self.issued, {}

    def groups(self, d: int) -> list[tuple[int, ...]]:
        return sorted({self.topology.group(r, d) for r in range(self.topology.nranks)})

    def stage(self, ready: dict[int, tuple[int, ...]], d: int, how: str, nbytes: float, stream: tuple
              ) -> dict[int, tuple[int, ...]]:
        """One reduce-scatter or all-gather stage on dimension d; each message carries nbytes."""
        self.stream = stream
        new: dict[int, tuple[int, ...]] = {}
        for group in self.groups(d):
            n = len(group)
            if how == "direct":
                for q in group:
                    new[q] = (*ready[q], *(self.add(Task("send", r, peer=q, nbytes=nbytes, deps=ready[r]))
                                          for r in group if r != q))
            elif how == "ring":
                last: dict[int, int] = {}
                for _step in range(n - 1):
                    sent = {}
                    for c, r in enumerate(group):
                        q = group[(c + 1) % n]
                        deps = (*ready[r], *((last[r],) if r in last else ()))
                        sent[q] = self.add(Task("send", r, peer=q, nbytes=nbytes, deps=deps))
                    last = sent
                for q in group:
                    new[q] = (*ready[q], last[q])
            elif how == "switch":
                every = tuple(t for m in group for t in ready[m])
                for r in group:
                    new[r] = (self.add(Task("reduce", r, dim=d, nbytes=nbytes, deps=every)),)
            elif how == "multicast":
                stores = tuple(self.add(Task("store", r, dim=d, nbytes=nbytes, deps=ready[r])) for r in group)
                for r in group:
                    new[r] = stores
            else:
                raise ValueError(how)
        return new


def allreduce_tasks(topology: Topology, nbytes: float, order: tuple[int, ...], scatter: dict[int, str],
                    gather: dict[int, str], chunks: int, split: bool = False) -> list[Task]:
    """The tasks of one schedule of the family: `scatter[d]` and `gather[d]` say how each
    dimension reduce-scatters and all-gathers."""
    b = _Builder(topology)
    orders = (order, tuple(reversed(order))) if split else (order,)
    for _chunk in range(chunks):
        for p, path in enumerate(orders):
            size = nbytes / chunks / len(orders)
            ready: dict[int, tuple[int, ...]] = {r: () for r in range(topology.nranks)}
            for d in path:
                size /= topology.dimensions[d].size
                ready = b.stage(ready, d, scatter[d], size, (p, "rs", d))
            for d in reversed(path):
                ready = b.stage(ready, d, gather[d], size, (p, "ag", d))
                size *= topology.dimensions[d].size
        b.next_chunk()
    return b.tasks


def family(topology: Topology, chunk_counts: tuple[int, ...] = (1, 4)) -> Iterator[tuple[str, dict]]:
    """Every schedule of the family on this topology: a label and allreduce_tasks' arguments."""
    dims = range(topology.ndims)

    def gpu_side(d: int) -> str:
        dim = topology.dimensions[d]
        return "direct" if dim.kind == "switch" or dim.size == 2 else "ring"

    scatter_ways = [[gpu_side(d)] + (["switch"] if topology.dimensions[d].nvls else []) for d in dims]
    gather_ways = [[gpu_side(d)] + (["multicast"] if topology.dimensions[d].nvls else []) for d in dims]
    for order in itertools.permutations(dims):
        for scatter in itertools.product(*scatter_ways):
            for gather in itertools.product(*gather_ways):
                for chunks in chunk_counts:
                    for split in ((False, True) if topology.ndims > 1 else (False,)):
                        label = f"order {order} rs {scatter} ag {gather} x{chunks}{' split' if split else ''}"
                        yield label, dict(order=order, scatter=dict(zip(dims, scatter)),
                                          gather=dict(zip(dims, gather)), chunks=chunks, split=split)
