"""Timing a program given as tasks and the tasks each waits for: point-to-point messages,
in-switch reductions and multicast stores (cost-model.md section 5), local work and marks.
A task starts when every task it depends on has finished; messages then follow the network
of cost-model.md section 2 (network.py).

A switch reduce of s bytes issued by rank r on dimension d: the port of every member of r's
group in d carries s bytes out and r's port s bytes in; a multicast store: r's port s out
and every member's port s in. Both pay the dimension's Simple alpha and move at the
dimension's in-switch efficiency times their share of the ports.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> topo = Topology((Dimension(4, "switch", 100, 1.0, nvls={"efficiency": 0.5}),))
>>> tasks = [Task("reduce", 0, dim=0, nbytes=1e5), Task("store", 0, dim=0, nbytes=1e5, deps=(0,))]
>>> run_dag(tasks, topo).time_us  # each: 1 us, then 1e5 bytes at half of 100 GB/s
6.0
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from ..hardware import WIRE_EFFICIENCY
from ..topology import Topology
from .network import Message, Network

KINDS = ("send", "reduce", "store", "local", "mark")


@dataclass(frozen=True)
class Task:
    """One operation of a task program: `kind` is one of KINDS; `rank` issues it; a send
    goes to `peer`; a switch reduce or multicast store runs on dimension `dim`; `nbytes` are
    data bytes (a send under LL puts twice as many on the wire); a local task takes
    `nbytes` / the topology's reduce bandwidth (free without one)."""

    kind: str
    rank: int
    peer: int = -1
    dim: int = -1
    nbytes: float = 0.0
    deps: tuple[int, ...] = ()
    protocol: str = "Simple"


@dataclass(frozen=True)
class DagResult:
    """When the last task finished, the wire bytes each dimension carried in all, and the
    busy fraction of each dimension's ports and links."""

    time_us: float
    dim_bytes: tuple[float, ...]
    busy: tuple[float, ...]
    finish_us: tuple[float, ...] = field(default=(), repr=False)


class DagError(Exception):
    """A task program that cannot run: a dependency on a later or missing task, a message
    between ranks with no link, or in-switch reduction where the switch has none."""


def run_dag(tasks: Sequence[Task], topology: Topology, start_us: float = 0.0, engine_GBps: float | None = None
            ) -> DagResult:
    """Time the tasks on the topology, the first starting at `start_us` (the per-call cost).
    `engine_GBps` caps the bytes of the point-to-point messages each rank sends, together."""
    net = Network(topology, "Simple")
    waiting = [len(t.deps) for t in tasks]
    dependents: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        if t.kind not in KINDS:
            raise DagError(f"task {i}: unknown kind {t.kind!r}")
        for d in t.deps:
            if not 0 <= d < i:
                raise DagError(f"task {i} depends on task {d}, which does not come before it")
            dependents[d].append(i)
    finish = [0.0] * len(tasks)
    g = topology.reduce_bandwidth * 1e3 if topology.reduce_bandwidth else None
    done = [0]

    def complete(i: int) -> None:
        finish[i] = net.now
        done[0] += 1
        for j in dependents.get(i, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                start(j)

    def start(i: int) -> None:
        t = tasks[i]
        if t.kind == "mark" or (t.kind == "local" and (g is None or t.nbytes <= 0)):
            complete(i)
        elif t.kind == "local":
            net.schedule(net.now + t.nbytes / g, "local", i)
        else:
            msg = _message(net, topology, t, i)
            if engine_GBps is not None and t.kind == "send":
                net.add_resource(("engine", t.rank), engine_GBps)
                msg.resources = (*msg.resources, ("engine", t.rank))
            net.send(msg)

    net.on_arrival = lambda msg: complete(msg.owner)
    net.now = start_us
    for i, n in enumerate(waiting):
        if n == 0:
            start(i)
    while net.events:
        time, _seq, kind, obj, version = heapq.heappop(net.events)
        net.now = time
        if kind == "local":
            complete(obj)
        else:
            net.handle(kind, obj, version)
    if done[0] != len(tasks):
        raise DagError(f"{len(tasks) - done[0]} task(s) never ran: their dependencies never finish")
    end = max(finish, default=start_us)
    return DagResult(max(end, start_us), tuple(net.dim_bytes), tuple(net.busy_fractions(end)), tuple(finish))


def _message(net: Network, topology: Topology, t: Task, i: int) -> Message:
    """The message of a send, switch reduce or multicast store."""
    if t.kind == "send":
        try:
            resources, dim, _alpha = net.link(t.rank, t.peer)
        except ValueError as exc:
            raise DagError(f"task {i}: {exc}") from None
        alpha = topology.dimensions[dim].alpha(t.protocol)
        return Message(i, resources, dim, t.nbytes / WIRE_EFFICIENCY[t.protocol], alpha)
    try:
        return net.switch_message(i, t.kind, t.rank, t.dim, t.nbytes)
    except ValueError as exc:
        raise DagError(f"task {i}: {exc}") from None
