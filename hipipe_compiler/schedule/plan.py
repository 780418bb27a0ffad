"""Plans: what a schedule decides, independent of MSCCL (design.md "Plan").

A plan splits the data of one loop iteration into pipeline chunks. Each chunk has a size
(in units of one cell per rank), its own dimension order (reduce-scatter down that order,
all-gather back up), a ring direction and a lane. Chunks on one lane share threadblocks and
pass through each dimension one after another, in the plan's schedule order; lanes run side
by side. The baselines of algorithms.md section 5 are plans too (baselines.py).

>>> from hipipe_compiler.presets import preset
>>> topo = preset("torus-4x4")
>>> plan = Plan(topo, "allreduce", (ChunkPlan(1, (0, 1), 1), ChunkPlan(1, (1, 0), -1)), ("ring", "ring"),
...             ("fused", "fused"))
>>> check_plan(plan)
>>> [(s.kind, s.axis) for s in plan.stages(1)], plan.nchunksperloop
([('rs', 1), ('ar', 0), ('ag', 1)], 32)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Literal, Sequence

from ..errors import InputError, PlanError
from ..msccl.program import PLANNED_COLLECTIVES, PROTOCOLS
from ..topology import Topology
from .fold import check_foldable

Algorithm = Literal["ring", "bidir", "direct", "oneshot", "tree"]
#: Algorithms inside one axis: a ring (n-1 steps), a ring run both ways at once (each block
#: reduced along two chains that meet at its owner: n // 2 steps, the same bytes per link),
#: direct exchange with every peer (one step per reduce-scatter or all-gather), or one-shot
#: (the last axis's reduce-scatter and all-gather replaced by sending the whole block to every
#: peer: one latency, n-1 times the bytes), or tree (the last axis's all-reduce as a reduce up
#: a binary tree and a broadcast back down, the two ring directions' chunks on complementary
#: trees: 2 log2(n) latencies; on a flat plan NCCL's own chain-and-double-binary-tree).
ALGORITHMS: tuple[str, ...] = ("ring", "bidir", "direct", "oneshot", "tree")
#: Algorithms that run only an all-reduce stage their own way (their axis's other stages run
#: as both-way rings, or directly on a switch).
ALLREDUCE_ONLY: tuple[str, ...] = ("oneshot", "tree")
#: Algorithms that move data around a ring, one neighbour at a time.
RING_ALGORITHMS: tuple[str, ...] = ("ring", "bidir")
Layout = Literal["fused", "split"]


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
    order lowering emits them; empty means the default list schedule (estimate.events).
    An all-reduce plan with `fold` is made for the network's innermost dimensions folded into
    one switch (fold.py): its `topology` is the folded one, and axis 0 exchanges directly.
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
    fold: tuple[int, ...] = ()  # axis 0 folds the network's innermost dimensions of these sizes (fold.py)

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
        if alg in ALLREDUCE_ONLY and plan.collective != "allreduce":
            raise PlanError(f"axis {a}: {alg} is an all-reduce of the last axis; {plan.collective} has none")
        if alg == "tree" and not plan.flat and plan.axis_size(a) > 3 and plan.topology.dimensions[a].kind == "ring":
            raise PlanError(f"axis {a}: a tree needs a switch dimension; a ring only links neighbours")
    if plan.fold:
        check_foldable(plan.collective)
        if plan.flat or math.prod(plan.fold) != plan.axis_size(0):
            raise PlanError(f"axis 0 folds dimensions of sizes {plan.fold}; it has {plan.axis_size(0)} ranks")
        if plan.algorithms[0] not in ("direct", "oneshot"):
            raise PlanError(f"axis 0 folds dimensions: it needs direct or one-shot exchange, not {plan.algorithms[0]}")
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


# -- stages ---------------------------------------------------------------------------------


def ring_axis(plan: Plan, axis: int) -> bool:
    """Whether an axis is a ring of more than two ranks (two ranks are one link either way)."""
    return plan.axis_size(axis) > 2 and (plan.flat or plan.topology.dimensions[axis].kind == "ring")


def stage_algorithm(plan: Plan, stage: Stage) -> str:
    """How a stage runs: its axis's algorithm, except that an axis of two ranks is one direct
    exchange (a flat tree keeps its shape), and one-shot and tree axes run only their
    all-reduce stage their own way (their other stages run as both-way rings, or directly on
    a switch)."""
    alg = plan.algorithms[stage.axis]
    if alg in ALLREDUCE_ONLY and stage.kind != "ar":
        return "bidir" if ring_axis(plan, stage.axis) else "direct"
    if plan.flat and alg == "tree":
        return alg
    return alg if plan.axis_size(stage.axis) > 2 else "direct"


def stage_bytes(plan: Plan, k: int, stage: Stage, nbytes: float) -> float:
    """The bytes per rank a stage of chunk k works on: the chunk's share of the call, divided
    by the sizes of the axes it has already reduce-scattered over."""
    chunk = plan.chunks[k]
    data = nbytes * (chunk.units / plan.units)
    for a in chunk.order[: stage.depth]:
        data /= plan.axis_size(a)
    return data


def plan_shape(plan: Plan) -> Plan:
    """The plan without its name, each axis's lanes numbered in order of first use: a lane
    only labels an axis's threadblocks (except on a flat ring, where its number picks the
    ranks a channel translates by), so plans of one shape lower to the same program up to
    the numbering of threadblocks and channels."""
    plan = replace(plan, name="", label="")
    if plan.flat:
        return plan
    ids: dict[tuple[int, int], int] = {}
    used = [0] * plan.naxes
    chunks = []
    for k, c in enumerate(plan.chunks):
        lanes = []
        for j, st in enumerate(plan.stages(k)):
            key = (st.axis, c.lane_of(j))
            if key not in ids:
                ids[key] = used[st.axis]
                used[st.axis] += 1
            lanes.append(ids[key])
        chunks.append(replace(c, lane=0, stage_lanes=tuple(lanes)))
    return replace(plan, chunks=tuple(chunks))


# -- geometry -------------------------------------------------------------------------------


def largest_blocks(topology: Topology, flat: bool, chunks: Sequence[ChunkPlan], algorithms: Sequence[str]) -> list[int]:
    """Per axis, the most cells a rank sends in one message of it when nothing is cut: a
    chunk's block at that depth (one-shot: the whole owned range)."""
    size = (lambda a: topology.nranks) if flat else (lambda a: topology.dimensions[a].size)
    largest = [0] * (1 if flat else topology.ndims)
    for c in chunks:
        for depth, a in enumerate(c.order):
            cells = c.units * math.prod(size(b) for b in c.order[depth + 1:])
            if algorithms[a] in ALLREDUCE_ONLY and depth == len(c.order) - 1:
                cells *= size(a)  # the whole owned range goes in one message
            largest[a] = max(largest[a], cells)
    return largest
