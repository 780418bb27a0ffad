"""The network's event queue: dropping stale events (compaction) is exact, and the rates kept
up to date event by event are the ones computed from scratch."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings, strategies as st

from hipipe_compiler.sim.network import Message, Network
from hipipe_compiler.topology import Dimension, Topology

TOPOLOGY = Topology((Dimension(4, "switch", 300.0, 1.0, nvls={"efficiency": 0.85}),
                     Dimension(3, "switch", 50.0, 5.0)))


class _Counting(Network):
    compactions = 0

    def compact(self) -> None:
        self.compactions += 1
        super().compact()


class _Checked(_Counting):
    """Checks after every start and finish that each moving message's rate is its scale times
    the least share of its resources, computed from scratch."""

    checked = 0

    def start_transfer(self, msg: Message) -> None:
        super().start_transfer(msg)
        self.check()

    def finish_transfer(self, msg: Message) -> None:
        super().finish_transfer(msg)
        self.check()

    def check(self) -> None:
        for active in self.active.values():
            for m in active:
                assert m.rate == m.scale * min(self.capacity[r] / _load(self.active[r], r) for r in m.resources)
                self.checked += 1


def _load(active: set[Message], r: object) -> int:
    """Messages moving bytes on resource r, each counted as often as its weights say."""
    return sum(1 if m.weights is None else m.weights[m.resources.index(r)] for m in active)


#: messages put on the network: (when, put or switch reduce or store, from, to, bytes)
SENDS = st.lists(st.tuples(st.floats(0, 50), st.sampled_from(["put", "reduce", "store"]), st.integers(0, 11),
                           st.integers(0, 11), st.integers(1, 1 << 22)), min_size=1, max_size=40)


def _linked(sends: list[tuple]) -> list[tuple]:
    """The sends with a peer other than the sender, and puts only where there is a link."""
    sends = [(at, kind, a, b if b != a else (a + 1) % 12, n) for at, kind, a, b, n in sends]
    return [s for s in sends if s[1] != "put" or TOPOLOGY.link_resources(s[2], s[3]) is not None]


def _arrivals(sends: list[tuple], floor: int, network: type[_Counting] = _Counting,
              orbits: bool = False) -> tuple[list[tuple], _Counting]:
    """Every message's arrival time when `sends` are put on the network at their times, and
    the network (how often it compacted its queue, what it checked)."""
    net = network(TOPOLOGY, "Simple", orbits=orbits)
    net.compact_floor = net.compact_at = floor
    arrived: list[tuple] = []
    net.on_arrival = lambda m: arrived.append((m.owner, net.now))
    for i, (at, kind, a, b, nbytes) in enumerate(sends):
        net.schedule(at, "go", (i, kind, a, b, nbytes))
    while net.events:
        time, _seq, what, obj, version = heapq.heappop(net.events)
        net.now = time
        if what != "go":
            net.handle(what, obj, version)
            continue
        i, kind, a, b, nbytes = obj
        if kind == "put":
            resources, dim, alpha = net.link(a, b)
            net.send(Message(i, resources, dim, nbytes, alpha))
        else:
            net.send(net.switch_message(i, kind, a, 0, nbytes))
    return sorted(arrived), net


@settings(max_examples=40, deadline=None)
@given(SENDS)
def test_dropping_stale_events_changes_no_arrival(sends):
    sends = _linked(sends)
    every, never = _arrivals(sends, 1 << 30)
    compacted, often = _arrivals(sends, 2)
    assert never.compactions == 0 and (often.compactions > 0 or len(sends) < 3)
    assert compacted == every
    assert len(every) == len(sends)


@settings(max_examples=40, deadline=None)
@given(SENDS, st.booleans())
def test_rates_kept_up_to_date_are_the_ones_computed_from_scratch(sends, orbits):
    """Also where each resource stands for its orbit and a switch message counts once for
    each port of an orbit it uses."""
    sends = _linked(sends)
    arrived, net = _arrivals(sends, 1 << 30, _Checked, orbits)
    assert len(arrived) == len(sends)
    assert net.checked > 0 or not any(kind != "put" for _at, kind, *_ in sends)
    if orbits:
        assert all(r[1] == 0 for r in net.capacity)  # only rank 0's resources stand


def test_rank_0_alone_meets_the_load_every_rank_puts_on_its_ports():
    """Every GPU of a node reduces in the switch while sending to the next node: rank 0's two
    messages alone, each resource standing for its orbit, arrive when everyone's do."""
    def run(orbits: bool) -> list[float]:
        net = Network(TOPOLOGY, "Simple", orbits=orbits)
        arrived: list[float] = []
        net.on_arrival = lambda m: arrived.append(net.now) if m.owner[0] == 0 else None
        for a in ([0] if orbits else range(TOPOLOGY.nranks)):
            net.send(net.switch_message((a, "reduce"), "reduce", a, 0, 1 << 20))
            resources, dim, alpha = net.link(a, TOPOLOGY.shift(a, 1, 1))
            net.send(Message((a, "put"), resources, dim, 1 << 21, alpha))
        net.run_until_idle()
        return arrived
    every, alone = run(False), run(True)
    assert alone == pytest.approx(every, rel=1e-12)
    assert len(alone) == 2 and alone[0] < alone[1]
