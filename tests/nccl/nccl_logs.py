"""nccl-tests output written from times: the logs of a machine our own simulator made, for
the calibration to recover, and variants of real layouts for the reader."""

from __future__ import annotations

from typing import Sequence

BINARY = {"allreduce": "all_reduce_perf", "reducescatter": "reduce_scatter_perf", "allgather": "all_gather_perf"}


def nccl_tests_log(rows: Sequence[tuple[int, float]], nodes: int, ppn: int, gpu: str = "NVIDIA H100 80GB HBM3",
                   collective: str = "allreduce", env: str = "") -> str:
    """A log in nccl-tests 2.17's layout: its header, a rank line per GPU, one row per (size,
    time in µs) with both halves, and the footer."""
    n = nodes * ppn
    lines = ["# nccl-tests version 2.17.6 nccl-headers=22605 nccl-library=22605",
             f"# Collective test starting: {BINARY[collective]}"]
    if env:
        lines.append(f"# env: {env}")
    lines += ["# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 "
              "validation: 1 graph: 0", "#", "# Using devices"]
    for r in range(n):
        lines.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {f'node{r // ppn}':>10s} device {r % ppn:2d} "
                     f"[0000:{r % ppn:02x}:00] {gpu}")
    lines += ["#", "#                                                              out-of-place                       "
              "in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
              "busbw  #wrong ",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  "
              "(GB/s)         "]
    factor = 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n
    for size, t in rows:
        algbw = size / t / 1e3
        half = f"  {t:7.1f}  {algbw:6.2f}  {algbw * factor:6.2f}  {0:6g}"
        lines.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}{half}{half}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0", "#",
              f"# Collective test concluded: {BINARY[collective]}", ""]
    return "\n".join(lines)
