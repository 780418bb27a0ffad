"""`hipipe calibrate` from three logs of one machine, end to end as a user runs it: the shared
logs the dgx-h100 presets are calibrated on (one DGX H100 node, and two nodes of two H100
clusters; benchmarks/calibrate_machines.py).

Target: under a minute on this machine (all its cores; the fit simulates each round's sizes in
parallel).
Run: python benchmarks/calibrate_speed.py      (needs ../shared)
"""

import os
import sys
import tempfile
from pathlib import Path

from harness import REPO, hipipe, print_table, run_command, target

SHARED = Path(os.environ.get("HIPIPE_SHARED_DIR", REPO.parent / "shared"))
LOGS = ["h100-1n-dgx-all_reduce.log", "h100-2n-ib400-xe9680-all_reduce.log", "h100-2n-ib400-clusterB-all_reduce.log"]

paths = [SHARED / "data" / "nccl-tests" / log for log in LOGS]
if not all(p.is_file() for p in paths):
    print(f"{SHARED / 'data' / 'nccl-tests'} lacks {', '.join(LOGS)}: this benchmark needs ../shared", file=sys.stderr)
    sys.exit(2)
with tempfile.TemporaryDirectory() as tmp:
    r = run_command([*hipipe(), "calibrate", *paths, "-o", Path(tmp) / "h100.yaml"])
if r["returncode"] != 0:
    print(r["stderr"].strip(), file=sys.stderr)
    sys.exit(1)
rms = r["stdout"].strip().splitlines()[-1]
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"hipipe calibrate {' '.join(LOGS)} -o FILE, end to end on {cores} core(s)")
print_table([(f"{r['seconds']:.1f}", f"{r['peak_mib']:.0f}", rms)], ("seconds", "peak MiB", "fit"))
sys.exit(0 if target("calibrating from three logs, end to end", r["seconds"], 60, "s") else 1)
