"""HiPIPE with in-switch stages on the calibrated H100 machines (1, 2, 4 and 8 nodes), against
`nccl` (NCCL 2.30.7's own pick there: NVLS, NVLSTree, ring or tree) and against our own
GPU-side plans. It compiles each machine's all-reduce directory for the MSCCL++ backend
(`hipipe compile --backend mscclpp`, 1 MiB to 1 GiB), with and without in-switch plans
(`--no-in-switch`), then times, at each size, the plan each directory serves, the best
in-switch plan alone and NCCL's pick.

    python benchmarks/nvls_plans.py          # about ten minutes on two cores
    python benchmarks/nvls_plans.py --save   # also writes samples/results/nvls-plans.json

Beside U, the table shows the U of the best in-switch pipeline with NVLink made free (its
bandwidth times 1000) at 64 and 256 MiB where the network binds the limit (the suffix of the
nodes alone, as on 4 and 8 nodes): what the network's latency and the pipeline's fill alone
leave, whatever the switch stages do.

Targets (the NVLS issue), in our simulator:
- from 64 MiB, the directory's plan at least 1.15x as fast as `nccl` on 4 and 8 nodes, and
  1.05x on 2 nodes;
- on one node, the in-switch plan within 3 % of NCCL's NVLS;
- from 64 MiB, U at least 0.90 against the limit with in-switch reduction;
- below 64 MiB, never slower than `nccl` or than the directory without in-switch plans.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hipipe_compiler.bounds import lower_bound, lower_bound_us  # noqa: E402
from hipipe_compiler.compiler import CompileOptions  # noqa: E402
from hipipe_compiler.nccl.timing import NcclTimer  # noqa: E402
from hipipe_compiler.plan_compiler import compile_plans, size_multiple, switch_candidates, timed_size  # noqa: E402
from hipipe_compiler.presets import preset  # noqa: E402
from hipipe_compiler.sim.plans import time_plan  # noqa: E402
from hipipe_compiler.topology import Topology  # noqa: E402
from hipipe_compiler.units import format_size  # noqa: E402

RESULTS = REPO / "samples" / "results" / "nvls-plans.json"
MACHINES = ("dgx-h100-8x1", "dgx-h100-8x2", "dgx-h100-8x4", "dgx-h100-8x8")
SIZES = tuple(1 << s for s in (20, 24, 26, 28, 30))
LARGE = 64 << 20
#: Speedup over `nccl` from 64 MiB, by node count.
OVER_NCCL = {2: 1.05, 4: 1.15, 8: 1.15}
#: Sizes at which the in-switch pipelines are also timed with NVLink made free (its bandwidth
#: times FREE): what the network's latency and the pipeline's fill alone leave of U.
FREE_SIZES = (64 << 20, 256 << 20)
FREE = 1000


def free_nvlink(topo: Topology) -> Topology:
    """The machine with its NVLink dimension's bandwidth made (all but) free."""
    first, *rest = topo.dimensions
    return replace(topo, dimensions=(replace(first, bandwidth=first.bandwidth * FREE), *rest))


def points(machine: str) -> list[dict]:
    topo = preset(machine)
    compiled = compile_plans(topo, CompileOptions(), SIZES[0], SIZES[-1])
    gpu_side = compile_plans(topo, CompileOptions(), SIZES[0], SIZES[-1], in_switch=False)
    nccl = NcclTimer(topo, "allreduce")
    out = []
    for size in SIZES:
        # the GPU-side directory may stop short of the largest sizes: beyond a plan's uint32
        # offsets its calls go to NCCL
        cp, gpu = (next((c for c in run if c.window.window.min_bytes <= size <= c.window.window.max_bytes), None)
                   for run in (compiled, gpu_side))
        assert cp is not None, f"{machine}: no plan serves {size} bytes"
        plan = cp.plans[0]
        at = timed_size(plan, size)
        switched, free = [], []
        nodes = topo.nranks // topo.dimensions[0].size
        network_binds = lower_bound(topo, "allreduce", size).binding_from >= 1  # the nodes' suffix alone
        freed = free_nvlink(topo)
        for build in switch_candidates(topo, "probe"):
            candidate = build(False)
            if size % size_multiple(candidate) == 0:
                switched.append(time_plan(candidate, topo, size).time_us)
                if network_binds and size in FREE_SIZES:
                    free.append(time_plan(candidate, freed, size).time_us)
        pick = nccl.pick(at)
        ours = time_plan(plan, topo, at).time_us
        out.append({"machine": machine, "nodes": nodes, "nbytes": size,
                    "timed_at": at, "choice": cp.details.get("choice", cp.window.plan.label), "ours_us": ours,
                    "in_switch_us": min(switched, default=None), "free_nvlink_us": min(free, default=None),
                    "gpu_side_us": None if gpu is None else time_plan(gpu.plans[0], topo,
                                                                      timed_size(gpu.plans[0], at)).time_us,
                    "nccl_us": pick.time_us, "nccl": pick.label, "lower_bound_us": lower_bound_us(topo, "allreduce", at)})
    return out


def verdicts(rows: list[dict]) -> list[tuple[str, bool]]:
    """Each target with whether it holds."""
    out = []
    for nodes, want in OVER_NCCL.items():
        large = [r for r in rows if r["nodes"] == nodes and r["nbytes"] >= LARGE]
        worst = min(r["nccl_us"] / r["ours_us"] for r in large)
        out.append((f"{nodes} nodes, from 64 MiB: at least {want:.2f}x nccl (worst {worst:.3f}x)", worst >= want))
    one = [r for r in rows if r["nodes"] == 1 and r["nbytes"] >= LARGE]
    off = max(abs(r["in_switch_us"] / r["nccl_us"] - 1) for r in one)
    out.append((f"1 node, from 64 MiB: in-switch plan within 3 % of NCCL's NVLS (off by up to {100 * off:.1f} %)",
                off <= 0.03))
    large = [r for r in rows if r["nbytes"] >= LARGE]
    u = min(r["lower_bound_us"] / r["ours_us"] for r in large)
    # where the network limits (4 and 8 nodes), what the pipelines reach with NVLink free
    ceiling = min((r["lower_bound_us"] / r["free_nvlink_us"], r["nodes"]) for r in large
                  if r.get("free_nvlink_us") and r["nodes"] >= 4 and r["nbytes"] == LARGE)
    out.append((f"from 64 MiB: U at least 0.90 against the in-switch limit (lowest {u:.3f}; at 64 MiB on "
                f"{ceiling[1]} nodes, even with NVLink free the best in-switch pipeline reaches only {ceiling[0]:.3f})",
                u >= 0.90))
    small = [r for r in rows if r["nbytes"] < LARGE]
    slower = [r for r in small if r["ours_us"] > min(r["nccl_us"], r["gpu_side_us"] or math.inf) * (1 + 1e-9)]
    out.append((f"below 64 MiB: never slower than nccl or the GPU-side plans ({len(slower)} of {len(small)} slower)",
                not slower))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| machine | size | served by | ours vs `nccl` (what NCCL runs) | in-switch plan alone | U "
             "| U, NVLink free |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        alone = "-" if r["in_switch_us"] is None else f"{r['nccl_us'] / r['in_switch_us']:.2f}x"
        free = "-" if not r.get("free_nvlink_us") else f"{r['lower_bound_us'] / r['free_nvlink_us']:.2f}"
        lines.append(f"| {r['machine']} | {format_size(r['nbytes'])} | {r['choice']} | "
                     f"**{r['nccl_us'] / r['ours_us']:.2f}x** ({r['nccl']}) | {alone} | "
                     f"{r['lower_bound_us'] / r['ours_us']:.2f} | {free} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="write samples/results/nvls-plans.json")
    args = parser.parse_args()
    rows = [row for machine in MACHINES for row in points(machine)]
    print(table(rows))
    print()
    for text, holds in verdicts(rows):
        print(f"{text}: {'holds' if holds else 'MISSED'}")
    if args.save:
        RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
