"""`hipipe compile` of a hierarchical all-reduce for one 1 GiB call, end to end as a user runs
it (interpreter start, imports, planning, lowering, the verification gate, the prediction
and writing the XML), with its phases broken out from the command's `--json`.

Target: the 1024-rank pod under 10 s on one core.
Run: python benchmarks/compile_speed.py [--save]   (--save writes samples/results/compile-speed.json)
"""

import json
import sys
import tempfile
from pathlib import Path

from harness import CASES, POD_HIERARCHICAL_LIMIT_S, hipipe, print_table, run_command, save, target

PHASES = ("plan", "lower", "verify", "predict", "write")
rows, results = [], {}
with tempfile.TemporaryDirectory() as tmp:
    for label, name in CASES.items():
        out = Path(tmp) / f"{name}.xml"
        r = run_command([*hipipe(), "compile", name, "--algo", "hierarchical", "--size", "1GiB", "-o", out, "--json"])
        if r["returncode"] != 0:
            rows.append((label, "error", r["stderr"].strip()[-60:], *[""] * (len(PHASES) + 1)))
            continue
        seconds = json.loads(r["stdout"])["seconds"]
        results[label] = {"preset": name, "seconds": r["seconds"], "peak_mib": r["peak_mib"], "phases": seconds,
                          "xml_mib": out.stat().st_size / 2**20}
        rows.append((label, f"{r['seconds']:.2f}", *(f"{seconds.get(p, 0.0):.2f}" for p in PHASES),
                     f"{out.stat().st_size / 2**20:.1f}", f"{r['peak_mib']:.0f}"))
print("hipipe compile PRESET --algo hierarchical --size 1GiB -o FILE: end to end, and its phases (s)")
print_table(rows, ("topology", "end to end s", *PHASES, "XML MiB", "peak MiB"))
pod = results.get("1024 (8x4x8x4)")
holds = pod is not None and target("hipipe compile of the 1024-rank pod, end to end", pod["seconds"], POD_HIERARCHICAL_LIMIT_S, "s")
if "--save" in sys.argv:
    save("compile-speed.json", results)
sys.exit(0 if holds else 1)
