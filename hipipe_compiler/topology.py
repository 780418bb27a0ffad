"""Hierarchical topologies: dimensions, rank coordinates, peers and the link rule.

This module is the only place that knows how ranks map to coordinates and which pairs of
ranks are linked (cost-model.md sections 1-2).

>>> topo = Topology((Dimension(8, "switch", 370.8, link="nvlink"), Dimension(4, "switch", 50, link="network")))
>>> topo.nranks, topo.coords(13), topo.rank((5, 1))
(32, (5, 1), 13)
>>> topo.link_dimension(0, 9), topo.has_link(0, 9)
(1, True)
>>> topo.link_latency(0, 9, "LL"), topo.link_latency(0, 9, "Simple")  # NCCL's estimates for IB
(2.7, 14.0)
>>> topo.call_cost("LL")  # no call_latency: calls cost nothing beyond their messages
0.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Hashable, Literal, Mapping

from .documents import validate_document
from .errors import InputError
from .hardware import MAX_LATENCY, PROTOCOLS, Latencies, gpu_model, latency_value, link_latencies, per_protocol

Kind = Literal["ring", "switch"]
#: CPU vendors NCCL's tuning distinguishes (its LL bandwidth caps and network overhead).
CPUS: tuple[str, ...] = ("intel", "amd", "arm", "power")
KINDS: tuple[str, ...] = ("ring", "switch")

#: A resource a message uses while it moves bytes, and that resource's capacity in GB/s.
Resource = tuple[Hashable, float]
#: A dimension's in-switch reduction (cost-model.md section 5) is only for switches of GPUs.
NVLS_KINDS: tuple[str, ...] = ("switch",)


@dataclass(frozen=True)
class Nvls:
    """In-switch reduction on a switch dimension (NVLink SHARP, cost-model.md section 5):
    switch reduces and multicast stores move at `efficiency` times the dimension's bandwidth,
    and a call that uses them pays `call_latency` µs once, on top of the topology's per-call
    cost (the multicast objects' synchronisation; a topology field because only a
    measurement can say what it is)."""

    efficiency: float
    call_latency: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.efficiency, (int, float)) and not isinstance(self.efficiency, bool)
                and 0 < self.efficiency <= 1):
            raise InputError(None, "nvls.efficiency", f"expected a number in (0, 1], got {self.efficiency!r}")
        if not latency_value(self.call_latency):
            raise InputError(None, "nvls.call_latency", f"expected a number from 0 to {MAX_LATENCY:g} (microseconds), "
                             f"got {self.call_latency!r}")

    @classmethod
    def of(cls, value: Any) -> "Nvls":
        if isinstance(value, Nvls):
            return value
        if not isinstance(value, Mapping) or "efficiency" not in value or set(value) - {"efficiency", "call_latency"}:
            raise InputError(None, "nvls", f"expected {{efficiency, call_latency}}, got {value!r}")
        return cls(value["efficiency"], value.get("call_latency", 0.0))

    def document(self) -> dict[str, float]:
        return {"efficiency": self.efficiency, "call_latency": self.call_latency}


@dataclass(frozen=True)
class Dimension:
    """One level of the network: `size` ranks, connected as a `switch` or a `ring`.

    `link` names the link type (nvlink, pcie, network): where `latency` is left out, the
    type's default latencies apply (cost-model.md section 1). `nvls` declares in-switch
    reduction on a switch (cost-model.md section 5). `rated_bandwidth` is what the hardware is
    rated at where a calibration found `bandwidth` to differ: NCCL decides from the rating.
    """

    size: int
    kind: str
    bandwidth: float  # GB/s a rank can send (and receive) in this dimension, in total
    latency: float | Latencies | None = None  # µs per message: one number for every protocol, or one each
    name: str = ""
    link: str | None = None
    nvls: Nvls | None = None
    rated_bandwidth: float | None = None  # GB/s the hardware is rated at, what NCCL's search sees

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 2:
            raise InputError(None, "size", f"expected an integer >= 2, got {self.size!r}")
        if self.kind not in KINDS:
            raise InputError(None, "kind", f"expected one of ring, switch, got {self.kind!r}")
        if not _bandwidth(self.bandwidth):
            raise InputError(None, "bandwidth", f"expected a number from {MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g} (GB/s), "
                             f"got {self.bandwidth!r}")
        if self.rated_bandwidth is not None and not _bandwidth(self.rated_bandwidth):
            raise InputError(None, "rated_bandwidth", f"expected a number from {MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g} "
                             f"(GB/s), got {self.rated_bandwidth!r}")
        if self.link is not None:
            link_latencies(self.link)
        if self.latency is None:
            if self.link is None:
                raise InputError(None, "latency", "expected a latency (µs per message), or a link type (nvlink, pcie, "
                                 "network) whose default latencies apply")
            object.__setattr__(self, "latency", link_latencies(self.link))
        else:
            object.__setattr__(self, "latency", Latencies.coerce(self.latency, "latency"))
        if self.nvls is not None:
            object.__setattr__(self, "nvls", Nvls.of(self.nvls))
            if self.kind not in NVLS_KINDS:
                raise InputError(None, "nvls", "in-switch reduction needs a switch dimension; a ring has no switch")

    def alpha(self, protocol: str) -> float:
        """alpha (µs) of a message in this dimension under `protocol`."""
        return per_protocol(self.latency, protocol)  # type: ignore[arg-type]

    @property
    def min_alpha(self) -> float:
        """The smallest alpha over the protocols: what the latency bound charges (cost-model.md 4)."""
        return min(self.alpha(p) for p in PROTOCOLS)

    @property
    def per_protocol(self) -> bool:
        return isinstance(self.latency, Latencies)

    def latency_document(self) -> float | dict[str, float]:
        """The latency as a topology file writes it."""
        return self.latency.document() if isinstance(self.latency, Latencies) else self.latency  # type: ignore[return-value]

    def document(self) -> dict[str, Any]:
        """The dimension in the file format of schemas/topology.schema.json."""
        return {**({"name": self.name} if self.name else {}), "size": self.size, "kind": self.kind,
                "bandwidth": self.bandwidth,
                **({"rated_bandwidth": self.rated_bandwidth} if self.rated_bandwidth is not None else {}),
                **({"link": self.link} if self.link else {}),
                "latency": self.latency_document(), **({"nvls": self.nvls.document()} if self.nvls else {})}

    @property
    def rating(self) -> float:
        """The bandwidth the hardware is rated at (NCCL's view), the effective one where none is given."""
        return self.bandwidth if self.rated_bandwidth is None else self.rated_bandwidth

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
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e-3, 1e6


def _bandwidth(x: Any) -> bool:
    """A bandwidth: a number in [MIN_BANDWIDTH, MAX_BANDWIDTH] GB/s."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and MIN_BANDWIDTH <= x <= MAX_BANDWIDTH


@dataclass(frozen=True)
class Topology:
    """A list of dimensions, innermost first; rank = sum_d c_d * prod_{j<d} n_j."""

    dimensions: tuple[Dimension, ...]
    name: str = ""
    reduce_bandwidth: float | None = None  # GB/s of local reduce/copy work; None means free
    call_latency: float | Latencies | None = None  # µs every call pays once (cost-model.md 1); None: 0
    gpu: str | None = None  # a GPU model (hardware.GPU_MODELS) or compute capability, for NCCL's model
    cpu: str | None = None  # the hosts' CPU vendor, one of CPUS: NCCL's tuning tables depend on it
    nccl_channel_scale: float | None = None  # NCCL's channels move this times what its tables say (calibrated)
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
        if self.call_latency is not None:
            object.__setattr__(self, "call_latency", Latencies.coerce(self.call_latency, "call_latency"))
        if self.gpu is not None:
            gpu_model(self.gpu)
        if self.nccl_channel_scale is not None and not (
                isinstance(self.nccl_channel_scale, (int, float)) and not isinstance(self.nccl_channel_scale, bool)
                and 0.01 <= self.nccl_channel_scale <= 100):
            raise InputError(None, "nccl_channel_scale", f"expected a number from 0.01 to 100, got {self.nccl_channel_scale!r}")
        if self.cpu is not None and self.cpu not in CPUS:
            raise InputError(None, "cpu", f"expected one of {', '.join(CPUS)}, got {self.cpu!r}")

    # -- costs that are not per link ------------------------------------------------------

    def call_cost(self, protocol: str) -> float:
        """c_p: µs every call of a program running `protocol` pays once (cost-model.md 1, 3)."""
        return 0.0 if self.call_latency is None else per_protocol(self.call_latency, protocol)

    @property
    def nvls_dimensions(self) -> tuple[int, ...]:
        """The dimensions that can reduce in the switch (cost-model.md section 5)."""
        return tuple(d for d, dim in enumerate(self.dimensions) if dim.nvls is not None)

    def with_outer_size(self, size: int, name: str | None = None) -> "Topology":
        """The same machine with `size` ranks along the outermost dimension (more or fewer
        nodes), or one dimension fewer where size is 1."""
        dims = self.dimensions[:-1] if size == 1 else (*self.dimensions[:-1], replace(self.dimensions[-1], size=size))
        if not dims:
            raise InputError(None, "--nodes", "a topology needs at least one dimension of two ranks")
        return replace(self, dimensions=tuple(dims), name=self.name if name is None else name)

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

    def offset(self, a: int, b: int) -> tuple[int, ...]:
        """Where b lies seen from a: b's coordinates minus a's, modulo each dimension's size."""
        return tuple((cb - ca) % d.size for ca, cb, d in zip(self.coords(a), self.coords(b), self.dimensions))

    def mirror(self, rank: int) -> int:
        """The rank at rank's negated coordinates: where every rank runs rank 0's schedule
        shifted, it does towards rank 0 what rank 0 does towards `rank`."""
        return self.rank(tuple(-c % d.size for c, d in zip(self.coords(rank), self.dimensions)))

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
        doc = self.to_document()
        dims = [{"name": self.dim_name(d), **dim.document()} for d, dim in enumerate(self.dimensions)]
        return {"name": self.name or None, "ranks": self.nranks, **{k: v for k, v in doc.items() if k != "name"},
                "dimensions": dims}

    def to_document(self) -> dict[str, Any]:
        """The topology in the file format of schemas/topology.schema.json."""
        doc: dict[str, Any] = {}
        if self.name:
            doc["name"] = self.name
        if self.gpu is not None:
            doc["gpu"] = self.gpu
        if self.cpu is not None:
            doc["cpu"] = self.cpu
        if self.nccl_channel_scale is not None:
            doc["nccl_channel_scale"] = self.nccl_channel_scale
        if self.call_latency is not None:
            doc["call_latency"] = (self.call_latency.document() if isinstance(self.call_latency, Latencies)
                                   else self.call_latency)
        if self.reduce_bandwidth is not None:
            doc["reduce_bandwidth"] = self.reduce_bandwidth
        doc["dimensions"] = [dim.document() for dim in self.dimensions]
        return doc


# -- construction -------------------------------------------------------------------------


def topology_from_document(doc: Any, source: str | None = None) -> Topology:
    """Build a Topology from a parsed file, checked against schemas/topology.schema.json."""
    validate_document(doc, "topology.schema.json", source)
    dims = []
    for i, d in enumerate(doc["dimensions"]):
        try:
            dims.append(Dimension(size=d["size"], kind=d["kind"], bandwidth=d["bandwidth"], latency=d.get("latency"),
                                  name=d.get("name", ""), link=d.get("link"), nvls=d.get("nvls"),
                                  rated_bandwidth=d.get("rated_bandwidth")))
        except InputError as exc:
            raise InputError(source, f"dimensions[{i}].{exc.field}", exc.message) from None
    names = [d.name for d in dims if d.name]
    if len(names) != len(set(names)):
        raise InputError(source, "dimensions", "expected distinct dimension names")
    try:
        return Topology(tuple(dims), name=doc.get("name", ""), reduce_bandwidth=doc.get("reduce_bandwidth"),
                        call_latency=doc.get("call_latency"), gpu=doc.get("gpu"), cpu=doc.get("cpu"),
                        nccl_channel_scale=doc.get("nccl_channel_scale"))
    except InputError as exc:
        raise InputError(source, exc.field, exc.message) from None
