"""compile_plans: each window's plan, and what stands in where the search's schedule does not fit."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from hipipe_compiler import plan_compiler
from hipipe_compiler.background import can_fork
from hipipe_compiler.compiler import CompileOptions, Stopwatch, VerificationFailed
from hipipe_compiler.errors import PlanError
from hipipe_compiler.msccl.runtime import Limits
from hipipe_compiler.msccl.verify import Violation
from hipipe_compiler.mscclpp.translate import opens_handshakes, translate
from hipipe_compiler.mscclpp.verify import verify_plan
from hipipe_compiler.plan_compiler import compile_plans, time_plan, timed_size
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan
from hipipe_compiler.sim.simulate import SimulationError


def test_the_fastest_hierarchical_schedule_that_fits_stands_in_not_the_first(monkeypatch):
    topo, size = preset("torus-4x4"), 1 << 20
    real = plan_compiler.fit

    def only_hierarchical(schedule, *args, **kwargs):
        if not schedule.label.startswith("hierarchical"):
            raise PlanError("the search's schedule needs more threadblocks than the budget")
        return real(schedule, *args, **kwargs)
    monkeypatch.setattr(plan_compiler, "fit", only_hierarchical)
    [cp] = compile_plans(topo, CompileOptions(collective="reducescatter"), size, size)
    assert "search_xml_us" in cp.details and cp.report.ok
    times = []
    for chunks in (4, 2, 1):
        for protocol in ("Simple", "LL"):
            program, plan = real(hierarchical_plan(topo, "reducescatter", chunks=chunks, protocol=protocol,
                                                   min_bytes=size, max_bytes=size), topo, "stand-in")
            opened = translate(program, topo, "stand-in", opening=True)  # handshakes open where that is faster
            times.append(min(time_plan(p, topo, timed_size(plan, size)).time_us for p in (plan, opened)))
    assert cp.details["predicted_us"] == min(times) < times[0]


def test_where_the_pick_does_not_fit_the_search_runs_again_for_shorter_threadblocks():
    topo, size = preset("torus-4x4"), 64 << 20
    limits = replace(Limits(), max_threadblocks=24)  # the search's own pick needs more once translated
    [cp] = compile_plans(topo, CompileOptions(collective="allreduce", limits=limits), size, size)
    assert cp.report.ok and "search_xml_us" in cp.details
    assert not cp.window.plan.label.startswith("hierarchical")
    assert cp.plans[0].max_threadblocks <= 24
    assert cp.details["predicted_us"] <= 1.02 * cp.details["search_xml_us"]
    for chunks in (4, 2, 1):  # and it beats every hierarchical stand-in that fits
        try:
            _, plan = fit(hierarchical_plan(topo, "allreduce", chunks=chunks, min_bytes=size, max_bytes=size), topo,
                          "stand-in", limits=limits)
        except PlanError:
            continue
        assert cp.details["predicted_us"] < time_plan(plan, topo, timed_size(plan, size)).time_us


def test_plans_proven_in_children_give_the_parents_parts_and_reports(monkeypatch):
    """With jobs, the plans (and fallbacks) are proven in forked children while the next
    parts are built: the parts and reports are a single process's, and a proof that fails in
    a child stops the compile, naming its part."""
    topo, lo, hi = preset("dgx-h100-8x1"), 4 << 20, 64 << 20
    options = CompileOptions(collective="allreduce")
    alone = compile_plans(topo, options, lo, hi, fallbacks=True)
    together = compile_plans(topo, replace(options, jobs=3), lo, hi, fallbacks=True)
    assert [(cp.window.window, cp.plans, cp.fallbacks, cp.report) for cp in together] == \
        [(cp.window.window, cp.plans, cp.fallbacks, cp.report) for cp in alone]
    assert all(cp.report.ok for cp in alone) and any(cp.fallbacks for cp in alone)
    broken = alone[0]  # its first plan is the first proof to start, in a child
    proven = plan_compiler.verify_plan
    planted = plan_compiler._proof_key((broken.fallbacks + broken.plans)[0], broken.program.inplace)[0]

    def fails_one(plan, layouts):
        report = proven(plan, layouts)
        if plan_compiler._proof_key(plan, broken.program.inplace)[0] != planted:  # its proof, whatever it is named
            return report
        return replace(report, violations=(Violation("semantics.result", f"planted in process {os.getpid()}"),))

    monkeypatch.setattr(plan_compiler, "verify_plan", fails_one)
    with pytest.raises(VerificationFailed) as failed:
        compile_plans(topo, replace(options, jobs=2), lo, hi, fallbacks=True)
    assert failed.value.window == broken.window.window
    proven_in = int(failed.value.report.violations[0].message.split()[-1])
    assert (proven_in != os.getpid()) == can_fork()

    # a later part that the simulator cannot time still gets the verifier's report of the broken plan first
    def deadlocks(program, topology, nbytes):
        raise SimulationError("deadlock: planted")

    monkeypatch.setattr(plan_compiler, "simulate_program", deadlocks)
    with pytest.raises(VerificationFailed) as failed:
        compile_plans(topo, replace(options, jobs=2), lo, hi, fallbacks=True)
    assert failed.value.window == broken.window.window
    monkeypatch.setattr(plan_compiler, "verify_plan", proven)
    with pytest.raises(SimulationError, match="planted"):
        compile_plans(topo, replace(options, jobs=2), lo, hi, fallbacks=True)


def test_a_directory_proves_each_windows_plan_before_it_tries_the_in_switch_plans(monkeypatch):
    """The GPU-side plan of every window is sent to be proven as soon as it is translated, so
    that the proofs run beside the in-switch trials and the parts, and every part is proven."""
    topo, lo, hi = preset("dgx-h100-8x1"), 4 << 20, 64 << 20
    events: list[str] = []
    prove, in_switch = plan_compiler._prove, plan_compiler._in_switch

    def recorded_prove(proofs, plan, aliased):
        events.append("proof")
        return prove(proofs, plan, aliased)

    def recorded_in_switch(*args, **kwargs):
        events.append("in-switch")
        return in_switch(*args, **kwargs)

    monkeypatch.setattr(plan_compiler, "_prove", recorded_prove)
    monkeypatch.setattr(plan_compiler, "_in_switch", recorded_in_switch)
    out = compile_plans(topo, CompileOptions(collective="allreduce", jobs=2), lo, hi, fallbacks=True)
    before = events[:events.index("in-switch")]
    assert before and set(before) == {"proof"}  # the windows' plans, one per buffer mode
    assert all(cp.report.ok for cp in out)
    events.clear()
    compile_plans(topo, CompileOptions(collective="allreduce", jobs=2), lo, hi, fallbacks=False)
    assert events.index("in-switch") == 0  # no fallbacks: a window's plan may serve no part, so nothing goes ahead


def test_the_windows_of_a_directory_build_and_check_each_in_switch_plan_once(monkeypatch):
    """Every window tries the same in-switch plans: each is made once per buffer mode, and
    whether rank 0 alone times it is checked once, for the whole directory."""
    from conftest import nvls_nodes

    topo = nvls_nodes(4, 2)
    builds: list[tuple] = []
    checked: list[int] = []
    build, check = plan_compiler.nvls_pipeline_plan, plan_compiler.symmetric

    def counted_build(topology, name, inplace, chunks, lanes=1, *args, **kwargs):
        builds.append((chunks, lanes, inplace))
        return build(topology, name, inplace, chunks, lanes, *args, **kwargs)

    def counted_check(plan, topology, *args):
        if plan.needs_symmetric_memory:  # an in-switch plan
            checked.append(replace(plan, name="-"))
        return check(plan, topology, *args)

    monkeypatch.setattr(plan_compiler, "nvls_pipeline_plan", counted_build)
    monkeypatch.setattr(plan_compiler, "symmetric", counted_check)
    out = compile_plans(topo, CompileOptions(collective="allreduce", check=False), 256 << 20, 4 << 30, fallbacks=True)
    assert len(out) >= 2 and all(cp.plans[0].needs_symmetric_memory for cp in out)  # both windows tried them
    assert len(builds) == len(set(builds)) and len({b[:2] for b in builds}) > 1  # once per shape and mode
    assert checked and len(checked) == len(set(checked))  # no plan checked twice, whichever window asked


def _fitted(topo, chunks: int, size: int = 1 << 20) -> tuple:
    """(program, plan, time, size, schedule) of a hierarchical schedule, as the compiler's choice."""
    schedule = hierarchical_plan(topo, chunks=chunks, max_bytes=size)
    program, plan = fit(schedule, topo, "t")
    return program, plan, time_plan(plan, topo, size), size, schedule


def test_a_simple_plan_takes_its_receives_in_a_pool_of_slots_where_that_costs_no_time():
    topo = preset("dgx-h100-8x2")
    best = _fitted(topo, 2)
    _program, plan, timed, _size, _schedule = plan_compiler._pooled(topo, CompileOptions(), best, 1 << 16, None,
                                                                    Stopwatch())
    assert plan.gpus[0].scratch_chunks * 1.5 < best[1].gpus[0].scratch_chunks
    assert timed.time_us <= best[2].time_us
    assert verify_plan(plan).ok


@pytest.mark.parametrize("name, chunks", [("dgx-h100-8x2", 2), ("torus-4x4", 4)])
def test_a_pool_that_is_slower_or_deadlocks_is_passed_over(monkeypatch, name, chunks):
    topo = preset(name)
    best = _fitted(topo, chunks)
    _, one = fit(best[4], topo, "t", pool=1)  # one slot per connection: slower on 8x2, a deadlock on the torus
    try:
        assert time_plan(one, topo, best[3]).time_us > best[2].time_us
    except SimulationError as exc:
        assert "deadlock" in str(exc)
    monkeypatch.setattr(plan_compiler, "POOLS", (1,))
    assert plan_compiler._pooled(topo, CompileOptions(), best, 1 << 16, None, Stopwatch()) is best


def test_a_plan_whose_handshakes_open_keeps_them_open_in_its_pools(monkeypatch):
    """The compiler opens a connection's handshake where that is faster; its pooled variants
    are translated the same way, or the faster opening would count against every pool."""
    topo = preset("dgx-h100-8x2")
    program, plain, timed, size, schedule = _fitted(topo, 2)
    every = frozenset((tb.chan, g.id, tb.send) for g, tb in program.threadblocks() if tb.send >= 0)
    opened = translate(program, topo, "t", opening=True, handshakes=every)
    assert opens_handshakes(opened) and not opens_handshakes(plain)
    asked: list[bool] = []
    real = plan_compiler.translate

    def spy(*args, **kwargs):
        asked.append(args[5] if len(args) > 5 else kwargs.get("opening", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_compiler, "translate", spy)
    plan_compiler._pooled(topo, CompileOptions(), (program, opened, time_plan(opened, topo, size), size, schedule),
                          1 << 16, None, Stopwatch())
    assert asked and all(asked)
    asked.clear()
    plan_compiler._pooled(topo, CompileOptions(), (program, plain, timed, size, schedule), 1 << 16, None, Stopwatch())
    assert asked and not any(asked)
