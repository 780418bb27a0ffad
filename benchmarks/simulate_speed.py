"""`hipipe simulate` of a hierarchical all-reduce at 1 GiB, end to end as a user runs it; the
files are compiled first, untimed.

Target: 8x16 at 1 GiB in under 5 s (the optimizer calls the simulator in its loop).
Run: python benchmarks/simulate_speed.py
"""

import json
import sys
import tempfile
from pathlib import Path

from harness import hipipe, print_table, run_command, target

CASES = {"8x4": "dgx-h100-8x4", "8x16": "dgx-h100-8x16", "1024 (8x4x8x4)": "pod-8x4x8x4"}
rows, seconds = [], {}
with tempfile.TemporaryDirectory() as tmp:
    for label, name in CASES.items():
        xml = Path(tmp) / f"{name}.xml"
        made = run_command([*hipipe(), "compile", name, "--algo", "hierarchical", "--size", "1GiB", "-o", xml, "--quiet"])
        if made["returncode"] != 0:
            rows.append((label, "error", made["stderr"].strip()[-60:], "", ""))
            continue
        r = run_command([*hipipe(), "simulate", xml, "--topo", name, "--size", "1GiB", "--json"])
        sim = json.loads(r["stdout"])
        seconds[name] = r["seconds"]
        rows.append((label, f"{r['seconds']:.2f}", f"{sim['time_us']:,.0f}", f"{sim['utilisation']:.3f}", str(sim["iterations"])))
print("hipipe simulate FILE --size 1GiB of a hierarchical all-reduce, end to end")
print_table(rows, ("topology", "simulate s", "simulated us", "T_LB/T", "iterations"))
holds = "dgx-h100-8x16" in seconds and target("hipipe simulate of 8x16 at 1 GiB", seconds["dgx-h100-8x16"], 5, "s")
sys.exit(0 if holds else 1)
