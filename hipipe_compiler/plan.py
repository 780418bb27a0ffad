"""Plans: what a schedule decides, independent of MSCCL (design.md "Plan").

A plan splits the data of one loop iteration into pipeline chunks. Each chunk has a size
(in units of one cell per rank), its own dimension order (reduce-scatter down that order,
all-gather back up), a ring direction and a lane. Chunks on one lane share threadblocks and
pass through each dimension one after another, in the plan's schedule order; lanes run side
by side. The baselines of algorithms.md section 5 are plans built here.

>>> from hipipe_compiler.topology import preset
>>> plan = hierarchical_plan(preset("dgx-h100-8x4"), "allreduce", chunks=2, nominal_bytes=1 << 28)
>>> [c.order for c in plan.chunks], plan.algorithms
([(0, 1), (0, 1)], ('direct', 'direct'))
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Iterable, Literal, Sequence

from .errors import InputError, PlanError
from .program import PLANNED_COLLECTIVES, PROTOCOLS
from .runtime import WIRE_EFFICIENCY, piece_count
from .topology import Topology

Algorithm = Literal["ring", "bidir", "direct", "oneshot"]
#: Algorithms inside one axis: a ring (n-1 steps), a ring run both ways at once (each block
#: reduced along two chains that meet at its owner: n // 2 steps, the same bytes per link),
#: direct exchange with every peer (one step per reduce-scatter or all-gather), or one-shot
#: (the last axis's reduce-scatter and all-gather replaced by sending the whole block to every
#: peer: one latency, n-1 times the bytes).
ALGORITHMS: tuple[str, ...] = ("ring", "bidir", "direct", "oneshot")
#: Algorithms that move data around a ring, one neighbour at a time.
RING_ALGORITHMS: tuple[str, ...] = ("ring", "bidir")
Layout = Literal["fused", "split"]

#: Switch dimensions up to this size use direct exchange by default; larger ones a ring.
DIRECT_MAX_SIZE = 16


@dataclass(frozen=True)
class ChunkPlan:
    """One pipeline chunk: `units` cells per rank, its axis order, ring direction and lane.

    `stage_lanes`, when given, names the lane of each of the chunk's stages instead: for
    example all-gathers on their own lane, so a dimension keeps reduce-scattering later data
    while earlier data waits to be gathered, or pieces that take one dimension in turn but
    another side by side.
    """

    units: int
    order: tuple[int, ...]
    direction: int = 1
    lane: int = 0
    stage_lanes: tuple[int, ...] | None = None

    def lane_of(self, stage_index: int) -> int:
        """The lane whose threadblocks run stage `stage_index` of this chunk."""
        return self.stage_lanes[stage_index] if self.stage_lanes is not None else self.lane


@dataclass(frozen=True)
class Stage:
    """One step of a chunk's journey: a reduce-scatter, all-gather, or both (`ar`) on an axis."""

    kind: Literal["rs", "ag", "ar"]
    axis: int
    depth: int  # position of the axis in the chunk's order: the data holds 1 / prod(sizes before)


@dataclass(frozen=True)
class Plan:
    """A complete schedule decision for one collective, topology and size window.

    `flat` plans use one ring through every rank (Topology.ring_order) as their single axis;
    otherwise axis d is topology dimension d. `schedule` lists (chunk, stage) pairs in the
    order lowering emits them; empty means `default_schedule`.
    """

    topology: Topology
    collective: str
    chunks: tuple[ChunkPlan, ...]
    algorithms: tuple[str, ...]
    layouts: tuple[str, ...]
    protocol: str = "Simple"
    flat: bool = False
    schedule: tuple[tuple[int, int], ...] = ()
    min_bytes: int = 0
    max_bytes: int = 0
    nominal_bytes: int = 0
    name: str = ""
    label: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def naxes(self) -> int:
        return 1 if self.flat else self.topology.ndims

    def axis_size(self, axis: int) -> int:
        return self.topology.nranks if self.flat else self.topology.dimensions[axis].size

    @cached_property
    def units(self) -> int:
        """Cells per rank in one loop iteration: the sum of the chunks' units."""
        return sum(c.units for c in self.chunks)

    @property
    def nchunksperloop(self) -> int:
        return self.units * self.topology.nranks

    def stages(self, k: int) -> tuple[Stage, ...]:
        """The stages chunk k passes through, in order."""
        return chunk_stages(self.collective, self.chunks[k].order)

    def events(self) -> tuple[tuple[int, int], ...]:
        """(chunk, stage index) pairs in emission order."""
        return self.schedule or default_schedule(self)

    def with_window(self, min_bytes: int, max_bytes: int) -> "Plan":
        return replace(self, min_bytes=min_bytes, max_bytes=max_bytes)


def chunk_stages(collective: str, order: Sequence[int]) -> tuple[Stage, ...]:
    """Reduce-scatter down `order`, all-gather back up; the last axis fuses both for allreduce."""
    return _chunk_stages(collective, tuple(order))


@lru_cache(maxsize=4096)
def _chunk_stages(collective: str, order: tuple[int, ...]) -> tuple[Stage, ...]:
    d = len(order)
    if collective == "allreduce":
        rs = [Stage("rs", a, i) for i, a in enumerate(order[:-1])]
        return (*rs, Stage("ar", order[-1], d - 1), *(Stage("ag", order[i], i) for i in range(d - 2, -1, -1)))
    if collective == "reducescatter":
        return tuple(Stage("rs", a, i) for i, a in enumerate(order))
    if collective == "allgather":
        return tuple(Stage("ag", order[i], i) for i in range(d - 1, -1, -1))
    raise InputError(None, "collective", f"expected one of {', '.join(PLANNED_COLLECTIVES)}, got {collective!r}")


# -- checks ---------------------------------------------------------------------------------


def check_plan(plan: Plan) -> None:
    """Raise PlanError if the plan is not well formed for its topology."""
    if plan.collective not in PLANNED_COLLECTIVES:
        raise PlanError(f"cannot plan collective {plan.collective!r}; expected one of {', '.join(PLANNED_COLLECTIVES)}")
    if plan.protocol not in PROTOCOLS:
        raise PlanError(f"unknown protocol {plan.protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    if not plan.chunks:
        raise PlanError("a plan needs at least one chunk")
    naxes = plan.naxes
    if len(plan.algorithms) != naxes or len(plan.layouts) != naxes:
        raise PlanError(f"expected one algorithm and one layout per axis ({naxes})")
    for a in range(naxes):
        alg, lay = plan.algorithms[a], plan.layouts[a]
        if alg not in ALGORITHMS:
            raise PlanError(f"axis {a}: unknown algorithm {alg!r}; expected one of {', '.join(ALGORITHMS)}")
        if lay not in ("fused", "split"):
            raise PlanError(f"axis {a}: unknown layout {lay!r}")
        if alg == "direct" and plan.axis_size(a) > 2:
            if plan.flat or plan.topology.dimensions[a].kind == "ring":
                raise PlanError(f"axis {a}: direct exchange needs a switch dimension; a ring only links neighbours")
        if alg == "oneshot" and plan.flat:
            raise PlanError("a flat ring has no one-shot exchange")
        if alg == "oneshot" and plan.collective != "allreduce":
            raise PlanError(f"axis {a}: one-shot exchange is an all-reduce of the last axis; {plan.collective} has none")
    for k, c in enumerate(plan.chunks):
        if c.units < 1:
            raise PlanError(f"chunk {k}: units must be >= 1")
        if sorted(c.order) != list(range(naxes)):
            raise PlanError(f"chunk {k}: order {c.order} must list every axis 0..{naxes - 1} once")
        if c.direction not in (1, -1):
            raise PlanError(f"chunk {k}: direction must be +1 or -1")
        if c.lane < 0 or (c.stage_lanes is not None and min(c.stage_lanes, default=0) < 0):
            raise PlanError(f"chunk {k}: lanes must be >= 0")
        if c.stage_lanes is not None and len(c.stage_lanes) != len(plan.stages(k)):
            raise PlanError(f"chunk {k}: stage_lanes needs one lane per stage ({len(plan.stages(k))})")
    if plan.schedule:
        seen = sorted(plan.schedule)
        want = sorted((k, j) for k in range(len(plan.chunks)) for j in range(len(plan.stages(k))))
        if seen != want:
            raise PlanError("the schedule must list every (chunk, stage) pair exactly once")
        pos = {e: i for i, e in enumerate(plan.schedule)}
        for k in range(len(plan.chunks)):
            for j in range(1, len(plan.stages(k))):
                if pos[(k, j)] < pos[(k, j - 1)]:
                    raise PlanError(f"the schedule runs stage {j} of chunk {k} before stage {j - 1}")


# -- the default operation order --------------------------------------------------------------


def ring_axis(plan: Plan, axis: int) -> bool:
    """Whether an axis is a ring of more than two ranks (two ranks are one link either way)."""
    return plan.axis_size(axis) > 2 and (plan.flat or plan.topology.dimensions[axis].kind == "ring")


def stage_algorithm(plan: Plan, stage: Stage) -> str:
    """How a stage runs: its axis's algorithm, except that an axis of two ranks is one direct
    exchange, and a one-shot axis runs only its all-reduce stage in one shot (its other
    stages run as both-way rings, or directly on a switch)."""
    alg = plan.algorithms[stage.axis]
    if alg == "oneshot":
        return "oneshot" if stage.kind == "ar" else ("bidir" if ring_axis(plan, stage.axis) else "direct")
    return alg if plan.axis_size(stage.axis) > 2 else "direct"


def stage_bytes(plan: Plan, k: int, stage: Stage, nbytes: float) -> float:
    """The bytes per rank a stage of chunk k works on: the chunk's share of the call, divided
    by the sizes of the axes it has already reduce-scattered over."""
    chunk = plan.chunks[k]
    data = nbytes * (chunk.units / plan.units)
    for a in chunk.order[: stage.depth]:
        data /= plan.axis_size(a)
    return data


def stage_cost(plan: Plan, k: int, stage: Stage, nbytes: float) -> float:
    """alpha-beta estimate (microseconds) of one stage of chunk k when the call moves nbytes."""
    data = stage_bytes(plan, k, stage, nbytes)
    n = plan.axis_size(stage.axis)
    if plan.flat:
        alpha = max(d.latency for d in plan.topology.dimensions)
        bw = min(d.bandwidth / (2 if d.uses_both_directions else 1) for d in plan.topology.dimensions)
    else:
        dim = plan.topology.dimensions[stage.axis]
        alpha = dim.latency
        bw = dim.bandwidth / (2 if dim.uses_both_directions else 1)
    bpus = bw * 1e3  # bytes per microsecond
    alg = stage_algorithm(plan, stage)
    if alg == "oneshot":
        # switch: one exchange; ring: n // 2 flooding rounds, each link carrying half the copies
        return (n // 2 if ring_axis(plan, stage.axis) else 1) * alpha + (n - 1) * data / bpus
    if alg == "ring":
        one = (n - 1) * (alpha + data / n / bpus)
    elif alg == "bidir":  # the longer chain's latencies; the two directions' links share the bytes
        one = n // 2 * alpha + (n - 1) * data / n / bpus
    else:
        one = alpha + (n - 1) / n * data / bpus
    return 2 * one if stage.kind == "ar" else one


def time_floor_us(plan: Plan, nbytes: float) -> float:
    """A time no run of `plan` at nbytes can beat: the larger of its busiest dimension's wire
    bytes per rank over that dimension's bandwidth, and its longest chain of message
    latencies (every byte of a chunk passes its stages one after another). The optimizer
    skips a candidate whose floor already loses to the best plan it has simulated.

    >>> from hipipe_compiler.topology import preset
    >>> plan = hierarchical_plan(preset("torus-4x4"), chunks=2, nominal_bytes=1 << 30)
    >>> round(time_floor_us(plan, 1 << 30), 1)  # 3/4 of the call twice through x, at 100 GB/s
    16106.1
    """
    topo = plan.topology
    # a flat ring's links lie in any dimension: it gets the fastest latency and all of them
    alphas = [min(d.latency for d in topo.dimensions)] if plan.flat else [d.latency for d in topo.dimensions]
    capacity = [sum(d.bandwidth for d in topo.dimensions)] if plan.flat else [d.bandwidth for d in topo.dimensions]
    wire = [0.0] * len(capacity)
    chain = 0.0
    for k in range(len(plan.chunks)):
        path = 0.0
        for st in plan.stages(k):
            data = stage_bytes(plan, k, st, nbytes)
            n = plan.axis_size(st.axis)
            alg = stage_algorithm(plan, st)
            if alg == "oneshot":  # every rank's block reaches n - 1 peers
                sent, hops = (n - 1) * data, (n // 2 if ring_axis(plan, st.axis) else 1)
            else:
                passes = 2 if st.kind == "ar" else 1
                sent, hops = passes * (n - 1) / n * data, passes * {"ring": n - 1, "bidir": n // 2}.get(alg, 1)
            wire[st.axis] += sent / WIRE_EFFICIENCY[plan.protocol]
            path += hops * alphas[st.axis]
        chain = max(chain, path)
    load = max(b / (c * 1e3) for b, c in zip(wire, capacity))
    return max(load, chain)


def default_schedule(plan: Plan) -> tuple[tuple[int, int], ...]:
    """A list schedule of all stages over the axes, later stages first (drain first).

    Each (axis, lane, ring direction) is one queue; a stage becomes ready when the chunk's
    previous stage ends. The start order of the simulated list schedule is the emission
    order, so every threadblock receives its work in the order it can run it.
    """
    nbytes = float(plan.nominal_bytes or plan.max_bytes or (1 << 20))
    nchunks = len(plan.chunks)
    stages = [plan.stages(k) for k in range(nchunks)]

    def resource(k: int, j: int) -> tuple[int, int, int]:
        c = plan.chunks[k]
        st = stages[k][j]
        ring_dir = c.direction if plan.algorithms[st.axis] in RING_ALGORITHMS else 0
        return (st.axis, c.lane_of(j), ring_dir)

    # per resource: stages not ready yet (by ready time) and stages ready once it is free
    # (later stages first, then lower chunks)
    free: dict[tuple[int, int, int], float] = {}
    pending: dict[tuple[int, int, int], list[tuple[float, int, int]]] = {}
    waiting: dict[tuple[int, int, int], list[tuple[int, int, float]]] = {}

    def add(res: tuple[int, int, int], ready: float, j: int, k: int) -> None:
        if ready <= free.get(res, 0.0):
            heapq.heappush(waiting.setdefault(res, []), (-j, k, ready))
        else:
            heapq.heappush(pending.setdefault(res, []), (ready, -j, k))

    def head(res: tuple[int, int, int]) -> tuple[float, int, int] | None:
        """The (start, -stage, chunk) of the stage res runs next, if any."""
        f = free.get(res, 0.0)
        if waiting.get(res):
            negj, k, _ready = waiting[res][0]
            return (f, negj, k)
        if pending.get(res):
            ready, negj, k = pending[res][0]
            return (max(ready, f), negj, k)
        return None

    # candidates: (head, resource), pushed whenever a resource's head may have changed; an
    # entry whose head is no longer the resource's is stale (heads are unique: a stage
    # belongs to one resource)
    heap: list[tuple[tuple[float, int, int], tuple[int, int, int]]] = []

    def offer(res: tuple[int, int, int]) -> None:
        key = head(res)
        if key is not None:
            heapq.heappush(heap, (key, res))

    for k in range(nchunks):
        add(resource(k, 0), 0.0, 0, k)
    for res in set(pending) | set(waiting):
        offer(res)
    out: list[tuple[int, int]] = []
    while heap:
        key, res = heapq.heappop(heap)
        if head(res) != key:
            continue
        start, negj, k = key
        if waiting.get(res) and waiting[res][0][:2] == (negj, k):
            heapq.heappop(waiting[res])
        else:
            heapq.heappop(pending[res])
        j = -negj
        end = start + stage_cost(plan, k, stages[k][j], nbytes)
        free[res] = end
        # stages that were waiting for this resource to become free at `end` or earlier
        while pending.get(res) and pending[res][0][0] <= end:
            ready, nj, kk = heapq.heappop(pending[res])
            heapq.heappush(waiting.setdefault(res, []), (nj, kk, ready))
        out.append((k, j))
        offer(res)
        if j + 1 < len(stages[k]):
            nxt = resource(k, j + 1)
            add(nxt, end, j + 1, k)
            offer(nxt)
    return tuple(out)


# -- builders (baselines) -------------------------------------------------------------------


def default_algorithms(topology: Topology, flat: bool = False) -> tuple[str, ...]:
    """Ring inside ring dimensions; direct exchange inside switch dimensions up to DIRECT_MAX_SIZE."""
    if flat:
        return ("ring",) if topology.nranks > 2 else ("direct",)
    return tuple(
        "direct" if d.size == 2 or (d.kind == "switch" and d.size <= DIRECT_MAX_SIZE) else "ring"
        for d in topology.dimensions
    )


def largest_blocks(topology: Topology, flat: bool, chunks: Sequence[ChunkPlan], algorithms: Sequence[str]) -> list[int]:
    """Per axis, the most cells a rank sends in one message of it when nothing is cut: a
    chunk's block at that depth (one-shot: the whole owned range)."""
    size = (lambda a: topology.nranks) if flat else (lambda a: topology.dimensions[a].size)
    largest = [0] * (1 if flat else topology.ndims)
    for c in chunks:
        for depth, a in enumerate(c.order):
            cells = c.units * math.prod(size(b) for b in c.order[depth + 1:])
            if algorithms[a] == "oneshot" and depth == len(c.order) - 1:
                cells *= size(a)  # the whole owned range goes in one message
            largest[a] = max(largest[a], cells)
    return largest


def auto_layouts(topology: Topology, flat: bool, chunks: Sequence[ChunkPlan], algorithms: Sequence[str],
                 protocol: str, max_bytes: int) -> tuple[str, ...]:
    """Fused threadblocks per axis unless the deadlock-safe piece limit would shred its blocks.

    A fused threadblock sends before it receives, so at the window's largest size each such
    send must fit the connection FIFO (runtime.piece_count). When an axis's blocks are larger
    than that, separate send and receive threadblocks ("split") move them in full steps.
    """
    naxes = 1 if flat else topology.ndims
    size = (lambda a: topology.nranks) if flat else (lambda a: topology.dimensions[a].size)
    nch = sum(c.units for c in chunks) * topology.nranks
    largest = largest_blocks(topology, flat, chunks, algorithms)
    out = []
    for a in range(naxes):
        limit = piece_count(protocol, max_bytes, nch, ring=algorithms[a] in RING_ALGORITHMS and size(a) > 2)
        out.append("fused" if largest[a] <= limit else "split")
    return tuple(out)


def bandwidth_order(topology: Topology) -> tuple[int, ...]:
    """Dimensions fastest first (ties: innermost first): the conventional hierarchical order."""
    return tuple(sorted(range(topology.ndims), key=lambda d: (-topology.dimensions[d].bandwidth, d)))


def needs_both_directions(topology: Topology, flat: bool, algorithms: Sequence[str]) -> bool:
    """Whether chunks come in pairs, one per ring direction: some ring of more than two ranks
    runs a ring algorithm, or one-shot (whose other stages run as rings); a flat ring uses
    one direction."""
    if flat:
        return False
    return any(d.uses_both_directions and alg in (*RING_ALGORITHMS, "oneshot") for d, alg in zip(topology.dimensions, algorithms))


def uniform_chunks(k: int, orders: Sequence[tuple[int, ...]], both_directions: bool, lanes: int = 1) -> tuple[ChunkPlan, ...]:
    """k chunks of one unit each (two halves, one per ring direction, when rings are present)."""
    chunks = []
    for i in range(k):
        order = tuple(orders[i % len(orders)])
        lane = i % lanes
        if both_directions:
            chunks.append(ChunkPlan(1, order, 1, lane))
            chunks.append(ChunkPlan(1, order, -1, lane))
        else:
            chunks.append(ChunkPlan(1, order, 1, lane))
    return tuple(chunks)


def hierarchical_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 1,
    protocol: str = "Simple",
    orders: Iterable[tuple[int, ...]] | None = None,
    algorithms: Sequence[str] | None = None,
    layouts: Sequence[str] | None = None,
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    lanes: int = 1,
    label: str = "",
) -> Plan:
    """Reduce-scatter down the dimensions, all-gather back up, with `chunks` uniform chunks.

    One chunk is the unpipelined hierarchical baseline; more chunks pipeline through the
    dimensions. Without `orders`, every chunk goes fastest dimension first.
    """
    if chunks < 1:
        raise InputError(None, "chunks", f"expected an integer >= 1, got {chunks}")
    algs = tuple(algorithms) if algorithms is not None else default_algorithms(topology)
    order_list = list(orders) if orders is not None else [bandwidth_order(topology)]
    plan_chunks = uniform_chunks(chunks, order_list, needs_both_directions(topology, False, algs), lanes)
    lays = tuple(layouts) if layouts is not None else auto_layouts(topology, False, plan_chunks, algs, protocol, max_bytes)
    plan = Plan(
        topology=topology, collective=collective, chunks=plan_chunks, algorithms=algs, layouts=lays, protocol=protocol, min_bytes=min_bytes, max_bytes=max_bytes,
        nominal_bytes=nominal_bytes or max_bytes,
        label=label or ("hierarchical" if chunks == 1 else f"hierarchical-k{chunks}"),
        name=f"{collective}-hierarchical-k{chunks}-{topology.label}",
    )
    check_plan(plan)
    return plan


def ring_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 1,
    protocol: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    label: str = "",
) -> Plan:
    """One ring through every rank (the NCCL-style flat ring), with `chunks` pipelined chunks."""
    if chunks < 1:
        raise InputError(None, "chunks", f"expected an integer >= 1, got {chunks}")
    algs = default_algorithms(topology, flat=True)
    plan_chunks = tuple(ChunkPlan(1, (0,), 1, 0) for _ in range(chunks))
    plan = Plan(
        topology=topology, collective=collective, chunks=plan_chunks, algorithms=algs,
        layouts=auto_layouts(topology, True, plan_chunks, algs, protocol, max_bytes), protocol=protocol, flat=True,
        min_bytes=min_bytes, max_bytes=max_bytes, nominal_bytes=nominal_bytes or max_bytes,
        label=label or ("ring" if chunks == 1 else f"ring-k{chunks}"),
        name=f"{collective}-ring-k{chunks}-{topology.label}",
    )
    check_plan(plan)
    return plan


def themis_orders(topology: Topology, chunks: int, chunk_bytes: float) -> list[tuple[int, ...]]:
    """Themis' OfflineGreedy dimension orders (algorithms.md 5.3), one per chunk.

    Each chunk reduce-scatters through the dimensions in ascending accumulated load, so the
    least loaded dimension carries the most data; loads are times normalised to dimension
    0's bandwidth. When the load gap is below 1/16 of a chunk, the default order is kept.
    """
    dims = topology.dimensions
    load = [0.0] * len(dims)
    default = tuple(range(len(dims)))
    orders = []
    for _ in range(chunks):
        gap_bytes = (max(load) - min(load)) * dims[0].bandwidth * 1e3
        order = default if gap_bytes < chunk_bytes / 16 else tuple(sorted(range(len(dims)), key=lambda d: (load[d], d)))
        size = chunk_bytes
        for d in order:
            n = dims[d].size
            load[d] += size * (n - 1) / n / (dims[d].bandwidth / dims[0].bandwidth) / (dims[0].bandwidth * 1e3)
            size /= n
        orders.append(order)
    return orders


def themis_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 16,
    protocol: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    label: str = "",
) -> Plan:
    """Themis-like: uniform chunks, each with its dimension order chosen greedily by load."""
    nbytes = nominal_bytes or max_bytes or (1 << 20)
    orders = themis_orders(topology, chunks, nbytes / chunks)
    plan = hierarchical_plan(topology, collective, chunks, protocol, orders=orders, min_bytes=min_bytes,
                             max_bytes=max_bytes, nominal_bytes=nbytes, label=label or f"themis-k{chunks}")
    return replace(plan, name=f"{collective}-themis-k{chunks}-{topology.label}")
