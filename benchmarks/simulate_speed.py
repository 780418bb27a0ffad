"""`hipipe simulate` at 1 GiB, end to end as a user runs it; the files are compiled first,
untimed: MSCCL XML of a hierarchical all-reduce, and the MSCCL++ plan that `hipipe compile
--backend mscclpp` picks on H100 nodes, which reduces in the switch. The XML files are also
simulated at 1 TiB, the largest size the commands take (the runtime replays them there; a
plan refuses sizes outside its window), and so is hipipe's LL program of 8x4's 256 KiB window,
far above that window: two of its threadblocks share a port but replay at slightly different
rates (about 1.03 to 1), so the replays never repeat exactly and every one is simulated.

The MSCCL++ plans of a hierarchical all-reduce are timed too: 8x16's (128 ranks), and with
--pod the 1024-rank pod's (a 115 MB plan; compiling it takes minutes and about 18 GB), where
reading and checking the plan is most of the time.

Targets: 8x16's XML in under 5 s at 1 GiB (the optimizer calls the simulator in its loop),
and every file at every size in under 10 s.
Run: python benchmarks/simulate_speed.py [--pod]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from harness import hipipe, print_table, run_command, target

XML = {"8x4": "dgx-h100-8x4", "8x16": "dgx-h100-8x16", "1024 (8x4x8x4)": "pod-8x4x8x4"}
PLANS = {"8x4, in-switch plan": "dgx-h100-8x4", "8x8, in-switch plan": "dgx-h100-8x8"}
#: (label, preset, how it is compiled, the size it is compiled for, the sizes it is simulated at)
CASES = [(label, name, ["--algo", "hierarchical"], "1GiB", ("1GiB", "1TiB")) for label, name in XML.items()]
CASES += [("torus-4x4, hipipe", "torus-4x4", [], "1GiB", ("1GiB", "1TiB"))]
CASES += [("8x4, hipipe LL of 256KiB", "dgx-h100-8x4", [], "256KiB", ("1GiB", "1TiB"))]
CASES += [(label, name, ["--backend", "mscclpp"], "1GiB", ("1GiB",)) for label, name in PLANS.items()]
CASES += [("8x16, hierarchical plan", "dgx-h100-8x16", ["--backend", "mscclpp", "--algo", "hierarchical"], "1GiB", ("1GiB",))]
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--pod", action="store_true", help="also the 1024-rank pod's hierarchical plan")
if parser.parse_args().pod:
    CASES += [("1024 (8x4x8x4), hierarchical plan", "pod-8x4x8x4", ["--backend", "mscclpp", "--algo", "hierarchical"],
               "1GiB", ("1GiB",))]
rows, seconds = [], {}
with tempfile.TemporaryDirectory() as tmp:
    for case, (label, name, how, compiled_at, sizes) in enumerate(CASES):
        out = Path(tmp) / f"case{case}.{'json' if 'mscclpp' in how else 'xml'}"
        made = run_command([*hipipe(), "compile", name, *how, "--size", compiled_at, "-o", out, "--quiet"])
        if made["returncode"] != 0:
            rows.append((label, "", "error", made["stderr"].strip()[-60:], "", ""))
            continue
        for size in sizes:
            r = run_command([*hipipe(), "simulate", out, "--topo", name, "--size", size, "--json"])
            sim = json.loads(r["stdout"])
            seconds[f"{label} at {size}"] = r["seconds"]
            rows.append((label, size, f"{r['seconds']:.2f}", f"{sim['time_us']:,.0f}", f"{sim['utilisation']:.3f}",
                         str(sim.get("iterations", 1))))
print("hipipe simulate FILE --size SIZE, end to end")
print_table(rows, ("file", "size", "simulate s", "simulated us", "T_LB/T", "iterations"))
holds = "8x16 at 1GiB" in seconds and target("hipipe simulate of 8x16's XML at 1 GiB", seconds["8x16 at 1GiB"], 5, "s")
slowest = max(seconds, key=seconds.get) if seconds else None
every = len(seconds) == len(rows) and target(f"hipipe simulate of every file at every size (slowest: {slowest})",
                                             seconds.get(slowest, float("inf")), 10, "s")
sys.exit(0 if holds and every else 1)
