"""Iteration time of every training policy on the built-in profiles, as the README shows it.

Collective times come from the simulator on the programs `hipipe plan` compiles for each
topology (one compile per size window, shared by all profiles of a topology).

    python benchmarks/training_table.py [--topo dgx-h100-8x4 torus-4x4] [--algo hipipe] [--markdown] [--save]

Target: ours (`hipipe`) is never slower than any other policy. --save writes
samples/results/training-table.json, which the README's table is made from.

Two scenarios: the profiles' own times (as `hipipe plan` uses them by default), and every
time derived from MACs at a small per-GPU batch (`hipipe plan --derive-all --batch-size 8`),
where compute is short and communication shows.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from tabulate import tabulate

from harness import save

from hipipe_compiler.presets import load_topology
from hipipe_compiler.training import POLICIES, SimulatedCost, load_profile, plan_training
from hipipe_compiler.training.profiles import A100_AMP, BUILTIN_PROFILES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topo", nargs="+", default=["dgx-h100-8x4", "torus-4x4", "samples/topologies/a100-8x4-100gbe.yaml"])
    parser.add_argument("--profiles", nargs="+", default=list(BUILTIN_PROFILES))
    parser.add_argument("--algo", default="hipipe")
    parser.add_argument("--markdown", action="store_true", help="print a GitHub table")
    parser.add_argument("--batch-size", type=int, default=8, help="per-GPU batch of the derived-times scenario")
    parser.add_argument("--save", action="store_true", help="write samples/results/training-table.json")
    args = parser.parse_args()
    rows, records = [], []
    for spec in args.topo:
        topo = load_topology(spec)
        cost = SimulatedCost(topo, args.algo)
        small_batch = replace(A100_AMP, batch_size=args.batch_size)
        scenarios = [(name, times, load_profile(name) if times == "profile" else load_profile(name, small_batch, keep_measured=False))
                     for times in ("profile", f"derived, batch {args.batch_size}") for name in args.profiles]
        for name, times, profile in scenarios:
            report = plan_training(profile, cost, topo.nranks)
            best_other = min(r.iteration_ms for r in report.results if r.policy != "hipipe")
            records.append({"topology": topo.label, "profile": name, "times": times, "compute_ms": report.compute_ms,
                            "policies": report.summary()})
            rows.append([topo.label, name, times, f"{report.compute_ms:.1f}"]
                        + [f"{report[p].iteration_ms:.2f} ({report[p].exposed_comm_ms:.2f})" for p in POLICIES]
                        + [f"{best_other / report['hipipe'].iteration_ms:.3f}"])
    headers = ["topology", "profile", "times", "compute ms"] + [f"{p} ms (exposed)" for p in POLICIES] + ["best other / hipipe"]
    print(tabulate(rows, headers=headers, tablefmt="github" if args.markdown else "simple", disable_numparse=True))
    slower = [r for r in records if any(r["policies"]["hipipe"]["iteration_ms"] > v["iteration_ms"] * (1 + 1e-12)
                                        for v in r["policies"].values())]
    print(f"target: ours never slower than any other policy: {'holds' if not slower else 'MISSED'} "
          f"({len(records) - len(slower)} of {len(records)} rows)")
    if args.save:
        save("training-table.json", {"batch_size": args.batch_size, "algorithm": args.algo, "rows": records})
    sys.exit(1 if slower else 0)


if __name__ == "__main__":
    main()
