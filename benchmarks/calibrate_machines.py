"""Remake the calibrated machines behind the H100 and A100 presets (samples/machines/) and the
quick start's sample topology, from the nccl-tests logs of ../shared/data/nccl-tests/:

    python benchmarks/calibrate_machines.py          # needs ../shared; takes a few minutes

The same as running `hipipe calibrate` on each machine's logs (the files say which). The
H100 sample (samples/topologies/dgx-h100-8x4.yaml) is the H100 machine with four nodes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HIPIPE_SHARED_DIR", REPO.parent / "shared"))
LOGS = SHARED / "data" / "nccl-tests"
#: Each calibrated machine: its name, its logs, and the network bandwidth per GPU its fit starts
#: at (None: 50 GB/s, a 400 Gb/s NIC per GPU).
MACHINES = {
    # DGX/HGX H100 nodes with a 400 Gb/s InfiniBand NIC per GPU: one node, and two nodes of two
    # clusters, NCCL's own choices. Cluster B's NCCL_ALGO=Ring run is left out: it also ran
    # NCCL_MIN_CTAS=24 and two QPs per connection, which the simulation does not model, and its
    # LL128 sizes would drag every LL128 cost up; fitted without it, the machine predicts its
    # sizes from 128 MiB within 5 % (README, fidelity).
    "dgx-h100": (["h100-1n-dgx-all_reduce.log", "h100-2n-ib400-xe9680-all_reduce.log",
                  "h100-2n-ib400-clusterB-all_reduce.log"], None),
    # 8 x A100-SXM4: one node's three collectives, and two RoCE nodes with 100 Gb/s per GPU pair
    "dgx-a100": (["a100-1n-azure-all_reduce.log", "a100-1n-azure-reduce_scatter.log",
                  "superbench-a100-8gpu-all_gather_perf.log", "a100-2n-roce-oci-all_reduce.log",
                  "oci-bm-gpu4.8-a100-8gpu-all_reduce_perf.log"], 25.0),
}


def main() -> int:
    from hipipe_compiler import __version__
    from hipipe_compiler.files import write_atomic
    from hipipe_compiler.nccl.calibrate import calibrate
    from hipipe_compiler.nccl.logs import read_log
    from hipipe_compiler.nccl.report import topology_yaml

    if not LOGS.is_dir():
        print(f"{LOGS} is absent: the calibrations need ../shared beside the checkout", file=sys.stderr)
        return 2
    tool = f"hipipe calibrate (hipipe-compiler {__version__})"
    for name, (logs, net) in MACHINES.items():
        paths = [str(LOGS / log) for log in logs]
        cal = calibrate([read_log(p) for p in paths], net_GBps=net)
        write_atomic(REPO / "samples" / "machines" / f"{name}.yaml", topology_yaml(cal, paths, 2, name, tool))
        print(f"{name}: rms log error {cal.rms_error:.3f} over {len(cal.points)} times")
        if name == "dgx-h100":
            write_atomic(REPO / "samples" / "topologies" / "dgx-h100-8x4.yaml",
                         topology_yaml(cal, paths, 4, "dgx-h100-8x4", tool))
    return 0


if __name__ == "__main__":
    sys.exit(main())
