"""HiPIPE's knobs and the plan each setting describes: the number of chunks K, whether chunk
sizes come from the pipeline LP or are uniform, whether dimension orders are mixed by the
order-mixing LP, lanes, ramps, one-shot and both-way exchanges, the protocol and the
granularity of chunks.

>>> from hipipe_compiler.presets import preset
>>> knobs = Knobs(chunks=4, mix=True, ag_lane=True)
>>> plan = build_plan(preset("torus-4x4"), "allreduce", 1 << 20, 1 << 30, knobs)
>>> sorted({c.order for c in plan.chunks})  # two equal dimensions: half the chunks each way
[(0, 1), (1, 0)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from ..errors import PlanError
from ..schedule.baselines import auto_layouts, bandwidth_order, default_algorithms, needs_both_directions
from ..schedule.estimate import default_schedule, stage_cost
from ..schedule.fold import check_foldable, fold_topology
from ..schedule.plan import RING_ALGORITHMS, ChunkPlan, Plan, chunk_stages
from ..topology import Topology
from .lp import StageCost, chunk_sizes, order_mix


@dataclass(frozen=True)
class Knobs:
    """The decisions that span HiPIPE's search space."""

    chunks: int = 1  # pipeline chunks per loop iteration (each split over both ring directions)
    mix: bool = False  # mix dimension orders by the order-mixing LP
    ag_lane: bool = False  # all-gathers on their own lane
    lp_sizes: bool = False  # chunk sizes from the pipeline LP instead of uniform
    granularity: int = 1  # base units per chunk on average (sets nchunksperloop)
    protocol: str = "Simple"
    lanes: int = 1  # chunks take lanes in turn
    ramp: int = 0  # the first and last `ramp` chunks shrink geometrically (halving), to shorten fill and drain
    oneshot: bool = False  # the last axis all-reduces in one exchange (one latency, more bytes)
    arrange: str = "spread"  # minority orders spread evenly, all at the front or the back, or on lanes of their own
    fan: bool = False  # reduce-scatters take their lane in turn; each chunk's later stages get a lane of their own
    split: bool = False  # separate send and receive threadblocks on every axis: the program then does not
    # depend on the window's largest size, so neighbouring windows can share it
    tilt: int = 0  # units moved from the major order to the next (negative: back): the LP balances an
    # idealised network, the simulator judges the real one
    bidir: bool = False  # rings reduce each block along both directions at once (n // 2 latencies, not n - 1)
    spread: int = 1  # stages on the highest-latency dimension take this many lane groups in turn (chunk by
    # chunk), so more of its messages are in flight to cover the latency of each
    tree: bool = False  # switch dimensions all-reduce over two complementary binary trees (2 log2 n latencies)
    fold: bool = False  # the innermost dimensions act as one switch (schedule/fold.py): one hop instead of several

    @property
    def label(self) -> str:
        parts = [f"k{self.chunks}"]
        if self.mix:
            parts.append("mix")
        if self.lp_sizes:
            parts.append("lp")
        if self.ag_lane:
            parts.append("ag")
        if self.lanes > 1:
            parts.append(f"l{self.lanes}")
        if self.granularity > 1:
            parts.append(f"g{self.granularity}")
        if self.ramp:
            parts.append(f"r{self.ramp}")
        if self.oneshot:
            parts.append("1s")
        if self.arrange != "spread":
            parts.append(self.arrange)
        if self.fan:
            parts.append("fan")
        if self.split:
            parts.append("split")
        if self.tilt:
            parts.append(f"t{self.tilt:+d}")
        if self.bidir:
            parts.append("bd")
        if self.spread > 1:
            parts.append(f"s{self.spread}")
        if self.tree:
            parts.append("tree")
        if self.fold:
            parts.append("fold")
        if self.protocol != "Simple":
            parts.append(self.protocol)
        return "-".join(parts)


def _orders(topology: Topology, collective: str, knobs: Knobs) -> list[tuple[tuple[int, ...], float]]:
    if not knobs.mix or topology.ndims == 1:
        return [(bandwidth_order(topology), 1.0)]
    mix = order_mix(topology, collective, min_fraction=0.5 / max(1, knobs.chunks))
    return sorted(mix.fractions.items(), key=lambda kv: -kv[1])


def _chunk_orders(orders: list[tuple[tuple[int, ...], float]], k: int, arrange: str = "spread"
                  ) -> list[tuple[tuple[int, ...], float]]:
    """k chunks spread over the orders in proportion, minority orders interleaved evenly (or
    all first, or all last). Returns (order, share of the data) per chunk."""
    counts = {o: max(1, round(k * f)) for o, f in orders}
    while sum(counts.values()) > max(k, len(orders)):
        biggest = max(counts, key=lambda o: (counts[o], -orders[[x[0] for x in orders].index(o)][1]))
        counts[biggest] -= 1
    slots = []
    for o, f in orders:
        n = counts[o]
        slots.extend(((i + 0.5) / n, o, f / n) for i in range(n))
    if arrange == "spread":
        slots.sort(key=lambda s: (s[0], s[1]))
    else:
        major = orders[0][0]
        minority_first = arrange == "front"
        slots.sort(key=lambda s: ((s[1] == major) == minority_first, s[0]))
    return [(o, share) for _pos, o, share in slots]


#: Lane numbers of the `spread` groups: group g adds g * SPREAD_STRIDE to a stage's lane.
SPREAD_STRIDE = 1000


def _stage_lanes(collective: str, order: tuple[int, ...], lane: int, knobs: Knobs, nlanes: int,
                 chunk: int, slow: frozenset[int] = frozenset()) -> tuple[int, ...] | None:
    """Which lane runs each stage of a chunk.

    fan: reduce-scatters on the chunk's lane, in turn; the rest of chunk i on lane nlanes + i,
    beside the other chunks' (their latencies overlap). ag_lane: all-gathers on lane + nlanes.
    spread: stages on the `slow` axes move to lane group chunk % spread.
    """
    if not (knobs.fan or knobs.ag_lane or knobs.spread > 1):
        return None  # every stage on the chunk's lane
    stages = chunk_stages(collective, order)
    group = chunk % knobs.spread * SPREAD_STRIDE
    lanes = []
    for st in stages:
        if knobs.fan:
            v = lane if st.kind == "rs" else nlanes + chunk
        else:
            v = lane + nlanes if knobs.ag_lane and st.kind == "ag" else lane
        lanes.append(v + group if st.axis in slow else v)
    return tuple(lanes)


def _ramped(chunks: list[tuple[tuple[int, ...], float]], ramp: int) -> list[tuple[tuple[int, ...], float]]:
    """Halve the share of each chunk per step toward the two ends, keeping every order's total."""
    k = len(chunks)
    if ramp <= 0 or k < 3:
        return chunks
    weights = [min(1.0, 0.5 ** max(0, ramp - i), 0.5 ** max(0, ramp - (k - 1 - i))) for i in range(k)]
    totals: dict[tuple[int, ...], float] = {}
    weighted: dict[tuple[int, ...], float] = {}
    for (order, share), w in zip(chunks, weights):
        totals[order] = totals.get(order, 0.0) + share
        weighted[order] = weighted.get(order, 0.0) + share * w
    return [(order, share * w * totals[order] / weighted[order]) for (order, share), w in zip(chunks, weights)]


def _round_units(shares: Sequence[float], total: int) -> list[int]:
    """Integer units (each >= 1) summing to total, closest to the shares (largest remainder)."""
    n = len(shares)
    total = max(total, n)
    s = sum(shares)
    ideal = [max(1e-9, x) / s * total for x in shares]
    units = [max(1, int(math.floor(v))) for v in ideal]
    while sum(units) > total:
        i = max(range(n), key=lambda j: (units[j] - ideal[j], units[j]))
        if units[i] == 1:
            break
        units[i] -= 1
    while sum(units) < total:
        i = max(range(n), key=lambda j: ideal[j] - units[j])
        units[i] += 1
    return units


def _round_by_order(pieces: Sequence[tuple[tuple[int, ...], float]], total: int, tilt: int = 0) -> list[int]:
    """Integer units per piece (each >= 1, summing to total) that keep every order's share of
    the data as close as the units allow: the order mix balances the dimensions only if its
    fractions survive rounding, so orders are rounded first and their pieces within them.
    `tilt` then moves that many units from the first order to the second."""
    orders = list(dict.fromkeys(order for order, _share in pieces))
    members = {o: [i for i, (order, _s) in enumerate(pieces) if order == o] for o in orders}
    shares = [sum(pieces[i][1] for i in members[o]) for o in orders]
    total = max(total, len(pieces))
    per_order = _round_units(shares, total)
    if tilt and len(orders) > 1:
        per_order[0] -= tilt
        per_order[1] += tilt
    # every piece needs a unit: an order with more pieces than units borrows from the largest
    for j, o in enumerate(orders):
        while per_order[j] < len(members[o]):
            donor = max(range(len(orders)), key=lambda i: per_order[i] - len(members[orders[i]]))
            per_order[donor] -= 1
            per_order[j] += 1
    units = [0] * len(pieces)
    for j, o in enumerate(orders):
        for i, u in zip(members[o], _round_units([pieces[i][1] for i in members[o]], per_order[j])):
            units[i] = u
    return units


def build_plan(topology: Topology, collective: str, min_bytes: int, max_bytes: int, knobs: Knobs,
               nominal_bytes: int | None = None) -> Plan:
    """The plan a set of knobs describes, for calls of min_bytes..max_bytes."""
    nominal = nominal_bytes or max_bytes
    radices: tuple[int, ...] = ()
    if knobs.fold:
        check_foldable(collective)
        try:
            topology, radices = fold_topology(topology)
        except ValueError as e:
            raise PlanError(str(e)) from None
    algs = default_algorithms(topology)
    if knobs.bidir:
        algs = tuple("bidir" if a == "ring" else a for a in algs)
    if knobs.oneshot and collective == "allreduce":
        algs = tuple("oneshot" for _ in algs)
    elif knobs.tree and collective == "allreduce":
        algs = tuple("tree" if d.kind == "switch" and d.size > 2 else a for d, a in zip(topology.dimensions, algs))
    if radices and algs[0] != "oneshot":
        algs = ("direct", *algs[1:])  # a folded axis exchanges directly: its ranks are no one ring
    dirs = (1, -1) if needs_both_directions(topology, False, algs) else (1,)
    per_chunk = _ramped(_chunk_orders(_orders(topology, collective, knobs), knobs.chunks, knobs.arrange), knobs.ramp)
    pieces = [(order, share / len(dirs), d) for order, share in per_chunk for d in dirs]
    # a power of two, so that nchunksperloop divides the power-of-two sizes calls are made with
    total_units = 1 << max(0, (len(pieces) * max(1, knobs.granularity) - 1).bit_length())
    if knobs.arrange == "lanes":
        # each order on lanes of its own: every order's pipeline runs start to end side by side
        distinct = list(dict.fromkeys(order for order, _share, _d in pieces))
        seen: dict[tuple[int, ...], int] = {}
        lane_of = []
        for order, _share, _d in pieces:
            i = seen.get(order, 0)
            seen[order] = i + 1
            lane_of.append(distinct.index(order) * knobs.lanes + (i // len(dirs)) % knobs.lanes)
        nlanes = len(distinct) * knobs.lanes
    else:
        lane_of = [i // len(dirs) % knobs.lanes for i in range(len(pieces))]
        nlanes = knobs.lanes
    units = _round_by_order([(order, share) for order, share, _d in pieces], total_units, knobs.tilt)
    alpha = max(d.alpha(knobs.protocol) for d in topology.dimensions)
    slow = frozenset(a for a, d in enumerate(topology.dimensions) if d.alpha(knobs.protocol) == alpha)
    chunks = tuple(ChunkPlan(u, order, d, lane_of[i], _stage_lanes(collective, order, lane_of[i], knobs, nlanes,
                                                                   i // len(dirs), slow))
                   for i, (u, (order, _share, d)) in enumerate(zip(units, pieces)))
    layouts = (tuple("split" for _ in algs) if knobs.split
               else auto_layouts(topology, False, chunks, algs, knobs.protocol, max_bytes))
    plan = Plan(
        topology=topology, collective=collective, chunks=chunks, algorithms=algs, layouts=layouts,
        protocol=knobs.protocol, min_bytes=min_bytes, max_bytes=max_bytes, nominal_bytes=nominal,
        name=f"{collective}-hipipe-{knobs.label}-{topology.label}", label=f"hipipe {knobs.label}", fold=radices,
    )
    if knobs.lp_sizes and len(chunks) > 1:
        plan = lp_resize(plan, total_units, nominal)
    return replace(plan, schedule=default_schedule(plan))


def lp_resize(plan: Plan, total_units: int, nbytes: float, rounds: int = 3) -> Plan:
    """Resize chunks with the pipeline LP, keeping each resource's order of operations from
    the list schedule of the current sizes; repeat a few times (algorithms.md 4.2)."""
    for _ in range(rounds):
        sched = default_schedule(plan)
        stages = []
        for k, c in enumerate(plan.chunks):
            row = []
            x_k = nbytes * c.units / plan.units
            for j, st in enumerate(plan.stages(k)):
                a = stage_cost(plan, k, st, 0.0)  # the latencies alone: the estimate is affine in the bytes
                b = max(0.0, stage_cost(plan, k, st, nbytes) - a) / x_k
                # the physical resource: lanes of one dimension share its ports or links
                resource = (st.axis, c.direction if plan.algorithms[st.axis] in RING_ALGORITHMS else 0)
                row.append(StageCost(resource, a, b))
            stages.append(row)
        sequence: dict = {}
        for k, j in sched:
            sequence.setdefault(stages[k][j].resource, []).append((k, j))
        sizes, _makespan = chunk_sizes(stages, sequence, float(nbytes), min_size=0.0)
        units = _round_units([max(s, 1e-6) for s in sizes], total_units)
        new = replace(plan, chunks=tuple(replace(c, units=u) for c, u in zip(plan.chunks, units)), schedule=())
        if new == plan:
            break
        plan = new
    return plan
