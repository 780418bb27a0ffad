"""Compile time and XML size of a hierarchical all-reduce at 1 GiB.

Target: the 1024-rank compile under 10 s on one core (issue: the compiler end to end).
Run: python benchmarks/compile_speed.py
"""

from harness import CASES, measure, print_table

CODE = """
from hipipe_compiler.topology import preset
from hipipe_compiler.schedule import hierarchical_plan
from hipipe_compiler.lower import lower
from hipipe_compiler.msccl import write_program
topo = preset({preset!r})
start = time.perf_counter()
program = lower(hierarchical_plan(topo, "allreduce", 1, max_bytes=1 << 30))
text = write_program(program)
seconds = time.perf_counter() - start
result = {{"seconds": seconds, "xml_mib": len(text) / 2**20, "threadblocks": program.max_threadblocks,
          "longest": program.max_steps, "channels": program.nchannels}}
"""

rows = []
for label, name in CASES.items():
    r = measure(CODE.format(preset=name))
    if "error" in r:
        rows.append((label, "error", r["error"], "", "", ""))
        continue
    rows.append((label, f"{r['seconds']:.2f}", f"{r['xml_mib']:.1f}", str(r["threadblocks"]), str(r["longest"]),
                 f"{r['peak_mib']:.0f}"))
print("hierarchical all-reduce, 1 GiB window: lower + write XML")
print_table(rows, ("topology", "compile s", "XML MiB", "threadblocks", "longest tb", "peak MiB"))
