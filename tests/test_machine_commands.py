"""`hipipe calibrate` and `hipipe topo import`, run as a user runs them."""

from __future__ import annotations

import json

import pytest

from hipipe_compiler.presets import load_topology

from conftest import run_hipipe, shared_path


def test_calibrate_prints_the_fit_and_writes_a_commented_topology(tmp_path):
    log = shared_path("data", "nccl-tests", "h100-1n-dgx-all_reduce.log")
    out, plot = tmp_path / "h100.yaml", tmp_path / "fit.png"
    done = run_hipipe("calibrate", log, "-o", out, "--plot", plot)
    assert done.returncode == 0, done.stderr
    assert "measured us" in done.stdout and "nvlink in-switch efficiency" in done.stdout
    topo = load_topology(out)
    assert topo.ndims == 1 and topo.dimensions[0].nvls is not None and topo.gpu == "H100"
    text = out.read_text()
    assert "h100-1n-dgx-all_reduce.log" in text and "# fitted" in text or "fitted (default" in text
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_calibrate_refuses_a_network_no_log_spans(tmp_path):
    log = shared_path("data", "nccl-tests", "h100-1n-dgx-all_reduce.log")
    done = run_hipipe("calibrate", log, "-o", tmp_path / "x.yaml", "--nodes", "4")
    assert done.returncode == 2 and "no log spans nodes" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.yaml").exists()


@pytest.mark.parametrize("text,words", [
    ("hello\n", "no nccl-tests table"),
    ("#  Rank  0 Group  0 Pid 1 on a device 0 [0x00] NVIDIA H100\n#  size count type redop root time algbw busbw "
     "#wrong time algbw busbw #wrong\n  8 2 float sum -1 1.0 0 0 0 1.0 0 0 0\n", "at least 2"),
])
def test_calibrate_refuses_a_log_it_cannot_use(tmp_path, text, words):
    log = tmp_path / "all_reduce.log"
    log.write_text(text)
    done = run_hipipe("calibrate", log, "-o", tmp_path / "x.yaml")
    assert done.returncode == 2 and words in done.stderr and str(log) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.yaml").exists()


def test_topo_import_writes_a_topology_from_nccls_xml(tmp_path):
    xml = shared_path("data", "nccl-topo", "ibm-vpc-gx3d-h100-topo.xml")
    out = tmp_path / "ibm.yaml"
    done = run_hipipe("topo", "import", xml, "--nodes", "4", "-o", out)
    assert done.returncode == 0, done.stderr
    topo = load_topology(out)
    assert topo.shape == (8, 4) and topo.dimensions[1].bandwidth == 25.0 and "18 NVLinks" in out.read_text()
    shown = run_hipipe("topo", "import", xml, "--json")
    assert json.loads(shown.stdout)["topology"]["dimensions"][0]["bandwidth"] == 370.8


def test_topo_import_names_what_a_partial_file_lacks(tmp_path):
    xml = shared_path("data", "nccl-topo", "p4d-24xl-topo.xml")
    done = run_hipipe("topo", "import", xml, "--nodes", "2", "-o", tmp_path / "p4d.yaml")
    assert done.returncode == 2 and "--nic-gbps" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p4d.yaml").exists()
    done = run_hipipe("topo", "import", xml, "--nodes", "2", "--nic-gbps", "6.25", "-o", tmp_path / "p4d.yaml")
    assert done.returncode == 0 and load_topology(tmp_path / "p4d.yaml").dimensions[1].bandwidth == 6.25
