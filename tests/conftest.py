"""Shared fixtures: where ../shared is, hypothesis settings, topology strategies, a helper that
runs the `hipipe` command the way a user does, and the order that starts the slow tests first."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hipipe_compiler.hardware import NETWORK, NVLINK, PCIE
from hipipe_compiler.topology import Dimension, Topology

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HIPIPE_SHARED_DIR", REPO.parent / "shared"))
SAMPLES = REPO / "samples" / "topologies"
# the package (also when installed, not editable) and every `hipipe` the tests run find ../shared here
os.environ.setdefault("HIPIPE_SHARED_DIR", str(SHARED))
# pytest-xdist already runs a test per core: the `hipipe compile` runs start no workers of their own
os.environ.setdefault("HIPIPE_JOBS", "1")

#: Hypothesis profiles: "default" is CI's, fixed examples so every run checks the same sample
#: quickly; "thorough" (HYPOTHESIS_PROFILE=thorough pytest) draws ten times as many, at
#: random, before a release.
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
SCALE = {"default": 1, "thorough": 10}[PROFILE]
SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("default", deadline=None, max_examples=25, derandomize=True, suppress_health_check=SLOW)
settings.register_profile("thorough", deadline=None, max_examples=25 * SCALE, derandomize=False,
                          suppress_health_check=SLOW, print_blob=True)
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow go first. pytest-xdist (--dist loadgroup) hands out the xdist
    groups first, then single tests in collection order, and a long test handed out last keeps
    one worker busy after the others have finished."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def examples(n: int) -> int:
    """A test's own number of examples, scaled by the profile."""
    return n * SCALE


def shared_path(*parts: str) -> Path:
    """A file or directory under ../shared, or skip the test saying why."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: this clone has no ../shared beside it (set HIPIPE_SHARED_DIR to point at one)")
    return path


def real_xml_files() -> list[Path]:
    """The real MSCCL files of ../shared/msccl-algorithms (empty when absent)."""
    root = SHARED / "msccl-algorithms"
    return sorted(root.glob("*/*.xml")) if root.exists() else []


def real_xml_params(keep: Callable[[Path], bool] = lambda _p: True, limit: int | None = None) -> list:
    """The real MSCCL files `keep` accepts (the first `limit`), as test parameters named
    folder/file; in a clone without ../shared, one parameter that skips saying why."""
    root = SHARED / "msccl-algorithms"
    if not root.exists():
        reason = f"{root} is absent: this clone has no ../shared beside it (set HIPIPE_SHARED_DIR to point at one)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-shared")]
    files = [p for p in real_xml_files() if keep(p)][:limit]
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no file of {root} is one this test takes"), id="none")]
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in files]


#: Per-protocol latencies (cost-model.md 1): NCCL's for NVLink, PCIe and the network.
PER_PROTOCOL = (NVLINK, PCIE, NETWORK)


@st.composite
def topologies(draw, max_dims: int = 4, max_ranks: int = 64, min_size: int = 2, max_size: int = 16) -> Topology:
    """Random hierarchical topologies: 1-4 dimensions, sizes 2-16 (odd ones too), both kinds,
    bounded rank count."""
    ndims = draw(st.integers(1, max_dims))
    dims = []
    ranks = 1
    for d in range(ndims):
        room = max_ranks // ranks
        if room < min_size:
            break
        size = draw(st.integers(min_size, min(max_size, room)))
        ranks *= size
        dims.append(Dimension(
            size=size, kind=draw(st.sampled_from(["ring", "switch"])),
            bandwidth=draw(st.sampled_from([12.5, 25.0, 50.0, 100.0, 200.0, 300.0])),
            latency=draw(st.one_of(st.sampled_from([0.0, 0.05, 0.5, 1.0, 5.0]), st.sampled_from(PER_PROTOCOL))),
            name=f"d{d}",
        ))
    assert math.prod(d.size for d in dims) <= max_ranks
    return Topology(tuple(dims))


COLLECTIVES = ("allreduce", "reducescatter", "allgather")
#: Bytes per element of the types calls are made with: float32, and bfloat16/float16.
DTYPE_BYTES = (4, 2)


def call_sizes(max_bytes: int = 64 << 20):
    """Call sizes in bytes: powers of two as benchmarks use, and any other size as real jobs do."""
    powers = st.integers(10, max(10, max_bytes.bit_length() - 1)).map(lambda k: 1 << k)
    return st.one_of(powers, st.integers(1, max_bytes))


def hipipe_command() -> list[str]:
    """The installed `hipipe` command, or the module when running from a bare checkout."""
    exe = shutil.which("hipipe")
    return [exe] if exe else [sys.executable, "-m", "hipipe_compiler"]


def run_hipipe(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `hipipe ARGS` as a user would; returns the completed process (text output)."""
    return subprocess.run([*hipipe_command(), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def nvls_nodes(n: int, k: int, efficiency: float = 0.85) -> Topology:
    """k H100-like nodes of n GPUs, whose NVSwitch reduces (nvls), on one switch network."""
    return Topology((Dimension(n, "switch", 370.8, {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
                               nvls={"efficiency": efficiency, "call_latency": 5.0}),
                     Dimension(k, "switch", 50, {"LL": 2.7, "LL128": 4.0, "Simple": 14.0})), call_latency=4.0)


def per_protocol_torus(*shape: int) -> Topology:
    """A torus of NVLink rings with NCCL's per-protocol latencies."""
    return Topology(tuple(Dimension(n, "ring", 200.0, NVLINK, f"d{i}") for i, n in enumerate(shape)), name="torus-p")


def c1p(nodes: int = 4) -> Topology:
    """C1p of the benchmark grid (C1 with NCCL's per-protocol latencies): 8-GPU NVSwitch nodes
    at 300 GB/s over a 50 GB/s NIC per GPU, uncalibrated: the tests' fixed machine, where the
    calibrated dgx-h100 presets move with every calibration. NCCL's choices are an H100's."""
    return Topology((Dimension(8, "switch", 300.0, NVLINK, "nvlink"), Dimension(nodes, "switch", 50.0, NETWORK, "ib")),
                    name=f"c1p-8x{nodes}", gpu="H100")
