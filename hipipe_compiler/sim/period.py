"""Skipping the replays' periodic steady state, exactly.

The runtime replays a program once per slice, and the simulator is deterministic: once the
whole state at one iteration boundary (every threadblock's place, every message in flight
with its bytes left and rate, every pending event, all relative to now and to the
iteration) equals the state q iterations earlier, shifted by a time T, the run from there on
repeats itself every q iterations. So whole periods can be skipped by shifting the state by
k T and k q iterations, up to the last iterations, which are simulated as usual (they end
differently). Statistics (bytes per dimension, busy time) grow by k times one period's.

Threadblocks that wait on each other, even through others (a receiver on its sender, a
sender on its receiver's window), form a component. A component that only depends on another
may replay faster or slower than it, so their offset grows while each repeats its own
period: iterations are counted from each component's first threadblock, and a period
advances each component by its own q, provided that no component gains on one it depends
on, and none waited on one that pulls ahead (further behind, it never will).

`Periodic` watches one simulation and makes the jump; simulate.py calls it at each
iteration boundary of a reference threadblock.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Hashable

#: Longest period looked for, in iterations.
MAX_PERIOD = 32
#: Runs with fewer iterations gain nothing from the shortcut.
MIN_ITERATIONS = 12
#: Two states match when every time agrees to within this fraction of the period (and every
#: byte count to within this fraction of itself, plus what the fastest resource moves in that
#: time): floating-point noise. A state that drifts by that much per period moves the end of
#: the run by at most this fraction of its length, however many periods are skipped.
TOLERANCE = 1e-9


@dataclass
class _Snapshot:
    iteration: int
    bases: tuple[int, ...]  # each component's first threadblock's iteration
    cross_waits: tuple[int, ...]  # waits of one component on another, per pair of components
    time: float
    discrete: tuple
    times: list[float]  # relative to now
    amounts: list[float]  # bytes, virtual bytes and rates
    busy: dict[Hashable, float]
    dim_bytes: list[float]


class Periodic:
    """Watches a simulation (simulate._Simulator) for a periodic steady state and skips it."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.history: list[_Snapshot] = []
        self.reference = min((t for t in sim.tbs.values() if t.steps), key=lambda t: t.key, default=None)
        self.seen = 0
        self.enabled = self.reference is not None and sim.iterations >= MIN_ITERATIONS and not sim.record
        self.component, self.firsts, crossing, self.pairs = components(sim) if self.enabled else ({}, [], {}, [])
        sim.crossing, sim.cross_waits = crossing, [0] * len(self.pairs)
        self.skipped = 0  # iterations skipped, per threadblock

    def check(self) -> None:
        """Called between events: when the reference threadblock has started a new iteration,
        compare the state with the last few boundaries and jump when it repeats."""
        ref = self.reference
        if not self.enabled or ref.iteration <= self.seen:
            return
        self.seen = ref.iteration
        sim = self.sim
        if any(t.done for t in sim.tbs.values() if t.steps):
            self.enabled = False
            return
        snap = self.snapshot()
        self.history.append(snap)
        history = self.history
        speed = max(sim.net.capacity.values(), default=0.0)
        for q in range(1, MAX_PERIOD + 1):
            if len(history) < 2 * q + 1:
                break
            first, middle = history[-1 - 2 * q], history[-1 - q]
            if self.repeats(first, middle, speed) and self.repeats(middle, snap, speed) and \
                    self.drifts_apart(first, snap):
                self.jump(middle, snap)
                return
        del history[:-2 * MAX_PERIOD - 1]

    @staticmethod
    def repeats(earlier: _Snapshot, later: _Snapshot, speed: float) -> bool:
        """Whether `later` is `earlier` shifted by their distance in time and iterations."""
        if earlier.discrete != later.discrete:
            return False
        eps = TOLERANCE * (later.time - earlier.time)
        if any(abs(x - y) > eps for x, y in zip(earlier.times, later.times)):
            return False
        return all(abs(x - y) <= TOLERANCE * max(abs(x), abs(y)) + eps * speed for x, y in zip(earlier.amounts, later.amounts))

    def drifts_apart(self, earlier: _Snapshot, later: _Snapshot) -> bool:
        """Whether the components keep their offsets or drift apart safely: a component that
        waits on another never gains on it, and where it falls behind, it did not wait on it
        in these periods (so, further behind, it never will)."""
        qs = [b - a for a, b in zip(earlier.bases, later.bases)]
        for i, (waiter, awaited) in enumerate(self.pairs):
            if qs[waiter] > qs[awaited]:
                return False
            if qs[waiter] < qs[awaited] and later.cross_waits[i] != earlier.cross_waits[i]:
                return False
        return True

    def snapshot(self) -> _Snapshot:
        sim, net = self.sim, self.sim.net
        now = net.now
        bases = tuple(t.iteration for t in self.firsts)
        component = self.component
        ids: dict[int, int] = {}
        disc: list = []
        times: list[float] = []
        amounts: list[float] = []

        def ref(m: Any) -> int:
            k = id(m)
            if k not in ids:
                ids[k] = len(ids)
                disc.append(("m", m.sender.key, m.conn, m.dim, m.resources, m.arrived, m.cnt,
                             m.iteration - bases[component[m.sender.key]], m.scale))
                amounts.extend((m.remaining, m.rate))
                times.extend(((m.since - now) if m.rate > 0 else 0.0, (m.start - now) if m.start != math.inf else -1.0,
                              (m.arrival - now) if m.arrived else 0.0))
            return ids[k]

        for key in sorted(component):
            t, base = sim.tbs[key], bases[component[key]]
            disc.append((t.index, t.iteration - base, t.phase, -1 if t.waiting_message is None else ref(t.waiting_message)))
            it, pos = sim.progress[key]
            disc.append((it - base, pos))
        disc.append(tuple((k, tuple(w.key for w in ws)) for k, ws in sorted(sim.waiters.items()) if ws))
        for conn in sorted(c for c, q in sim.fifo.items() if q):
            disc.append((conn, tuple(ref(m) for m in sim.fifo[conn])))
        disc.append(tuple((c, t.key) for c, t in sorted(sim.window_waiter.items())))
        disc.append(tuple((c, t.key) for c, t in sorted(sim.recv_waiter.items())))
        for r in sorted(r for r, ms in net.active.items() if ms):
            disc.append((r, tuple(ref(m) for m in sorted(net.active[r], key=lambda m: (m.start, m.serial)))))
        for r in sorted(r for r, q in net.shared.items() if q[2]):
            v, when, heap, _version = net.shared[r]
            times.append(when - now)
            entries = sorted(heap, key=lambda e: (e[0], e[1]))
            disc.append((r, tuple(ref(e[2]) for e in entries)))
            amounts.extend(e[0] - v for e in entries)
        for time, _seq, kind, obj, version in sorted(net.events, key=lambda e: (e[0], e[1])):
            if kind == "transfer" and (obj.version != version or obj.arrived):
                continue
            if kind == "shared" and net.shared[obj][3] != version:
                continue
            target = obj.key if kind in ("try", "local") else obj if kind == "shared" else ref(obj)
            disc.append((kind, target))
            times.append(time - now)
        busy = {r: net.busy_time[r] + (now - since) for r, since in net.busy_since.items()}
        for r, t in net.busy_time.items():
            busy.setdefault(r, t)
        return _Snapshot(self.reference.iteration, bases, tuple(sim.cross_waits), now, tuple(disc), times, amounts,
                         busy, list(net.dim_bytes))

    def jump(self, earlier: _Snapshot, later: _Snapshot) -> None:
        """Skip as many whole periods (earlier -> later) as leave every threadblock at least
        one iteration before its last."""
        sim, net = self.sim, self.sim.net
        qs = [b - a for a, b in zip(earlier.bases, later.bases)]
        period = later.time - earlier.time
        self.history.clear()
        if min(qs) < 1 or period <= 0:
            self.enabled = False  # a component that makes no progress: nothing to skip
            return
        highest = [0] * len(qs)
        for key, c in self.component.items():
            highest[c] = max(highest[c], sim.tbs[key].iteration)
        k = min((sim.iterations - 2 - h) // q for h, q in zip(highest, qs))
        if k < 1:
            self.enabled = False  # too close to the end to gain anything
            return
        dt = k * period
        shift = [k * q for q in qs]
        component = self.component
        net.now += dt
        net.events = [(time + dt, seq, kind, obj, version) for time, seq, kind, obj, version in net.events]
        heapq.heapify(net.events)
        messages: dict[int, Any] = {}
        for _time, _seq, kind, obj, _version in net.events:
            if kind in ("latency", "transfer"):
                messages[id(obj)] = obj
        for key, c in component.items():
            t = sim.tbs[key]
            t.iteration += shift[c]
            if t.waiting_message is not None:
                messages[id(t.waiting_message)] = t.waiting_message
            it, pos = sim.progress[key]
            sim.progress[key] = (it + shift[c], pos)
        for queue in sim.fifo.values():
            messages.update((id(m), m) for m in queue)
        for ms in net.active.values():
            messages.update((id(m), m) for m in ms)
        for queue in net.shared.values():
            queue[1] += dt
            messages.update((id(e[2]), e[2]) for e in queue[2])
        for m in messages.values():
            m.since += dt
            m.start += dt
            if m.arrived:
                m.arrival += dt
            m.iteration += shift[component[m.sender.key]]
        for r in net.busy_since:
            net.busy_since[r] += dt
        for r, value in later.busy.items():
            net.busy_time[r] += k * (value - earlier.busy.get(r, 0.0))
        net.dim_bytes = [b + k * (x - y) for b, x, y in zip(net.dim_bytes, later.dim_bytes, earlier.dim_bytes)]
        sim.last_done += dt
        self.seen = self.reference.iteration
        self.skipped += shift[component[self.reference.key]]


def components(sim: Any) -> tuple[dict[tuple[int, int], int], list[Any], dict[tuple, int], list[tuple[int, int]]]:
    """The threadblocks' components (the strongly connected parts of who waits on whom: a step
    on its dependency, a receiver on its sender, a sender on its receiver's window). Returns
    each threadblock's component, each component's first threadblock, the dependencies from
    one component to another (waiter, awaited) with the index of their pair of components, and
    those pairs."""
    import networkx as nx  # a tenth of a second to import: commands that never simulate skip it

    keys = sorted(k for k, t in sim.tbs.items() if t.steps)
    graph = nx.DiGraph()
    graph.add_nodes_from(keys)
    ends: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for key in keys:
        t = sim.tbs[key]
        graph.add_edges_from((key, (t.rank, depid)) for pending in t.deps for depid, _count in pending
                             if (t.rank, depid) in graph)
        if t.send >= 0:
            ends[sim.send_queue(t)].append(key)
        if t.recv >= 0:
            ends[sim.recv_queue(t)].append(key)
    for tbs in ends.values():
        if len(tbs) > 1:
            nx.add_cycle(graph, tbs)
    groups = sorted(sorted(c) for c in nx.strongly_connected_components(graph))
    component = {k: i for i, group in enumerate(groups) for k in group}
    pairs: list[tuple[int, int]] = []
    crossing: dict[tuple, int] = {}
    for a, b in graph.edges:
        pair = (component[a], component[b])
        if pair[0] != pair[1]:
            if pair not in pairs:
                pairs.append(pair)
            crossing[a, b] = pairs.index(pair)
    return component, [sim.tbs[g[0]] for g in groups], crossing, pairs
