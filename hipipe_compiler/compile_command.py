"""`hipipe compile`: a collective for a topology, one verified MSCCL file or a directory of
size windows; a directory leaves to NCCL the windows where NCCL would be as fast."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .compiler import (
    BUCKET_WINDOW, DTYPES, CompileOptions, Stopwatch, check_divisible, check_fits_one_file, compile_range,
    window_summary, write_directory, write_file,
)
from .console import print_json, summary_table, verified
from .errors import InputError
from .files import check_output_path
from .handoff import against_nccl, kept, left
from .msccl.runtime import LEGACY_MAX_ALGORITHMS, Limits
from .optimizer.workers import default_jobs
from .presets import load_topology
from .units import format_size


def _bucket_setting(value: int | None) -> int | str | None:
    """--max-bucket-nchunksperloop as CompileOptions takes it: absent "auto", 0 none."""
    return "auto" if value is None else value or None


def cmd_compile(args: argparse.Namespace) -> int:
    directory = args.sizes is not None
    if args.max_scratch is not None:
        raise InputError(None, "--max-scratch", "bounds MSCCL++ plans' scratch: use it with --backend mscclpp")
    out = check_output_path(args.output, directory)
    topo = load_topology(args.topology)
    check_fits_one_file(topo, args.topology)
    options = CompileOptions(
        collective=args.coll, algorithm=args.algo, chunks=args.chunks, protocol=args.proto,
        dtype_bytes=DTYPES[args.dtype], limits=Limits.for_runtime(args.runtime, args.max_tbs),
        max_nchunksperloop=args.max_nchunksperloop, max_bucket_nchunksperloop=_bucket_setting(args.max_bucket_nchunksperloop),
        jobs=args.jobs or default_jobs(),
    )
    lo, hi = args.sizes if directory else (args.size, args.size)
    planner = None
    bar = None
    if args.algo == "hipipe" and not args.quiet and not args.json and sys.stderr.isatty():
        from functools import partial

        from tqdm import tqdm

        from .compiler import hipipe_planner
        # tqdm's monitor thread outlives the bar, and a process with a second thread forks no workers or proofs
        tqdm.monitor_interval = 0
        bar = tqdm(desc="planning windows", unit="window", leave=False)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
        planner = partial(hipipe_planner, progress=progress)
    watch = Stopwatch()
    windows, failed = verified(topo, bar, lambda: compile_range(topo, options, lo, hi, planner, stopwatch=watch))
    if failed:
        return failed
    # the cap the planner applied to some window (none for one size, a baseline, or too many ranks)
    bucket_cap = next((w.details["bucket_cap"] for w in windows if w.details.get("bucket_cap") is not None), None)
    notes: list[str] = []
    if args.algo == "hipipe":
        with watch.phase("nccl"):
            windows = against_nccl(windows, topo, args.coll, args.min_speedup if directory else 0.0)
    if not directory:
        check_divisible(windows[0].program, args.size, options.dtype_bytes)
        with watch.phase("write"):
            write_file(windows[0], out, args.dialect)
        speedup = windows[0].details.get("nccl", {}).get("speedup")
        if speedup is not None and speedup < args.min_speedup:
            notes.append(f"NCCL's own pick ({windows[0].details['nccl']['nccl_runs'][0]}) is predicted at "
                         f"{speedup:.2f}x this program's speed or better at this size: a directory (--sizes) would leave "
                         "it to NCCL")
    else:
        manifest = {
            "tool": f"hipipe-compiler {__version__}", "topology": topo.to_document(), "collective": args.coll,
            "algorithm": args.algo, "dialect": args.dialect, "runtime": args.runtime, "dtype_bytes": options.dtype_bytes,
            "max_nchunksperloop": args.max_nchunksperloop,
            "max_bucket_nchunksperloop": bucket_cap,
            "bucket_window_bytes": BUCKET_WINDOW,
            "min_speedup": args.min_speedup if args.algo == "hipipe" else None,
            "windows": [window_summary(w) for w in kept(windows)],
            "left_to_nccl": [window_summary(w) for w in left(windows)],
        }
        with watch.phase("write"):
            write_directory(kept(windows), out, manifest, args.dialect)
    if args.dialect == "legacy":
        folder = out if directory else out.parent
        held = len(list(folder.glob("*.xml")))
        if held > LEGACY_MAX_ALGORITHMS:
            notes.append(f"microsoft/msccl loads at most {LEGACY_MAX_ALGORITHMS} algorithms from MSCCL_XML_FILES and "
                         f"{folder}/ holds {held} ({len(windows)} from this run): list the ones your job calls most")
    summaries = [window_summary(w) for w in windows]
    if args.json:
        print_json({"output": str(out), "windows": summaries, "seconds": watch.seconds, "notes": notes})
    elif not args.quiet:
        where = f"{out}/ ({len(kept(windows))} file(s); MSCCL_ALGO_DIR={out})" if directory else str(out)
        print(f"{args.coll} on {topo.label} ({topo.nranks} ranks), {args.algo}: wrote {where}")
        print(summary_table(summaries))
        if directory and left(windows):
            labels = ", ".join(w.window.label for w in left(windows))
            print(f"left to NCCL (not {args.min_speedup:g}x as fast as NCCL's own pick there): {labels}; the runtime "
                  "runs NCCL for those calls")
        if bucket_cap is not None:
            print(f"below {format_size(BUCKET_WINDOW)} every program of a range of sizes serves element counts in "
                  f"multiples of at most {bucket_cap}, as gradient buckets need; --max-bucket-nchunksperloop 0 takes "
                  "the fastest plans instead")
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return 0
