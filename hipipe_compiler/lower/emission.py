"""Passes 4 and 5 of lowering: a receive and the send that forwards its data fuse into one
step (rrs, rcs, rrcs); dependencies are pruned with vector clocks, each one left over is
carried by a nop; then the steps, threadblocks and the Program."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import PlanError
from ..msccl.program import Gpu, Program, Step, Threadblock, buffer_chunks
from ..msccl.runtime import Limits
from ..schedule.plan import Plan
from .dependencies import slot_mapper
from .generate import Generator
from .ops import Op
from .segments import channel_bases, op_segments, role_cuts, threadblock_keys


@dataclass(frozen=True)
class _Frame:
    """A rank's threadblocks: its (role, segment) pairs in order, the threadblock of each
    role's segments, and (threadblock, the role's previous segment's) pairs, chained in order."""

    keys: list[tuple[int, int]]
    role_tbs: list[dict[int, int]]
    chains: list[tuple[int, int]]

    @classmethod
    def of(cls, keys: list[tuple[int, int]], nroles: int) -> "_Frame":
        role_tbs: list[dict[int, int]] = [{} for _ in range(nroles)]
        for t, (role, seg) in enumerate(keys):
            role_tbs[role][seg] = t
        chains = [(t, role_tbs[role][seg - 1]) for t, (role, seg) in enumerate(keys)
                  if seg > 0 and seg - 1 in role_tbs[role]]
        return cls(keys, role_tbs, chains)


@dataclass(slots=True)
class _Unit:
    """A step-to-be: one op, or a receive fused with the send after it."""

    index: int  # in the rank's list of units
    ops: list[int]
    tb: int
    pos: int
    type: str
    cnt: int


def emit(plan: Plan, gen: Generator, ranks: list[int], per_rank_ops: list[list[Op]], raw: list[list[list[int]]],
          cuts: dict[tuple[int, int, int], list[tuple[int, int, int]]], limits: Limits, build: bool = True,
          first: list[tuple[Any, Layout]] | None = None) -> tuple[Program | None, dict[tuple[int, int, int], int], list[list[int]]]:
    """Lay out every rank's steps for given segment cuts; report step-limit overflow per
    group and the nops before each op's step. The Program is built only with `build`
    and when nothing overflows (lower() discards it otherwise).

    `first` holds the first rank's layout for the cuts it was made with: it is reused when
    the cuts are the same (the probe's last round is often the full round's first), and
    replaced by this call's."""
    topo = plan.topology
    nranks = topo.nranks
    channel_base, nchannels = channel_bases(cuts)
    if nchannels > limits.max_channels:
        raise PlanError(
            f"the plan needs {nchannels} channels (threadblocks are split over channels to stay within "
            f"{limits.max_steps} steps each); the runtime allows {limits.max_channels}; use fewer chunks or lanes")

    # each rank's threadblocks: its (role, segment) pairs in a fixed order (ranks of a tree
    # differ: a leaf has no children to talk to)
    per_rank_segs = [op_segments(ops, role_cuts(gen, cuts)) for ops in per_rank_ops]
    frames: dict[frozenset[tuple[int, int]], _Frame] = {}
    rank_frames: list[_Frame] = []
    for ops, segs in zip(per_rank_ops, per_rank_segs):
        keys = frozenset(threadblock_keys(ops, segs))
        if keys not in frames:
            frames[keys] = _Frame.of(sorted(keys), len(gen.roles))
        rank_frames.append(frames[keys])
    check_threadblocks(max(len(f.keys) for f in frames.values()), limits)

    overflow: dict[tuple[int, int, int], int] = {}
    layouts: list[Layout] = []
    scratch: list[int] = []  # per rank: scratch chunks used
    shared: tuple[Any, Layout] | None = None  # the first rank's schedule and its layout
    for index, rank in enumerate(ranks):
        ops = per_rank_ops[index]
        slot_offset = slot_mapper(plan, rank)[1]
        # a rank that runs the first rank's schedule (its offsets aside) gets the same layout
        schedule = schedule_signature(ops, raw[index])
        frame = rank_frames[index]
        if index == 0 and first and first[0][0] == cuts:
            layout = first[0][1]
        elif shared is not None and shared[0] == schedule:
            layout = shared[1]
        else:
            tb_of_op = [frame.role_tbs[op.role][g] for op, g in zip(ops, per_rank_segs[index])]
            graph = _unit_graph(ops, tb_of_op, raw[index], len(frame.keys), frame.chains)
            layout = _layout(graph, _prune(graph, len(frame.keys)), len(ops))
            if index == 0 and first is not None:
                first[:] = [(cuts, layout)]
        if index == 0:
            shared = (schedule, layout)
        layouts.append(layout)
        for t, length in enumerate(layout.tb_steps):
            if length > limits.max_steps:
                key = gen.roles[frame.keys[t][0]].group
                overflow[key] = max(overflow.get(key, 0), length - limits.max_steps)
        scratch.append(max((slot_offset(*loc) + op.cnt for op in ops for loc in (op.src, op.dst)
                            if loc is not None and loc[0] == "s"), default=0))
        if scratch[-1] > limits.max_offset + 1:
            raise PlanError(f"the plan needs {scratch[-1]} scratch chunks; offsets are stored as int16 by the runtime, "
                            f"so at most {limits.max_offset + 1}; use fewer or smaller chunks")
    nops_per_op = [layout.nops for layout in layouts]
    if not overflow:
        check_nodes(nranks, max(len(f.keys) + sum(layout.tb_steps) for f, layout in zip(rank_frames, layouts)), limits)
    if overflow or not build:
        return None, overflow, nops_per_op

    bufs = buffer_chunks(plan.collective, nranks, plan.nchunksperloop)
    gpus: list[Gpu] = []
    for index, (rank, layout) in enumerate(zip(ranks, layouts)):
        tb_steps = _steps(layout, per_rank_ops[index], slot_mapper(plan, rank)[1])
        tbs = []
        for t, (role_idx, seg) in enumerate(rank_frames[index].keys):
            role = gen.roles[role_idx]
            axis = gen.axes[role.axis] if role.axis >= 0 else None
            send, recv = role.peers(axis, rank)
            chan = channel_base[role.group] + seg if role.axis >= 0 else 0
            tbs.append(Threadblock(t, send, recv, chan, tb_steps[t]))
        gpus.append(Gpu(rank, bufs["i"], bufs["o"], scratch[index], tuple(tbs)))
    program = Program(
        name=plan.name or f"{plan.collective}-{plan.topology.label}", collective=plan.collective,
        protocol=plan.protocol, nchannels=nchannels, nchunksperloop=plan.nchunksperloop, ngpus=nranks,
        inplace=True, outofplace=True, min_bytes=plan.min_bytes, max_bytes=plan.max_bytes, gpus=tuple(gpus),
    )
    return program, overflow, nops_per_op


def footprint(gen: Generator, ops: list[Op], cuts: dict[tuple[int, int, int], list[tuple[int, int, int]]]) -> tuple[int, int]:
    """(threadblocks, threadblocks + steps) a rank with these operations needs at least: one
    step per operation but the sends that fuse; more cuts (after overflow) and the nops that
    carry extra dependencies only add to them. Lowering refuses a plan from this floor
    before the costly passes."""
    ntb = len(threadblock_keys(ops, op_segments(ops, role_cuts(gen, cuts))))
    return ntb, ntb + len(ops) - sum(fusing_sends(ops))


def schedule_signature(ops: list[Op], raw: list[list[int]]) -> tuple[Any, ...]:
    """What decides a rank's steps but their operands: each operation's role, tick, type,
    count and fusion, and the operations it waits for. Ranks with equal signatures get the
    same threadblocks, steps and dependencies, their offsets aside."""
    shape = tuple((op.role, op.tick, op.type, op.cnt, op.fuse, op.dead, f) for op, f in zip(ops, fusing_sends(ops)))
    return shape, tuple(map(tuple, raw))


def fuses(receive: Op, send: Op) -> bool:
    """Whether a send forwards what a fusing receive just got: the two make one step."""
    return send.type == "s" and receive.fuse and receive.dst == send.src and receive.cnt == send.cnt


def fusing_sends(ops: list[Op]) -> list[bool]:
    """Per op, whether it is a send that fuses with its role's previous op."""
    last: dict[int, Op] = {}
    out = []
    for op in ops:
        prev = last.get(op.role)
        out.append(prev is not None and fuses(prev, op))
        last[op.role] = op
    return out


def check_threadblocks(ntb: int, limits: Limits, floor: bool = False) -> None:
    """PlanError unless a rank's `ntb` threadblocks (at least, with `floor`) fit the runtime."""
    needs = f"at least {ntb}" if floor else str(ntb)
    if ntb > limits.max_threadblocks:
        raise PlanError(
            f"the plan needs {needs} threadblocks per rank; the budget is {limits.max_threadblocks} "
            f"(all threadblocks must be resident at once); use fewer lanes, chunks, or a ring inside large switch dimensions")
    if ntb > limits.max_depid + 1:
        raise PlanError(f"the plan needs {needs} threadblocks; dependencies can only name threadblocks 0..{limits.max_depid}")


def check_nodes(nranks: int, rank_nodes: int, limits: Limits, floor: bool = False) -> None:
    """PlanError unless the XML nodes a rank loads (its threadblocks and steps, `rank_nodes`
    or at least that with `floor`, with the algo node and every gpu node) fit the reader."""
    nodes = 1 + nranks + rank_nodes
    if nodes > limits.max_nodes:
        raise PlanError(
            f"a rank's share of the XML has {'at least ' if floor else ''}{nodes} nodes (algo + every gpu + its "
            f"threadblocks and steps); the runtime's reader holds {limits.max_nodes}; use fewer chunks")


@dataclass(slots=True)
class _Graph:
    """One rank's units and the dependencies between them (by unit index)."""

    units: list[_Unit]
    tb_units: list[list[_Unit]]  # per threadblock, in order
    deps: list[set[int]]  # per unit: the units it waits for
    prev_in_tb: list[int]  # per unit: the unit before it in its threadblock, or -1
    forward: bool  # every unit comes after those it waits for (unit order is topological)


def _unit_graph(ops: list[Op], tb_of_op: list[int], raw: list[list[int]], ntb: int,
                chains: list[tuple[int, int]]) -> _Graph:
    """Group a rank's ops into units, in op order, and collect their dependencies.

    A send that forwards what the receive just before it in its threadblock got (same
    data) fuses with it into one step. A unit waits for the units of its ops' raw
    dependencies, and the first unit of a role's segment for the last of the segment
    before (`chains`: (threadblock, previous segment's threadblock))."""
    tb_units: list[list[_Unit]] = [[] for _ in range(ntb)]
    unit_of = [0] * len(ops)
    units: list[_Unit] = []
    deps: list[set[int]] = []
    prev_in_tb: list[int] = []
    forward = True
    for idx, op in enumerate(ops):
        t = tb_of_op[idx]
        lst = tb_units[t]
        me = -1
        if lst and op.type == "s":
            prev = lst[-1]
            if len(prev.ops) == 1:
                pop = ops[prev.ops[0]]
                if fuses(pop, op):
                    prev.ops.append(idx)
                    prev.type = {"rrc": "rrs" if pop.dead else "rrcs", "r": "rcs"}[pop.type]
                    me = prev.index
        if me < 0:
            me = len(units)
            u = _Unit(me, [idx], t, len(lst), op.type, op.cnt)
            units.append(u)
            deps.append(set())
            prev_in_tb.append(lst[-1].index if lst else -1)
            lst.append(u)
        unit_of[idx] = me
        op_deps = raw[idx]
        if op_deps:
            found = deps[me]
            for d in op_deps:
                other = unit_of[d]
                if other != me:
                    found.add(other)
                    if other > me:
                        forward = False
    for t, prev_t in chains:
        if tb_units[prev_t] and tb_units[t]:
            first, last = tb_units[t][0].index, tb_units[prev_t][-1].index
            deps[first].add(last)
            if last > first:
                forward = False
    return _Graph(units, tb_units, deps, prev_in_tb, forward)


@dataclass(slots=True)
class Layout:
    """Where a rank's units land: their step positions (after the nops before them)."""

    graph: _Graph
    pruned: list[list[int]]  # per unit: the units it names (the last in its step, the others in nops)
    step_of: list[int]  # per unit: its step's position in its threadblock
    nops: list[int]  # per op: the nops before its unit's step (0 for a fused send)
    tb_steps: list[int]  # steps per threadblock


def _layout(graph: _Graph, pruned: list[list[int]], nops_total: int) -> Layout:
    """Step positions: a step names one dependency; each other one takes a nop just before it."""
    step_of = [0] * len(graph.units)
    nops = [0] * nops_total
    tb_steps = []
    for lst in graph.tb_units:
        pos = 0
        for u in lst:
            extra = len(pruned[u.index]) - 1
            if extra > 0:
                pos += extra
                nops[u.ops[0]] = extra
            step_of[u.index] = pos
            pos += 1
        tb_steps.append(pos)
    return Layout(graph, pruned, step_of, nops, tb_steps)


def _steps(layout: Layout, ops: list[Op], slot_offset: Callable[[str, int], int]) -> list[tuple[Step, ...]]:
    """Every threadblock's steps, with the operands of this rank's operations (a layout can
    serve every rank that runs its schedule)."""
    units, pruned, step_of = layout.graph.units, layout.pruned, layout.step_of
    hasdep: set[int] = set()
    for deps in pruned:
        hasdep.update(deps)
    tb_of = [u.tb for u in units]
    out: list[tuple[Step, ...]] = []
    for lst in layout.graph.tb_units:
        steps: list[Step] = []
        for u in lst:
            deps = pruned[u.index]
            depid = dstep = -1
            if deps:
                targets = sorted(deps, key=lambda d: (tb_of[d], step_of[d])) if len(deps) > 1 else deps
                for d in targets[:-1]:
                    steps.append(Step(len(steps), "nop", "i", -1, "o", -1, 0, tb_of[d], step_of[d], False))
                depid, dstep = tb_of[targets[-1]], step_of[targets[-1]]
            op = ops[u.ops[0]]
            src, dst = op.src, None if u.type in ("s", "rrs") else op.dst
            srcbuf, srcoff = ("i", -1) if src is None or u.type == "rcs" else (src[0], slot_offset(*src))
            dstbuf, dstoff = ("o", -1) if dst is None else (dst[0], slot_offset(*dst))
            steps.append(Step(len(steps), u.type, srcbuf, srcoff, dstbuf, dstoff, u.cnt, depid, dstep, u.index in hasdep))
        out.append(tuple(steps))
    return out


def _prune(graph: _Graph, ntb: int) -> list[list[int]]:
    """Drop dependencies already implied by threadblock order or by other dependencies.

    Vector clocks: the clock of unit u holds, per threadblock t, the highest position of t
    known complete once u is (u's ancestors and u). A dependency stays unless the unit
    before u in its threadblock, or another dependency of u, implies it. Units are visited
    in a topological order of the dependency graph.

    Only a unit that keeps a dependency gets a clock of its own; the others share the
    clock of the unit before them in their threadblock, so a clock may lag in its owner's
    own threadblock: that entry is read as the owner's position instead (`_implied`).
    """
    units, unit_deps, prev_in_tb = graph.units, graph.deps, graph.prev_in_tb
    n = len(units)
    tb_of = [u.tb for u in units]
    pos_of = [u.pos for u in units]
    result: list[list[int]] = [[] for _ in range(n)]
    order = range(n) if graph.forward else _topological_order(unit_deps, prev_in_tb)
    nothing = np.full(ntb, -1, dtype=np.int64)
    clock = [nothing] * n
    for ui in order:
        deps = unit_deps[ui]
        prev = prev_in_tb[ui]
        known = clock[prev] if prev >= 0 else nothing
        clock[ui] = known
        if not deps:
            continue
        t = tb_of[ui]
        final = [d for d in deps if tb_of[d] != t and known[tb_of[d]] < pos_of[d]]
        if len(final) > 1 or (final and len(deps) > 1):
            final = [d for d in final if not _implied(d, deps, t, tb_of, pos_of, clock)]
        if final:
            # the clocks may lag in their owners' threadblocks: those entries are set exactly
            # (a final dependency is the latest known unit of its threadblock)
            row = np.maximum(known, clock[final[0]])
            for d in final[1:]:
                np.maximum(row, clock[d], out=row)
            for d in final:
                row[tb_of[d]] = pos_of[d]
            row[t] = pos_of[ui]
            clock[ui] = row
            result[ui] = final
    return result


def _implied(d: int, deps: set[int], t: int, tb_of: list[int], pos_of: list[int], clock: list[np.ndarray]) -> bool:
    """Whether another dependency (outside threadblock t) of a unit in t implies dependency d."""
    td, pd = tb_of[d], pos_of[d]
    for o in deps:
        if o != d:
            to = tb_of[o]
            if to != t and (pos_of[o] if to == td else clock[o][td]) >= pd:
                return True
    return False


def _topological_order(unit_deps: list[set[int]], prev_in_tb: list[int]) -> list[int]:
    """Units in an order where each comes after its dependencies and its threadblock
    predecessor (Kahn); PlanError on a cycle."""
    n = len(unit_deps)
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for ui in range(n):
        deps = unit_deps[ui]
        for p in deps:
            succ[p].append(ui)
        k = len(deps)
        prev = prev_in_tb[ui]
        if prev >= 0 and prev not in deps:
            succ[prev].append(ui)
            k += 1
        indeg[ui] = k
    order = [ui for ui in range(n) if indeg[ui] == 0]
    for ui in order:  # grows while it is walked
        for s in succ[ui]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    if len(order) != n:
        raise PlanError("internal error: the lowered program has a dependency cycle")
    return order
