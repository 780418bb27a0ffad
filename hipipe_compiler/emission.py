"""Emission: a rank's logical operations -> threadblocks of MSCCL steps.

The back half of lowering (see lowering.py for the passes): which earlier operation each
one waits for (by the chunk slots it reads and writes), where threadblocks are cut to stay
within the step limit, and the steps themselves, with dependencies pruned by vector clocks
and the rest carried by nops.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .errors import PlanError
from .plan import Plan
from .program import Gpu, Program, Step, Threadblock, buffer_chunks
from .runtime import Limits

if TYPE_CHECKING:
    from .lowering import _Generator, _Op

# -- slots, aliasing and raw dependencies -------------------------------------------------------


def _slot_mapper(plan: Plan, rank: int) -> tuple[Callable[[str, int], int], Callable[[str, int], int]]:
    """(slot of a logical location, buffer offset of a logical location); scratch follows i/o."""
    nch = plan.nchunksperloop
    b = plan.units
    coll = plan.collective

    def slot(buf: str, y: int) -> int:
        return nch + y if buf == "s" else y

    if coll == "reducescatter":
        def offset(buf: str, y: int) -> int:
            return y - rank * b if buf == "o" else y
    elif coll == "allgather":
        def offset(buf: str, y: int) -> int:
            return y - rank * b if buf == "i" else y
    else:
        def offset(buf: str, y: int) -> int:
            return y
    return slot, offset


#: Op types that read their src operand, and those that write their dst operand.
_READS = frozenset(("s", "rrc", "cpy", "re"))
_WRITES = frozenset(("r", "rrc", "cpy", "re"))


def raw_dependencies(plan: Plan, ops: list[_Op]) -> list[list[int]]:
    """For each op, the earlier ops (any role) it must wait for, by slot reads and writes.

    A read waits for the slots' last writers; a write also waits, per role, for the latest
    read of any of its slots since they were last written. Slots are tracked in runs that
    no op's range splits (every op covers a run whole or not at all, so all slots of a run
    share their history): an op then touches one or two runs, not dozens of slots.
    """
    reads, writes, bounds = _slot_ranges(plan, ops)
    run_of = {b: i for i, b in enumerate(sorted(bounds))}
    writer = [-1] * len(run_of)  # last op that wrote each run
    readers: list[dict[int, int] | None] = [None] * len(run_of)  # per run: role -> its last op reading it since
    deps: list[list[int]] = []
    for idx, op in enumerate(ops):
        found: set[int] = set()
        read, write = reads[idx], writes[idx]
        if read is not None:
            ra, rb = run_of[read[0]], run_of[read[1]]
            found.update(writer[ra:rb])
        if write is not None:
            wa, wb = run_of[write[0]], run_of[write[1]]
            found.update(writer[wa:wb])  # (re also reads its dst: the same writer)
            found.update(_latest_reads(readers[wa:wb]))
        found.discard(-1)
        if read is not None:
            role = op.role
            for a in range(ra, rb):
                seen = readers[a]
                if seen is None:
                    readers[a] = {role: idx}
                else:
                    seen[role] = idx
        if write is not None:
            writer[wa:wb] = [idx] * (wb - wa)
            readers[wa:wb] = [None] * (wb - wa)
        deps.append(sorted(found))
    return deps


def _slot_ranges(plan: Plan, ops: list[_Op]) -> tuple[list[tuple[int, int] | None], list[tuple[int, int] | None], set[int]]:
    """Per op, the slots [a, b) it reads and writes (None: none), and every range's ends.

    The slot table holds i/o (one slot per chunk) and then scratch as far as any op uses
    it; slots past its end are ignored."""
    nch = plan.nchunksperloop
    nslots = nch + max((loc[1] + op.cnt for op in ops for loc in (op.src, op.dst) if loc is not None and loc[0] == "s"),
                       default=0)
    bounds = {0, nslots}

    def slots(loc: tuple[str, int], cnt: int) -> tuple[int, int] | None:
        a = nch + loc[1] if loc[0] == "s" else loc[1]
        b = min(a + cnt, nslots)
        if a >= b:
            return None
        bounds.add(a)
        bounds.add(b)
        return a, b

    reads = [slots(op.src, op.cnt) if op.type in _READS else None for op in ops]  # type: ignore[arg-type]
    writes = [slots(op.dst, op.cnt) if op.type in _WRITES else None for op in ops]  # type: ignore[arg-type]
    return reads, writes, bounds


def _latest_reads(readers: list[dict[int, int] | None]) -> list[int]:
    """Per role, the latest op that read any of these runs."""
    if len(readers) == 1:
        return list(readers[0].values()) if readers[0] else []
    latest: dict[int, int] = {}
    for seen in readers:
        if seen:
            for role, idx in seen.items():
                if idx > latest.get(role, -1):
                    latest[role] = idx
    return list(latest.values())


# -- segmentation -----------------------------------------------------------------------------


def segment_cuts(gen: _Generator, per_rank_ops: list[list[_Op]], budgets: dict[tuple[int, int], int],
                  extra_steps: list[list[int]]) -> dict[tuple[int, int], list[tuple[int, int, int]]]:
    """For each (axis, lane): the ticks at which a new threadblock segment starts."""
    cuts: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for key, ticks in _steps_per_tick(gen, per_rank_ops, extra_steps).items():
        cuts[key] = _cuts_within(ticks, budgets.get(key, gen.limits.max_steps))
    return cuts


def _steps_per_tick(gen: _Generator, per_rank_ops: list[list[_Op]], extra_steps: list[list[int]]
                    ) -> dict[tuple[int, int], dict[tuple[int, int, int], dict[int, int]]]:
    """Per (axis, lane), per tick: the steps each (rank, role) spends there (keyed by
    rank * nroles + role). A send after a role's fusing receive costs only its nops."""
    nroles = len(gen.roles)
    group_of = [(role.axis, role.lane) if role.axis >= 0 else None for role in gen.roles]
    groups: dict[tuple[int, int], dict[tuple[int, int, int], dict[int, int]]] = {}
    for rank, ops in enumerate(per_rank_ops):
        extra = extra_steps[rank]
        prev_fuse = [False] * nroles
        for idx, op in enumerate(ops):
            role = op.role
            key = group_of[role]
            if key is None:
                continue
            steps = extra[idx] if op.type == "s" and prev_fuse[role] else 1 + extra[idx]
            prev_fuse[role] = op.fuse
            ticks = groups.get(key)
            if ticks is None:
                ticks = groups[key] = {}
            counts = ticks.get(op.tick)
            if counts is None:
                counts = ticks[op.tick] = {}
            who = rank * nroles + role
            counts[who] = counts.get(who, 0) + steps
    return groups


def _cuts_within(ticks: dict[tuple[int, int, int], dict[int, int]], budget: int) -> list[tuple[int, int, int]]:
    """Cut an (axis, lane)'s ticks into segments in which no (rank, role) spends more than
    `budget` steps; a cut goes at the start of the event in progress if that is inside the
    segment, else at the tick that overflows."""
    order = sorted(ticks)
    acc: dict[int, int] = {}
    seg = 0  # index in order of the segment's first tick
    event = 0  # index of the first tick of the current event
    out: list[tuple[int, int, int]] = []
    for i, t in enumerate(order):
        if t[0] != order[event][0]:
            event = i
        counts = ticks[t]
        if i != seg and any(acc.get(who, 0) + c > budget for who, c in counts.items()):
            seg = event if event > seg else i
            out.append(order[seg])
            acc = {}
            for t2 in order[seg:i]:
                for who, c in ticks[t2].items():
                    acc[who] = acc.get(who, 0) + c
        for who, c in counts.items():
            acc[who] = acc.get(who, 0) + c
    return out


# -- emission ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Unit:
    """A step-to-be: one op, or a receive fused with the send after it."""

    index: int  # in the rank's list of units
    ops: list[int]
    tb: int
    pos: int
    type: str
    src: tuple[str, int] | None
    dst: tuple[str, int] | None
    cnt: int



def emit(plan: Plan, gen: _Generator, ranks: list[int], per_rank_ops: list[list[_Op]], raw: list[list[list[int]]],
          cuts: dict[tuple[int, int], list[tuple[int, int, int]]], limits: Limits, build: bool = True,
          first: list[tuple[Any, Layout]] | None = None) -> tuple[Program | None, dict[tuple[int, int], int], list[list[int]]]:
    """Lay out every rank's steps for given segment cuts; report step-limit overflow per
    (axis, lane) and the nops before each op's step. The Program is built only with `build`
    and when nothing overflows (lower() discards it otherwise).

    `first` holds the first rank's layout for the cuts it was made with: it is reused when
    the cuts are the same (the probe's last round is often the full round's first), and
    replaced by this call's."""
    topo = plan.topology
    nranks = topo.nranks
    channel_base, nchannels = _channels(cuts)
    if nchannels > limits.max_channels:
        raise PlanError(
            f"the plan needs {nchannels} channels (threadblocks are split over channels to stay within "
            f"{limits.max_steps} steps each); the runtime allows {limits.max_channels}; use fewer chunks or lanes")

    # threadblock keys in a fixed order: (role, segment)
    per_rank_segs = [_segments(ops, _role_cuts(gen, cuts)) for ops in per_rank_ops]
    tb_keys: list[tuple[int, int]] = sorted(_threadblock_keys(per_rank_ops[0], per_rank_segs[0]))
    if any(_threadblock_keys(ops, segs) != set(tb_keys) for ops, segs in zip(per_rank_ops[1:], per_rank_segs[1:])):
        raise PlanError("internal error: ranks disagree on their threadblocks")
    ntb = len(tb_keys)
    check_threadblocks(ntb, limits)
    role_tbs: list[dict[int, int]] = [{} for _ in gen.roles]  # role -> segment -> threadblock
    for t, (role, seg) in enumerate(tb_keys):
        role_tbs[role][seg] = t
    # (threadblock of a segment, threadblock of the role's previous segment): chained in order
    chains = [(t, role_tbs[role][seg - 1]) for t, (role, seg) in enumerate(tb_keys)
              if seg > 0 and seg - 1 in role_tbs[role]]

    overflow: dict[tuple[int, int], int] = {}
    layouts: list[Layout] = []
    for index, rank in enumerate(ranks):
        ops = per_rank_ops[index]
        slot_offset = _slot_mapper(plan, rank)[1]
        if index == 0 and first and first[0][0] == cuts:
            layout = first[0][1]
        else:
            tb_of_op = [role_tbs[op.role][g] for op, g in zip(ops, per_rank_segs[index])]
            graph = _unit_graph(ops, tb_of_op, raw[index], ntb, chains)
            layout = _layout(graph, _prune(graph, ntb), len(ops))
            if index == 0 and first is not None:
                first[:] = [(cuts, layout)]
        layouts.append(layout)
        for t, length in enumerate(layout.tb_steps):
            if length > limits.max_steps:
                role = gen.roles[tb_keys[t][0]]
                key = (role.axis, role.lane)
                overflow[key] = max(overflow.get(key, 0), length - limits.max_steps)
        layout.s_used = max((slot_offset(*loc) + op.cnt for op in ops for loc in (op.src, op.dst)
                             if loc is not None and loc[0] == "s"), default=0)
        if layout.s_used > limits.max_offset + 1:
            raise PlanError(f"the plan needs {layout.s_used} scratch chunks; offsets are stored as int16 by the runtime, "
                            f"so at most {limits.max_offset + 1}; use fewer or smaller chunks")
    nops_per_op = [layout.nops for layout in layouts]
    if not overflow:
        check_nodes(nranks, max(ntb + sum(layout.tb_steps) for layout in layouts), limits)
    if overflow or not build:
        return None, overflow, nops_per_op

    bufs = buffer_chunks(plan.collective, nranks, plan.nchunksperloop)
    gpus: list[Gpu] = []
    for rank, layout in zip(ranks, layouts):
        tb_steps = _steps(layout, _slot_mapper(plan, rank)[1])
        tbs = []
        for t, (role_idx, seg) in enumerate(tb_keys):
            role = gen.roles[role_idx]
            axis = gen.axes[role.axis] if role.axis >= 0 else None
            send, recv = role.peers(axis, rank)
            chan = channel_base[(role.axis, role.lane)] + seg if role.axis >= 0 else 0
            tbs.append(Threadblock(t, send, recv, chan, tb_steps[t]))
        gpus.append(Gpu(rank, bufs["i"], bufs["o"], layout.s_used, tuple(tbs)))
    program = Program(
        name=plan.name or f"{plan.collective}-{plan.topology.label}", collective=plan.collective,
        protocol=plan.protocol, nchannels=nchannels, nchunksperloop=plan.nchunksperloop, ngpus=nranks,
        inplace=True, outofplace=True, min_bytes=plan.min_bytes, max_bytes=plan.max_bytes, gpus=tuple(gpus),
    )
    return program, overflow, nops_per_op


def footprint(gen: _Generator, ops: list[_Op], cuts: dict[tuple[int, int], list[tuple[int, int, int]]]) -> tuple[int, int]:
    """(threadblocks, threadblocks + steps) a rank with these operations needs at least: one
    step per operation but the sends that fuse; more cuts (after overflow) and the nops that
    carry extra dependencies only add to them. Lowering refuses a plan from this floor
    before the costly passes."""
    ntb = len(_threadblock_keys(ops, _segments(ops, _role_cuts(gen, cuts))))
    return ntb, ntb + len(ops) - sum(fusing_sends(ops))


def fuses(receive: _Op, send: _Op) -> bool:
    """Whether a send forwards what a fusing receive just got: the two make one step."""
    return send.type == "s" and receive.fuse and receive.dst == send.src and receive.cnt == send.cnt


def fusing_sends(ops: list[_Op]) -> list[bool]:
    """Per op, whether it is a send that fuses with its role's previous op."""
    last: dict[int, _Op] = {}
    out = []
    for op in ops:
        prev = last.get(op.role)
        out.append(prev is not None and fuses(prev, op))
        last[op.role] = op
    return out


def _threadblock_keys(ops: list[_Op], segments: list[int]) -> set[tuple[int, int]]:
    """A rank's threadblocks: the (role, segment) pairs its operations fall in."""
    return {(op.role, g) for op, g in zip(ops, segments)}


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


def _role_cuts(gen: _Generator, cuts: dict[tuple[int, int], list[tuple[int, int, int]]]) -> list[list[tuple[int, int, int]]]:
    """Each role's cuts (those of its axis and lane)."""
    return [cuts.get((role.axis, role.lane), []) if role.axis >= 0 else [] for role in gen.roles]


def _channels(cuts: dict[tuple[int, int], list[tuple[int, int, int]]]) -> tuple[dict[tuple[int, int], int], int]:
    """The first channel of every (axis, lane) (its segments take successive channels; lanes
    of one axis follow each other) and the number of channels."""
    segs_of = {key: len(c) + 1 for key, c in cuts.items()}
    channel_base: dict[tuple[int, int], int] = {}
    by_axis: dict[int, list[int]] = defaultdict(list)
    for axis, lane in sorted(segs_of):
        by_axis[axis].append(lane)
    nchannels = 1
    for axis, lanes in by_axis.items():
        base = 0
        for lane in sorted(lanes):
            channel_base[(axis, lane)] = base
            base += segs_of[(axis, lane)]
        nchannels = max(nchannels, base)
    return channel_base, nchannels


def _segments(ops: list[_Op], role_cuts: list[list[tuple[int, int, int]]]) -> list[int]:
    """Each op's segment of its role: how many of the role's cuts are at or before its tick."""
    out = []
    for op in ops:
        c = role_cuts[op.role]
        out.append(bisect_right(c, op.tick) if c else 0)
    return out


@dataclass(slots=True)
class _Graph:
    """One rank's units and the dependencies between them (by unit index)."""

    units: list[_Unit]
    tb_units: list[list[_Unit]]  # per threadblock, in order
    deps: list[set[int]]  # per unit: the units it waits for
    prev_in_tb: list[int]  # per unit: the unit before it in its threadblock, or -1
    forward: bool  # every unit comes after those it waits for (unit order is topological)


def _unit_graph(ops: list[_Op], tb_of_op: list[int], raw: list[list[int]], ntb: int,
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
                    if prev.type == "rrs":
                        prev.dst = None
                    me = prev.index
        if me < 0:
            me = len(units)
            u = _Unit(me, [idx], t, len(lst), op.type, op.src, op.dst, op.cnt)
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
    s_used: int = 0  # scratch chunks used


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


def _steps(layout: Layout, slot_offset: Callable[[str, int], int]) -> list[tuple[Step, ...]]:
    """Every threadblock's steps."""
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
            srcbuf, srcoff = ("i", -1) if u.src is None or u.type == "rcs" else (u.src[0], slot_offset(*u.src))
            dstbuf, dstoff = ("o", -1) if u.dst is None or u.type == "s" else (u.dst[0], slot_offset(*u.dst))
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
