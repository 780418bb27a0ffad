"""Lowering: Plan -> Program (per-rank threadblocks of send/recv/reduce steps), the driver of
the passes, one module each:
1. generate (generate.py): every rank's operations in one logical order (the plan's
   schedule), each on a *role* (a logical threadblock: an axis, a lane, and a ring direction
   or a peer offset);
2. dependencies (dependencies.py): per rank, which earlier operation each one must wait
   for, found by tracking every chunk slot's last writer and readers;
3. segmentation (segments.py): roles longer than the step limit are cut, at the same
   message on every rank, into several threadblocks on successive channels;
4. fusion and 5. emission (emission.py): a receive followed by a send of the same data
   becomes rrs/rcs/rrcs; dependencies are pruned with vector clocks, extra ones carried by
   nops; then the Program with channel and threadblock numbers.

>>> from hipipe_compiler.presets import preset
>>> from hipipe_compiler.schedule import hierarchical_plan
>>> program = lower(hierarchical_plan(preset("dgx-h100-8x2"), "allreduce", max_bytes=1 << 20))
>>> program.ngpus, program.nchunksperloop, program.max_steps <= 64
(16, 16, True)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from ..collector import paused
from ..errors import PlanError
from ..msccl.program import Program
from ..msccl.runtime import MAX_ITERATIONS, SLICE_BYTES, Limits, iterations, piece_count
from ..schedule.estimate import events
from ..schedule.plan import Plan, check_plan, largest_blocks
from ..units import format_size
from .dependencies import raw_dependencies
from .emission import Layout, check_nodes, check_threadblocks, emit, footprint, schedule_signature
from .generate import Generator
from .segments import segment_cuts


def lowering_key(plan: Plan) -> tuple[Any, ...]:
    """Plans with equal keys lower to the same program apart from the window.

    The window enters only through the piece limits, which cut nothing at or above the largest
    block, and through whether the runtime replays the program often enough for its largest
    call: windows that agree on those share the key (and the program, or the refusal)."""
    n = plan.nchunksperloop
    cap = max(largest_blocks(plan.topology, plan.flat, plan.chunks, plan.algorithms))
    return (replace(plan, min_bytes=0, max_bytes=0, nominal_bytes=0, schedule=events(plan)),
            min(cap, piece_count(plan.protocol, plan.max_bytes, n, True)),
            min(cap, piece_count(plan.protocol, plan.max_bytes, n, False)),
            iterations(plan.protocol, plan.max_bytes, n) <= MAX_ITERATIONS)


def lower(plan: Plan, limits: Limits = Limits(), ranks: Sequence[int] | None = None,
          axis_steps: Mapping[int, int] | None = None) -> Program:
    """Lower a plan to a Program within the runtime limits, or raise PlanError saying why not.

    With `ranks`, only those ranks' gpus are built (a partial program for estimates, such as
    simulate(..., quotient=True) on rank 0; never written out). `axis_steps` cuts the
    threadblocks of some axes shorter than the step limit (a backend whose steps cost more
    on some links).
    """
    with paused():
        return _lower(plan, limits, ranks, axis_steps)


def same_schedule(plan: Plan, ranks: Sequence[int], limits: Limits = Limits()) -> bool:
    """Whether each of `ranks` generates rank 0's operations (roles, ticks, types, counts and
    fusions) with rank 0's dependencies. Lowering then gives them rank 0's program shifted
    (simulate.symmetric), so rank 0 alone times the plan exactly; checked without emitting.

    >>> from hipipe_compiler.schedule import hierarchical_plan
    >>> from hipipe_compiler.presets import preset
    >>> same_schedule(hierarchical_plan(preset("torus-4x4"), chunks=2, max_bytes=1 << 20), [5, 15])
    True
    """
    with paused():
        gen = Generator(plan, limits)
        first = None
        for rank in (0, *ranks):
            ops = gen.generate(rank)
            signature = schedule_signature(ops, raw_dependencies(plan, ops))
            if first is None:
                first = signature
            elif signature != first:
                return False
    return True


def _lower(plan: Plan, limits: Limits, ranks: Sequence[int] | None, axis_steps: Mapping[int, int] | None) -> Program:
    """lower() with the collector paused."""
    check_plan(plan)
    if plan.topology.nranks > limits.max_children:
        raise PlanError(f"{plan.topology.nranks} ranks; the runtime's XML reader holds at most {limits.max_children} "
                        "<gpu> elements per file (more corrupt its memory)")
    if plan.nchunksperloop > limits.max_offset + 1:
        raise PlanError(
            f"the plan needs {plan.nchunksperloop} chunks per loop ({plan.units} per rank x {plan.topology.nranks} ranks); "
            f"chunk offsets are stored as int16 by the runtime, so at most {limits.max_offset + 1}; use fewer or smaller chunks")
    loops = iterations(plan.protocol, plan.max_bytes, plan.nchunksperloop)
    if loops > MAX_ITERATIONS:
        raise PlanError(f"a call of {format_size(plan.max_bytes)} needs {loops} iterations of the program "
                        f"({format_size(plan.max_bytes / plan.nchunksperloop)} chunks, {plan.protocol} slices of "
                        f"{format_size(SLICE_BYTES[plan.protocol])}); the runtime runs at most {MAX_ITERATIONS}: "
                        "use more chunks, or a smaller size")
    gen = Generator(plan, limits)
    chosen = list(range(plan.topology.nranks)) if ranks is None else list(ranks)
    per_rank_ops = [gen.generate(r) for r in chosen]
    # what the first rank needs at least, before the costly passes: many candidates fail here
    first_cuts = segment_cuts(gen, per_rank_ops[:1], {}, [[0] * len(per_rank_ops[0])], axis_steps)
    ntb, rank_nodes = footprint(gen, per_rank_ops[0], first_cuts)
    check_threadblocks(ntb, limits, floor=True)
    check_nodes(plan.topology.nranks, rank_nodes, limits, floor=True)
    raw = [raw_dependencies(plan, ops) for ops in per_rank_ops]

    # Segment with rank 0 alone first (cheap), then emit every rank with those budgets; ranks
    # whose dependencies need a few more nops make another round.
    budgets: dict[tuple[int, int, int], int] = {}
    first: list[tuple[Any, Layout]] = []  # the first rank's last layout and its cuts: emit reuses it
    probe = ([chosen[0]], per_rank_ops[:1], raw[:1])
    extra = [[0] * len(per_rank_ops[0])]
    for phase in ("probe", "all"):
        ranks_, ops_, raw_ = probe if phase == "probe" else (chosen, per_rank_ops, raw)
        if phase == "all":
            extra = [list(extra[0]) if len(ops) == len(extra[0]) else [0] * len(ops) for ops in per_rank_ops]
        # the probe's program is only kept when it is the whole answer
        build = phase == "all" or len(chosen) == 1
        for attempt in range(12):
            cuts = first_cuts if phase == "probe" and attempt == 0 else segment_cuts(gen, ops_, budgets, extra, axis_steps)
            program, overflow, nops = emit(plan, gen, ranks_, ops_, raw_, cuts, limits, build, first)
            if not overflow:
                break
            extra = nops
            for key, over in overflow.items():
                start = min(limits.max_steps, (axis_steps or {}).get(key[0], limits.max_steps))
                budgets[key] = min(budgets.get(key, start), limits.max_steps) - max(1, over // 2)
                if budgets[key] < 4:
                    raise PlanError(f"axis {key[0]} lane {key[1]}: cannot fit the steps of one exchange into "
                                    f"{limits.max_steps} steps per threadblock")
        else:
            raise PlanError("could not fit the plan into the step limit after repeated segmentation")
        if len(chosen) == 1:
            break
    assert program is not None
    return program
