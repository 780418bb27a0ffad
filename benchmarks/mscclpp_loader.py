"""Every plan of the default directories, loaded by MSCCL++'s own loader on a CPU.

MSCCL++ cannot run without CUDA, but its plan loader can: benchmarks/mscclpp-loader/ builds it
from microsoft/mscclpp at the pinned commit, with a driver that redoes the host side of the
executor's set-up, into a `load-plan` program and its `check-plan.sh`, which runs it for every
rank (its README says how, and what runs). This script compiles the default directories (the
sample topologies up to 128 ranks, all three collectives, 64 KiB to 1 GiB), hands every plan to
that loader at the largest size of its window that the plan's chunks divide (`--both-ends`: the
smallest too), and prints each plan's verdict and how many the loader accepts. The target: all
of them.

    python benchmarks/mscclpp_loader.py LOADER_DIR [--both-ends] [--jobs N] [--collective C] [TOPOLOGY ...]

LOADER_DIR holds `load-plan` and `check-plan.sh` (`bash benchmarks/mscclpp-loader/build.sh CHECKOUT LOADER_DIR`).
A 128-rank plan takes about a second per rank: MSCCL++ parses the whole plan for each.
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

from hipipe_compiler.arguments import integer_option  # noqa: E402
from hipipe_compiler.compiler import CompileOptions  # noqa: E402
from hipipe_compiler.plan_compiler import compile_plans, size_multiple, timed_size  # noqa: E402
from hipipe_compiler.mscclpp.writer import save_plan  # noqa: E402
from hipipe_compiler.presets import load_topology  # noqa: E402
from harness import PLAN_COLLECTIVES as COLLECTIVES, PLAN_TOPOLOGIES as TOPOLOGIES  # noqa: E402


class LoaderError(Exception):
    """check-plan.sh could not run (exit 2): the tool is broken, not the plan."""


def _check(check: Path, path: Path, sizes: list[int]) -> str | None:
    """None when the loader accepts the plan for every rank at every size, else its last line."""
    done = subprocess.run(["bash", str(check), "-q", str(path), *map(str, sizes)], capture_output=True, text=True)
    if done.returncode == 2:
        raise LoaderError(done.stderr.strip() or done.stdout.strip())
    if done.returncode == 0:
        return None
    return (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or ["(no output)"])[-1]


def _run(args: argparse.Namespace, check: Path, tmp: Path, pool: ThreadPoolExecutor) -> tuple[int, int]:
    """Compile each directory, check its plans on the pool, print each verdict; (accepted, refused)."""
    accepted = refused = 0
    start = time.perf_counter()
    for name in args.topologies or list(TOPOLOGIES):
        topo = load_topology(name)
        for coll in args.collective or COLLECTIVES:
            compiled = compile_plans(topo, CompileOptions(collective=coll), 64 << 10, 1 << 30)
            checks: dict[str, Future[str | None]] = {}
            for cp in compiled:
                for plan in cp.plans:
                    path = tmp / f"{plan.name}.json"
                    save_plan(plan, path)
                    lo = max(plan.min_message_size, size_multiple(plan))
                    lo += -lo % size_multiple(plan)
                    hi = timed_size(plan, plan.max_message_size)
                    sizes = sorted({lo, hi}) if args.both_ends else [hi]
                    # check-plan takes the per-rank size n of an all-gather and the output of a reduce-scatter
                    per = [s // topo.nranks if coll in ("allgather", "reducescatter") else s for s in sizes]
                    checks[plan.name] = pool.submit(_check, check, path, per)
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
    parser.add_argument("loader", type=Path, help="the directory holding load-plan and check-plan.sh")
    parser.add_argument("topologies", nargs="*", help="topology files or presets (default: the sample directories')")
    parser.add_argument("--both-ends", action="store_true", help="also the smallest size of each window")
    parser.add_argument("--collective", action="append", choices=COLLECTIVES, help="only these (repeatable)")
    parser.add_argument("--jobs", type=integer_option("--jobs", 1), default=1,
                        help="plans checked at once (each check runs every rank)")
    args = parser.parse_args(argv)
    check = args.loader / "check-plan.sh"
    if not check.exists() or not os.access(args.loader / "load-plan", os.X_OK):
        print(f"{args.loader} holds no check-plan.sh and load-plan: build the loader first "
              "(benchmarks/mscclpp-loader/README.md)")
        return 2
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        try:
            accepted, refused = _run(args, check, Path(tmp), pool)
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
