"""A topology from NCCL's topology XML (NCCL_TOPO_DUMP_FILE, or a file for NCCL_TOPO_FILE;
nccl-formats.md part A): GPUs per node, their NVLink bandwidth (links x the generation's
per-link figure), NVSwitch and in-switch reduction, the NICs and their speeds, and which GPU
is nearest which NIC. Partial files (Azure's and AWS's have no <gpu>, <nic> or speeds) take
what they lack from the caller, or fail naming the missing fact.

>>> xml = b'''<system version="1"><cpu numaid="0" vendor="GenuineIntel" arch="x86_64">
...   <pci busid="0000:01:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
...     <pci busid="0000:02:00.0" class="0x030200" device="0x2330"><gpu dev="0" sm="90" rank="0">
...       <nvlink target="0000:f0:00.0" count="18" tclass="0x068000"/></gpu></pci>
...     <pci busid="0000:03:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0" speed="400000"/></nic></pci>
...   </pci></cpu></system>'''
>>> machine = read_topology_xml(xml, "x.xml")
>>> machine.gpus, machine.gpu.name, machine.nvlink_GBps, machine.nic_GBps, machine.nvswitch
(1, 'H100', 370.8, 50.0, True)
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree

from ..errors import InputError
from ..hardware import GPU_MODELS, GpuModel, Latencies, gpu_model, nvlink_per_link
from ..topology import Dimension, Nvls, Topology

#: Largest file read: NCCL itself handles at most 256 nodes of XML.
MAX_TOPO_BYTES = 4 << 20
#: PCI device ids of NVIDIA GPUs whose model the file may not name otherwise.
DEVICE_IDS = {"0x2330": "H100", "0x2331": "H100", "0x2335": "H200", "0x2324": "H800", "0x20b0": "A100",
              "0x20b2": "A100", "0x20f3": "A800", "0x1db1": "V100", "0x1db5": "V100", "0x2901": "B200"}
#: PCIe cards (no NVLink to a switch), by PCI device id.
PCIE_CARDS = {"0x20b5": GpuModel("A100 PCIe", 80, 0), "0x20f1": GpuModel("A100 PCIe", 80, 0),
              "0x2331": GpuModel("H100 PCIe", 90, 0)}
#: 100 Mb/s per lane of PCIe by link speed string (topo.cc), unknown ones 60 (Gen3).
PCIE_SPEEDS = {"2.5": 15, "5": 30, "8": 60, "16": 120, "32": 240, "64": 480}


@dataclass(frozen=True)
class NodeMachine:
    """What one node of the file holds."""

    source: str
    gpus: int
    gpu: GpuModel
    nvlink_GBps: float | None  # per GPU; None where the file has no <nvlink>
    nvswitch: bool
    nics: int
    nic_GBps: float | None  # summed over the node's NICs; None where no speed is given
    hosts: int
    cpu: str | None
    nearest: tuple[str, ...] = field(default=(), compare=False)  # per GPU: "NIC name (path type)"
    notes: tuple[str, ...] = field(default=(), compare=False)
    pcie_GBps: float = 24.0  # each GPU's PCIe link


def read_topology_xml(source: bytes | str | Path, label: str | None = None, gpu: str | None = None) -> NodeMachine:
    """Parse a topology file safely (no entities, DTDs or network; bounded size)."""
    if isinstance(source, (bytes, bytearray)):
        data, name = bytes(source), label or "<xml>"
    else:
        name = label or str(source)
        try:
            with open(source, "rb") as fh:
                data = fh.read(MAX_TOPO_BYTES + 1)
        except OSError as exc:
            raise InputError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_TOPO_BYTES:
        raise InputError(name, None, f"larger than {MAX_TOPO_BYTES >> 20} MiB; NCCL's topology files are a few kB")
    if re.search(rb"<!DOCTYPE|<!ENTITY", data, re.I):
        raise InputError(name, None, "DOCTYPE and entity declarations are not allowed in a topology file")
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                             remove_comments=True, remove_pis=True, recover=False)
    try:
        root = etree.parse(io.BytesIO(data), parser).getroot()
    except etree.XMLSyntaxError as exc:
        msg = " ".join(str(getattr(exc, "msg", exc)).split(", line")[0].split())
        raise InputError(name, f"line {getattr(exc, 'lineno', '?')}", f"malformed XML: {msg}") from None
    if root.tag != "system":
        raise InputError(name, root.tag, "expected NCCL's <system> element at the top")
    if root.get("version") != "1":
        raise InputError(name, "system.version", f"expected 1 (NCCL's format; RCCL writes 2), got {root.get('version')!r}")
    return _machine(root, name, gpu)


def _machine(root: etree._Element, name: str, gpu_name: str | None) -> NodeMachine:
    gpus = [p for p in root.iter("pci") if p.get("class", "").startswith("0x03") or p.find("gpu") is not None]
    if not gpus:
        raise InputError(name, "pci", "no GPU: expected <pci> elements of class 0x03... or holding a <gpu>")
    hosts = len({c.get("host_hash") for c in root.iter("cpu") if c.get("host_hash")}) or 1
    per_node = len(gpus) // hosts
    model = _gpu_model(gpus, name, gpu_name)
    notes: list[str] = []
    nvlink: float | None = None
    nvswitch = False
    links = []
    for p in gpus:
        g = p.find("gpu")
        rows = [] if g is None else [n for n in g.iter("nvlink") if n.get("target") != p.get("busid")]
        links.append(sum(_int(n.get("count"), name, "nvlink.count") for n in rows))
        nvswitch |= any(n.get("tclass", "").startswith("0x0680") and n.get("tclass") != "0x068001" for n in rows)
    pcie = min(_pcie_GBps(p) for p in gpus)
    if not any(links) and model.nvlink_links:
        notes.append(f"the file lists no NVLinks: the {model.name}'s {model.nvlink_links} NVLinks to its NVSwitch assumed")
        links = [model.nvlink_links]
        nvswitch = model.nvlink_links >= 12
    if any(links):
        nvlink = round(max(links) * nvlink_per_link(model.sm), 3)
        if min(links) != max(links):
            notes.append(f"GPUs have {min(links)} to {max(links)} NVLinks; the topology takes the most")
        any_self = any(n.get("target") == p.get("busid") for p in gpus for n in p.iter("nvlink"))
        if any_self:
            notes.append("NVLink rows that point at the GPU itself are ignored (as NCCL does)")
    nets = [n for n in root.iter("net")]
    nic_pcis = [p for p in root.iter("pci") if p.get("class", "").startswith("0x02") and p.find("nic") is None]
    speeds = [_int(n.get("speed"), name, "net.speed") for n in nets]
    nics = len(nets) + len(nic_pcis)
    nic_total = None
    if nets and not nic_pcis and all(s > 0 for s in speeds):  # NCCL takes 10 Gb/s for the others: no measure of them
        nic_total = sum(speeds) / 8000 / hosts
    nearest = tuple(_nearest(p, nets + nic_pcis) for p in gpus[:per_node])
    vendor = next((c.get("vendor") for c in root.iter("cpu") if c.get("vendor")), None)
    arch = next((c.get("arch") for c in root.iter("cpu") if c.get("arch")), None)
    cpu = ("amd" if vendor == "AuthenticAMD" else "intel" if vendor == "GenuineIntel" else
           "arm" if arch in ("arm64", "aarch64") else "power" if arch == "ppc64" else None)
    return NodeMachine(name, per_node, model, nvlink, nvswitch, nics // hosts, nic_total, hosts, cpu, nearest,
                       tuple(notes), pcie)


def _pcie_GBps(pci: etree._Element) -> float:
    """A PCIe link's GB/s (topo.cc): lanes x 100 Mb/s per lane by speed / 80; width 0 is 16."""
    speed = (pci.get("link_speed") or "").split()
    code = PCIE_SPEEDS.get(speed[0].rstrip("0").rstrip(".") if speed else "", 60)
    width = int(pci.get("link_width") or 0) or 16
    return width * code / 80


def _int(value: str | None, name: str, what: str) -> int:
    try:
        return int(value or "0")
    except ValueError:
        raise InputError(name, what, f"expected an integer, got {value!r}") from None


def _gpu_model(gpus: list, name: str, gpu_name: str | None) -> GpuModel:
    if gpu_name:
        return gpu_model(gpu_name)
    sms = {g.find("gpu").get("sm") for g in gpus if g.find("gpu") is not None}
    devices = {p.get("device", "").lower() for p in gpus}
    if len(devices) == 1 and next(iter(devices)) in PCIE_CARDS:
        return PCIE_CARDS[devices.pop()]
    by_device = {DEVICE_IDS[d] for d in devices if d in DEVICE_IDS}
    if len(by_device) == 1:
        return GPU_MODELS[by_device.pop().lower()]
    if len(sms) == 1 and None not in sms:
        return gpu_model(f"sm_{sms.pop()}")
    raise InputError(name, "gpu", "the file names no GPU model (no <gpu sm=...>, no known PCI device id): give it "
                     "with --gpu")


def _nearest(gpu: etree._Element, nics: list) -> str:
    """The NIC nearest a GPU by the lowest common ancestor, and NCCL's name for the path."""
    best = None
    gpu_path = list(gpu.iterancestors())
    for nic in nics:
        holder = nic.getparent().getparent() if nic.tag == "net" else nic  # net > nic > pci
        if holder is None:
            continue
        ancestors = [holder, *holder.iterancestors()]
        for depth, a in enumerate(gpu_path):
            if a in ancestors:
                kind = ("PIX" if depth == 0 else "PXB") if a.tag == "pci" else ("PHB" if a.tag == "cpu" else "SYS")
                label = nic.get("name") if nic.tag == "net" else nic.get("busid")
                if best is None or depth < best[0]:
                    best = (depth, f"{label} ({kind})")
                break
    return best[1] if best else "none (SYS)"


def import_topology(machine: NodeMachine, nodes: int | None = None, nvlink_GBps: float | None = None,
                    nic_GBps: float | None = None) -> tuple[Topology, list[str]]:
    """The topology of `nodes` such nodes (the file's hosts by default), and a comment per
    number saying where it came from. Flags fill what the file lacks."""
    nodes = machine.hosts if nodes is None else nodes
    why: list[str] = []
    nv = nvlink_GBps if nvlink_GBps is not None else machine.nvlink_GBps
    link = "nvlink"
    if nv is None and machine.gpu.nvlink_links == 0:
        nv, link = machine.pcie_GBps, "pcie"  # a PCIe card: its GPUs talk over PCIe
        why.append(f"PCIe {nv:g} GB/s per GPU: the {machine.gpu.name} has no NVLink; its PCIe link from the file")
    elif nv is None:
        raise InputError(machine.source, "nvlink", "the file lists no NVLinks and names no GPU model with them: give the "
                         "NVLink bandwidth per GPU with --nvlink-gbps (H100 SXM: 370.8, A100 SXM: 240), or --gpu")
    else:
        why.append(f"NVLink {nv:g} GB/s per GPU: " + ("--nvlink-gbps" if nvlink_GBps is not None else
                   f"{round(nv / nvlink_per_link(machine.gpu.sm))} NVLinks x {nvlink_per_link(machine.gpu.sm):g} GB/s "
                   f"(sm {machine.gpu.sm})"))
    switched = machine.nvswitch
    nvls = None
    if switched and machine.gpu.nvls_efficiency > 0 and machine.gpus >= 2:
        nvls = Nvls(machine.gpu.nvls_efficiency, 9.8)
        why.append(f"in-switch reduction: NVSwitch and sm {machine.gpu.sm} (NCCL's efficiency "
                   f"{machine.gpu.nvls_efficiency:g})")
    dims = [Dimension(machine.gpus, "switch", nv, link=link, name=link, nvls=nvls if link == "nvlink" else None)]
    if nodes > 1:
        total = nic_GBps * machine.gpus if nic_GBps is not None else machine.nic_GBps
        if total is None:
            raise InputError(machine.source, "net.speed", f"the file does not give the speed of every NIC ({machine.nics} "
                             "NIC(s); a <net speed=...> above 0 for each, where NCCL would take 10 Gb/s): give the network "
                             "bandwidth per GPU with --nic-gbps (a 400 Gb/s NIC per GPU: 50)")
        per_gpu = total / machine.gpus
        why.append(f"network {per_gpu:g} GB/s per GPU: " + ("--nic-gbps" if nic_GBps is not None else
                   f"{machine.nics} NIC(s) of {total:g} GB/s in all, shared by {machine.gpus} GPUs"))
        dims.append(Dimension(nodes, "switch", per_gpu, link="network", name="net"))
    elif nodes < 1:
        raise InputError(None, "--nodes", f"expected at least 1, got {nodes}")
    if machine.gpus < 2 and nodes < 2:
        raise InputError(machine.source, "pci", "one GPU and one node: a topology needs at least two ranks")
    if machine.gpus < 2:
        dims = dims[1:]
    topo = Topology(tuple(dims), name=f"{machine.gpu.name.lower().replace(' ', '-')}-{machine.gpus}x{nodes}",
                    gpu=machine.gpu.name.split()[0] if machine.gpu.name.split()[0].lower() in GPU_MODELS else f"sm_{machine.gpu.sm}",
                    cpu=machine.cpu, call_latency=Latencies(6.6, 14.0, 8.4))
    why.append("latencies: NCCL's per-hop estimates for the link types; per-call costs: NCCL's ring base latencies "
               "(calibrate to measure yours)")
    return topo, why + list(machine.notes)
