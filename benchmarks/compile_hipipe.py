"""Full-directory HiPIPE compile time: `hipipe compile TOPO --sizes 1KiB:4GiB -o DIR` for each
topology of benchmarks/grid.yaml and for the 1024-rank pod (plan, lower, verify and predict
every window), each in a fresh process.

Targets (issue: HiPIPE): under 60 s per grid topology on one core, the 1024-rank pod under
5 minutes. Run: python benchmarks/compile_hipipe.py [--skip-pod]
"""

import sys

from harness import REPO, measure, print_table

CODE = """
from hipipe_compiler.bench import load_grid
from hipipe_compiler.compiler import CompileOptions, compile_range
from hipipe_compiler.topology import preset
topo = {topology}
start = time.perf_counter()
windows = compile_range(topo, CompileOptions(), 1 << 10, 4 << 30)
seconds = time.perf_counter() - start
result = {{"seconds": seconds, "windows": len(windows), "verified": all(w.report.ok for w in windows),
          "u_at_4GiB": windows[-1].details["utilisation"]}}
"""

grid = REPO / "benchmarks" / "grid.yaml"
cases = {name: f"load_grid({str(grid)!r}).topologies[{name!r}]" for name in ("C1", "C3", "C5", "C6")}
if "--skip-pod" not in sys.argv:
    cases["pod-8x4x8x4 (1024)"] = 'preset("pod-8x4x8x4")'
rows = []
for label, expr in cases.items():
    r = measure(CODE.format(topology=expr))
    if "error" in r:
        rows.append((label, "error", r["error"], "", "", ""))
        continue
    rows.append((label, f"{r['seconds']:.1f}", str(r["windows"]), "yes" if r["verified"] else "NO",
                 f"{r['u_at_4GiB']:.3f}", f"{r['peak_mib']:.0f}"))
print("HiPIPE all-reduce, 1KiB:4GiB directory: plan + lower + verify + predict")
print_table(rows, ("topology", "compile s", "files", "verified", "U at 4GiB", "peak MiB"))
