"""`hipipe compile --backend mscclpp`, and `hipipe verify` / `hipipe simulate` of MSCCL++
execution plans (JSON): the same commands as for MSCCL XML, on the other backend."""

from __future__ import annotations

import argparse
import gc
from dataclasses import replace
from typing import Sequence

from .background import available_memory
from .collector import paused
from .compiler import DTYPES, CompileOptions, Stopwatch
from .console import print_json, report_violations, summary_table, verified
from .errors import InputError
from .files import check_output_path, write_atomic, writing
from .handoff import against_nccl, fallbacks_against_nccl, kept, left
from .msccl.runtime import Limits
from .optimizer.workers import default_jobs
from .mscclpp.plan import ExecutionPlan
from .mscclpp.reader import read_plan
from .sim.plans import time_plan
from .msccl.verify.report import Collector
from .mscclpp.verify import layouts_of, verify_plan
from .mscclpp.verify.footprint import ProofTooLarge
from .mscclpp.verify.structure import check_structure
from .mscclpp.writer import write_plan
from .mscclpp.register import SYMMETRIC_MEMORY_ENV
from .plan_compiler import (base_manifest, compile_plans, node_size_of, plan_summary, plan_timer,
                            scratch_binds, size_multiple, write_plans_directory)
from .presets import load_topology
from .sim import SimulationError
from .units import format_size
from .windows import Window, window_label


def cmd_compile_plans(args: argparse.Namespace) -> int:
    directory = args.sizes is not None
    if args.dialect != "executor" or args.runtime != "executor":
        raise InputError(None, "--backend", "mscclpp writes JSON execution plans: --dialect and --runtime are MSCCL's")
    out = check_output_path(args.output, directory)
    topo = load_topology(args.topology)
    node = node_size_of(topo, args.ranks_per_node)
    options = CompileOptions(
        collective=args.coll, algorithm=args.algo, chunks=args.chunks, protocol=args.proto,
        dtype_bytes=DTYPES[args.dtype], limits=replace(Limits(), max_threadblocks=args.max_tbs),
        max_nchunksperloop=args.max_nchunksperloop, jobs=args.jobs or default_jobs(),
        max_bucket_nchunksperloop="auto" if args.max_bucket_nchunksperloop is None else args.max_bucket_nchunksperloop or None,
    )
    lo, hi = args.sizes if directory else (args.size, args.size)
    watch = Stopwatch()
    compiled, failed = verified(topo, None, lambda: compile_plans(topo, options, lo, hi, node_size=node, stopwatch=watch,
                                                                  in_switch=not args.no_in_switch, fallbacks=directory,
                                                                  max_scratch=args.max_scratch))
    if failed:
        return failed
    windows = [cp.window for cp in compiled]
    if args.algo == "hipipe":
        with watch.phase("nccl"):
            windows = against_nccl(windows, topo, args.coll, args.min_speedup if directory else 0.0,
                                   plan_timer(compiled, topo))
    compiled = [fallbacks_against_nccl(replace(cp, window=w), args.min_speedup if directory else 0.0)
                for cp, w in zip(compiled, windows)]
    summaries = [plan_summary(cp) for cp in compiled]
    if not directory:
        plan = next((p for p in compiled[0].plans if p.inplace == args.inplace), None)
        if plan is None:
            raise InputError(None, "--inplace", f"this {args.coll} program has no {'in-place' if args.inplace else 'out-of-place'} form")
        if args.size % size_multiple(plan):
            raise InputError(None, "--size", f"{args.size} bytes is not a multiple of {size_multiple(plan)} bytes (the "
                             "plan's chunks on 16-byte boundaries): the executor would refuse the call")
        with writing(out):
            write_atomic(out, write_plan(plan))
    keep = {id(w) for w in kept(windows)}
    if directory:
        manifest = {**base_manifest(topo, args.coll, args.algo, node),
                    "min_speedup": args.min_speedup if args.algo == "hipipe" else None,
                    "max_scratch": args.max_scratch,
                    "windows": [s for s, w in zip(summaries, windows) if id(w) in keep],
                    "left_to_nccl": [s for s, w in zip(summaries, windows) if id(w) not in keep]}
        with watch.phase("write"):
            write_plans_directory([cp for cp in compiled if id(cp.window) in keep], out, manifest, node)
    if args.json:
        print_json({"output": str(out), "backend": "mscclpp", "windows": summaries, "seconds": watch.seconds})
    elif not args.quiet:
        count = sum(len(cp.plans) + len(cp.fallbacks) for cp in compiled if id(cp.window) in keep)
        where = f"{out}/ ({count} plan(s); register them with hipipe_compiler.mscclpp.register)" if directory else str(out)
        print(f"{args.coll} on {topo.label} ({topo.nranks} ranks, {node} per node), {args.algo}, MSCCL++ plans: wrote {where}")
        print(summary_table(summaries))
        if directory and left(windows):
            labels = ", ".join(w.window.label for w in left(windows))
            print(f"left to NCCL (not {args.min_speedup:g}x as fast as NCCL's own pick there): {labels}; the shim "
                  "falls back to NCCL for those calls")
        served_to = max(cp.window.window.max_bytes for cp in compiled)
        if directory and served_to < hi:
            tops = [p for cp in compiled if cp.window.window.max_bytes == served_to for p in (*cp.plans, *cp.fallbacks)]
            why = (f"the plans' scratch per context would pass --max-scratch {format_size(args.max_scratch)}"
                   if scratch_binds(tops, args.max_scratch)
                   else "the plans' offsets would wrap the executor's uint32 there (their buffers or scratch pass 4 GiB; "
                   "mscclpp.md 6)")
            print(f"above {format_size(served_to)} the shim runs NCCL: {why}")
        symmetric = [cp for cp in compiled if id(cp.window) in keep and cp.plans[0].needs_symmetric_memory]
        if directory and symmetric:
            instead = {how: _ranges([cp.window.window for cp in symmetric if bool(cp.fallbacks) == fb])
                       for how, fb in (("the GPU-side fallback", True), ("NCCL", False))}
            print(f"in-switch plans address peers' buffers: they serve jobs run with {SYMMETRIC_MEMORY_ENV}=1 "
                  "(docs/mscclpp.md); otherwise the shim runs "
                  + "; ".join(f"{how} for {labels}" for how, labels in instead.items() if labels))
    return 0


def _ranges(windows: Sequence[Window]) -> str:
    """Size windows as few labels as they make, joining those that follow each other."""
    joined: list[tuple[int, int]] = []
    for w in sorted(windows, key=lambda w: w.min_bytes):
        if joined and joined[-1][1] + 1 == w.min_bytes:
            joined[-1] = (joined[-1][0], w.max_bytes)
        else:
            joined.append((w.min_bytes, w.max_bytes))
    return ", ".join(window_label(lo, hi) for lo, hi in joined)


def _read(path: str) -> ExecutionPlan:
    """A plan to prove or time: its objects are then left out of the cycle collector's passes
    (a 1024-rank plan is hundreds of thousands of them even with repeats shared, none in a
    cycle, and the proof makes millions more). They are frozen before the collector resumes:
    its first pass would otherwise walk them all."""
    with paused():
        plan = read_plan(path)
        gc.freeze()
    return plan


def cmd_verify_plan(args: argparse.Namespace) -> int:
    plan = _read(args.file)
    try:
        report = verify_plan(plan, layouts_of(plan, aliased=args.aliased), available=available_memory())
    except ProofTooLarge as e:
        raise InputError(args.file, None, f"{e}; prove it on a machine with more memory") from None
    if args.json:
        print_json({"file": args.file, "ok": report.ok, "collective": plan.collective, "ranks": plan.ngpus,
                    "format": "mscclpp", "checked": list(report.checked),
                    "violations": [v.to_dict() for v in report.violations]})
    elif report.ok:
        ops = sum(sum(1 for _ in tb.flat_ops()) for g in plan.gpus for tb in g.threadblocks)
        print(f"{args.file}: MSCCL++ plan, {plan.collective} on {plan.ngpus} ranks, {ops} operations: {report.summary()}")
    else:
        report_violations(args.file, report)
    return 0 if report.ok else 1


def cmd_simulate_plan(args: argparse.Namespace) -> int:
    if args.timeline:
        from .sim.timeline import check_picture_path
        check_picture_path(args.timeline)
        check_output_path(args.timeline, directory=False, option="--timeline")
    plan = _read(args.file)
    topo = load_topology(args.topo)
    if plan.ngpus != topo.nranks:
        raise InputError(args.file, "gpus", f"the plan is for {plan.ngpus} ranks but {topo.label} has {topo.nranks}")
    broken = Collector(1)  # a time for a plan that cannot load would mean nothing; its semantics need not hold
    if not check_structure(plan, broken):
        raise InputError(args.file, None, f"cannot be simulated: {broken.items[0]}; hipipe verify names every broken rule")
    try:
        result = time_plan(plan, topo, args.size, record=bool(args.timeline))
    except SimulationError as exc:
        if exc.exit_code == 2:
            raise InputError(args.file, "--size", str(exc)) from None
        raise
    if args.timeline:
        from .sim.timeline import render_plan_timeline
        if any(not 0 <= r < topo.nranks for r in args.rank):
            raise InputError(None, "--rank", f"expected ranks below {topo.nranks}, got {max(args.rank)}")
        render_plan_timeline(result, plan.name, topo, args.timeline, args.rank)
    if args.json:
        print_json({"file": args.file, "topology": topo.label, "format": "mscclpp", **result.to_dict()})
        return 0
    u = result.utilisation
    print(f"{args.file}: MSCCL++ plan, {plan.collective} of {format_size(args.size)} on {topo.label} ({topo.nranks} ranks)")
    print(f"  time {result.time_us:,.2f} us   algbw {result.algbw_GBps:,.2f} GB/s   busbw {result.busbw_GBps:,.2f} GB/s")
    if result.lower_bound_us is not None and u is not None:
        print(f"  physical limit T_LB {result.lower_bound_us:,.2f} us   utilisation T_LB/T {u:.3f}")
    return 0


