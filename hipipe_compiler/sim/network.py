"""The network of cost-model.md section 2: messages wait their alpha, then move their bytes at
the minimum over their resources (ports, directed links) of the resource's capacity divided
by the messages moving bytes on it; rates change whenever a message starts or stops moving
bytes. A program's executor (simulate.py) sends messages and hears of their arrival.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> net = Network(Topology((Dimension(4, "switch", 100, 1.0),)), "Simple")
>>> arrived = []
>>> net.on_arrival = lambda m: arrived.append((m.owner, net.now))
>>> for dst in (1, 2):  # two messages of 100 kB leave rank 0's port after 1 µs: each gets half of it
...     resources, dim, alpha = net.link(0, dst)
...     net.send(Message(f"m{dst}", resources, dim, 1e5, alpha))
>>> net.run_until_idle(); arrived
[('m1', 3.0), ('m2', 3.0)]
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from itertools import repeat
from typing import Any, Callable, Hashable

from ..topology import Topology


class Message:
    """Bytes on the network: `resources` it shares while moving, `remaining` wire bytes (as
    of `since`), and its current `rate`; `scale` multiplies the rate (in-switch reduction
    runs at a fraction of the ports' capacity). `weights` counts it more than once on a
    resource (in an orbit run, one resource stands for several). `owner` is the executor's."""

    __slots__ = ("owner", "resources", "remaining", "rate", "since", "version", "arrived", "arrival", "dim", "start",
                 "scale", "alpha", "serial", "least", "weights")

    def __init__(self, owner: Any, resources: tuple, dim: int, wire_bytes: float, alpha: float = 0.0,
                 scale: float = 1.0, weights: tuple[int, ...] | None = None) -> None:
        self.owner = owner
        self.resources = resources
        self.weights = weights
        self.dim = dim
        self.remaining = wire_bytes
        self.alpha = alpha
        self.scale = scale
        self.rate = 0.0
        self.least = math.inf  # the least share among its resources, while it moves bytes
        self.since = 0.0
        self.version = 0
        self.arrived = False
        self.arrival = math.inf
        self.start = math.inf  # when it started moving bytes (after its alpha)
        self.serial = 0


#: Event kinds the network handles itself; an executor handles the others.
NETWORK_EVENTS = ("latency", "transfer", "shared")


class Network:
    """The event queue and the resources of one simulated call on `topology`.

    `quotient` times rank 0 alone, standing for every rank: a rank's ingress port then
    carries the mirror image of its egress traffic, so ingress ports are left out. `orbits`
    also times rank 0 alone, for programs every rank runs shifted by its coordinates: each
    resource stands for its orbit under those shifts (`orbit`), and a message counts once
    on it for each resource of that orbit it uses."""

    def __init__(self, topology: Topology, protocol: str, quotient: bool = False, orbits: bool = False) -> None:
        self.topology = topology
        self.protocol = protocol
        self.quotient = quotient
        self.orbits = orbits
        self.now = 0.0
        self.events: list = []
        self.seq = 0
        self.active: dict[Hashable, set[Message]] = defaultdict(set)
        self.load: dict[Hashable, int] = {}  # messages moving bytes on each busy resource, weights counted
        self.share: dict[Hashable, float] = {}  # capacity / load, of each busy resource
        self.compact_floor = 1 << 12  # compact() when the queue holds twice what it did, and this many
        self.compact_at = self.compact_floor
        # a resource whose messages use it alone (a ring link; a port in a quotient run) is a
        # processor-sharing queue: [virtual bytes served per message, when, heap of (virtual
        # finish, seq, message), version], so a start or finish reschedules one event, not all
        self.shared: dict[Hashable, list] = {}
        self.capacity: dict[Hashable, float] = {}
        self.busy_since: dict[Hashable, float] = {}
        self.busy_time: dict[Hashable, float] = defaultdict(float)
        self.dim_bytes = [0.0] * topology.ndims
        self.link_cache: dict[tuple[int, int], tuple] = {}
        self.sent = 0
        self.on_arrival: Callable[[Message], None] = lambda msg: None

    # -- events
    def schedule(self, time: float, kind: str, obj: Any, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (time, self.seq, kind, obj, version))
        if len(self.events) > self.compact_at:
            self.compact()

    def compact(self) -> None:
        """Drop the events a rate change has made stale, which handle() would skip anyway; the
        others keep their (time, seq) and so their order."""
        shared = self.shared
        self.events = [e for e in self.events
                       if not (e[2] == "transfer" and (e[3].version != e[4] or e[3].arrived)
                               or e[2] == "shared" and shared[e[3]][3] != e[4])]
        heapq.heapify(self.events)
        self.compact_at = max(self.compact_floor, 2 * len(self.events))

    def handle(self, kind: str, obj: Any, version: int) -> None:
        """Process one of the network's own events (NETWORK_EVENTS)."""
        if kind == "latency":
            self.start_transfer(obj)
        elif kind == "transfer":
            if obj.version == version and not obj.arrived:
                self.finish_transfer(obj)
        elif self.shared[obj][3] == version:
            self.finish_shared(obj)

    def run_until_idle(self) -> None:
        """Process events until none is left (for a network driven without an executor)."""
        while self.events:
            time, _seq, kind, obj, version = heapq.heappop(self.events)
            self.now = time
            self.handle(kind, obj, version)

    # -- links
    def link(self, a: int, b: int) -> tuple[tuple, int, float]:
        """The resources, dimension and alpha of a message from rank a to rank b; ValueError
        when the topology has no such link."""
        key = (a, b)
        if key not in self.link_cache:
            res = self.topology.link_resources(a, b)
            if res is None:
                raise ValueError(f"no link between rank {a} and rank {b} in topology {self.topology.label}")
            d = self.topology.link_dimension(a, b)
            assert d is not None
            if self.quotient:
                res = tuple((r, cap) for r, cap in res if r[0] != "in")
            elif self.orbits:
                res = tuple((self.orbit(r), cap) for r, cap in res)
            for r, cap in res:
                self.capacity[r] = cap * 1e3  # bytes per microsecond
            self.link_cache[key] = (tuple(r for r, _cap in res), d, self.topology.dimensions[d].alpha(self.protocol))
        return self.link_cache[key]

    def orbit(self, resource: Hashable) -> Hashable:
        """The resource that stands for this one's orbit under the shifts of rank coordinates:
        a port of rank 0, or a ring link out of rank 0."""
        kind, a, b = resource  # type: ignore[misc]
        return (kind, 0, b) if kind != "link" else ("link", 0, self.topology.rank(self.topology.offset(a, b)))

    def add_resource(self, resource: Hashable, capacity_GBps: float) -> None:
        """Declare a resource that no point-to-point link names (ports of a switch reduce)."""
        self.capacity[resource] = capacity_GBps * 1e3

    def switch_message(self, owner: Any, kind: str, rank: int, dim: int, nbytes: float,
                       group: tuple[int, ...] | None = None) -> Message:
        """A switch reduce (`kind` "reduce") or multicast store ("store") of nbytes issued by
        rank on dimension dim (cost-model.md section 5): a reduce takes nbytes out of every
        member's port and into the issuer's, a store out of the issuer's and into every
        member's; at the dimension's in-switch efficiency, after its Simple alpha. `group`
        defaults to the ranks that differ from rank in dim alone."""
        d = self.topology.dimensions[dim]
        if d.nvls is None:
            raise ValueError(f"dimension {self.topology.dim_name(dim)} has no in-switch reduction")
        members = self.topology.group(rank, dim) if group is None else group
        if kind == "reduce":
            ports = [("out", m, dim) for m in members] + [("in", rank, dim)]
        else:
            ports = [("out", rank, dim)] + [("in", m, dim) for m in members]
        weights = None
        if self.orbits:
            counted = defaultdict(int)
            for p in ports:
                counted[self.orbit(p)] += 1
            ports, weights = list(counted), tuple(counted.values())
        for p in ports:
            self.add_resource(p, d.bandwidth)
        return Message(owner, tuple(ports), dim, nbytes, d.alpha("Simple"), d.nvls.efficiency, weights)

    # -- messages
    def send(self, msg: Message) -> None:
        """Put a message on the network now: it waits its alpha, then moves its bytes."""
        self.sent += 1
        msg.serial = self.sent
        self.dim_bytes[msg.dim] += msg.remaining
        self.schedule(self.now + msg.alpha, "latency", msg)

    def start_transfer(self, msg: Message) -> None:
        msg.start = self.now
        if msg.remaining <= 0:
            self.arrive(msg)
            return
        if len(msg.resources) == 1 and msg.scale == 1.0 and msg.weights is None:
            r = msg.resources[0]
            queue = self.shared.get(r)
            if queue is None:
                queue = self.shared[r] = [0.0, self.now, [], 0]
            self.serve(r, queue)
            if not queue[2]:
                self.busy_since[r] = self.now
            self.seq += 1
            heapq.heappush(queue[2], (queue[0] + msg.remaining, self.seq, msg))
            self.next_finish(r, queue)
            return
        share, load = self.share, self.load
        for r, w in zip(msg.resources, msg.weights or repeat(1)):
            active = self.active[r]
            if not active:
                self.busy_since[r] = self.now
            active.add(msg)
            load[r] = n = load.get(r, 0) + w
            share[r] = self.capacity[r] / n
        # shares only fell, so another message's least share is its old one or a fallen one
        msg.least = min([share[r] for r in msg.resources])
        lowered = {msg}
        for r in msg.resources:
            s = share[r]
            for m in self.active[r]:
                if s < m.least:
                    m.least = s
                    lowered.add(m)
        self.reschedule(lowered)

    def finish_transfer(self, msg: Message) -> None:
        share, load = self.share, self.load
        eased: set[Message] = set()  # messages whose least share was on a resource that rose
        for r, w in zip(msg.resources, msg.weights or repeat(1)):
            active = self.active[r]
            active.discard(msg)
            if active:
                old = share[r]
                load[r] -= w
                share[r] = self.capacity[r] / load[r]
                eased.update(m for m in active if m.least == old)
            else:
                del load[r]
                self.busy_time[r] += self.now - self.busy_since.pop(r)
        msg.remaining = 0.0
        self.arrive(msg)
        least = share.__getitem__
        for m in eased:
            m.least = min(map(least, m.resources))
        self.reschedule(eased)

    def serve(self, r: Hashable, queue: list) -> None:
        """Bring a shared resource's virtual time up to now: each of its n messages got
        capacity / n bytes per microsecond since the last change."""
        if queue[2]:
            queue[0] += (self.now - queue[1]) * self.capacity[r] / len(queue[2])
        queue[1] = self.now

    def next_finish(self, r: Hashable, queue: list) -> None:
        queue[3] += 1
        if queue[2]:
            left = max(0.0, queue[2][0][0] - queue[0])
            self.schedule(self.now + left * len(queue[2]) / self.capacity[r], "shared", r, queue[3])

    def finish_shared(self, r: Hashable) -> None:
        """The message of a shared resource with the least bytes left has moved them all."""
        queue = self.shared[r]
        self.serve(r, queue)
        _v, _seq, msg = heapq.heappop(queue[2])
        if not queue[2]:
            self.busy_time[r] += self.now - self.busy_since.pop(r)
        msg.remaining = 0.0
        self.next_finish(r, queue)
        self.arrive(msg)

    def reschedule(self, messages: set[Message]) -> None:
        """Bring each message whose rate changed up to date, with its new rate (from its least
        share, kept current by the caller) and end time."""
        now = self.now
        changed = []
        for m in messages:
            rate = m.scale * m.least
            if rate != m.rate:  # otherwise its end time stands
                changed.append((m.start, m.serial, m, rate))
        # events in the order the messages started moving, then were sent, whatever order a
        # set iterates in, so runs are the same
        changed.sort()
        events = self.events
        for _start, _serial, m, rate in changed:
            if m.rate > 0:
                m.remaining = max(0.0, m.remaining - m.rate * (now - m.since))
            m.rate = rate
            m.since = now
            m.version += 1
            self.seq += 1  # schedule(), inline: this is the simulator's busiest line
            heapq.heappush(events, (now + m.remaining / rate, self.seq, "transfer", m, m.version))
        if len(events) > self.compact_at:
            self.compact()

    def arrive(self, msg: Message) -> None:
        msg.arrived = True
        msg.arrival = self.now
        self.on_arrival(msg)

    # -- statistics
    def busy_fractions(self, time: float) -> list[float]:
        """The mean busy fraction of each dimension's resources over [0, time]."""
        out = []
        for d in range(self.topology.ndims):
            keys = [r for r in self.capacity if _dimension_of(self.topology, r) == d]
            busy = sum(self.busy_time[r] for r in keys) / (len(keys) * time) if keys and time > 0 else 0.0
            out.append(busy)
        return out


def _dimension_of(topology: Topology, r: Hashable) -> int | None:
    kind = r[0]  # type: ignore[index]
    if kind == "link":
        return topology.link_dimension(r[1], r[2])  # type: ignore[index]
    if kind in ("out", "in"):
        return r[2]  # type: ignore[index]
    return None
