"""What a topology may say about its hardware, and what follows from it: the per-protocol
latencies of a link type (cost-model.md section 1), GPU models and their generation, NVLink
per-link bandwidth and in-switch reduction efficiency (nccl-tuning.md sections 2.1 and 2.3).

>>> gpu_model("H100").sm, gpu_model("h100").nvlink_GBps, gpu_model("sm_80").generation
(90, 370.8, 'ampere')
>>> link_latencies("network").Simple
14.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InputError

#: The runtime's protocols, in the order latencies are written.
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
#: Payload bytes per wire byte of each protocol (cost-model.md 3): LL puts a flag beside every
#: 4 bytes, LL128 one 8-byte flag per 128-byte line.
WIRE_EFFICIENCY: dict[str, float] = {"Simple": 1.0, "LL128": 120 / 128, "LL": 0.5}
#: The largest latency a topology may give, in microseconds (a second): more is a typing mistake.
MAX_LATENCY = 1e6


def latency_value(x: Any) -> bool:
    """A latency: a number in [0, MAX_LATENCY] microseconds."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= MAX_LATENCY


@dataclass(frozen=True)
class Latencies:
    """One value per protocol, in microseconds: a link's alpha (how long a message takes to
    become visible to its receiver) or a call's fixed cost (cost-model.md section 1).

    >>> Latencies.of({"LL": 0.6, "LL128": 1.9, "Simple": 3.4}).alpha("LL128")
    1.9
    """

    LL: float
    LL128: float
    Simple: float

    @classmethod
    def of(cls, values: Mapping[str, Any], field: str = "latency") -> "Latencies":
        """From a mapping with exactly the keys LL, LL128 and Simple; InputError names the key."""
        keys = set(values)
        if keys != set(PROTOCOLS):
            missing, extra = sorted(set(PROTOCOLS) - keys), sorted(keys - set(PROTOCOLS), key=str)
            what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(map(repr, extra))}"
            raise InputError(None, field, f"expected exactly LL, LL128 and Simple; {what}")
        for key in PROTOCOLS:
            if not latency_value(values[key]):
                raise InputError(None, f"{field}.{key}", f"expected a number from 0 to {MAX_LATENCY:g} (microseconds), "
                                 f"got {values[key]!r}")
        return cls(**{key: values[key] for key in PROTOCOLS})

    @classmethod
    def coerce(cls, value: Any, field: str) -> "float | Latencies":
        """One number for every protocol, or a mapping of one per protocol; InputError otherwise."""
        if isinstance(value, Latencies):
            return value
        if isinstance(value, Mapping):
            return cls.of(value, field)
        if not latency_value(value):
            raise InputError(None, field, f"expected a number from 0 to {MAX_LATENCY:g} (microseconds), or one per "
                             f"protocol (LL, LL128, Simple), got {value!r}")
        return value

    def alpha(self, protocol: str) -> float:
        return getattr(self, protocol)

    def document(self) -> dict[str, float]:
        return {p: self.alpha(p) for p in PROTOCOLS}


def per_protocol(value: "float | Latencies", protocol: str) -> float:
    """A latency field's value for one protocol (the number itself where it is one number)."""
    return value.alpha(protocol) if isinstance(value, Latencies) else value


#: NCCL's own per-hop latency estimates (src/graph/tuning.cc, hwLat, ring column), in µs: the
#: defaults of cost-model.md section 1 for links named by their type.
NVLINK = Latencies(0.6, 1.9, 3.4)
PCIE = Latencies(1.0, 2.5, 5.7)
NETWORK = Latencies(2.7, 4.0, 14.0)
#: Link types a dimension may name (`link`), and their default latencies.
LINKS: dict[str, Latencies] = {"nvlink": NVLINK, "pcie": PCIE, "network": NETWORK}


def link_latencies(link: str) -> Latencies:
    """The default latencies of a link type; InputError names the known ones."""
    try:
        return LINKS[link]
    except KeyError:
        raise InputError(None, "link", f"expected one of {', '.join(LINKS)}, got {link!r}") from None


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as NCCL's tuning sees it: compute capability, generation, NVLink bandwidth
    per GPU (links x per-link GB/s, nccl-tuning.md 2.1) and in-switch reduction efficiency."""

    name: str
    sm: int
    nvlink_links: int  # 0 for parts without NVLink (PCIe cards)
    multiprocessors: int = 0  # SMs of the part (0: unknown): how many one-block-per-SM kernels' blocks stay resident

    @property
    def generation(self) -> str:
        return generation(self.sm)

    @property
    def nvlink_per_link_GBps(self) -> float:
        return nvlink_per_link(self.sm)

    @property
    def nvlink_GBps(self) -> float:
        return round(self.nvlink_links * self.nvlink_per_link_GBps, 3)

    @property
    def nvls_efficiency(self) -> float:
        """NCCL's nvlsEfficiency (tuning.cc): 0 where the generation has no in-switch reduction."""
        return {"hopper": 0.85, "blackwell": 0.74}.get(self.generation, 0.0)


def generation(sm: int) -> str:
    """The generation NCCL's tables index by (Volta, Ampere, Hopper, Blackwell)."""
    return "volta" if sm < 80 else "ampere" if sm < 90 else "hopper" if sm < 100 else "blackwell"


def nvlink_per_link(sm: int) -> float:
    """GB/s per NVLink, one direction (ncclTopoNVLinkBw, NCCL 2.30.7)."""
    if sm >= 100:
        return 40.1
    if sm >= 90:
        return 20.6
    return {60: 18.0, 70: 20.0, 80: 20.0, 86: 12.0}.get(sm, 20.0 if sm >= 70 else 18.0)


#: GPU models by name: compute capability and NVLinks per GPU (SXM parts; PCIe parts have none).
GPU_MODELS: dict[str, GpuModel] = {m.name.lower(): m for m in (
    GpuModel("V100", 70, 6, 80), GpuModel("A100", 80, 12, 108), GpuModel("A800", 80, 8, 108), GpuModel("A10", 86, 0, 72),
    GpuModel("A40", 86, 0, 84), GpuModel("L40S", 89, 0, 142), GpuModel("H100", 90, 18, 132), GpuModel("H200", 90, 18, 132),
    GpuModel("H800", 90, 8, 132), GpuModel("H20", 90, 18, 78), GpuModel("B200", 100, 18, 148), GpuModel("GB200", 100, 18, 148),
    GpuModel("B300", 103, 18, 160), GpuModel("GB300", 103, 18, 160),
)}


def gpu_model(name: str) -> GpuModel:
    """A GPU by model name (H100, A100, ...) or compute capability (sm_90, sm90, 90)."""
    key = str(name).strip().lower()
    if key in GPU_MODELS:
        return GPU_MODELS[key]
    m = re.fullmatch(r"(?:sm_?)?(\d{2,3})", key)
    if m:
        sm = int(m.group(1))
        return GpuModel(f"sm_{sm}", sm, 18 if sm >= 90 else 12 if sm == 80 else 6 if sm == 70 else 0)
    raise InputError(None, "gpu", f"expected a GPU model ({', '.join(m.name for m in GPU_MODELS.values())}) or a "
                     f"compute capability such as sm_90, got {name!r}")


def gpu_from_description(text: str) -> GpuModel | None:
    """The GPU model named in a device description such as 'NVIDIA H100 80GB HBM3'."""
    words = re.findall(r"[A-Za-z]+\d+[A-Za-z]?", text)
    for word in words:
        key = word.lower()
        for name in sorted(GPU_MODELS, key=len, reverse=True):
            if key == name or (key.startswith(name) and not key[len(name):].isdigit()):
                return GPU_MODELS[name]
    return None
