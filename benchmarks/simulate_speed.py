"""Simulation time of the hierarchical baseline at 1 GiB.

Target: 8x16 at 1 GiB in under 5 s, so the optimizer can call the simulator in its loop.
Run: python benchmarks/simulate_speed.py
"""

from harness import measure, print_table

CASES = {"8x4": "dgx-h100-8x4", "8x16": "dgx-h100-8x16", "1024 (8x4x8x4)": "pod-8x4x8x4"}
CODE = """
from hipipe_compiler.topology import preset
from hipipe_compiler.schedule import hierarchical_plan
from hipipe_compiler.lower import lower
from hipipe_compiler.sim import simulate
topo = preset({preset!r})
program = lower(hierarchical_plan(topo, "allreduce", 1, max_bytes=1 << 30))
start = time.perf_counter()
sim = simulate(program, topo, 1 << 30)
result = {{"seconds": time.perf_counter() - start, "time_us": sim.time_us, "u": sim.utilisation,
          "iterations": sim.iterations, "steps": program.nsteps}}
"""

rows = []
for label, name in CASES.items():
    r = measure(CODE.format(preset=name))
    if "error" in r:
        rows.append((label, "error", r["error"], "", "", ""))
        continue
    rows.append((label, f"{r['seconds']:.2f}", f"{r['time_us']:,.0f}", f"{r['u']:.3f}", str(r["iterations"]),
                 f"{r['steps']:,}"))
print("simulate the hierarchical all-reduce at 1 GiB")
print_table(rows, ("topology", "simulate s", "simulated us", "T_LB/T", "iterations", "steps"))
