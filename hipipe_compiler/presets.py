"""Named topologies, and the one way to name a topology on the command line: a file or a
preset (`load_topology`).

>>> load_topology("torus-4x4").shape
(4, 4)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .documents import load_document
from .errors import InputError
from .hardware import NETWORK, NVLINK
from .topology import Dimension, Topology, topology_from_document


def load_topology(spec: str | Path) -> Topology:
    """A topology from a YAML/JSON file, or a preset name (see `PRESETS`)."""
    path = Path(spec)
    if path.is_file() or path.suffix.lower() in (".yaml", ".yml", ".json") or "/" in str(spec):
        topo = topology_from_document(load_document(path), str(path))
        return topo if topo.name else replace(topo, name=path.stem)
    if str(spec) in PRESETS:
        return preset(str(spec))
    raise InputError(str(spec), None, f"not a topology file or a preset; presets: {', '.join(PRESETS)}")


def _nvswitch_ib(nodes: int, name: str) -> Topology:
    """Nodes of 8 H100s on NVSwitch joined by a 400 Gb/s NIC per GPU, at NCCL's per-protocol latencies."""
    return Topology((Dimension(8, "switch", 300.0, NVLINK, "nvlink"), Dimension(nodes, "switch", 50.0, NETWORK, "ib")),
                    name=name)


def _presets() -> dict[str, Topology]:
    out: dict[str, Topology] = {}
    for nodes in (2, 4, 16, 32, 64):
        out[f"dgx-h100-8x{nodes}"] = _nvswitch_ib(nodes, f"dgx-h100-8x{nodes}")
    out["torus-4x4"] = Topology((Dimension(4, "ring", 100.0, 0.5, "x"), Dimension(4, "ring", 100.0, 0.5, "y")), name="torus-4x4")
    out["torus-4x4x4"] = Topology((Dimension(4, "ring", 200.0, 0.05, "x"), Dimension(4, "ring", 100.0, 0.5, "y"),
                                   Dimension(4, "ring", 50.0, 2.0, "z")), name="torus-4x4x4")
    out["ring-fc-switch-2x8x4"] = Topology((Dimension(2, "ring", 200.0, 0.05, "ring"), Dimension(8, "switch", 100.0, 0.5, "fc"),
                                            Dimension(4, "switch", 50.0, 2.0, "switch")), name="ring-fc-switch-2x8x4")
    out["pod-8x4x8x4"] = Topology((Dimension(8, "switch", 300.0, NVLINK, "nvlink"), Dimension(4, "switch", 50.0, NETWORK, "leaf"),
                                   Dimension(8, "switch", 25.0, NETWORK, "spine"), Dimension(4, "ring", 12.5, NETWORK, "dc")),
                                  name="pod-8x4x8x4")
    return out


#: Named topologies: NVSwitch nodes over IB (C1 of algorithms.md 6.2 is dgx-h100-8x4), tori
#: (C3 torus-4x4, C5 torus-4x4x4), the astra-sim default (C6 ring-fc-switch-2x8x4) and a
#: 1024-rank four-dimensional pod.
PRESETS: dict[str, Topology] = _presets()


def preset(name: str) -> Topology:
    """A named topology from `PRESETS`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError(name, None, f"unknown preset; expected one of {', '.join(PRESETS)}") from None
