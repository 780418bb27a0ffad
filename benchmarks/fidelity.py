"""How well the calibrated model reproduces every shared nccl-tests log: each machine's logs
are calibrated together (`hipipe calibrate`), and every measured time is set beside what NCCL,
as hipipe simulates it on the fitted topology, takes.

    python benchmarks/fidelity.py --save     # needs ../shared; several minutes

writes samples/results/fidelity.json, from which benchmarks/readme_tables.py renders the
README's fidelity table; tests/test_readme_results.py re-times a few of its points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HIPIPE_SHARED_DIR", REPO.parent / "shared"))
LOGS = SHARED / "data" / "nccl-tests"
RESULTS = REPO / "samples" / "results" / "fidelity.json"
#: The shared logs by machine: each group is one machine (and calibrated as one).
MACHINES = {
    "DGX H100, 1 node": ["h100-1n-dgx-all_reduce.log"],
    "HGX H100 XE9680, 2 nodes, 8 x 400G IB": ["h100-2n-ib400-xe9680-all_reduce.log"],
    "H100 cluster B, 2 nodes, 400G IB": ["h100-2n-ib400-clusterB-all_reduce.log",
                                         "h100-2n-ib400-clusterB-all_reduce-ring.log"],
    "AWS p5, 2 nodes, 32 x 100G EFA": ["h100-2n-efa-p5-all_reduce.log"],
    "GCP A3 Mega, 2 nodes, 8 x 200G TCPXO": ["a3mega-2node-h100-all_reduce_perf.log"],
    "A100 VM, 1 node": ["a100-1n-azure-all_reduce.log", "a100-1n-azure-reduce_scatter.log",
                        "superbench-a100-8gpu-all_gather_perf.log"],
    "AWS p4de, 2 nodes, 4 x 100G EFA": ["a100-2n-efa-p4de-all_reduce.log"],
    "OCI BM.GPU4.8, 1-2 nodes, 16 x 100G RoCE": ["a100-2n-roce-oci-all_reduce.log",
                                                 "oci-bm-gpu4.8-a100-8gpu-all_reduce_perf.log"],
}
#: Where a fit starts for the network: GB/s per GPU (a NIC's share), by machine.
NETWORK = {"GCP A3 Mega, 2 nodes, 8 x 200G TCPXO": 25.0, "AWS p4de, 2 nodes, 4 x 100G EFA": 6.25,
           "OCI BM.GPU4.8, 1-2 nodes, 16 x 100G RoCE": 25.0}


#: Held out: the H100 machine calibrated without some of its logs, predicting them. The logs
#: of one cluster are never fitted and judged at once.
HELD_OUT = {
    "H100 cluster B's NCCL_ALGO=Ring run, predicted by the dgx-h100 preset's calibration": (
        ["h100-1n-dgx-all_reduce.log", "h100-2n-ib400-xe9680-all_reduce.log", "h100-2n-ib400-clusterB-all_reduce.log"],
        ["h100-2n-ib400-clusterB-all_reduce-ring.log"]),
    "H100 cluster B, predicted from the other H100 logs": (
        ["h100-1n-dgx-all_reduce.log", "h100-2n-ib400-xe9680-all_reduce.log"],
        ["h100-2n-ib400-clusterB-all_reduce.log", "h100-2n-ib400-clusterB-all_reduce-ring.log"]),
    "HGX H100 XE9680, predicted from the other H100 logs": (
        ["h100-1n-dgx-all_reduce.log", "h100-2n-ib400-clusterB-all_reduce.log",
         "h100-2n-ib400-clusterB-all_reduce-ring.log"],
        ["h100-2n-ib400-xe9680-all_reduce.log"]),
}


def _points(points) -> list[dict]:
    return [{"log": Path(p.log).name, "collective": p.collective, "nodes": p.nodes, "nbytes": p.nbytes,
             "nccl": p.run, "measured_us": p.measured_us, "predicted_us": p.predicted_us} for p in points]


def run() -> dict:
    from hipipe_compiler.nccl.calibrate import calibrate, predict
    from hipipe_compiler.nccl.logs import read_log

    out = {}
    for machine, logs in MACHINES.items():
        start = time.perf_counter()
        cal = calibrate([read_log(LOGS / log) for log in logs], net_GBps=NETWORK.get(machine))
        out[machine] = {"logs": logs, "seconds": round(time.perf_counter() - start, 1), "rms_log_error": cal.rms_error,
                        "topology": cal.topology.to_document(), "points": _points(cal.points)}
        print(f"{machine}: rms log error {cal.rms_error:.3f} ({out[machine]['seconds']} s)", file=sys.stderr)
    for case, (fitted_on, judged) in HELD_OUT.items():
        cal = calibrate([read_log(LOGS / log) for log in fitted_on])
        points = predict(cal.topology, [read_log(LOGS / log) for log in judged])
        out[case] = {"logs": judged, "calibrated_on": fitted_on, "topology": cal.topology.to_document(),
                     "points": _points(points)}
        print(f"{case}: done", file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save", action="store_true", help=f"write {RESULTS.relative_to(REPO)}")
    args = parser.parse_args()
    if not LOGS.is_dir():
        print(f"{LOGS} is absent: fidelity needs ../shared beside the checkout", file=sys.stderr)
        return 2
    results = run()
    text = json.dumps(results, indent=1) + "\n"
    if args.save:
        RESULTS.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
