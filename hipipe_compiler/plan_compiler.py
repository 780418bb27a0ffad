"""The compiler for the MSCCL++ backend: the search's schedule per size window, lowered and
translated into execution plans under Simple and under LL (MSCCL++ has no LL128), the faster
plan kept, one plan per buffer mode the shim tells apart, every plan proven, and a directory
with a manifest of what the shim must match on. An all-reduce on one NVLS domain also tries
the plan that reduces in the switch (mscclpp/nvls.py), and keeps it where it is faster.

>>> from hipipe_compiler.presets import preset
>>> topo = preset("dgx-h100-8x1")
>>> [cp] = compile_plans(topo, CompileOptions(algorithm="hierarchical", collective="allgather"), 1 << 20, 1 << 20)
>>> [p.inplace for p in cp.plans], cp.report.ok
([False, True], True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__
from .background import Background
from .compiler import (CompiledWindow, CompileOptions, Planner, Stopwatch, VerificationFailed, compile_range,
                       hipipe_planner, window_summary, write_file_set)
from .crossover import fastest_segments
from .errors import InputError, PlanError
from .msccl.program import Program
from .msccl.verify import Report
from .mscclpp.nvls import nvls_allreduce_plan, switch_domain
from .mscclpp.nvls_pipeline import describe, nvls_pipeline_plan, pipeline_shape, staggered
from .mscclpp.plan import (ExecutionPlan, context_scratch_bytes, largest_message_size, largest_size_within_scratch,
                           scratch_per_chunk)
from .mscclpp.ordering import handshake_connections
from .mscclpp.translate import TooManyOperations, opens_handshakes, ranks_per_node, translate
from .mscclpp.verify import layouts_of, verify_plan
from .mscclpp.verify.footprint import ProofTooLarge, proof_footprint, room_shortfall
from .mscclpp.writer import PlanWriter
from .plan_fitting import fit, threadblock_budget
from .schedule import Plan, hierarchical_plan
from .sim import simulate_exact
from .sim.plans import symmetric, time_plan
from .sim.simulate import SimResult, SimulationError
from .topology import Topology
from .units import format_size
from .windows import Window

#: The MSCCL++ commit whose executor the plans are written for (mscclpp.md).
MSCCLPP_COMMIT = "1f5f065d"
PLAN_PROTOCOLS = ("Simple", "LL")
#: Threadblocks of an in-switch plan: as many as NCCL's NVLS runs channels on an H100 node.
SWITCH_THREADBLOCKS = 16
#: (pipeline chunks per GPU, lanes) an in-switch pipeline tries per window: one lane of switch
#: operations, or two, four or eight staggered ones, whose latencies then hide behind each
#: other's bytes.
PIPELINE_SHAPES = ((4, 1), (8, 1), (16, 1), (32, 1), (64, 1), (16, 2), (32, 2), (64, 2), (128, 2), (32, 4), (64, 4),
                   (128, 4), (64, 8), (128, 8))
#: Chunks times ranks above which a pipeline is not tried: the simulator's time grows with both
#: and with how much the chunks overlap, to minutes per size at 1 GiB beyond this.
MAX_CHUNK_RANKS = 4096
#: Receive slots per connection a Simple plan is tried with, in this order (translate's `pool`).
POOLS = (2, 4)
#: Steps per threadblock the search is run again with where its pick does not fit the
#: executor: a step becomes three to nine operations, and a threadblock runs at most 64.
REFIT_STEPS = 8


@dataclass(frozen=True)
class CompiledPlans:
    """One size window: the program the plans were translated from, a plan per buffer mode,
    and the verifier's verdict over all of them."""

    window: CompiledWindow
    program: Program
    plans: tuple[ExecutionPlan, ...]
    report: Report
    details: dict[str, Any] = field(default_factory=dict, compare=False)
    #: what the search already simulated of the out-of-place plan, by size (nccl-tests bytes)
    times: dict[int, SimResult] = field(default_factory=dict, compare=False)
    #: where the plans need symmetric memory (in-switch), the GPU-side plans the selector runs
    #: instead where the job's buffers may sit at different offsets; proven like the plans
    fallbacks: tuple[ExecutionPlan, ...] = ()


def size_multiple(plan: ExecutionPlan) -> int:
    """Call sizes (nccl-tests bytes) the executor accepts are multiples of this (mscclpp.md 2.6):
    anything else throws inside the NCCL call, with no fallback."""
    g = plan.gpus[0]
    per_rank = plan.buffer_alignment * g.input_chunks
    return per_rank * plan.ngpus if plan.collective == "allgather" else per_rank


def timed_size(plan: ExecutionPlan, nbytes: int) -> int:
    """The largest size at or below nbytes that the plan runs (at least one multiple)."""
    m = size_multiple(plan)
    return max(m, nbytes - nbytes % m)


def _name(topology: Topology, collective: str, index: int, lo: int, hi: int, inplace: bool) -> str:
    return (f"hipipe-{collective}-{topology.nranks}r-{index:02d}-{format_size(lo)}-{format_size(hi)}-"
            f"{'inplace' if inplace else 'outofplace'}")


def _part(plan: ExecutionPlan, name: str, inplace: bool, lo: int, hi: int) -> ExecutionPlan:
    """A plan as it serves one part of a directory, in one buffer mode."""
    return replace(plan, name=name, inplace=inplace, min_message_size=lo, max_message_size=hi)


def _modes(program: Program) -> tuple[bool, ...]:
    """The buffer modes to emit: the shim tells in-place from out-of-place calls for all-reduce
    and all-gather; an in-place reduce-scatter from NCCL reaches the out-of-place plan."""
    if program.collective == "reducescatter":
        return (False,)
    return tuple(m for m, ok in ((False, program.outofplace), (True, program.inplace)) if ok) or (False,)


def compile_plans(topology: Topology, options: CompileOptions, min_bytes: int, max_bytes: int,
                  planner: Planner | None = None, node_size: int | None = None,
                  stopwatch: Stopwatch | None = None, in_switch: bool = True,
                  fallbacks: bool = False, max_scratch: int | None = None) -> list[CompiledPlans]:
    """Plans for every size window of [min, max]; VerificationFailed if one does not verify.
    `in_switch` lets the search's all-reduces give way to plans that reduce in the switch, and
    `fallbacks` keeps the GPU-side plan behind each of them, timed at the part's ends, for jobs
    whose buffers are not symmetric (ExecutionPlan.needs_symmetric_memory). `max_scratch`
    bounds each plan's scratch per context (`context_scratch_bytes`): a plan then serves up
    to where its scratch would pass it, and NCCL above."""
    watch = stopwatch or Stopwatch()
    choices = (options.protocol,) if options.protocol in PLAN_PROTOCOLS else PLAN_PROTOCOLS
    if options.protocol == "LL128":
        raise InputError(None, "--proto", "MSCCL++ has no LL128; expected Simple or LL")
    windows = compile_range(topology, replace(options, check=False), min_bytes, max_bytes, planner, stopwatch=watch,
                            timed=False)
    owners: dict[tuple[ExecutionPlan, bool], Window] = {}  # each proof's part, in the order the parts use them
    with Background[Report](options.jobs if options.check else 1) as proofs:
        bests: list[_Translated] = []
        for index, cw in enumerate(windows):
            bests.append(best := _best_plan(topology, options, choices, index, cw, node_size, watch))
            lo, hi = cw.window.min_bytes, min(cw.window.max_bytes, reach(best.plan, max_scratch))
            if options.check and fallbacks and lo <= hi:
                # a directory emits each window's plan as a part, or as the fallback of an in-switch
                # part it reaches across: its proof starts now, for every size those can take, while
                # the parent goes on (where it ends up in neither, the proof is spent for nothing)
                for m in _modes(best.program):
                    _prove(proofs, _part(best.plan, _name(topology, options.collective, index, lo, hi, m), m, lo, hi),
                           best.program.inplace)
        # in-switch plans win from some size up, though not always all of a window: from the top
        # window down, until one where they serve nothing
        served: list[list[Served]] = [[(cw.window.min_bytes, None, {})] for cw in windows]
        trials = _SwitchTrials(_once_per_mode(switch_candidates(topology, "in-switch")))
        for index in reversed(range(len(windows)) if in_switch else ()):
            lo, hi = windows[index].window.min_bytes, windows[index].window.max_bytes
            served[index] = _in_switch(topology, options, bests[index].plan, lo, hi, watch, trials, max_scratch)
            proofs.poll()
            if all(build is None for _s, build, _k in served[index]):
                break
        try:
            out = _parts(topology, options, windows, bests, served, fallbacks, max_scratch, watch, proofs, owners)
        except ProofTooLarge:  # at once: the proofs sent so far would not change it
            raise
        except Exception:  # a broken plan met later (a simulation, a part) gets the verifier's report first
            _first_failure(proofs, owners, watch)
            raise
        if not options.check:
            return out
        _first_failure(proofs, owners, watch)
        proven = []
        for cp in out:  # the report kept is the last plan's, after its fallbacks'
            report = proofs.result(_proof_key(cp.plans[-1], cp.program.inplace))
            proven.append(replace(cp, report=report, window=replace(cp.window, report=report)))
        return proven


def _prove(proofs: Background[Report], plan: ExecutionPlan, aliased: bool) -> tuple[ExecutionPlan, bool]:
    """Send the plan's proof (once per proof key, whoever asks first) and return its key."""
    key = _proof_key(plan, aliased)
    footprint = proof_footprint(plan)
    short = room_shortfall(footprint, proofs.capacity())
    if short:
        raise ProofTooLarge(f"{plan.name}: {short}; compile it on a machine with more memory")
    proofs.submit(key, partial(verify_plan, plan, layouts_of(plan, aliased=aliased)), footprint.reserve)
    return key


def _parts(topology: Topology, options: CompileOptions, windows: Sequence[CompiledWindow], bests: Sequence[Any],
           served: Sequence[Sequence[Served]], fallbacks: bool, max_scratch: int | None, watch: Stopwatch,
           proofs: Background[Report], owners: dict[tuple[ExecutionPlan, bool], Window]) -> list[CompiledPlans]:
    """compile_plans' parts of every window, their plans sent to `proofs` (and the part each
    proof is for to `owners`) as they are built."""
    out = []
    ceiling = None  # where a part was left out: the largest size its plan's offsets (or scratch budget) allow
    by_scratch = False  # whether the scratch budget set it
    for index, (cw, best) in enumerate(zip(windows, bests)):
        hi = cw.window.max_bytes
        program, plan, result, size, schedule = best.program, best.plan, best.result, best.size, best.schedule
        # in-switch plans take the parts of the window where they are faster; the GPU-side plan the rest
        starts = [start for start, _b, _t in served[index]] + [hi + 1]
        segments = [(start, starts[k + 1] - 1, build, known) for k, (start, build, known) in enumerate(served[index])]
        for seg_lo, seg_hi, build, known in segments:
            built = [(m, plan) for m in _modes(program)] if build is None else [(m, build(m)) for m in (False, True)]
            # above the size where a plan's offsets wrap or its scratch passes the budget, NCCL serves the part
            top = min(seg_hi, *(reach(p, max_scratch) for _m, p in built))
            if any(top - top % size_multiple(p) < seg_lo for _m, p in built):  # no size of the part that it runs
                ceiling = top
                by_scratch = scratch_binds([p for _m, p in built], max_scratch)
                continue
            names = {m: _name(topology, options.collective, index, seg_lo, top, m) for m, _p in built}
            plans = tuple(_part(p, names[m], m, seg_lo, top) for m, p in built)
            at = timed_size(plans[0], top)
            with watch.phase("predict"):
                timed = result if build is None and at == size else known.get(at) or time_plan(plans[0], topology, at)
            backup = ()  # a fallback must take every size of the part, or NCCL takes them all
            if (fallbacks and build is not None and any(p.needs_symmetric_memory for p in plans)
                    and reach(plan, max_scratch) >= top):
                backup = tuple(_part(plan, f"{names[m]}-fallback", m, seg_lo, top) for m in _modes(program))
            part = replace(cw.window, min_bytes=seg_lo, max_bytes=top)
            if options.check:
                for p in backup + plans:  # a plan that serves several parts is proven once, named by the first
                    owners.setdefault(_prove(proofs, p, program.inplace), part)
            done = _finish(topology, options, cw, part, program, plans, timed, at, schedule,
                           best.stand_in and build is None, build is not None, watch, backup)
            out.append(replace(done, times={**known, at: timed}, fallbacks=backup))
    if not out:
        raise PlanError(f"the plan serves at most {format_size(ceiling or 0)} ({ceiling} bytes): above it "
                        + (f"its scratch per context passes --max-scratch {format_size(max_scratch or 0)}" if by_scratch
                           else "the MSCCL++ executor's uint32 offsets wrap, as its buffers or scratch pass 4 GiB "
                                "(mscclpp.md 6)"))
    return out


def scratch_binds(plans: Sequence[ExecutionPlan], max_scratch: int | None) -> bool:
    """Whether the scratch budget, not the executor's offsets, ends some plan's reach."""
    return max_scratch is not None and any(reach(p, max_scratch) < largest_message_size(p) for p in plans)


def reach(plan: ExecutionPlan, max_scratch: int | None = None) -> int:
    """The largest call a plan may serve: where its offsets still fit the executor's uint32,
    and its scratch per context stays within max_scratch bytes (when given)."""
    top = largest_message_size(plan)
    return top if max_scratch is None else min(top, largest_size_within_scratch(plan, max_scratch))


@dataclass(frozen=True)
class _Translated:
    """A window's fastest GPU-side plan: its program, the plan, its time at `size`, and the
    schedule it came from (a stand-in where the search's own does not fit)."""

    program: Program
    plan: ExecutionPlan
    result: Any
    size: int
    schedule: Any
    stand_in: bool


def _best_plan(topology: Topology, options: CompileOptions, choices: tuple[str, ...], index: int, cw: CompiledWindow,
               node_size: int | None, watch: Stopwatch) -> _Translated:
    """The fastest plan translated from the search's schedule for a window, in each protocol the
    backend has. Where it does not fit, the fastest of what does: the search run again for
    shorter threadblocks, and the hierarchical schedule with fewer chunks."""
    lo, hi = cw.window.min_bytes, cw.window.max_bytes
    errors: list[PlanError] = []

    def fitted(schedules: Sequence[Plan]) -> list[tuple[Program, ExecutionPlan, Any, int, Plan]]:
        out = []
        for schedule in schedules:
            with watch.phase("lower"):
                try:
                    program, plan = fit(schedule, topology, _name(topology, options.collective, index, lo, hi, False),
                                        False, options.limits, node_size)
                except PlanError as exc:
                    errors.append(exc)
                    continue
            size = timed_size(plan, hi)
            if size < lo:
                errors.append(PlanError(f"no size of {cw.window.label} is a multiple of {size_multiple(plan)} bytes (the "
                                        "plan's chunks on 16-byte boundaries), so the executor would refuse every call"))
                continue
            with watch.phase("predict"):
                timed = time_plan(plan, topology, size)
                if plan.protocol == "Simple" and (handshakes := handshake_connections(program)):
                    plan, timed = _sooner_handshakes(program, plan, timed, topology, size, node_size, handshakes)
                out.append((program, plan, timed, size, schedule))
        return out

    found = fitted([replace(cw.plan, protocol=p) for p in sorted(choices, key=lambda p: p != cw.plan.protocol)])
    stand_in = not found
    if stand_in:
        # the search judges programs replayed over slices, and a plan runs one pass, so its
        # ranking does not carry over: every schedule it found, and the hierarchical ones
        # (the first of which to fit can be far slower than another: on torus-4x4x4, LL with
        # four chunks where Simple's needs too many threadblocks), are timed as plans
        again: list[Plan] = []
        if options.algorithm == "hipipe":
            with watch.phase("plan"):
                try:
                    again = _searched_again(topology, options, cw.window, REFIT_STEPS, choices)
                except PlanError:  # no schedule fits such threadblocks: the lowering's error says why
                    pass
        found = fitted([*again, *(hierarchical_plan(topology, options.collective, chunks=k, protocol=p, min_bytes=lo,
                                                    max_bytes=hi) for k in (4, 2, 1) for p in choices)])
    if not found:
        raise errors[0] if errors else PlanError(f"window {cw.window.label}: no plan")
    return _Translated(*_pooled(topology, options, min(found, key=lambda f: f[2].time_us), lo, node_size, watch),
                       stand_in=stand_in)


def _pooled(topology: Topology, options: CompileOptions, best: tuple, lo: int, node_size: int | None,
            watch: Stopwatch) -> tuple:
    """`best` (program, plan, time, size, schedule), or, for a Simple plan, the same schedule
    with each connection's receives in a pool of slots (translate's `pool`, fewest first)
    where that needs less scratch and is no slower at `size` nor at the smallest size from
    `lo` it runs: the credits often cost nothing, since a receiver reads a slot long before
    the sender comes round to it again. Pools that deadlock (the credits close a cycle of
    waits) are passed over. A plan whose handshakes open keeps them open."""
    program, plan, timed, size, schedule = best
    if plan.protocol != "Simple":
        return best
    opening = opens_handshakes(plan)
    m = size_multiple(plan)
    low = min(size, max(m, lo + -lo % m))
    plain_low: float | None = None  # the plan's own time at `low`, once a pool gets that far
    for pool in POOLS:
        with watch.phase("lower"):
            try:  # the program as it is, unless the credits take a threadblock past the executor's limit
                pooled_program, pooled = program, translate(program, topology, plan.name, False, node_size, opening,
                                                             pool=pool)
            except TooManyOperations:
                try:
                    pooled_program, pooled = fit(schedule, topology, plan.name, False, options.limits, node_size,
                                                 pool=pool, shorter_than=program.max_steps, opening=opening)
                except PlanError:
                    continue
        if scratch_per_chunk(pooled) >= scratch_per_chunk(plan):
            continue
        with watch.phase("predict"):
            try:
                result = time_plan(pooled, topology, size)
                if result.time_us > timed.time_us:
                    continue
                if low < size:
                    if plain_low is None:
                        plain_low = time_plan(plan, topology, low).time_us
                    if time_plan(pooled, topology, low).time_us > plain_low:
                        continue
            except SimulationError:
                continue
        return pooled_program, pooled, result, size, schedule
    return best


def _sooner_handshakes(program: Program, plan: ExecutionPlan, timed: SimResult, topology: Topology, size: int,
                       node_size: int | None, handshakes: frozenset) -> tuple[ExecutionPlan, SimResult]:
    """The plan whose connections that need a handshake close with it, or the same plan with
    them opening with it, whichever is faster at `size`: an opening handshake's latency hides
    behind the work before a connection's first send, a closing one's is paid at the end."""
    try:
        opened = translate(program, topology, plan.name, False, node_size, opening=True, handshakes=handshakes)
    except TooManyOperations:  # its wait needs a nop more
        return plan, timed
    other = time_plan(opened, topology, size)
    return (opened, other) if other.time_us < timed.time_us else (plan, timed)


def _searched_again(topology: Topology, options: CompileOptions, window: Any, steps: int,
                    choices: tuple[str, ...]) -> list[Plan]:
    """The search's pick and runners-up for one window whose threadblocks may hold at most
    `steps` steps: each in its protocol, or in the backend's where it is LL128."""
    limits = replace(threadblock_budget(topology, options.limits), max_steps=steps)
    [(pick, details)] = hipipe_planner(topology, replace(options, limits=limits), [window])
    return [replace(plan, protocol=p) for plan in (pick, *details.get("alternatives", ()))
            for p in ((plan.protocol,) if plan.protocol in choices else choices)]


def _finish(topology: Topology, options: CompileOptions, cw: CompiledWindow, window: Any, program: Program,
            plans: tuple[ExecutionPlan, ...], result: Any, size: int, schedule: Any, stand_in: bool, switched: bool,
            watch: Stopwatch, fallbacks: tuple[ExecutionPlan, ...] = ()) -> CompiledPlans:
    """One window's part (its plans proven apart, sent by `_parts`), and what the summary says of it."""
    plan = plans[0]
    report = Report((), ())
    with watch.phase("predict"):
        xml = simulate_program(program, topology, size)
    details = {"predicted_at_bytes": size, "predicted_us": result.time_us, "busbw_GBps": result.busbw_GBps,
               "utilisation": result.utilisation, "utilisation1": result.utilisation1, "xml_us": xml,
               "size_multiple": size_multiple(plan)}
    if switched:
        one_node = switch_domain(topology) is not None
        units, lanes = ((1,) * len(plan.gpus[0].threadblocks), 1) if one_node else describe(plan)
        in_lanes = f" in {lanes} lanes" if lanes > 1 else ""
        details["choice"] = ("in-switch (glres on one NVLS domain)" if one_node else
                             f"in-switch pipeline ({len(units)} chunks{in_lanes}: switch, network, multicast)")
        # what the summary says of the window is the plan's, not the search's schedule's
        details.update(chunks=str(len(units)), chunk_units=list(units), orders=[], fold=[],
                       element_multiple=size_multiple(plan) // 4, channels=len(plan.gpus[0].peers("memory"))
                       + len(plan.gpus[0].peers("port")) + len(plan.gpus[0].switch_groups()))
        if fallbacks:  # timed at the part's ends, where the handoff times NCCL
            with watch.phase("predict"):
                details["fallback_us"] = [time_plan(fallbacks[0], topology, timed_size(fallbacks[0], e)).time_us
                                          for e in sorted({window.min_bytes, window.max_bytes})]
    elif stand_in:
        details["choice"] = f"{schedule.label} (search's pick does not fit)"
        with watch.phase("predict"):  # what the stand-in costs against the search's own program
            details["search_xml_us"] = simulate_program(cw.program, topology, size)
    compiled = replace(cw, window=window, program=program, plan=schedule, report=report,
                       details={**{k: v for k, v in cw.details.items() if k not in details}, **details})
    return CompiledPlans(compiled, program, plans, report, details)


def _proof_key(plan: ExecutionPlan, inplace: bool) -> tuple[ExecutionPlan, bool]:
    """What a plan's proof depends on: not its name and sizes, whose checks (a name; sizes up to
    where the offsets wrap) hold for every part `reach` allows, so each plan is proven once."""
    return replace(plan, name="-", min_message_size=0, max_message_size=0), inplace


def _first_failure(proofs: Background[Report], owners: dict[tuple[ExecutionPlan, bool], Window],
                   watch: Stopwatch) -> None:
    """VerificationFailed for the first proof, in the order they were sent, that fails,
    naming the first part its plan serves."""
    with watch.phase("verify"):
        for key, part in owners.items():
            if not (report := proofs.result(key)).ok:
                raise VerificationFailed(part, report) from None


Builder = Callable[[bool], ExecutionPlan]
#: A part of a window: from which size, the in-switch plan that serves it (None: the plan
#: translated from the search's schedule), and what was simulated of it on the way.
Served = tuple[int, "Builder | None", dict[int, SimResult]]


@dataclass(frozen=True)
class _SwitchTrials:
    """What a directory's windows share of the in-switch plans: the plans, their times by
    (candidate, size), and whether rank 0 alone times each."""

    builders: tuple[Builder, ...]
    seen: dict[tuple[int, int], float] = field(default_factory=dict)
    orbits: dict[int, bool] = field(default_factory=dict)


def _once_per_mode(builders: Sequence[Builder]) -> tuple[Builder, ...]:
    """The builders, each making its plan once per buffer mode however often it is asked (its
    name is a placeholder: each part it serves names it)."""
    def once(build: Builder) -> Builder:
        made: dict[bool, ExecutionPlan] = {}
        return lambda inplace: made[inplace] if inplace in made else made.setdefault(inplace, build(inplace))
    return tuple(once(b) for b in builders)


def _in_switch(topology: Topology, options: CompileOptions, translated: ExecutionPlan, lo: int, hi: int,
               watch: Stopwatch, trials: _SwitchTrials, max_scratch: int | None = None) -> list[Served]:
    """Which plan serves each part of an all-reduce window, ascending from `lo`: (from which
    size, the in-switch plan as a builder per buffer mode or None for `translated`, the times
    of that out-of-place plan simulated on the way), as `fastest_segments` decides between
    `translated` and every in-switch plan. `trials` carries the in-switch plans and what was
    learnt of them from one window to the next."""
    if (options.collective != "allreduce" or not topology.nvls_dimensions or options.protocol == "LL"
            or options.algorithm != "hipipe"):
        return [(lo, None, {})]
    budget = threadblock_budget(topology, options.limits).max_threadblocks
    candidates = [(build, plan) for build in trials.builders if (plan := build(False)).max_threadblocks <= budget]
    # each plan serves up to its reach; above every plan's, the part goes to NCCL
    reaches = {None: reach(translated, max_scratch), **{i: reach(p, max_scratch) for i, (_b, p) in enumerate(candidates)}}
    hi = min(hi, max(reaches.values()))
    if not candidates or hi < lo:
        return [(lo, None, {})]
    step = math.lcm(size_multiple(translated), *(size_multiple(plan) for _b, plan in candidates))
    results: dict[tuple[int | None, int], SimResult] = {}
    orbits: dict[int | None, bool] = dict(trials.orbits)  # whether rank 0 alone times a plan: checked once

    def time(i: int | None, size: int) -> float:
        plan = translated if i is None else candidates[i][1]
        if size > reaches[i]:
            return math.inf
        if i not in orbits:
            orbits[i] = symmetric(plan, topology)
            if i is not None:  # the in-switch plans are every window's
                trials.orbits[i] = orbits[i]
        results[(i, size)] = time_plan(plan, topology, size, orbits=orbits[i])
        return results[(i, size)].time_us
    with watch.phase("predict"):
        segments = fastest_segments(lo, hi, step, len(candidates), time, seen=trials.seen)
    return [(seg.start, None if seg.choice is None else candidates[seg.choice][0],
             {at: r for (i, at), r in results.items() if i == seg.choice}) for seg in segments]


def switch_candidates(topology: Topology, name: str) -> list[Builder]:
    """The in-switch plans this topology has: one NVLS domain, or NVLS nodes on one network
    with the pipeline's chunk counts."""
    if switch_domain(topology) is not None:
        return [lambda inplace: nvls_allreduce_plan(topology, name, inplace, SWITCH_THREADBLOCKS)]
    try:
        pipeline_shape(topology, 1)
    except PlanError:
        return []
    return [lambda inplace, c=c, lanes=lanes: nvls_pipeline_plan(topology, name, inplace, c, lanes,
                                                                 staggered(c, lanes) if lanes > 1 else ())
            for c, lanes in PIPELINE_SHAPES if c * topology.nranks <= MAX_CHUNK_RANKS]


def simulate_program(program: Program, topology: Topology, nbytes: int) -> float:
    """The time of the same program as MSCCL XML, for the comparison the docs report."""
    return simulate_exact(program, topology, nbytes).time_us


def plan_timer(compiled: Sequence[CompiledPlans], topology: Topology) -> Callable[[CompiledWindow, int], float]:
    """Our time of a window's plan at a size, for the NCCL handoff."""
    by_window = {id(cp.window): cp for cp in compiled}

    def ours(cw: CompiledWindow, nbytes: int) -> float:
        cp = by_window[id(cw)]
        at = timed_size(cp.plans[0], nbytes)
        return (cp.times.get(at) or time_plan(cp.plans[0], topology, at)).time_us
    return ours


def plan_summary(cp: CompiledPlans) -> dict[str, Any]:
    return {**window_summary(cp.window), "backend": "mscclpp", "threadblocks": cp.plans[0].max_threadblocks,
            "longest_threadblock": cp.plans[0].max_ops, "symmetric_memory": cp.plans[0].needs_symmetric_memory,
            "files": [plan_file_name(p) for p in cp.plans], "fallback_files": [plan_file_name(p) for p in cp.fallbacks]}


def plan_file_name(plan: ExecutionPlan) -> str:
    return plan.name.removeprefix("hipipe-") + ".json"


def manifest_entry(plan: ExecutionPlan, node_size: int) -> dict[str, Any]:
    """What the shim's selection matches on (mscclpp.md 1), and the divisibility it does not check."""
    return {"file": plan_file_name(plan), "name": plan.name, "collective": plan.collective, "world_size": plan.ngpus,
            "ranks_per_node": node_size, "inplace": plan.inplace, "min_message_size": plan.min_message_size,
            "max_message_size": plan.max_message_size, "protocol": plan.protocol, "size_multiple": size_multiple(plan),
            "in_switch": any(g.switch_groups() for g in plan.gpus), "symmetric_memory": plan.needs_symmetric_memory,
            "fallback": plan.name.endswith("-fallback"),
            "scratch_bytes_per_context": context_scratch_bytes(plan)}


def write_plans_directory(compiled: Sequence[CompiledPlans], path: str | Path, manifest: dict[str, Any],
                          node_size: int) -> list[Path]:
    """Write one JSON per plan and .hipipe/manifest.json; all text is made before the first write.
    Fallbacks are listed after every plan, since the selector takes the first that can serve a call."""
    plans = [p for cp in compiled for p in cp.plans] + [p for cp in compiled for p in cp.fallbacks]
    writer = PlanWriter()  # the parts of a window share their GPUs, and plans their operations
    texts = [(plan_file_name(p), writer.plan(p)) for p in plans]
    manifest = {**manifest, "backend": "mscclpp", "mscclpp_commit": MSCCLPP_COMMIT,
                "plans": [manifest_entry(p, node_size) for p in plans]}
    prefixes = {f"{p.collective}-{p.ngpus}r-" for p in plans}
    return write_file_set(path, texts, manifest, ".json", lambda name: any(name.startswith(x) for x in prefixes))


def base_manifest(topology: Topology, collective: str, algorithm: str, node_size: int) -> dict[str, Any]:
    return {"tool": f"hipipe-compiler {__version__}", "topology": topology.to_document(), "collective": collective,
            "algorithm": algorithm, "world_size": topology.nranks, "ranks_per_node": node_size}


def node_size_of(topology: Topology, requested: int | None) -> int:
    """Ranks per node: as given (it must divide the rank count), or what the topology says."""
    if requested is None:
        return ranks_per_node(topology)
    if topology.nranks % requested:
        raise InputError(None, "--ranks-per-node", f"expected a divisor of the {topology.nranks} ranks, got {requested}")
    return requested
