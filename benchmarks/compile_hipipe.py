"""Full-directory HiPIPE compile time: `hipipe compile TOPO --sizes 1KiB:4GiB -o DIR` end to
end (plan, lower, verify and predict every window, and write them) for each topology of
benchmarks/grid.yaml and for the 1024-rank pod, each a fresh process.

Targets: under 60 s per grid topology on one core, the 1024-rank pod under 5 minutes.
Run: python benchmarks/compile_hipipe.py [--skip-pod] [--save]
     (--save writes samples/results/compile-hipipe.json, which the README quotes)
"""

import json
import sys
import tempfile
from pathlib import Path

import yaml

from harness import GRID_COMPILE_LIMIT_S, POD_COMPILE_LIMIT_S, REPO, hipipe, print_table, run_command, save, target

from hipipe_compiler.bench import load_grid

PHASES = ("plan", "lower", "verify", "predict", "write")
grid = load_grid(REPO / "benchmarks" / "grid.yaml")
cases = {name: grid.topologies[name] for name in ("C1", "C3", "C5", "C6")}
limits = {name: GRID_COMPILE_LIMIT_S for name in cases}
if "--skip-pod" not in sys.argv:
    cases["pod-8x4x8x4 (1024)"] = "pod-8x4x8x4"
    limits["pod-8x4x8x4 (1024)"] = POD_COMPILE_LIMIT_S
rows, results = [], {}
with tempfile.TemporaryDirectory() as tmp:
    for label, topo in cases.items():
        spec = topo
        if not isinstance(topo, str):  # a grid topology: as a file, exactly as the grid defines it
            spec = Path(tmp) / f"{label}.yaml"
            spec.write_text(yaml.safe_dump(topo.to_document()))
        # --jobs 1: the targets are for one core (compile_ratio.py times the default, a worker per core)
        r = run_command([*hipipe(), "compile", spec, "--sizes", "1KiB:4GiB", "--jobs", "1", "-o", Path(tmp) / label,
                         "--json"])
        if r["returncode"] != 0:
            rows.append((label, "error", r["stderr"].strip()[-60:], *[""] * 4))
            continue
        out = json.loads(r["stdout"])
        windows = out["windows"]
        results[label] = {"seconds": r["seconds"], "peak_mib": r["peak_mib"], "files": len(windows),
                          "phases": out["seconds"], "u_at_4GiB": windows[-1]["utilisation"]}
        rows.append((label, f"{r['seconds']:.1f}", *(f"{out['seconds'].get(p, 0.0):.1f}" for p in PHASES),
                     str(len(windows)), "yes" if all(w["verified"] for w in windows) else "NO",
                     f"{windows[-1]['utilisation']:.3f}", f"{r['peak_mib']:.0f}"))
print("hipipe compile TOPO --sizes 1KiB:4GiB -o DIR (HiPIPE all-reduce), end to end, and its phases (s)")
print_table(rows, ("topology", "compile s", *PHASES, "files", "verified", "U at 4GiB", "peak MiB"))
holds = all(label in results for label in cases)
for label in cases:
    if label in results:
        holds &= target(f"a {label} directory", results[label]["seconds"], limits[label], "s")
if "--save" in sys.argv:
    save("compile-hipipe.json", results)
sys.exit(0 if holds else 1)
