"""The compile-time target as a ratio in one run: `hipipe compile TOPO --sizes 1KiB:4GiB -o
DIR` end to end with this checkout and with an earlier commit's code (a git worktree of BASE),
one after the other on the same machine, for C1, C3, C5, C6 and the 1024-rank pod. Then every
window's new program is timed against the old program for the same size, both by this
checkout's simulator, at both ends of the new window. This checkout runs with its default
--jobs (a worker per usable core, up to 8), so the CPU time is reported beside the wall time.

Targets: each directory compiles in at most a third of BASE's time, and no window's program is
slower than BASE's by more than 0.3 %.
Run: python benchmarks/compile_ratio.py [--base COMMIT] [--skip-pod] [--save]
     (--save writes samples/results/compile-ratio.json)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from harness import REPO, SLOWER, print_table, run_command, save

from hipipe_compiler.bench import load_grid
from hipipe_compiler.msccl.reader import read_program
from hipipe_compiler.optimizer.workers import usable_cores
from hipipe_compiler.presets import load_topology
from hipipe_compiler.sim import simulate_exact

#: The code before the calibration work and the faster simulator (aee901e, their first commit, is its child).
BASE = "d7ee598"


def compile_dir(root: Path, spec: Path | str, out: Path) -> dict:
    """Compile a 1KiB:4GiB directory with the package under `root`, in a fresh process."""
    return run_command([sys.executable, "-m", "hipipe_compiler", "compile", spec, "--sizes", "1KiB:4GiB", "-o", out,
                        "--json"], cwd=root, env={**os.environ, "PYTHONPATH": str(root)})


def windows(directory: Path) -> list[tuple[int, int, Path]]:
    """(min bytes, max bytes, file) of every window a compiled directory's manifest lists."""
    manifest = json.loads((directory / ".hipipe" / "manifest.json").read_text())
    return [(w["min_bytes"], w["max_bytes"], directory / name) for w, name in zip(manifest["windows"], manifest["files"])]


def covering(ws: list[tuple[int, int, Path]], size: int) -> Path | None:
    """The file whose window holds size (None where the directory left the size to NCCL)."""
    return next((f for lo, hi, f in ws if lo <= size <= hi), None)


def slowest_window(old_dir: Path, new_dir: Path, topo_spec: Path | str) -> tuple[float, int]:
    """The largest new/old time ratio over both ends of every new window, and its size."""
    topo = load_topology(str(topo_spec))
    old, new = windows(old_dir), windows(new_dir)
    worst = (0.0, 0)
    for lo, hi, path in new:
        for size in sorted({lo, hi}):
            before = covering(old, size)
            if before is None:
                continue
            t_new = simulate_exact(read_program(str(path)), topo, size).time_us
            t_old = simulate_exact(read_program(str(before)), topo, size).time_us
            worst = max(worst, (t_new / t_old, size))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help=f"the commit to compare against (default {BASE})")
    parser.add_argument("--skip-pod", action="store_true")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    grid = load_grid(REPO / "benchmarks" / "grid.yaml")
    rows, results, holds = [], {}, True
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = tmp / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            cases: dict[str, Path | str] = {}
            for name in ("C1", "C3", "C5", "C6"):
                cases[name] = tmp / f"{name}.yaml"
                cases[name].write_text(yaml.safe_dump(grid.topologies[name].to_document()))
            if not args.skip_pod:
                cases["pod-8x4x8x4 (1024)"] = "pod-8x4x8x4"
            for label, spec in cases.items():
                key = label.split()[0]
                was = compile_dir(base, spec, tmp / f"{key}-base")
                now = compile_dir(REPO, spec, tmp / f"{key}-head")
                if was["returncode"] or now["returncode"]:
                    rows.append((label, "error", (was["stderr"] or now["stderr"]).strip()[-60:], "", "", ""))
                    holds = False
                    continue
                ratio = now["seconds"] / was["seconds"]
                worst, at = slowest_window(tmp / f"{key}-base", tmp / f"{key}-head", spec)
                results[label] = {"base_seconds": was["seconds"], "seconds": now["seconds"], "ratio": ratio,
                                  "base_cpu_seconds": was["cpu_seconds"], "cpu_seconds": now["cpu_seconds"],
                                  "worst_window_ratio": worst, "worst_window_bytes": at}
                ok = ratio <= 1 / 3 and worst <= SLOWER
                holds &= ok
                rows.append((label, f"{was['seconds']:.1f}", f"{now['seconds']:.1f}", f"{ratio:.3f}",
                             f"{now['cpu_seconds'] / was['cpu_seconds']:.3f}", f"{worst:.4f} at {at:,} B",
                             "holds" if ok else "MISSED"))
                print(*rows[-1], file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)
    print(f"hipipe compile TOPO --sizes 1KiB:4GiB -o DIR, end to end: {args.base} against this checkout, "
          f"on {usable_cores()} usable cores (this checkout's default --jobs)")
    print_table(rows, ("topology", f"{args.base} s", "now s", "ratio", "CPU time ratio", "slowest window (new/old time)",
                       "target"))
    print(f"target: every directory in at most 1/3 of {args.base}'s time, no window slower than {SLOWER:.3f}x: "
          f"{'holds' if holds else 'MISSED'}")
    if args.save:
        save("compile-ratio.json", {"base": args.base, "cores": usable_cores(), "topologies": results})
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
