"""Every plan of the default directories, fallbacks included, loaded by MSCCL++'s own loader on a CPU.

MSCCL++ cannot run without CUDA, but its plan loader can. This script compiles the default
directories (the sample topologies up to 128 ranks, all three collectives, 64 KiB to 1 GiB),
hands every plan to a `load-plan` program for every rank, at the largest size of its window that
the plan's chunks divide (`--both-ends`: the smallest too), and prints each plan's verdict and
how many the loader accepts. The target: all of them.

    python benchmarks/mscclpp_loader.py LOAD_PLAN [--both-ends] [--jobs N] [--collective C] [--sizes LO:HI]
                                          [TOPOLOGY ...]

LOAD_PLAN is MSCCL++'s loader (execution_plan.cc at the pinned commit) built for a CPU with a
driver, outside this repository, that takes `PLAN.json RANK NBYTES` (NBYTES as NCCL's shim
passes it: an all-gather's per-rank input, a reduce-scatter's per-rank output) and exits 0 when
MSCCL++ accepts the plan, 1, 3 or 4 with one line on stderr when it refuses (an exception, an
assertion, a crash), and 2 on bad usage. A 128-rank plan takes about a second per rank: MSCCL++
parses the whole plan for each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hipipe_compiler.arguments import integer_option, size_range_option  # noqa: E402
from hipipe_compiler.compiler import CompileOptions  # noqa: E402
from hipipe_compiler.errors import InputError  # noqa: E402
from hipipe_compiler.plan_compiler import compile_plans, size_multiple, timed_size  # noqa: E402
from hipipe_compiler.mscclpp.writer import save_plan  # noqa: E402
from hipipe_compiler.presets import load_topology  # noqa: E402
from hipipe_compiler.topology import Topology  # noqa: E402
from harness import PLAN_COLLECTIVES as COLLECTIVES, PLAN_TOPOLOGIES as TOPOLOGIES  # noqa: E402


class LoaderError(Exception):
    """load-plan could not run: the tool is broken, not the plan."""


def _check(load_plan: Path, path: Path, ranks: int, sizes: list[int]) -> str | None:
    """None when the loader accepts the plan for each of its ranks at every size, else the first refusal."""
    for size in sizes:
        for rank in range(ranks):
            try:
                done = subprocess.run([str(load_plan), str(path), str(rank), str(size)], capture_output=True, text=True)
            except OSError as e:
                raise LoaderError(f"{load_plan}: {e.strerror}") from e
            if done.returncode == 0:
                continue
            line = " ".join(done.stderr.split()) or "(no output)"
            if done.returncode == 2:
                raise LoaderError(line)
            return f"rank {rank} at {size} bytes, exit {done.returncode}: {line}"
    return None


def _run(args: argparse.Namespace, topologies: list[Topology], load_plan: Path, tmp: Path,
         pool: ThreadPoolExecutor) -> tuple[int, int]:
    """Compile each directory, check its plans on the pool, print each verdict; (accepted, refused)."""
    accepted = refused = 0
    start = time.perf_counter()
    for topo in topologies:
        for coll in args.collective or COLLECTIVES:
            compiled = compile_plans(topo, CompileOptions(collective=coll), *args.sizes, fallbacks=True)
            checks: dict[str, Future[str | None]] = {}
            for cp in compiled:
                for plan in cp.plans + cp.fallbacks:
                    path = tmp / f"{plan.name}.json"
                    save_plan(plan, path)
                    lo = max(plan.min_message_size, size_multiple(plan))
                    lo += -lo % size_multiple(plan)
                    hi = timed_size(plan, plan.max_message_size)
                    sizes = sorted({lo, hi}) if args.both_ends else [hi]
                    # load-plan takes the per-rank size n of an all-gather and the output of a reduce-scatter
                    per = [s // topo.nranks if coll in ("allgather", "reducescatter") else s for s in sizes]
                    checks[plan.name] = pool.submit(_check, load_plan, path, plan.ngpus, per)
            for plan_name, verdict in checks.items():
                failure = verdict.result()
                accepted += failure is None
                refused += failure is not None
                print(f"{'accepted' if failure is None else 'REFUSED'} {topo.label} {plan_name} for all "
                      f"{topo.nranks} ranks{'' if failure is None else ': ' + failure}", flush=True)
            print(f"{topo.label} {coll}: {len(checks)} plan(s) checked; {accepted} accepted, {refused} refused so "
                  f"far ({time.perf_counter() - start:.0f} s)", flush=True)
    return accepted, refused


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("load_plan", type=Path, help="MSCCL++'s loader built for a CPU (see above)")
    parser.add_argument("topologies", nargs="*", help="topology files or presets (default: the sample directories')")
    parser.add_argument("--both-ends", action="store_true", help="also the smallest size of each window")
    parser.add_argument("--collective", action="append", choices=COLLECTIVES, help="only these (repeatable)")
    parser.add_argument("--sizes", type=size_range_option, default=(64 << 10, 1 << 30),
                        help="the directories' size range (default 64KiB:1GiB)")
    parser.add_argument("--jobs", type=integer_option("--jobs", 1), default=1,
                        help="plans checked at once (each check runs every rank)")
    args = parser.parse_args(argv)
    if not args.load_plan.is_file() or not os.access(args.load_plan, os.X_OK):
        print(f"{args.load_plan}: not an executable load-plan program (see this script's docstring)")
        return 2
    try:  # every topology read before the first hour of loading
        topologies = [load_topology(name) for name in args.topologies or TOPOLOGIES]
    except InputError as e:
        print(f"mscclpp_loader.py: {e}")
        return 2
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        try:
            accepted, refused = _run(args, topologies, args.load_plan, Path(tmp), pool)
        except LoaderError as e:
            pool.shutdown(cancel_futures=True)
            print(f"the loader did not run: {e}")
            return 2
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    total = accepted + refused
    holds = refused == 0 and total > 0
    print(f"target: MSCCL++'s loader accepts every plan, for every rank: {accepted} of {total} -> "
          f"{'holds' if holds else 'MISSED'}")
    return 0 if holds else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
