"""Hierarchical topologies: dimensions, rank coordinates, peers and the link rule.

This module is the only place that knows how ranks map to coordinates and which pairs of
ranks are linked (cost-model.md sections 1-2).

>>> topo = preset("dgx-h100-8x4")
>>> topo.nranks, topo.coords(13), topo.rank((5, 1))
(32, (5, 1), 13)
>>> topo.link_dimension(0, 9), topo.has_link(0, 9)
(1, True)
>>> topo.link_latency(0, 9, "LL"), topo.link_latency(0, 9, "Simple")  # NCCL's estimates for IB
(2.7, 14.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Hashable, Literal, Mapping

from .documents import load_document, validate_document
from .errors import InputError

Kind = Literal["ring", "switch"]
KINDS: tuple[str, ...] = ("ring", "switch")

#: A resource a message uses while it moves bytes, and that resource's capacity in GB/s.
Resource = tuple[Hashable, float]
#: The runtime's protocols, in the order latencies are written.
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class Latencies:
    """alpha per protocol, in microseconds: how long a message takes to become visible to its
    receiver (cost-model.md section 1).

    >>> Latencies.of({"LL": 0.6, "LL128": 1.9, "Simple": 3.4}).alpha("LL128")
    1.9
    """

    LL: float
    LL128: float
    Simple: float

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> "Latencies":
        """From a mapping with exactly the keys LL, LL128 and Simple; InputError names the key."""
        keys = set(values)
        if keys != set(PROTOCOLS):
            missing, extra = sorted(set(PROTOCOLS) - keys), sorted(keys - set(PROTOCOLS), key=str)
            what = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(map(repr, extra))}"
            raise InputError(None, "latency", f"expected exactly LL, LL128 and Simple; {what}")
        for key in PROTOCOLS:
            if not _latency(values[key]):
                raise InputError(None, f"latency.{key}", f"expected a number from 0 to {MAX_LATENCY:g} (microseconds), got {values[key]!r}")
        return cls(**{key: values[key] for key in PROTOCOLS})

    def alpha(self, protocol: str) -> float:
        return getattr(self, protocol)


#: NCCL's own per-hop latency estimates (src/graph/tuning.cc, hwLat, NCCL 2.18), in µs: the
#: defaults of cost-model.md section 1 for links named by their type.
NVLINK = Latencies(0.6, 1.9, 3.4)
PCIE = Latencies(1.0, 2.5, 5.7)
NETWORK = Latencies(2.7, 4.0, 14.0)


@dataclass(frozen=True)
class Dimension:
    """One level of the network: `size` ranks, connected as a `switch` or a `ring`."""

    size: int
    kind: str
    bandwidth: float  # GB/s a rank can send (and receive) in this dimension, in total
    latency: float | Latencies  # microseconds per message: one number for every protocol, or one each
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 2:
            raise InputError(None, "size", f"expected an integer >= 2, got {self.size!r}")
        if self.kind not in KINDS:
            raise InputError(None, "kind", f"expected one of ring, switch, got {self.kind!r}")
        if not _bandwidth(self.bandwidth):
            raise InputError(None, "bandwidth", f"expected a number from {MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g} (GB/s), "
                             f"got {self.bandwidth!r}")
        if isinstance(self.latency, Mapping):
            object.__setattr__(self, "latency", Latencies.of(self.latency))
        elif not isinstance(self.latency, Latencies) and not _latency(self.latency):
            raise InputError(None, "latency", f"expected a number from 0 to {MAX_LATENCY:g} (microseconds), or one per protocol "
                             f"(LL, LL128, Simple), got {self.latency!r}")

    def alpha(self, protocol: str) -> float:
        """alpha (µs) of a message in this dimension under `protocol`."""
        return self.latency.alpha(protocol) if isinstance(self.latency, Latencies) else self.latency

    @property
    def min_alpha(self) -> float:
        """The smallest alpha over the protocols: what the latency bound charges (cost-model.md 4)."""
        return min(self.alpha(p) for p in PROTOCOLS)

    @property
    def per_protocol(self) -> bool:
        return isinstance(self.latency, Latencies)

    def latency_document(self) -> float | dict[str, float]:
        """The latency as a topology file writes it."""
        return {p: self.alpha(p) for p in PROTOCOLS} if self.per_protocol else self.latency

    @property
    def uses_both_directions(self) -> bool:
        """A ring of three or more ranks has two directed links per rank (one each way)."""
        return self.kind == "ring" and self.size >= 3

    @property
    def diameter(self) -> int:
        """Hops between the farthest two ranks along this dimension."""
        return self.size // 2 if self.kind == "ring" else 1


#: The physical range of a link, in GB/s (1 MB/s to 1 PB/s) and microseconds (up to a second):
#: numbers far outside it are typing mistakes, and would leave the LPs no numerical room.
MIN_BANDWIDTH, MAX_BANDWIDTH, MAX_LATENCY = 1e-3, 1e6, 1e6


def _bandwidth(x: Any) -> bool:
    """A bandwidth: a number in [MIN_BANDWIDTH, MAX_BANDWIDTH] GB/s."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and MIN_BANDWIDTH <= x <= MAX_BANDWIDTH


def _latency(x: Any) -> bool:
    """A latency: a number in [0, MAX_LATENCY] microseconds."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= MAX_LATENCY


@dataclass(frozen=True)
class Topology:
    """A list of dimensions, innermost first; rank = sum_d c_d * prod_{j<d} n_j."""

    dimensions: tuple[Dimension, ...]
    name: str = ""
    reduce_bandwidth: float | None = None  # GB/s of local reduce/copy work; None means free
    _strides: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.dimensions:
            raise InputError(None, "dimensions", "expected at least one dimension")
        object.__setattr__(self, "dimensions", tuple(self.dimensions))
        strides, n = [], 1
        for dim in self.dimensions:
            strides.append(n)
            n *= dim.size
        object.__setattr__(self, "_strides", tuple(strides))
        if self.reduce_bandwidth is not None and not _bandwidth(self.reduce_bandwidth):
            raise InputError(None, "reduce_bandwidth", f"expected a number from {MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g} (GB/s), "
                             f"got {self.reduce_bandwidth!r}")

    # -- shape ---------------------------------------------------------------------------

    @property
    def ndims(self) -> int:
        return len(self.dimensions)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dimensions)

    @cached_property
    def nranks(self) -> int:
        return math.prod(self.shape)

    @property
    def label(self) -> str:
        """The name, or the shape such as 8x4 when the topology has none."""
        return self.name or "x".join(map(str, self.shape))

    def dim_name(self, d: int) -> str:
        return self.dimensions[d].name or f"dim{d}"

    # -- coordinates ---------------------------------------------------------------------

    def coords(self, rank: int) -> tuple[int, ...]:
        """Coordinates of a rank, innermost dimension first."""
        return tuple((rank // s) % d.size for s, d in zip(self._strides, self.dimensions))

    def coord(self, rank: int, d: int) -> int:
        return (rank // self._strides[d]) % self.dimensions[d].size

    def rank(self, coords: tuple[int, ...] | list[int]) -> int:
        """The rank at the given coordinates."""
        return sum(c * s for c, s in zip(coords, self._strides))

    def shift(self, rank: int, d: int, delta: int) -> int:
        """The rank whose coordinate in dimension d is c_d + delta (mod n_d), others equal."""
        n, s = self.dimensions[d].size, self._strides[d]
        c = (rank // s) % n
        return rank + (((c + delta) % n) - c) * s

    def group(self, rank: int, d: int) -> tuple[int, ...]:
        """The ranks that differ from `rank` in dimension d only, ordered by that coordinate."""
        base = rank - self.coord(rank, d) * self._strides[d]
        return tuple(base + c * self._strides[d] for c in range(self.dimensions[d].size))

    def peers(self, rank: int, d: int) -> tuple[int, ...]:
        """Ranks reachable from `rank` by one message in dimension d alone."""
        dim = self.dimensions[d]
        if dim.kind == "ring":
            return tuple(sorted({self.shift(rank, d, 1), self.shift(rank, d, -1)}))
        return tuple(r for r in self.group(rank, d) if r != rank)

    # -- links (cost-model.md section 2) -------------------------------------------------

    def link_dimension(self, a: int, b: int) -> int | None:
        """The highest dimension in which ranks a and b differ (None when a == b)."""
        for d in range(self.ndims - 1, -1, -1):
            if self.coord(a, d) != self.coord(b, d):
                return d
        return None

    def has_link(self, a: int, b: int) -> bool:
        """Whether a message from a to b is legal."""
        return self.link_resources(a, b) is not None

    def link_resources(self, a: int, b: int) -> tuple[Resource, ...] | None:
        """The resources a message from a to b uses, with capacities in GB/s; None if illegal.

        switch: a's egress and b's ingress port of the dimension, each of capacity B.
        ring: the directed link a->b, of capacity B/2 (n >= 3) or B (n == 2); only between
        neighbours that differ in that dimension alone.
        """
        if not (0 <= a < self.nranks and 0 <= b < self.nranks):
            return None
        d = self.link_dimension(a, b)
        if d is None:
            return None
        dim = self.dimensions[d]
        if dim.kind == "switch":
            return ((("out", a, d), dim.bandwidth), (("in", b, d), dim.bandwidth))
        for j in range(d):
            if self.coord(a, j) != self.coord(b, j):
                return None
        ca, cb, n = self.coord(a, d), self.coord(b, d), dim.size
        if (cb - ca) % n not in (1, n - 1):
            return None
        capacity = dim.bandwidth / 2 if n >= 3 else dim.bandwidth
        return ((("link", a, b), capacity),)

    def link_latency(self, a: int, b: int, protocol: str = "Simple") -> float:
        """alpha (microseconds) of a message from a to b under `protocol`."""
        d = self.link_dimension(a, b)
        if d is None:
            raise ValueError("a message needs two different ranks")
        return self.dimensions[d].alpha(protocol)

    # -- whole-network facts -------------------------------------------------------------

    def ring_order(self) -> tuple[int, ...]:
        """A cycle through every rank whose consecutive pairs (and last->first) are linked.

        Built dimension by dimension from a cycle of the lower dimensions, so it exists for
        every topology: snake through layers (even ring size), through columns (odd ring
        size, even number of lower ranks) or a comb (both odd); any order over a switch.
        """
        cycle: list[tuple[int, ...]] = [(c,) for c in range(self.dimensions[0].size)]
        for d in range(1, self.ndims):
            n = self.dimensions[d].size
            m = len(cycle)
            if self.dimensions[d].kind == "switch":
                new = [v + (j,) for j in range(n) for v in cycle]
            elif n % 2 == 0:
                new = [v + (j,) for j in range(n) for v in (cycle if j % 2 == 0 else cycle[::-1])]
            elif m % 2 == 0:
                new = [cycle[i] + (j,) for i in range(m) for j in (range(n) if i % 2 == 0 else range(n - 1, -1, -1))]
            else:
                new = [v + (0,) for v in cycle]
                for step, i in enumerate(range(m - 1, 0, -1)):
                    layers = range(1, n) if step % 2 == 0 else range(n - 1, 0, -1)
                    new.extend(cycle[i] + (j,) for j in layers)
                new.extend(cycle[0] + (j,) for j in range(1, n))
            cycle = new
        return tuple(self.rank(c) for c in cycle)

    def describe(self) -> dict[str, Any]:
        """A plain dictionary of the topology (the file format, plus derived facts)."""
        return {
            "name": self.name or None,
            "ranks": self.nranks,
            "dimensions": [
                {"name": self.dim_name(d), "size": dim.size, "kind": dim.kind,
                 "bandwidth": dim.bandwidth, "latency": dim.latency_document()}
                for d, dim in enumerate(self.dimensions)
            ],
            **({"reduce_bandwidth": self.reduce_bandwidth} if self.reduce_bandwidth else {}),
        }

    def to_document(self) -> dict[str, Any]:
        """The topology in the file format of schemas/topology.schema.json."""
        doc: dict[str, Any] = {}
        if self.name:
            doc["name"] = self.name
        if self.reduce_bandwidth is not None:
            doc["reduce_bandwidth"] = self.reduce_bandwidth
        doc["dimensions"] = [
            {**({"name": dim.name} if dim.name else {}), "size": dim.size, "kind": dim.kind,
             "bandwidth": dim.bandwidth, "latency": dim.latency_document()}
            for dim in self.dimensions
        ]
        return doc


# -- construction -------------------------------------------------------------------------


def topology_from_document(doc: Any, source: str | None = None) -> Topology:
    """Build a Topology from a parsed file, checked against schemas/topology.schema.json."""
    validate_document(doc, "topology.schema.json", source)
    dims = []
    for i, d in enumerate(doc["dimensions"]):
        try:
            dims.append(Dimension(size=d["size"], kind=d["kind"], bandwidth=d["bandwidth"],
                                  latency=d["latency"], name=d.get("name", "")))
        except InputError as exc:
            raise InputError(source, f"dimensions[{i}].{exc.field}", exc.message) from None
    names = [d.name for d in dims if d.name]
    if len(names) != len(set(names)):
        raise InputError(source, "dimensions", "expected distinct dimension names")
    try:
        return Topology(tuple(dims), name=doc.get("name", ""), reduce_bandwidth=doc.get("reduce_bandwidth"))
    except InputError as exc:
        raise InputError(source, exc.field, exc.message) from None


def load_topology(spec: str | Path) -> Topology:
    """A topology from a YAML/JSON file, or a preset name (see `PRESETS`).

    >>> load_topology("torus-4x4").shape
    (4, 4)
    """
    path = Path(spec)
    if path.is_file() or path.suffix.lower() in (".yaml", ".yml", ".json") or "/" in str(spec):
        topo = topology_from_document(load_document(path), str(path))
        if not topo.name:
            topo = Topology(topo.dimensions, name=path.stem, reduce_bandwidth=topo.reduce_bandwidth)
        return topo
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
