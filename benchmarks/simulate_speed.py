"""`hipipe simulate` at 1 GiB, end to end as a user runs it; the files are compiled first,
untimed: MSCCL XML of a hierarchical all-reduce, and the MSCCL++ plan that `hipipe compile
--backend mscclpp` picks on H100 nodes, which reduces in the switch.

Targets: 8x16's XML in under 5 s (the optimizer calls the simulator in its loop), and every
file in under 10 s.
Run: python benchmarks/simulate_speed.py
"""

import json
import sys
import tempfile
from pathlib import Path

from harness import hipipe, print_table, run_command, target

XML = {"8x4": "dgx-h100-8x4", "8x16": "dgx-h100-8x16", "1024 (8x4x8x4)": "pod-8x4x8x4"}
PLANS = {"8x4, in-switch plan": "dgx-h100-8x4", "8x8, in-switch plan": "dgx-h100-8x8"}
rows, seconds = [], {}
with tempfile.TemporaryDirectory() as tmp:
    cases = [(label, name, False) for label, name in XML.items()]
    cases += [(label, name, True) for label, name in PLANS.items()]
    for label, name, plan in cases:
        out = Path(tmp) / f"{name}.{'json' if plan else 'xml'}"
        how = ["--backend", "mscclpp"] if plan else ["--algo", "hierarchical"]
        made = run_command([*hipipe(), "compile", name, *how, "--size", "1GiB", "-o", out, "--quiet"])
        if made["returncode"] != 0:
            rows.append((label, "error", made["stderr"].strip()[-60:], "", ""))
            continue
        r = run_command([*hipipe(), "simulate", out, "--topo", name, "--size", "1GiB", "--json"])
        sim = json.loads(r["stdout"])
        seconds[label] = r["seconds"]
        rows.append((label, f"{r['seconds']:.2f}", f"{sim['time_us']:,.0f}", f"{sim['utilisation']:.3f}",
                     str(sim.get("iterations", 1))))
print("hipipe simulate FILE --size 1GiB, end to end")
print_table(rows, ("file", "simulate s", "simulated us", "T_LB/T", "iterations"))
holds = "8x16" in seconds and target("hipipe simulate of 8x16's XML at 1 GiB", seconds["8x16"], 5, "s")
slowest = max(seconds, key=seconds.get) if seconds else None
every = len(seconds) == len(rows) and target(f"hipipe simulate of every file (slowest: {slowest})",
                                             seconds.get(slowest, float("inf")), 10, "s")
sys.exit(0 if holds and every else 1)
