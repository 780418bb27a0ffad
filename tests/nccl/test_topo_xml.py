"""NCCL's topology XML becomes a topology: the six real files, partial ones completed by flags
or refused naming the missing fact, and hostile XML refused."""

from __future__ import annotations

import pytest

from hipipe_compiler.errors import InputError
from hipipe_compiler.nccl.topo_xml import import_topology, read_topology_xml

from conftest import shared_path


def topo_file(name: str):
    return shared_path("data", "nccl-topo", name)


@pytest.mark.parametrize("name,gpus,gpu,nvlink,nvswitch,nics,nic_total,cpu", [
    ("ibm-vpc-gx3d-h100-topo.xml", 8, "H100", 370.8, True, 8, 200.0, "intel"),
    ("topo_8A100_4CX6.xml", 8, "A100", 240.0, True, 5, 125.0, "intel"),
    ("ncv4-topo.xml", 4, "A100 PCIe", None, False, 1, 12.5, "amd"),
    ("p4d-24xl-topo.xml", 8, "A100", 240.0, True, 4, None, "intel"),
])
def test_real_files_give_their_machines(name, gpus, gpu, nvlink, nvswitch, nics, nic_total, cpu):
    m = read_topology_xml(topo_file(name))
    assert (m.gpus, m.gpu.name, m.nvlink_GBps, m.nvswitch, m.nics, m.nic_GBps, m.cpu) == (
        gpus, gpu, nvlink, nvswitch, nics, nic_total, cpu)


def test_an_h100_dump_becomes_nvswitch_nodes_with_in_switch_reduction_and_a_nic_per_gpu():
    m = read_topology_xml(topo_file("ibm-vpc-gx3d-h100-topo.xml"))
    topo, why = import_topology(m, nodes=4)
    nvlink, net = topo.dimensions
    assert (nvlink.size, nvlink.bandwidth, nvlink.nvls is not None, net.size, net.bandwidth) == (8, 370.8, True, 4, 25.0)
    assert topo.gpu == "H100" and any("18 NVLinks" in w for w in why)
    assert all(n.endswith("(PIX)") for n in m.nearest)  # every GPU has a NIC under its own PCIe switch


def test_partial_files_take_what_they_lack_from_flags_or_name_it():
    with pytest.raises(InputError, match="no GPU model") as err:
        read_topology_xml(topo_file("ndv5-topo.xml"))
    assert "--gpu" in str(err.value)
    m = read_topology_xml(topo_file("ndv5-topo.xml"), gpu="H100")
    with pytest.raises(InputError, match="--nic-gbps"):
        import_topology(m, nodes=2)
    topo, why = import_topology(m, nodes=2, nic_GBps=50)
    assert topo.dimensions[1].bandwidth == 50 and "--nic-gbps" in " ".join(why)
    assert import_topology(m, nodes=1)[0].ndims == 1  # one node needs no network


@pytest.mark.parametrize("speeds", [('speed="400000"', 'speed="-1"'), ('speed="400000"', ""), ("", "")])
def test_a_nic_without_a_speed_is_not_given_nccls_guess(speeds):
    nics = "".join(f'<pci busid="0000:0{i}:00.0" class="0x020700"><nic><net name="mlx5_{i}" dev="{i}" {s}/></nic></pci>'
                   for i, s in enumerate(speeds))
    gpus = "".join(f'<pci busid="0000:1{i}:00.0" class="0x030200" device="0x2330"><gpu dev="{i}" sm="90"/></pci>'
                   for i in range(2))
    m = read_topology_xml(f'<system version="1"><cpu>{nics}{gpus}</cpu></system>'.encode(), "nics.xml")
    assert m.nic_GBps is None  # NCCL would take 10 Gb/s for the NIC without a speed; the machine's is unknown
    with pytest.raises(InputError, match="speed of every NIC") as err:
        import_topology(m, nodes=2)
    assert str(err.value).startswith("nics.xml") and "--nic-gbps" in str(err.value)
    assert import_topology(m, nodes=2, nic_GBps=50)[0].dimensions[1].bandwidth == 50


def test_a_pcie_card_talks_over_pcie():
    m = read_topology_xml(topo_file("ncv4-topo.xml"))
    topo, _why = import_topology(m, nodes=1)
    assert topo.dimensions[0].link == "pcie" and topo.dimensions[0].nvls is None


@pytest.mark.parametrize("xml,message", [
    (b'<!DOCTYPE s [<!ENTITY a "b">]><system version="1"/>', "DOCTYPE"),
    (b'<system version="2"><cpu/></system>', "RCCL writes 2"),
    (b'<system version="1"><cpu>', "malformed XML"),
    (b'<graph/>', "<system>"),
    (b'<system version="1"><cpu><pci class="0x060400"/></cpu></system>', "no GPU"),
    (b'<system version="1"><cpu><pci class="0x030200" device="0x2330"><gpu sm="90"><nvlink target="x" count="many"/>'
     b'</gpu></pci></cpu></system>', "nvlink.count"),
])
def test_hostile_or_broken_xml_is_one_line(xml, message):
    with pytest.raises(InputError) as err:
        read_topology_xml(xml, "bad.xml")
    assert message in str(err.value) and str(err.value).startswith("bad.xml") and "\n" not in str(err.value)
