"""The HiPIPE planner: pipelined hierarchical schedules that keep every dimension busy.

For a topology, collective and size window it builds candidate plans from a few knobs:
the number of chunks K, whether chunk sizes come from the pipeline LP or are uniform,
whether dimension orders are mixed by the order-mixing LP, whether all-gathers run on
their own lane, the protocol and the granularity of chunks. Every candidate is lowered and
simulated; the simulator is the judge (design.md "Optimizer").

>>> from hipipe_compiler.topology import preset
>>> knobs = Knobs(chunks=4, mix=True, ag_lane=True)
>>> plan = build_plan(preset("torus-4x4"), "allreduce", 1 << 20, 1 << 30, knobs)
>>> sorted({c.order for c in plan.chunks})  # two equal dimensions: half the chunks each way
[(0, 1), (1, 0)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import islice
from typing import Iterable, Sequence

from .bounds import lower_bound_us
from .collector import settling
from .lp import StageCost, chunk_sizes, order_mix
from .plan import (
    RING_ALGORITHMS, ChunkPlan, Plan, auto_layouts, bandwidth_order, chunk_stages, default_algorithms, default_schedule,
    needs_both_directions, stage_cost, time_floor_us,
)
from .topology import Topology


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
    algs = default_algorithms(topology)
    if knobs.bidir:
        algs = tuple("bidir" if a == "ring" else a for a in algs)
    if knobs.oneshot and collective == "allreduce":
        algs = tuple("oneshot" for _ in algs)
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
    alpha = max(d.latency for d in topology.dimensions)
    slow = frozenset(a for a, d in enumerate(topology.dimensions) if d.latency == alpha)
    chunks = tuple(ChunkPlan(u, order, d, lane_of[i], _stage_lanes(collective, order, lane_of[i], knobs, nlanes,
                                                                   i // len(dirs), slow))
                   for i, (u, (order, _share, d)) in enumerate(zip(units, pieces)))
    layouts = (tuple("split" for _ in algs) if knobs.split
               else auto_layouts(topology, False, chunks, algs, knobs.protocol, max_bytes))
    plan = Plan(
        topology=topology, collective=collective, chunks=chunks, algorithms=algs, layouts=layouts,
        protocol=knobs.protocol, min_bytes=min_bytes, max_bytes=max_bytes, nominal_bytes=nominal,
        name=f"{collective}-hipipe-{knobs.label}-{topology.label}", label=f"hipipe {knobs.label}",
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


# -- the search ---------------------------------------------------------------------------------

#: Most pipeline chunks per loop iteration the search considers (program size grows with it).
MAX_CHUNKS = 64
#: A window keeps its smaller neighbour's plan when that costs less than this (the two windows
#: then share one program and file when the plan does not depend on the window).
REUSE_TOLERANCE = 0.003
#: From this call size on, candidates use separate send and receive threadblocks everywhere
#: (the same speed, and a program that neighbouring windows can share).
LARGE_WINDOW = 64 << 20
#: Simulations per window for the coordinate descent; bandwidth-bound windows (from
#: BANDWIDTH_WINDOW on) get more on topologies up to BANDWIDTH_RANKS ranks, since balancing
#: every dimension is where the search pays (larger ones cost too much per simulation).
BUDGET = 60
BANDWIDTH_BUDGET = 160
BANDWIDTH_WINDOW = 16 << 20
BANDWIDTH_RANKS = 256
#: Best candidates of the coarse sweep that are also tried with both-way rings on tori.
BIDIR_TRIALS = 6
#: A candidate whose time floor (plan.time_floor_us) is this much above the best simulated
#: time so far is not lowered or simulated: it cannot win, and the margin keeps the near
#: misses that may still rank among the descent's seeds and the finalists.
FLOOR_MARGIN = 0.05


@dataclass(frozen=True)
class Evaluation:
    """One candidate plan and its simulated times at the sizes it was judged at."""

    knobs: Knobs | None
    plan: Plan
    times_us: tuple[float, ...]
    score: float  # mean of T / T_LB over the judged sizes (lower is better)


class Search:
    """Judges candidate plans with the quotient simulator, caching lowered programs."""

    def __init__(self, topology: Topology, collective: str, limits: "Limits | None" = None, dtype_bytes: int = 4) -> None:
        from .runtime import Limits
        self.topology = topology
        self.collective = collective
        self.limits = limits or Limits()
        self.dtype_bytes = dtype_bytes
        self.programs: dict = {}
        self.symmetric: dict = {}
        self.times: dict = {}
        self.evaluations = 0

    def _lowered(self, plan: Plan, baseline: bool) -> "tuple[Program, bool] | None":  # noqa: F821
        """The program to simulate and whether rank 0 alone stands for every rank, or None
        when the plan does not fit the runtime. A flat ring is never the same on every rank;
        a baseline whose ranks differ (see `exact`) is simulated in full, since HiPIPE must
        beat its real time."""
        from .errors import PlanError
        from .lowering import lower
        try:
            if plan.flat:
                return lower(plan, self.limits), False
            rank0 = lower(plan, self.limits, ranks=[0])  # fails fast when the plan does not fit
            if baseline and not self.exact(plan):
                return lower(plan, self.limits), False
            return rank0, True
        except PlanError:
            return None

    def divides(self, plan: Plan, nbytes: int) -> bool:
        """The runtime only runs a program when nchunksperloop divides the element count."""
        return nbytes % (plan.nchunksperloop * self.dtype_bytes) == 0

    def exact(self, plan: Plan) -> bool:
        """Whether rank 0 alone times `plan` exactly: every probe rank runs rank 0's schedule
        shifted. Checked only for candidates that could win."""
        from .errors import PlanError
        from .lowering import lowering_key, same_schedule
        from .simulate import probe_ranks
        if plan.flat:
            return True  # simulated in full
        key = lowering_key(plan)
        if key not in self.symmetric:
            try:
                self.symmetric[key] = same_schedule(plan, probe_ranks(self.topology), self.limits)
            except PlanError:
                self.symmetric[key] = False
        return self.symmetric[key]

    def judge(self, plan: Plan, sizes: Sequence[int], knobs: Knobs | None = None) -> Evaluation | None:
        """Simulate `plan` at each size (rank 0 alone when that is exact); None when the plan
        does not fit the runtime or is not the same on every rank."""
        from .lowering import lowering_key
        from .simulate import SimulationError, simulate
        key = lowering_key(plan)
        if key not in self.programs:
            self.programs[key] = self._lowered(plan, baseline=knobs is None)
        entry = self.programs[key]
        if entry is None:
            return None
        program, quotient = entry
        times = []
        for size in sizes:
            tkey = (key, size)
            if tkey not in self.times:
                self.evaluations += 1
                try:
                    self.times[tkey] = simulate(program, self.topology, size, quotient=quotient).time_us
                except SimulationError:
                    self.times[tkey] = math.inf
            times.append(self.times[tkey])
        score = sum(t / (lower_bound_us(self.topology, self.collective, s) or 1.0) for t, s in zip(times, sizes)) / len(sizes)
        return Evaluation(knobs, plan, tuple(times), score)


def _knob_neighbours(k: Knobs, allreduce: bool, rings: bool) -> list[Knobs]:
    out = []
    for chunks in sorted({max(1, k.chunks // 2), max(1, round(k.chunks * 2 / 3)), min(MAX_CHUNKS, round(k.chunks * 3 / 2)),
                          min(MAX_CHUNKS, k.chunks * 2)}):
        if chunks != k.chunks:
            out.append(replace(k, chunks=chunks))
    out += [replace(k, mix=not k.mix), replace(k, ag_lane=not k.ag_lane), replace(k, lp_sizes=not k.lp_sizes)]
    out += [replace(k, lanes=v) for v in (1, 2, 3) if v != k.lanes]
    out += [replace(k, granularity=v) for v in (1, 4, 8, 16) if v != k.granularity]
    out += [replace(k, ramp=v) for v in (0, 1, 2, 3) if v != k.ramp]
    out += [replace(k, spread=v) for v in (1, 2, 3) if v != k.spread]
    out += [replace(k, protocol=v) for v in ("Simple", "LL128") if v != k.protocol]
    if k.chunks <= 8:
        out.append(replace(k, fan=not k.fan))
    out.append(replace(k, split=not k.split))
    if k.mix:
        out += [replace(k, arrange=v) for v in ("spread", "lanes") if v != k.arrange]
        out += [replace(k, tilt=k.tilt + d) for d in (1, -1, 3, -3)]
    if allreduce:
        out.append(replace(k, oneshot=not k.oneshot))
    if rings:
        out.append(replace(k, bidir=not k.bidir))
    return out


@dataclass(frozen=True)
class Choice:
    """The plan HiPIPE picked for one size window, with what it was judged on, and the next
    best candidates (to fall back on if the chosen plan does not fit every rank)."""

    min_bytes: int
    max_bytes: int
    plan: Plan
    knobs: Knobs | None
    sizes: tuple[int, ...]
    times_us: tuple[float, ...]
    evaluations: int
    alternatives: tuple[Plan, ...] = ()


def judged_sizes(min_bytes: int, max_bytes: int) -> tuple[int, ...]:
    """The sizes a window's candidates are simulated at: its two ends (one when they meet)."""
    return (min_bytes,) if min_bytes == max_bytes else (min_bytes, max_bytes)


def _baselines(topology: Topology, collective: str, lo: int, hi: int, nominal: int) -> list[tuple[Knobs | None, Plan]]:
    """The baselines of bench: hierarchical with 1, 4, 16 uniform chunks, Themis-like, and the
    flat ring last (it is simulated on every rank, so it is judged only if the others leave
    it a chance)."""
    from .plan import hierarchical_plan, ring_plan, themis_plan
    out: list[tuple[Knobs | None, Plan]] = []
    for k in (1, 4, 16):
        out.append((None, hierarchical_plan(topology, collective, k, min_bytes=lo, max_bytes=hi, nominal_bytes=nominal)))
    out.append((None, themis_plan(topology, collective, 16, min_bytes=lo, max_bytes=hi, nominal_bytes=nominal)))
    out.append((None, ring_plan(topology, collective, 1, "Simple", lo, hi, nominal)))
    return out


#: Restricted searches for the ablation of `hipipe bench --ablation`: knob values forced on
#: every candidate, and whether the baselines compete.
ABLATIONS: dict[str, tuple[dict[str, object], bool]] = {
    "hipipe-uniform": ({"lp_sizes": False, "ramp": 0, "mix": False}, False),
    "hipipe-lp-1order": ({"lp_sizes": True, "mix": False}, False),
    "hipipe-lp-mixed": ({"lp_sizes": True, "mix": True}, False),
    "hipipe-fixed-k8": ({"chunks": 8}, False),
}


def optimize_window(search: Search, min_bytes: int, max_bytes: int, seeds: Sequence[Knobs] = (),
                    budget: int | None = None, forced: dict[str, object] | None = None, baselines: bool = True,
                    neighbour: Choice | None = None) -> Choice:
    """The best plan for calls of min_bytes..max_bytes, judged by the simulator.

    Candidates: the baselines; a coarse sweep of chunk counts, plain or with order mixing
    and all-gather lanes, and with one-shot for few chunks; then coordinate descent over
    every knob from the best three, judged at the window's middle. The five best are judged
    again at both ends of the window, and the best mean T / T_LB wins; the `neighbour`
    window's plan wins if it is within REUSE_TOLERANCE of that.
    """
    topo, coll = search.topology, search.collective
    nominal = int(math.sqrt(min_bytes * max_bytes))
    middle = (nominal,)
    if budget is None:
        bandwidth_bound = nominal >= BANDWIDTH_WINDOW and topo.nranks <= BANDWIDTH_RANKS
        budget = BANDWIDTH_BUDGET if bandwidth_bound else BUDGET

    def selectable(plan: Plan) -> bool:
        return search.divides(plan, min_bytes)


    start = search.evaluations
    skipped = 0  # candidates dropped by their time floor: they count toward the budget
    bound = lower_bound_us(topo, coll, nominal) or 1.0
    allreduce = coll == "allreduce"
    def hopeless(plan: Plan, scores: Iterable[float]) -> bool:
        """Whether the plan's time floor already loses to the best of these scores."""
        return time_floor_us(plan, nominal) / bound > min(scores, default=math.inf) * (1 + FLOOR_MARGIN)

    base_evals: list[Evaluation | None] = []
    for knobs, plan in _baselines(topo, coll, min_bytes, max_bytes, nominal):
        if not hopeless(plan, (ev.score for ev in base_evals if ev is not None and selectable(ev.plan))):
            base_evals.append(search.judge(plan, middle, knobs))
    # when no plan that fits can divide the window's smallest size (odd sizes, or a rank count
    # that is not a power of two), divisibility cannot steer the choice
    strict = any(ev is not None and selectable(ev.plan) for ev in base_evals)
    evals: list[Evaluation] = [ev for ev in base_evals if ev is not None and (selectable(ev.plan) or not strict)]
    if not baselines:
        evals = []
    tried: set[Knobs] = set()

    # a chunk whose last-stage messages carry under ~256 bytes per rank only adds latency
    max_chunks = max(1, min(MAX_CHUNKS, nominal // (256 * topo.nranks)))

    def attempt(knobs: Knobs) -> Evaluation | None:
        nonlocal skipped
        if forced:
            knobs = replace(knobs, **forced)  # type: ignore[arg-type]
        if knobs.oneshot and allreduce:
            knobs = replace(knobs, bidir=False)  # one-shot plans run their ring stages both ways anyway
        if knobs in tried or knobs.chunks < 1 or (knobs.chunks > max_chunks and not forced):
            return None
        tried.add(knobs)
        plan = build_plan(topo, coll, min_bytes, max_bytes, knobs, nominal)
        if strict and not selectable(plan):
            return None
        if hopeless(plan, (e.score for e in evals)):
            skipped += 1
            return None
        ev = search.judge(plan, middle, knobs)
        if ev is not None:
            evals.append(ev)
        return ev

    coarse = [Knobs(1), *(Knobs(1, oneshot=True) for _ in [0] if allreduce)]
    large = nominal >= LARGE_WINDOW  # windows whose programs can be made size-independent
    for k in (2, 4, 8, 16, 24, 32, 48, MAX_CHUNKS):
        if k > max_chunks:
            break
        spread = [Knobs(k, mix=True, ag_lane=True, granularity=2, ramp=1, arrange="lanes", spread=v) for v in (2, 3)]
        if k == MAX_CHUNKS:  # the finest pipelines pay only with the slow dimension's latency covered
            coarse += spread
            break
        coarse += [Knobs(k), Knobs(k, ag_lane=True), Knobs(k, mix=True, ag_lane=True),
                   Knobs(k, mix=True, ag_lane=True, granularity=4, ramp=2)]
        if k >= 8:
            coarse.append(Knobs(k, mix=True, ag_lane=True, granularity=8, ramp=2, arrange="lanes", split=large))
            coarse.append(Knobs(k, mix=True, ag_lane=True, granularity=4, ramp=2, lanes=3, split=large))
        if k >= 24:
            coarse += [Knobs(k, mix=True, ag_lane=True, granularity=g, ramp=r, arrange="lanes", split=large)
                       for g, r in ((4, 1), (4, 3), (2, 2), (1, 4))]
            coarse += spread
        if allreduce and k <= 4:
            coarse.append(Knobs(k, ag_lane=True, oneshot=True))
        if k <= 8:
            coarse += [Knobs(k, fan=True), Knobs(k, fan=True, oneshot=allreduce)]
    for knobs in (*seeds, *coarse):
        attempt(knobs)
    rings = "ring" in default_algorithms(topo)
    if rings:  # the best few of the sweep also with both-way rings (or without, for seeds)
        for ev in sorted((e for e in evals if e.knobs is not None), key=lambda e: e.score)[:BIDIR_TRIALS]:
            attempt(replace(ev.knobs, bidir=not ev.knobs.bidir))  # type: ignore[union-attr]
    def exact(ev: Evaluation) -> bool:
        return ev.knobs is None or search.exact(ev.plan)

    seeds_ranked = list(islice((e for e in sorted(evals, key=lambda e: e.score) if e.knobs is not None and exact(e)), 3))

    def spent() -> int:
        return search.evaluations - start + skipped

    for i, seed in enumerate(seeds_ranked):
        best = seed
        improved = True
        until = spent() + (budget - spent()) // (len(seeds_ranked) - i)
        while improved and spent() < until:
            improved = False
            for knobs in _knob_neighbours(best.knobs, allreduce, rings):
                ev = attempt(knobs)
                # rank 0's time steers the descent; only the seeds and finalists must be exact
                # (the check generates the probe ranks' operations, about one more lowering)
                if ev is not None and ev.score < best.score * (1 - 1e-6):
                    best, improved = ev, True
                    break
    sizes = judged_sizes(min_bytes, max_bytes)
    finalists = [search.judge(e.plan, sizes, e.knobs) for e in islice((e for e in sorted(evals, key=lambda e: e.score) if exact(e)), 5)]
    ranked = sorted((f for f in finalists if f is not None), key=lambda e: (e.score, e.knobs is not None))
    best = ranked[0]
    if neighbour is not None and not forced:
        # keep the neighbour's plan (its schedule and chunk sizes too) when it is nearly as
        # good: the windows then share a program if it does not depend on the window
        plan = neighbour.plan.with_window(min_bytes, max_bytes)
        previous = (search.judge(plan, sizes, neighbour.knobs)
                    if (not strict or selectable(plan)) and search.exact(plan) else None)
        if previous is not None and previous.score <= best.score * (1 + REUSE_TOLERANCE):
            ranked.insert(0, previous)
            best = previous
    return Choice(min_bytes, max_bytes, best.plan, best.knobs, sizes, best.times_us, search.evaluations - start,
                  tuple(e.plan for e in ranked[1:]))


def _next_size(search: Search, previous: Choice, lo: int, hi: int) -> Choice | None:
    """A window of the one size just past its neighbour's largest (such as 4GiB after
    1GiB..<4GiB) takes the neighbour's plan: that plan was judged one byte away. None when
    the plan does not fit or divide the size, or the window is wider."""
    if not lo == hi == previous.max_bytes + 1:
        return None
    plan = previous.plan.with_window(lo, hi)
    if not search.divides(plan, lo) or not search.exact(plan):
        return None
    ev = search.judge(plan, (lo,), previous.knobs)
    if ev is None:
        return None
    return Choice(lo, hi, plan, previous.knobs, (lo,), ev.times_us, 0, previous.alternatives)


def optimize(topology: Topology, collective: str, windows: Sequence[tuple[int, int]], limits=None,
             progress=None, dtype_bytes: int = 4) -> list[Choice]:
    """One Choice per window; each window starts from its neighbours' best knobs."""
    search = Search(topology, collective, limits, dtype_bytes)
    out: list[Choice] = []
    with settling() as settle:
        for lo, hi in windows:
            seeds = [c.knobs for c in out[-2:] if c.knobs is not None]
            edge = _next_size(search, out[-1], lo, hi) if out else None
            out.append(edge or optimize_window(search, lo, hi, seeds, neighbour=out[-1] if out else None))
            settle()  # the programs cached so far stay: later collections need not walk them
            if progress is not None:
                progress(out[-1])
    return out
