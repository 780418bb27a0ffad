"""The `hipipe` command line.

Exit codes: 0 success, 1 verification failed, 2 bad input (one line on stderr naming the
file, the field and what was expected; no traceback; no partial output file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from tabulate import tabulate

from . import __version__
from .arguments import Parser, integer_option, nonnegative_option, positive_option, size_option, size_range_option
from .compile_command import cmd_compile
from .mscclpp.reader import looks_like_plan
from .plan_commands import cmd_compile_plans, cmd_simulate_plan, cmd_verify_plan
from .compiler import ALGORITHMS, BUCKET_NCHUNKSPERLOOP, BUCKET_ROOM, BUCKET_WINDOW, DTYPES, check_fits_one_file
from .console import print_json, report_violations, verified
from .errors import InputError, PlanError
from .files import check_output_path, write_atomic
from .handoff import MIN_SPEEDUP
from .machine_commands import add_calibrate, cmd_calibrate, cmd_topo_import
from .msccl.lexical import lexical_issues
from .msccl.program import PLANNED_COLLECTIVES, PROTOCOLS
from .msccl.reader import read_program
from .msccl.runtime import DEFAULT_THREADBLOCK_BUDGET, RUNTIMES, Limits
from .msccl.selection import size_refusal
from .msccl.verify import Report, VerifyOptions, Violation, structural_violations, verify
from .msccl.writer import DIALECTS
from .optimizer.workers import MAX_JOBS
from .presets import PRESETS, load_topology
from .sim import SimulationError, simulate, simulate_exact
from .topology import PROTOCOLS as PROTOCOL_ORDER
from .training.planner import POLICIES
from .training.profiles import A100_AMP
from .units import format_size


RUNTIME_HELP = ("the runtime that will load the files, whose limits they must respect: "
                + "; ".join(f"{r.name} ({r.what}: at most {r.max_threadblocks} threadblocks, {r.max_channels} channels)"
                            for r in RUNTIMES.values()) + "; default executor")
DIALECT_HELP = "XML dialect: executor (msccl-executor-nccl, RCCL; default) or legacy (microsoft/msccl)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hipipe", description="Pipelined hierarchical collectives for multi-dimensional GPU networks, "
                     "compiled to verified MSCCL XML.")
    parser.add_argument("--version", action="version", version=f"hipipe-compiler {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("topo", help="show and check a topology file or preset; `hipipe topo import FILE.xml` makes "
                       "one from NCCL's topology XML")
    p.add_argument("topology", nargs="?", help=f"a YAML/JSON topology file or a preset ({', '.join(PRESETS)})")
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("compile", help="compile a collective for a topology into MSCCL XML")
    p.add_argument("topology", help="a YAML/JSON topology file or a preset")
    p.add_argument("--coll", default="allreduce", choices=PLANNED_COLLECTIVES, help="collective (default allreduce)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--size", type=size_option("--size"), help="one call size, e.g. 256MiB: writes one file")
    size.add_argument("--sizes", type=size_range_option, help="a range MIN:MAX, e.g. 1KiB:4GiB: writes one file per size window into a directory")
    p.add_argument("--algo", default="hipipe", choices=ALGORITHMS,
                   help="hipipe (default: the optimizer, judged by the simulator), or a baseline: hierarchical, ring")
    p.add_argument("--chunks", type=integer_option("--chunks", 1, 4096), help="baselines: pipeline chunks per loop iteration (default 1)")
    p.add_argument("--proto", choices=PROTOCOLS, help="baselines: MSCCL protocol (default Simple)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="element type of the calls (default float32)")
    p.add_argument("--max-nchunksperloop", type=integer_option("--max-nchunksperloop", 1),
                   help="cap the chunks per loop: the runtime runs a program only for element counts that are a multiple "
                   "of it, so a lower cap serves more calls unpadded, at some speed (default: none; among plans within "
                   "1%% of the fastest, the search already takes the finest)")
    p.add_argument("--max-bucket-nchunksperloop", type=integer_option("--max-bucket-nchunksperloop", 0),
                   help=f"hipipe: cap the element multiple (nchunksperloop, for an all-reduce) of the size windows below "
                   f"{format_size(BUCKET_WINDOW)}, where training frameworks' gradient buckets land: their element "
                   f"counts are often multiples of 256 and of nothing larger (default: {BUCKET_NCHUNKSPERLOOP} on "
                   f"topologies whose coarsest plan needs at most {BUCKET_NCHUNKSPERLOOP // BUCKET_ROOM}, else none; "
                   "0: none)")
    p.add_argument("--min-speedup", type=nonnegative_option("--min-speedup"), default=MIN_SPEEDUP,
                   help=f"hipipe, --sizes: leave to NCCL (write no file for) each window where our program is not this "
                   f"much faster than NCCL's own pick, at both ends, in the simulator: a margin for the model's error "
                   f"(default {MIN_SPEEDUP:g}; 0 keeps every window)")
    p.add_argument("--dialect", default="executor", choices=DIALECTS, help=DIALECT_HELP)
    p.add_argument("--runtime", default="executor", choices=sorted(RUNTIMES), help=RUNTIME_HELP)
    p.add_argument("--max-tbs", type=integer_option("--max-tbs", 1, 1024), default=DEFAULT_THREADBLOCK_BUDGET,
                   help=f"threadblock budget per rank (default {DEFAULT_THREADBLOCK_BUDGET}, the A100's SM count; "
                   "never more than the runtime accepts)")
    p.add_argument("--backend", default="msccl", choices=("msccl", "mscclpp"),
                   help="msccl: MSCCL XML (default); mscclpp: MSCCL++ execution plans (JSON) for its NCCL shim")
    p.add_argument("--ranks-per-node", type=integer_option("--ranks-per-node", 1),
                   help="mscclpp: ranks that share a node (memory channels among them, port channels between nodes; "
                   "default: the dimensions linked by NVLink or PCIe, else the innermost one)")
    p.add_argument("--inplace", action="store_true", help="mscclpp, --size: write the in-place plan (default out-of-place)")
    p.add_argument("--no-in-switch", action="store_true",
                   help="mscclpp: never reduce in the switch (NVLS), even where the topology declares nvls")
    p.add_argument("--max-scratch", type=size_option("--max-scratch"),
                   help="mscclpp: the most scratch each plan may take per rank and context (the executor allocates "
                   "one per pair of buffer allocations, sized by max_message_size where the allocations are that "
                   "large, and never frees it); each plan serves up to where its scratch would pass it, NCCL above "
                   "(default: no bound)")
    p.add_argument("--jobs", "-j", type=integer_option("--jobs", 1, 256),
                   help=f"processes that simulate the candidates the search is about to judge (hipipe) and prove each "
                   f"window's final program while the next is lowered; the programs do not depend on it (default: "
                   f"$HIPIPE_JOBS, else the usable cores, at most {MAX_JOBS}; 1: none besides this one)")
    p.add_argument("-o", "--output", required=True, help="output file (--size) or directory (--sizes)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.add_argument("--json", action="store_true", help="print the per-window summary as JSON")

    p = sub.add_parser("simulate", help="time an MSCCL XML program or an MSCCL++ plan on a topology (cost-model.md)")
    p.add_argument("file", help="an MSCCL XML algorithm file or an MSCCL++ execution plan (JSON)")
    p.add_argument("--topo", required=True, help="a YAML/JSON topology file or a preset")
    p.add_argument("--size", required=True, type=size_option("--size"), help="call size in bytes (nccl-tests convention), e.g. 1GiB")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeline", help="also draw the timeline (rows per dimension, bars coloured by chunk) to this .png or .svg file")
    p.add_argument("--rank", type=integer_option("--rank", 0), nargs="+", default=[0], help="timeline: draw the messages these ranks send (default 0)")
    p.add_argument("--per-rank", action="store_true", help="timeline: one set of rows per rank of --rank")
    p.add_argument("--dialect", default="executor", choices=DIALECTS, help=DIALECT_HELP)

    p = sub.add_parser("bench", help="every algorithm on every topology and size of a grid, side by side")
    p.add_argument("--grid", default=None, help="grid file (default: benchmarks/grid.yaml of the checkout, configs C1 C3 C5 C6, and C1p C6p with per-protocol latencies)")
    p.add_argument("--sizes", nargs="+", type=size_option("--sizes"), help="override the grid's sizes, e.g. 1MiB 64MiB 1GiB")
    p.add_argument("--algos", nargs="+", help="override the grid's algorithms")
    p.add_argument("--topo", nargs="+", help="benchmark these topologies (files or presets) instead of the grid's")
    p.add_argument("--plot", help="write busbw against size, one panel per topology, to this PNG/SVG file")
    p.add_argument("--csv", help="also write the rows as CSV to this file")
    p.add_argument("--json", help="also write the rows as JSON to this file")
    p.add_argument("--ablation", action="store_true",
                   help="add HiPIPE's ablation: uniform chunks, LP sizes with one order, LP sizes with mixed orders, fixed K=8")
    p.add_argument("--backend", choices=("msccl", "mscclpp"), default="msccl",
                   help="mscclpp: add hipipe-mscclpp, HiPIPE's schedules as MSCCL++ plans timed as plans, beside the XML programs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("plan", help="plan a training iteration's gradient synchronisation (PipeDAP-style) and compile its programs")
    p.add_argument("--profile", required=True, help="a built-in model (vgg16, resnet50, densenet201, bert_base, gpt2) or a layer-profile YAML/JSON file")
    p.add_argument("--topo", required=True, help="a YAML/JSON topology file or a preset")
    p.add_argument("--policy", default="hipipe", choices=POLICIES, help="the policy whose plan is written (default hipipe, ours); the table compares all")
    p.add_argument("--algo", default="hipipe", choices=ALGORITHMS, help="algorithm of the compiled collectives (default hipipe)")
    p.add_argument("--batch-size", type=integer_option("--batch-size", 1), help=f"per-GPU batch for times derived from MACs (default {A100_AMP.batch_size})")
    p.add_argument("--tflops", type=positive_option("--tflops"), help=f"effective device TFLOP/s for derived times (default {A100_AMP.tflops:g}, an A100 with AMP)")
    p.add_argument("--derive-all", action="store_true", help="derive every time from MACs, also the measured ones")
    p.add_argument("--runtime", default="executor", choices=sorted(RUNTIMES), help=RUNTIME_HELP)
    p.add_argument("-o", "--output", help="write DIR/plan.json and DIR/msccl-algorithms/ (for MSCCL_ALGO_DIR)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("coverage", help="which calls of a training job a directory of programs really serves")
    p.add_argument("directory", help="a directory of MSCCL programs (as for MSCCL_ALGO_DIR) or of MSCCL++ plans")
    calls = p.add_mutually_exclusive_group(required=True)
    calls.add_argument("--profile", help="a built-in model or a layer-profile file: its PyTorch DDP gradient buckets")
    calls.add_argument("--counts", help="a file of element counts, one all-reduce per line")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="element type (default float32)")
    p.add_argument("--bucket-cap-mb", type=positive_option("--bucket-cap-mb"), default=25.0, help="DDP's bucket_cap_mb (default 25)")
    p.add_argument("--first-bucket-mb", type=positive_option("--first-bucket-mb"), default=1.0, help="DDP's first bucket cap (default 1)")
    p.add_argument("--world-size", type=integer_option("--world-size", 1), help="the ranks of the job, when the directory has programs for several")
    p.add_argument("--symmetric-memory", action="store_true", help="MSCCL++ plans: the job runs with "
                   "MSCCLPP_NCCL_SYMMETRIC_MEMORY=1, so plans that address peers' buffers (in-switch) serve too")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    add_calibrate(sub)

    p = sub.add_parser("verify", help="prove an MSCCL XML program or an MSCCL++ plan correct, or name each broken rule")
    p.add_argument("file", help="an MSCCL XML algorithm file or an MSCCL++ execution plan (JSON)")
    p.add_argument("--aliased", action="store_true", help="MSCCL++ reduce-scatter plans: also prove NCCL's in-place "
                   "layout, which the shim hands to out-of-place plans")
    p.add_argument("--max-steps", type=integer_option("--max-steps", 1, 256), default=64, help="steps allowed per threadblock (default 64)")
    p.add_argument("--runtime", default="executor", choices=sorted(RUNTIMES), help=RUNTIME_HELP)
    p.add_argument("--max-tbs", type=integer_option("--max-tbs", 1, 1024), help="threadblocks allowed per rank (default: what the runtime accepts)")
    p.add_argument("--size", type=size_option("--size"), help="call size for the FIFO model (default: the file's maxBytes)")
    p.add_argument("--rendezvous", action="store_true", help="conservative mode: every send waits for its receive")
    p.add_argument("--dialect", default="executor", choices=DIALECTS, help=DIALECT_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["topo", "import"]:
        return _guarded(lambda: cmd_topo_import(argv[2:]))
    args = build_parser().parse_args(argv)
    if args.command == "compile" and args.backend == "mscclpp":
        return _guarded(lambda: cmd_compile_plans(args))
    if args.command in ("verify", "simulate") and looks_like_plan(args.file):
        return _guarded(lambda: (cmd_verify_plan if args.command == "verify" else cmd_simulate_plan)(args))
    return _guarded(lambda: {"topo": cmd_topo, "compile": cmd_compile, "verify": cmd_verify, "simulate": cmd_simulate,
                "bench": cmd_bench, "plan": cmd_plan, "coverage": cmd_coverage,
                "calibrate": cmd_calibrate}[args.command](args))


def _guarded(run: Any) -> int:
    """Run a command; bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        return run()
    except InputError as exc:
        print(f"hipipe: error: {exc}", file=sys.stderr)
        return 2
    except PlanError as exc:
        print(f"hipipe: error: cannot compile this plan: {exc}", file=sys.stderr)
        return 2
    except SimulationError as exc:
        print(f"hipipe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path the file system refuses (a name too long, a loop of links): bad input
        where = f"{str(exc.filename)[:200]}: " if exc.filename else ""
        print(f"hipipe: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# -- topo -------------------------------------------------------------------------------------


def cmd_topo(args: argparse.Namespace) -> int:
    if args.list or not args.topology:
        rows = [(name, t.nranks, " x ".join(f"{d.size} {d.kind}" for d in t.dimensions)) for name, t in PRESETS.items()]
        if args.json:
            print_json({name: t.to_document() for name, t in PRESETS.items()})
        else:
            print(tabulate(rows, headers=("preset", "ranks", "dimensions")))
        return 0
    topo = load_topology(args.topology)
    doc = topo.describe()
    if args.json:
        print_json(doc)
        return 0
    print(f"{topo.label}: {topo.nranks} ranks in {topo.ndims} dimension(s), innermost first")
    rows = []
    for d, dim in enumerate(topo.dimensions):
        links = "2 directed links (B/2 each)" if dim.uses_both_directions else (
            "1 directed link each way" if dim.kind == "ring" else f"1 port to {dim.size - 1} peers")
        if dim.nvls is not None:
            links += f"; in-switch reduction at {dim.nvls.efficiency:g} of B"
        rows.append((topo.dim_name(d), dim.size, dim.kind, dim.link or "-", dim.bandwidth,
                     *(dim.alpha(p) for p in PROTOCOL_ORDER), links))
    print(tabulate(rows, headers=("dimension", "size", "kind", "link", "GB/s", *(f"{p} us" for p in PROTOCOL_ORDER),
                                  "per rank")))
    if not any(dim.per_protocol for dim in topo.dimensions):
        print("latency: one number per dimension, the same for every protocol")
    if topo.call_latency is not None:
        costs = ", ".join(f"{p} {topo.call_cost(p):g}" for p in PROTOCOL_ORDER)
        print(f"per-call cost (us, paid once per call): {costs}")
    for d in topo.nvls_dimensions:
        nvls = topo.dimensions[d].nvls
        assert nvls is not None
        print(f"in-switch reduction on {topo.dim_name(d)}: efficiency {nvls.efficiency:g}, "
              f"{nvls.call_latency:g} us per call on top")
    if topo.gpu or topo.cpu:
        print("hardware: " + ", ".join(f"{k} {v}" for k, v in (("gpu", topo.gpu), ("cpu", topo.cpu)) if v))
    if topo.reduce_bandwidth:
        print(f"local reduce bandwidth: {topo.reduce_bandwidth} GB/s")
    return 0


# -- compile ----------------------------------------------------------------------------------


# -- verify -----------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    path = Path(args.file)
    program = read_program(path, args.dialect)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read file: {exc.strerror}") from None
    lexical = [Violation(i.rule, f"line {i.line}: {i.message}") for i in lexical_issues(data)]
    report = verify(program, VerifyOptions(max_steps=args.max_steps, max_threadblocks=args.max_tbs, runtime=args.runtime,
                                           nbytes=args.size, rendezvous=args.rendezvous))
    if lexical:
        report = Report(tuple(lexical) + report.violations, ("lexical",) + report.checked, report.skipped, report.stats)
    else:
        report = Report(report.violations, ("lexical",) + report.checked, report.skipped, report.stats)
    if args.json:
        print_json({"file": str(path), "ok": report.ok, "collective": program.collective, "ranks": program.ngpus,
                     "checked": list(report.checked), "skipped": list(report.skipped),
                     "violations": [v.to_dict() for v in report.violations]})
    elif report.ok:
        print(f"{path}: {program.collective} on {program.ngpus} ranks, {program.nsteps} steps: {report.summary()}")
    else:
        report_violations(str(path), report)
    return 0 if report.ok else 1


# -- simulate -----------------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    program = read_program(args.file, args.dialect)
    topo = load_topology(args.topo)
    if program.ngpus != topo.nranks:
        raise InputError(args.file, "algo.ngpus", f"the program is for {program.ngpus} ranks but {topo.label} has {topo.nranks}")
    broken = structural_violations(program)
    if broken:  # a time for a program that cannot run would mean nothing
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise InputError(args.file, None, f"cannot be simulated: {broken[0]}{more}; hipipe verify names every broken rule")
    if args.timeline:
        from .sim.timeline import check_picture_path
        check_picture_path(args.timeline)
        check_output_path(args.timeline, directory=False, option="--timeline")
        bad = [r for r in args.rank if r >= topo.nranks]
        if bad:
            raise InputError(None, "--rank", f"expected ranks below {topo.nranks}, got {bad[0]}")
    if args.timeline:  # draws every rank
        result = simulate(program, topo, args.size, record=True)
        from .sim.timeline import render_timeline
        render_timeline(result, program, topo, args.timeline, args.rank, args.per_rank)
    else:  # rank 0 alone where every rank runs its schedule shifted: exact
        result = simulate_exact(program, topo, args.size)
    # timed all the same: what the program would take is still worth knowing
    refused = size_refusal(program, args.size)
    notes = [f"the runtime would not run this program for a call of {format_size(args.size)} (float32): {refused}"] if refused else []
    if args.json:
        print_json({"file": args.file, "topology": topo.label, **result.to_dict(),
                     **({"timeline": args.timeline} if args.timeline else {}), "notes": notes})
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    u = result.utilisation
    print(f"{args.file}: {program.collective} of {format_size(args.size)} on {topo.label} ({topo.nranks} ranks), "
          f"{result.iterations} iteration(s)")
    print(f"  time {result.time_us:,.2f} us   algbw {result.algbw_GBps:,.2f} GB/s   busbw {result.busbw_GBps:,.2f} GB/s")
    if result.lower_bound_us is not None and u is not None:
        print(f"  physical limit T_LB {result.lower_bound_us:,.2f} us   utilisation T_LB/T {u:.3f}")
    rows = [(d.name, format_size(d.bytes_per_rank), f"{d.busy_fraction:.3f}") for d in result.dims]
    print(tabulate(rows, headers=("dimension", "bytes sent per rank", "busy fraction")))
    if args.timeline:
        print(f"wrote the timeline to {args.timeline}")
    return 0


# -- bench --------------------------------------------------------------------------------------


def _default_grid() -> Path:
    """benchmarks/grid.yaml of the checkout: under the working directory, else beside the package."""
    here = Path.cwd() / "benchmarks" / "grid.yaml"
    return here if here.is_file() else Path(__file__).resolve().parent.parent / "benchmarks" / "grid.yaml"


def cmd_bench(args: argparse.Namespace) -> int:
    from dataclasses import replace as dc_replace

    from .bench import BASELINES, Grid, check_algorithms, load_grid, plot, run_grid, table, to_csv, to_json
    for option, target in (("--plot", args.plot), ("--csv", args.csv), ("--json", args.json)):
        if target:
            check_output_path(target, directory=False, option=option)
    if args.plot:  # before hours of benchmarking, not after
        from .sim.timeline import check_picture_path
        check_picture_path(args.plot)
    if args.grid:
        grid = load_grid(args.grid)
    elif args.topo:
        grid = Grid({load_topology(t).label: load_topology(t) for t in args.topo}, (1 << 20, 64 << 20, 1 << 30),
                    algorithms=(*BASELINES, "nccl", "hipipe"))
    else:
        path = _default_grid()
        if not path.is_file():
            raise InputError(str(path), None, "no default grid here (run from the checkout); pass --grid FILE or --topo")
        grid = load_grid(path)
    if args.topo and args.grid:
        grid = dc_replace(grid, topologies={load_topology(t).label: load_topology(t) for t in args.topo})
    if args.sizes:
        grid = dc_replace(grid, sizes=tuple(args.sizes))
    if args.algos:
        check_algorithms(args.algos, BASELINES)
        grid = dc_replace(grid, algorithms=tuple(args.algos))
    if args.backend == "mscclpp":
        from .bench import MSCCLPP
        grid = dc_replace(grid, algorithms=tuple(dict.fromkeys((*grid.algorithms, MSCCLPP))))
    if args.ablation:
        from .bench import OPTIMIZED
        grid = dc_replace(grid, algorithms=tuple(dict.fromkeys((*grid.algorithms, *OPTIMIZED))))
    rows = run_grid(grid, progress=not args.no_progress and sys.stderr.isatty())
    print(table(rows))
    if args.csv:
        write_text(args.csv, to_csv(rows))
    if args.json:
        write_text(args.json, to_json(rows))
    if args.plot:
        plot(rows, args.plot, grid)
    return 0


# -- plan -------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .training.commcost import SimulatedCost
    from .training.planner import describe_cost, plan_training, write_plan
    from .training.profiles import load_profile
    out = check_output_path(args.output, directory=True) if args.output is not None else None
    topo = load_topology(args.topo)
    check_fits_one_file(topo, args.topo)
    device = replace(A100_AMP, batch_size=args.batch_size or A100_AMP.batch_size, tflops=args.tflops or A100_AMP.tflops)
    profile = load_profile(args.profile, device, keep_measured=not args.derive_all)
    if (args.batch_size or args.tflops) and not args.derive_all and not args.json:
        print("note: --batch-size and --tflops only change the times derived from MACs; measured times are kept "
              "unless --derive-all is given", file=sys.stderr)
    bar = None
    if not args.json and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(desc="compiling programs", unit="window", leave=False)
    cost = SimulatedCost(topo, args.algo, profile.dtype_bytes, Limits.for_runtime(args.runtime),
                         progress=None if bar is None else lambda coll, w: (bar.set_postfix_str(f"{coll} {w.label}"), bar.update()))
    def work() -> tuple[Any, Any]:
        report = plan_training(profile, cost, topo.nranks)
        return report, (write_plan(report, args.policy, cost, out, topo.label) if out is not None else None)

    result, failed = verified(topo, bar, work)
    if failed:
        return failed
    report, doc = result
    summary = report.summary()
    if args.json:
        print_json({"profile": profile.name, "topology": topo.label, "world_size": topo.nranks,
                     "cost_model": describe_cost(cost), "compute_ms": report.compute_ms, "best": report.best,
                     "written": None if out is None else {"policy": args.policy, "plan": str(out / "plan.json"),
                                                          "msccl_algo_dir": str(out / "msccl-algorithms"),
                                                          "programs": [p["xml"] for p in doc["programs"]]},
                     "policies": summary, "notes": list(profile.notes)})
        return 0
    print(f"{profile.name}: {len(profile.layers)} layers, {profile.params / 1e6:.1f}M parameters "
          f"({format_size(profile.nbytes)} of gradients), compute {report.compute_ms:.2f} ms per iteration")
    print(f"on {topo.label} ({topo.nranks} ranks); collective times: {describe_cost(cost)}")
    for note in profile.notes:
        print(f"note: {note}")
    rows = []
    fastest = min(r.iteration_ms for r in report.results)
    for r in report.results:
        prims = r.plan.primitives
        rows.append((r.policy + (" *" if r.iteration_ms <= fastest * (1 + 1e-12) else ""), len(r.plan.buckets),
                     f"{prims.count('allreduce')} AR / {prims.count('rs+ag')} RS+AG", f"{r.iteration_ms:.3f}",
                     f"{r.exposed_comm_ms:.3f}", f"{r.iteration_ms / report['wfbp'].iteration_ms:.3f}" if "wfbp" in report.policies else "-"))
    print(tabulate(rows, headers=("policy", "buckets", "primitives", "iteration ms", "exposed comm ms", "vs wfbp"),
                   disable_numparse=True))
    if out is not None:
        print(f"wrote {out / 'plan.json'} ({args.policy}) and {len(doc['programs'])} verified program(s) in "
              f"{out / 'msccl-algorithms'}/ (MSCCL_ALGO_DIR={out / 'msccl-algorithms'})")
    return 0


# -- coverage ---------------------------------------------------------------------------------


def cmd_coverage(args: argparse.Namespace) -> int:
    from .coverage import (MIB, coverage, ddp_buckets, directory_programs, left_windows, plan_coverage, profile_tensors,
                           read_counts)
    from .coverage import directory_plans
    from .training.profiles import load_profile
    if not Path(args.directory).is_dir():
        raise InputError(args.directory, None, "expected a directory of MSCCL programs (as for MSCCL_ALGO_DIR) or of "
                         "MSCCL++ plans")
    found = directory_plans(args.directory, "allreduce", args.world_size)
    plans = found is not None
    if found is not None:
        entries, world = found
        files = [(e.file, e) for e in entries]
    else:
        files, world = directory_programs(args.directory, "allreduce", args.world_size)
    dtype_bytes = DTYPES[args.dtype]
    if args.counts is not None:
        counts = read_counts(args.counts)
        labels = [f"line {i + 1}" for i in range(len(counts))]
        source = args.counts
    else:
        profile = load_profile(args.profile)
        buckets = ddp_buckets(profile_tensors(profile), dtype_bytes, int(args.bucket_cap_mb * MIB),
                              int(args.first_bucket_mb * MIB))
        labels, counts = [b[0] for b in buckets], [b[1] for b in buckets]
        source = f"{profile.name}: PyTorch DDP buckets ({args.first_bucket_mb:g} MiB first, then {args.bucket_cap_mb:g} MiB)"
    left = left_windows(args.directory, "allreduce", world)
    if plans:
        report = plan_coverage([e for _name, e in files], counts, dtype_bytes, world, labels, left=left,
                               symmetric_memory=args.symmetric_memory)
    else:
        report = coverage(files, counts, dtype_bytes, world, labels, left=left)
    if args.json:
        print_json({"directory": str(args.directory), "calls_from": source, **report.to_dict()})
        return 0
    kind = "MSCCL++ plan(s)" if plans else "program(s)"
    print(f"{args.directory}: {len(files)} all-reduce {kind} for {world} ranks; calls: {source}, {args.dtype}")
    rows = [(c.label if len(c.label) <= 40 else c.label[:37] + "...", c.count, format_size(c.nbytes),
             c.file or "-", "" if c.file else c.why_not,
             "-" if c.padded_count is None else f"+{c.padded_count - c.count}") for c in report.calls_detail]
    print(tabulate(rows, headers=("call", "elements", "size", "served by", "why not", "pad"), disable_numparse=True))
    share = report.served_bytes / report.bytes if report.bytes else 0.0
    print(f"served: {report.served_calls} of {report.calls} calls, {share:.1%} of {format_size(report.bytes)}"
          + (f"; {report.left_calls} left to NCCL by design (it is as fast there)" if report.left_calls else ""))
    print(f"padded to the smallest count a file serves: {report.padded_served_calls} of {report.calls} calls, "
          f"{report.padded_extra_bytes} extra bytes ({report.padded_extra_bytes / max(report.bytes, 1):.3%})")
    if report.scratch_bytes is not None:
        print(f"scratch the executor keeps per GPU for these calls: at most {format_size(report.scratch_bytes)}, a context "
              "per bucket while each keeps its buffer, each sized by its plan's largest message (docs/mscclpp.md; "
              "compile with --max-scratch to bound it)")
    ambiguous = [c for c in report.calls_detail if c.also]
    if ambiguous:
        print(f"note: {len(ambiguous)} call(s) match several files; the runtime takes the first in the directory "
              "listing's order, which depends on the file system")
    return 0


def write_text(path: str, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise InputError(path, None, f"cannot write: {exc.strerror or exc}") from None


if __name__ == "__main__":
    sys.exit(main())
