"""Named topologies, and the one way to name a topology on the command line: a file or a
preset (`load_topology`).

>>> load_topology("torus-4x4").shape
(4, 4)
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
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


#: Calibrated machines (samples/machines/*.yaml, shipped in the package): hipipe calibrate's
#: fits of the shared nccl-tests logs of such machines, each file saying which logs. Their
#: presets are the machine with 1 to 64 nodes.
MACHINES: dict[str, tuple[int, ...]] = {"dgx-h100": (1, 2, 4, 8, 16, 32, 64), "dgx-a100": (1, 2, 4, 8)}


def machine_path(name: str) -> Path:
    """The file of a calibrated machine: in the installed package (hipipe_compiler.machines),
    or in samples/machines/ of a checkout."""
    try:
        candidate = Path(str(resources.files("hipipe_compiler.machines") / f"{name}.yaml"))
        if candidate.is_file():
            return candidate
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "samples" / "machines" / f"{name}.yaml"


def machine(name: str) -> Topology:
    """A calibrated machine as its file describes it (its node count is the logs')."""
    path = machine_path(name)
    return topology_from_document(load_document(path), path.name)


def _presets() -> dict[str, Topology]:
    out: dict[str, Topology] = {}
    for name, nodes in MACHINES.items():
        base = machine(name)
        ppn = base.dimensions[0].size
        for n in nodes:
            out[f"{name}-{ppn}x{n}"] = base.with_outer_size(n, f"{name}-{ppn}x{n}")
    out["torus-4x4"] = Topology((Dimension(4, "ring", 100.0, 0.5, "x"), Dimension(4, "ring", 100.0, 0.5, "y")), name="torus-4x4")
    out["torus-4x4x4"] = Topology((Dimension(4, "ring", 200.0, 0.05, "x"), Dimension(4, "ring", 100.0, 0.5, "y"),
                                   Dimension(4, "ring", 50.0, 2.0, "z")), name="torus-4x4x4")
    out["ring-fc-switch-2x8x4"] = Topology((Dimension(2, "ring", 200.0, 0.05, "ring"), Dimension(8, "switch", 100.0, 0.5, "fc"),
                                            Dimension(4, "switch", 50.0, 2.0, "switch")), name="ring-fc-switch-2x8x4")
    out["pod-8x4x8x4"] = Topology((Dimension(8, "switch", 300.0, NVLINK, "nvlink"), Dimension(4, "switch", 50.0, NETWORK, "leaf"),
                                   Dimension(8, "switch", 25.0, NETWORK, "spine"), Dimension(4, "ring", 12.5, NETWORK, "dc")),
                                  name="pod-8x4x8x4")
    return out


#: Named topologies: calibrated H100 and A100 machines (MACHINES), tori (C3 torus-4x4, C5
#: torus-4x4x4), the astra-sim default (C6 ring-fc-switch-2x8x4) and a 1024-rank
#: four-dimensional pod.
PRESETS: dict[str, Topology] = _presets()


def preset(name: str) -> Topology:
    """A named topology from `PRESETS`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise InputError(name, None, f"unknown preset; expected one of {', '.join(PRESETS)}") from None
