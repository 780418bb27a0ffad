"""Calibration fits a topology to nccl-tests logs: it recovers a machine from logs our own
simulator made of it, reproduces a real log, and refuses what it cannot use."""

from __future__ import annotations

import pytest

from hipipe_compiler.hardware import Latencies
from hipipe_compiler.nccl.calibrate import calibrate, log_machines, template
from hipipe_compiler.nccl.logs import parse_log, read_log
from hipipe_compiler.nccl.timing import NcclTimer
from hipipe_compiler.topology import Dimension, Topology

from conftest import shared_path
from nccl_logs import nccl_tests_log

#: A machine unlike the defaults the fit starts from: slower links, dearer calls, a less
#: efficient switch, slower channels.
TRUTH = Topology((
    Dimension(8, "switch", 340.0, Latencies(0.7, 2.2, 4.0), name="nvlink", link="nvlink",
              nvls={"efficiency": 0.8, "call_latency": 12.0}, rated_bandwidth=370.8),
    Dimension(2, "switch", 45.0, Latencies(3.5, 5.0, 16.0), name="net", link="network", rated_bandwidth=50.0)),
    gpu="H100", call_latency=Latencies(7.5, 15.0, 10.0), nccl_channel_scale=0.9)
SIZES = [8 << k for k in range(0, 27, 3)] + [64 << 20, 256 << 20]


def synthetic_logs() -> list:
    logs = []
    for nodes, env in ((1, ""), (2, ""), (2, "NCCL_ALGO=Ring")):
        topo = TRUTH.with_outer_size(nodes)
        timer = NcclTimer(topo, "allreduce")
        rows = [(n, timer.pick(n, ["ring"] if env else None).time_us) for n in SIZES]
        logs.append(parse_log(nccl_tests_log(rows, nodes, 8, env=env), f"synthetic-{nodes}n{'-ring' if env else ''}.log"))
    return logs


@pytest.mark.xdist_group("calibration")
def test_it_recovers_the_machine_a_simulated_log_came_from():
    cal = calibrate(synthetic_logs())
    got = {f.quantity.name: f.value for f in cal.fitted}
    for name, truth in (("nvlink bandwidth", 340.0), ("net bandwidth", 45.0), ("nvlink in-switch efficiency", 0.8),
                        ("NCCL channel throughput", 0.9)):
        assert got[name] == pytest.approx(truth, rel=0.02), name
    assert max(abs(p.error) for p in cal.points) < 0.03  # and reproduces every time within 3 %


def test_a_real_log_is_reproduced_from_64_mib_within_ten_percent():
    log = read_log(shared_path("data", "nccl-tests", "h100-1n-dgx-all_reduce.log"))
    cal = calibrate([log])
    large = [p for p in cal.points if p.nbytes >= 64 << 20]
    assert large and max(abs(p.error) for p in large) < 0.10
    assert max(abs(p.error) for p in cal.points if (1 << 20) <= p.nbytes <= (32 << 20)) < 0.25
    assert {p.run for p in large} == {"nvls/Simple"}


def test_the_fit_starts_from_the_gpus_figures():
    log = parse_log(nccl_tests_log([(8, 20.0), (1 << 20, 30.0)], 2, 8, gpu="NVIDIA A100-SXM4-80GB"), "a.log")
    start = template(log_machines([log]))
    assert start.dimensions[0].bandwidth == 240.0 and start.dimensions[0].nvls is None  # A100: no in-switch reduction
    assert start.dimensions[1].link == "network" and start.call_cost("LL") == 6.6


def test_check_predicts_logs_on_a_topology_without_fitting(tmp_path):
    """`hipipe calibrate --check`: a log the topology itself produced is predicted to its last
    printed digit, one of another machine shape is refused, and nothing is written."""
    from conftest import run_hipipe
    topo = TRUTH.with_outer_size(2)
    timer = NcclTimer(topo, "allreduce")
    rows = [(n, timer.pick(n).time_us) for n in SIZES]
    own = tmp_path / "own.log"
    own.write_text(nccl_tests_log(rows, 2, 8))
    truth = tmp_path / "truth.json"
    truth.write_text(__import__("json").dumps(topo.to_document()))
    done = run_hipipe("calibrate", "--check", truth, own, "--json")
    assert done.returncode == 0, done.stderr
    points = __import__("json").loads(done.stdout)["points"]
    assert len(points) == len(SIZES) and all(abs(p["error"]) < 0.06 / p["measured_us"] + 1e-9 for p in points)
    other = tmp_path / "four.log"
    other.write_text(nccl_tests_log(rows, 2, 4))
    done = run_hipipe("calibrate", "--check", truth, other)
    assert done.returncode == 2 and f"{truth}: dimensions: expected 4 ranks per node" in done.stderr
    done = run_hipipe("calibrate", "--check", truth, own, "-o", tmp_path / "x.yaml")
    assert done.returncode == 2 and "--output" in done.stderr and not (tmp_path / "x.yaml").exists()
