"""Shared by the benchmark scripts: run the `hipipe` command (or a snippet) in a fresh process
and report its wall time and peak memory, print tables, and say whether a target holds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Where curated benchmark results live; benchmarks/readme_tables.py renders the README from them.
RESULTS = REPO / "samples" / "results"

CASES = {
    "8x4": "dgx-h100-8x4",
    "8x16": "dgx-h100-8x16",
    "8x64": "dgx-h100-8x64",
    "1024 (8x4x8x4)": "pod-8x4x8x4",
}


#: The default directories of the MSCCL++ backend's targets: the sample topologies up to 128
#: ranks, every planned collective, 64 KiB to 1 GiB.
PLAN_TOPOLOGIES = tuple(str(REPO / "samples" / "topologies" / name) for name in (
    "dgx-h100-8x4.yaml", "a100-8x4-100gbe.yaml", "torus-4x4.yaml", "ring-fc-switch-2x8x4.yaml", "torus-4x4x4.yaml",
    "dgx-h100-8x16.json"))
PLAN_COLLECTIVES = ("allreduce", "reducescatter", "allgather")

#: The compile-time targets the scripts check and readme_tables.py quotes, in seconds: a grid
#: directory and the pod's (compile_hipipe.py), the pod's hierarchical program (compile_speed.py),
#: the 1 TiB compile and the simulation of its file (compile_huge.py).
GRID_COMPILE_LIMIT_S, POD_COMPILE_LIMIT_S, POD_HIERARCHICAL_LIMIT_S = 60.0, 300.0, 10.0
HUGE_COMPILE_LIMIT_S, HUGE_SIMULATE_LIMIT_S = 60.0, 10.0
#: compile_ratio.py: no window's program may take more than this times the base commit's.
SLOWER = 1.003


def hipipe() -> list[str]:
    """The installed `hipipe` command, or the module from this checkout."""
    exe = shutil.which("hipipe")
    return [exe] if exe else [sys.executable, "-m", "hipipe_compiler"]


#: Runs a command as its only child: its wall time and peak memory are then that command's.
_WRAPPER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": time.perf_counter() - start, "returncode": done.returncode,
                  "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024}), file=sys.stderr)
"""


def run_command(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> dict:
    """Run a command to the end, as a user would: its wall seconds (interpreter start and
    imports included), CPU seconds (its worker processes' too), peak MiB, exit code and output."""
    done = subprocess.run([sys.executable, "-c", _WRAPPER, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=env)
    *lines, last = done.stderr.rstrip("\n").split("\n")
    return {**json.loads(last), "stdout": done.stdout, "stderr": "\n".join(lines)}


def measure(code: str) -> dict:
    """Run `code` (which must set a dict `result`) in a new interpreter; add seconds and peak MiB."""
    script = "\n".join([
        "import json, resource, sys, time",
        f"sys.path.insert(0, {str(REPO)!r})",
        textwrap.dedent(code),
        'result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024',
        "print(json.dumps(result))",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(rows: list[tuple], headers: tuple[str, ...]) -> None:
    from tabulate import tabulate
    print(tabulate(rows, headers=headers, disable_numparse=True))


def target(what: str, value: float, limit: float, unit: str) -> bool:
    """Print one target line (`target: ... : holds` or `: MISSED`) and return whether it holds."""
    holds = value <= limit
    print(f"target: {what} under {limit:g} {unit}: {value:.1f} {unit}: {'holds' if holds else 'MISSED'}")
    return holds


def save(name: str, data: object) -> Path:
    """Write a result file under samples/results/ (what the README's tables are made from)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"saved {path.relative_to(REPO)}")
    return path
