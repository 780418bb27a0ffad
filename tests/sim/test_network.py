"""The network's event queue: dropping stale events (compaction) is exact, and the rates kept
up to date event by event are the ones computed from scratch."""

from __future__ import annotations

import heapq

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
                assert m.rate == m.scale * min(self.capacity[r] / len(self.active[r]) for r in m.resources)
                self.checked += 1


#: messages put on the network: (when, put or switch reduce or store, from, to, bytes)
SENDS = st.lists(st.tuples(st.floats(0, 50), st.sampled_from(["put", "reduce", "store"]), st.integers(0, 11),
                           st.integers(0, 11), st.integers(1, 1 << 22)), min_size=1, max_size=40)


def _linked(sends: list[tuple]) -> list[tuple]:
    """The sends with a peer other than the sender, and puts only where there is a link."""
    sends = [(at, kind, a, b if b != a else (a + 1) % 12, n) for at, kind, a, b, n in sends]
    return [s for s in sends if s[1] != "put" or TOPOLOGY.link_resources(s[2], s[3]) is not None]


def _arrivals(sends: list[tuple], floor: int, network: type[_Counting] = _Counting) -> tuple[list[tuple], _Counting]:
    """Every message's arrival time when `sends` are put on the network at their times, and
    the network (how often it compacted its queue, what it checked)."""
    net = network(TOPOLOGY, "Simple")
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
@given(SENDS)
def test_rates_kept_up_to_date_are_the_ones_computed_from_scratch(sends):
    sends = _linked(sends)
    arrived, net = _arrivals(sends, 1 << 30, _Checked)
    assert len(arrived) == len(sends)
    assert net.checked > 0 or not any(kind != "put" for _at, kind, *_ in sends)
