"""`hipipe compile torus-4x4 --size 1TiB`, end to end as a user runs it, on one core and with
the default workers: at this size the runtime replays each candidate program hundreds to tens
of thousands of times, so the search ranks candidates at 4 GiB (search.SCREEN_BYTES) and the
period detector skips the replays that repeat. Also `hipipe simulate` of the file it writes,
at 1 TiB.

Targets: the compile under a minute, the simulation under 10 s.
Run: python benchmarks/compile_huge.py [--save]   (--save writes samples/results/compile-huge.json)
"""

import json
import sys
import tempfile
from pathlib import Path

from harness import HUGE_COMPILE_LIMIT_S, HUGE_SIMULATE_LIMIT_S, hipipe, print_table, run_command, save, target

results, rows = {}, []
with tempfile.TemporaryDirectory() as tmp:
    out = Path(tmp) / "torus.xml"
    for label, jobs in (("one core", ["--jobs", "1"]), ("default workers", [])):
        r = run_command([*hipipe(), "compile", "torus-4x4", "--size", "1TiB", "-o", out, "--json", *jobs])
        if r["returncode"] != 0:
            rows.append((f"compile, {label}", "error", r["stderr"].strip()[-60:], ""))
            continue
        window = json.loads(r["stdout"])["windows"][0]
        results[f"compile, {label}"] = {"seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"],
                                        "utilisation": window["utilisation"], "plan": window["algorithm"]}
        rows.append((f"compile, {label}", f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}", f"{window['utilisation']:.4f}"))
    if out.exists():
        r = run_command([*hipipe(), "simulate", out, "--topo", "torus-4x4", "--size", "1TiB", "--json"])
        sim = json.loads(r["stdout"])
        results["simulate"] = {"seconds": r["seconds"], "iterations": sim["iterations"], "utilisation": sim["utilisation"]}
        rows.append(("simulate at 1TiB", f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}", f"{sim['utilisation']:.4f}"))
print("hipipe compile torus-4x4 --size 1TiB, and hipipe simulate of its file at 1TiB")
print_table(rows, ("command", "wall s", "CPU s", "T_LB/T"))
limits = {"compile, one core": HUGE_COMPILE_LIMIT_S, "compile, default workers": HUGE_COMPILE_LIMIT_S,
          "simulate": HUGE_SIMULATE_LIMIT_S}
holds = all([name in results and target(f"hipipe {name} at 1TiB", results[name]["seconds"], limit, "s")
             for name, limit in limits.items()])
if "--save" in sys.argv:
    save("compile-huge.json", results)
sys.exit(0 if holds else 1)
