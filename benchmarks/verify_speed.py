"""Verification time and peak memory of a hierarchical all-reduce at 1 GiB.

Target: the 1024-rank program in under 30 s and 2 GiB.
Run: python benchmarks/verify_speed.py
"""

from harness import CASES, measure, print_table

CODE = """
from hipipe_compiler.topology import preset
from hipipe_compiler.schedule import hierarchical_plan
from hipipe_compiler.lower import lower
from hipipe_compiler.msccl import verify
topo = preset({preset!r})
program = lower(hierarchical_plan(topo, "allreduce", 1, max_bytes=1 << 30))
start = time.perf_counter()
report = verify(program)
result = {{"seconds": time.perf_counter() - start, "ok": report.ok, "steps": program.nsteps}}
"""

rows = []
for label, name in CASES.items():
    r = measure(CODE.format(preset=name))
    if "error" in r:
        rows.append((label, "error", r["error"], "", ""))
        continue
    rows.append((label, f"{r['seconds']:.2f}", f"{r['peak_mib']:.0f}", "yes" if r["ok"] else "NO", f"{r['steps']:,}"))
print("verify a hierarchical all-reduce (1 GiB window): peak MiB includes building the program")
print_table(rows, ("topology", "verify s", "peak MiB", "verified", "steps"))
