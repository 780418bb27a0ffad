"""NCCL's own performance model, pinned to NCCL 2.30.7 (nccl-tuning.md): the graphs its search
finds on a machine, the latency and bandwidth of every algorithm and protocol, and the pick:
the argmin of lat + bytes / bw. We time what NCCL picks with our simulator (timing.py); this
module only says what NCCL would run.

>>> from hipipe_compiler.topology import Dimension, Topology
>>> h100 = Topology((Dimension(8, "switch", 370.8, link="nvlink", nvls={"efficiency": 0.85}),), gpu="H100")
>>> model = Model.of(System.of(h100), "allreduce")
>>> round(model.latency_us["ring"]["LL"], 1), round(model.busbw_GBps("nvls", "Simple"), 1)
(15.0, 476.0)
>>> model.pick(1 << 20), model.pick(4 << 20)
(('ring', 'LL'), ('nvls', 'Simple'))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..hardware import PROTOCOLS, gpu_model
from ..topology import Topology

#: NCCL's algorithms this model knows, in NCCL's order (ties go to the first).
ALGORITHMS: tuple[str, ...] = ("tree", "ring", "nvls", "nvlstree")
#: Which algorithms run which collective (tuning.cc:294-298).
RUNS = {"allreduce": ALGORITHMS, "reducescatter": ("ring", "nvls"), "allgather": ("ring", "nvls")}

BASE_LATENCY = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "nvlstree": (0.0, 0.0, 0.0)}
HW_LATENCY = {  # per hop, by hardware class (NVLINK, PCI, NET), algorithm, protocol (LL, LL128, Simple)
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0, 0, 25), "nvlstree": (0, 0, 25)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "nvls": (0, 0, 0), "nvlstree": (0, 0, 0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "nvls": (0, 0, 18), "nvlstree": (0, 0, 20.9)},
}
GENERATIONS = ("volta", "ampere", "hopper", "blackwell")
#: Caps indexed by generation, then node-count bucket (1, 2, 4+ nodes), in GB/s.
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
#: Trees stray from the model at medium sizes: a factor on the bandwidth by log2(bytes / 64).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
#: Per-channel speeds the graph search tries, GB/s (search.cc:1051-1067).
SPEEDS_INTRA = {80: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
                90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                100: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
SPEEDS_INTER = {80: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                     0.24, 0.12),
                90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
                100: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                      2.4, 1.2, 0.24, 0.12)}
#: Most channels a ring graph has (MAXCHANNELS / 2).
MAX_GRAPH_CHANNELS = 32


@dataclass(frozen=True)
class System:
    """A machine as NCCL's tuning sees it: nodes of `ppn` GPUs of compute capability `sm`, the
    NVLink (or PCIe) bandwidth of each GPU inside its node, and the network bandwidth of each
    GPU's NIC (one NIC per GPU: a NIC shared by k GPUs is k NICs of 1/k its speed)."""

    sm: int
    cpu: str
    ppn: int
    nodes: int
    intra_GBps: float
    nic_GBps: float
    intra_link: str  # "nvlink" or "pci": the hardware class of hops inside a node
    nvls: bool  # an NVSwitch that reduces in the switch, and a GPU that can use it
    nvswitch: bool

    @property
    def nranks(self) -> int:
        return self.ppn * self.nodes

    @property
    def generation(self) -> int:
        return 0 if self.sm < 80 else 1 if self.sm < 90 else 2 if self.sm < 100 else 3

    @property
    def bucket(self) -> int:
        """The node-count bucket NCCL's caps are indexed by: 1, 2, or more nodes."""
        return self.nodes - 1 if self.nodes <= 2 else 2

    @classmethod
    def of(cls, topology: Topology) -> "System":
        """The machine a topology describes, as NCCL sees it: a node is its dimensions before
        the first one whose link is the network (all but the outermost where none says), and
        each GPU's NIC carries the first dimension outside the node; bandwidths are the
        ratings (NCCL's search reads them off the hardware), not a calibration's effective ones."""
        dims = topology.dimensions
        inside = next((d for d, dim in enumerate(dims) if dim.link == "network"), None)
        if inside is None:
            inside = len(dims) if len(dims) == 1 else len(dims) - 1
        inside = max(inside, 1)
        ppn = math.prod(dim.size for dim in dims[:inside])
        nodes = topology.nranks // ppn
        gpu = gpu_model(topology.gpu or "H100")
        intra = sum(dim.rating for dim in dims[:inside])
        nic = dims[inside].rating if inside < len(dims) else 0.0
        pcie = any(dim.link == "pcie" for dim in dims[:inside])
        nvswitch = not pcie and any(dim.kind == "switch" for dim in dims[:inside])
        nvls = inside == 1 and dims[0].nvls is not None and gpu.sm >= 90 and ppn >= 2
        return cls(gpu.sm, topology.cpu or "intel", ppn, nodes, intra, nic, "pci" if pcie else "nvlink", nvls, nvswitch)


@dataclass(frozen=True)
class Graph:
    """What NCCL's search found for one algorithm: channels and per-channel GB/s."""

    channels: int
    bw_intra: float
    bw_inter: float
    pattern: str  # "ring", "balanced_tree", "tree", "nvls"


def _speeds(sm: int, inter: bool) -> tuple[float, ...]:
    table = SPEEDS_INTER if inter else SPEEDS_INTRA
    return table[100 if sm >= 100 else 90 if sm >= 90 else 80]


def _first(speeds: Sequence[float], limit: float, channels: int = 1, total: float = math.inf) -> float:
    """The first speed of the list at most `limit` whose `channels` fit `total`."""
    for s in speeds:
        if s <= limit and s * channels <= total:
            return s
    return speeds[-1]


def graphs(system: System) -> dict[str, Graph]:
    """NCCL's graphs on this machine, as its search finds them (search.cc; checked against
    NCCL's own search on 8 x H100 and 2 x 8 H100 with a 400G NIC per GPU, nccl-spec): one node
    fills its NVLink with the fastest speed that fits, then doubles the channels where they
    are fast; across nodes each NIC carries one channel of the fastest speed it and its
    PCIe link (48 GB/s on Hopper, 24 before) allow."""
    s = system
    pcie = 48.0 if s.sm >= 90 else 24.0
    out: dict[str, Graph] = {}
    if s.nodes == 1:
        speed = _first(_speeds(s.sm, False), s.intra_GBps)
        ch = max(1, min(MAX_GRAPH_CHANNELS, int(s.intra_GBps // speed)))
        ring = Graph(ch, speed, speed, "ring")
    else:
        limit = min(s.nic_GBps, pcie)
        speed = _first(_speeds(s.sm, True), limit)
        per_nic = max(1, int(s.nic_GBps // speed)) if speed > 0 else 1
        ch = max(1, min(MAX_GRAPH_CHANNELS, s.ppn * per_nic))
        while ch > 1 and (ch - 1) * speed >= s.intra_GBps:
            ch -= 1  # the search stops once the channels fill the GPU's own bandwidth
        ring = Graph(ch, speed, speed, "ring")
    if not (ring.bw_intra < 25.0 or (s.sm > 80 and ring.bw_intra < 50.0 and ring.channels > 4)):
        doubled = min(2 * ring.channels, MAX_GRAPH_CHANNELS)  # ncclTopoDupChannels
        factor = math.ceil(doubled / ring.channels)
        ring = Graph(doubled, ring.bw_intra / factor, ring.bw_inter / factor, "ring")
    out["ring"] = ring
    if s.nodes == 1:
        out["tree"] = Graph(ring.channels, ring.bw_intra, ring.bw_inter, "balanced_tree")
    elif s.sm >= 90:
        out["tree"] = Graph(ring.channels, ring.bw_intra, ring.bw_inter, "tree")
    else:  # pass 2 raises a balanced tree's intra bandwidth up to twice its inter bandwidth
        intra = min(2 * ring.bw_inter, s.intra_GBps / ring.channels)
        out["tree"] = Graph(ring.channels, intra, ring.bw_inter, "balanced_tree")
    if s.nvls:
        heads = s.ppn  # a head per GPU on one node, per NIC (one per GPU here) across nodes
        intra = _first(_speeds(s.sm, False), s.intra_GBps / (heads + 1))
        inter = min(60.0, _first(_speeds(s.sm, True), min(s.nic_GBps, pcie))) if s.nodes > 1 else 60.0
        out["nvls"] = out["nvlstree"] = Graph(heads, intra, inter, "nvls")
    return out


def runtime_channels(system: System, found: dict[str, Graph]) -> int:
    """The channels NCCL's ring and tree run on (comm->nChannels): twice the fewer of the two
    graphs', twice again on Hopper and later across nodes where a ring channel is fast and
    there are fewer than 16 (connect.cc)."""
    ch = 2 * min(found["ring"].channels, found["tree"].channels)
    if system.sm >= 90 and system.nodes > 1 and found["ring"].bw_intra > 45 and ch < 16:
        ch *= 2
    return min(ch, 64)


def nvls_channels(system: System) -> int:
    """The channels NCCL's NVLS kernels run on (nvls.cc): 16 on Hopper, 24 or 32 on Blackwell."""
    return 16 if system.sm < 100 else (24 if system.nodes == 1 else 32)


@dataclass(frozen=True)
class Model:
    """NCCL's latency (µs) and algorithm bandwidth (GB/s) for each algorithm and protocol of
    one collective on one machine; a bandwidth of 0 means NCCL would not run it."""

    system: System
    collective: str
    latency_us: dict[str, dict[str, float]]
    algbw_GBps: dict[str, dict[str, float]]
    graphs: dict[str, Graph] = field(compare=False)

    @classmethod
    def of(cls, system: System, collective: str, algorithms: Sequence[str] | None = None,
           protocols: Sequence[str] | None = None) -> "Model":
        """The tables of ncclTopoTuneModel (tuning.cc:243-618), with NCCL_ALGO / NCCL_PROTO
        restricted to `algorithms` / `protocols` where given."""
        s = system
        found = graphs(s)
        n, nodes, g, b = s.nranks, s.nodes, s.generation, s.bucket
        llmax = LL_MAX_BW[g if nodes == 1 else (1 if s.cpu == "amd" else 0)][b]
        nsteps = 2 * (n - 1) if collective == "allreduce" else n - 1
        lat: dict[str, dict[str, float]] = {}
        bws: dict[str, dict[str, float]] = {}
        for a in ALGORITHMS:
            lat[a], bws[a] = {}, {}
            for pi, p in enumerate(PROTOCOLS):
                bws[a][p] = 0.0
                lat[a][p] = 0.0
                graph = found.get(a)
                if graph is None or a not in RUNS[collective] or not _enabled(s, a, p, collective):
                    continue
                if (algorithms is not None and a not in algorithms) or (protocols is not None and p not in protocols):
                    continue
                bw = graph.bw_intra if nodes <= 2 else graph.bw_inter
                if a in ("nvls", "nvlstree"):
                    if graph.channels < 2:
                        continue
                    intra = graph.bw_intra * NVLS_EFFICIENCY[g] * (graph.channels - 1) / graph.channels
                    intra *= 2.0 if collective == "allreduce" else (s.ppn - 1) / s.ppn
                    inter = graph.bw_inter * (2 if nodes <= 2 and a == "nvlstree" else 1)
                    bw = min(intra, inter, PER_CH_MAX_NVLS_TREE[g][b] if a == "nvlstree" else math.inf)
                bus = graph.channels * bw
                if a == "ring" and p == "LL":
                    bus = min(llmax, bus * 0.5)
                if a == "ring" and p == "LL128":
                    bus = min(bus * 0.92, graph.channels * PER_CH_MAX_RING_LL128[g][b])
                if a == "tree" and collective == "allreduce":
                    bus = min(bus * 0.92, graph.channels * PER_CH_MAX_TREE[g][b])
                if a == "tree" and p == "LL":
                    bus = min(bus / 3.8, llmax)
                if a == "tree" and p == "LL128":
                    bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), graph.channels * PER_CH_MAX_TREE_LL128[g][b])
                if a == "tree" and graph.pattern == "tree":
                    bus *= 0.85
                if not (a != "ring" and collective != "allreduce"):
                    bus *= n / nsteps if a in ("ring", "nvls", "nvlstree") else 0.5
                bws[a][p] = bus
                lat[a][p] = _latency(s, a, pi, collective, nsteps)
        return cls(s, collective, lat, bws, found)

    def busbw_GBps(self, algorithm: str, protocol: str) -> float:
        """The model's bandwidth as nccl-tests reports busbw."""
        n = self.system.nranks
        factor = 2 * (n - 1) / n if self.collective == "allreduce" else (n - 1) / n
        return self.algbw_GBps[algorithm][protocol] * factor

    def time_us(self, algorithm: str, protocol: str, nbytes: int) -> float | None:
        """NCCL's predicted time of one call (ncclTopoGetAlgoTime), None where it would not run.
        `nbytes` is the nccl-tests size (the whole buffer of a reduce-scatter or all-gather)."""
        bw = self.algbw_GBps[algorithm][protocol]
        if bw <= 0:
            return None
        lat = self.latency_us[algorithm][protocol]
        log_size = (nbytes >> 6).bit_length() - 1 if nbytes >= 64 else -1
        if algorithm == "tree" and self.collective == "allreduce" and 0 <= log_size < 23:
            bw *= TREE_CORRECTION[protocol][log_size]
        if (algorithm == "nvlstree" and self.collective == "allreduce" and 0 <= log_size < 24
                and self.system.sm >= 100):
            bw *= TREE_CORRECTION[protocol][log_size]
        if (algorithm == "ring" and protocol == "Simple" and self.system.nodes > 1 and self.collective == "allreduce"
                and nbytes // (runtime_channels(self.system, self.graphs) * self.system.nranks) >= 64):
            lat *= 1.9 if self.system.sm < 80 else 1.4  # the ring's plateau
        return lat + nbytes / (1000 * bw)

    def pick(self, nbytes: int) -> tuple[str, str]:
        """NCCL's choice at this size: the fastest algorithm and protocol by its model, ties
        to the first in NCCL's order (Tree, Ring, ..., LL, LL128, Simple)."""
        best: tuple[float, str, str] | None = None
        for a in ALGORITHMS:
            for p in PROTOCOLS:
                t = self.time_us(a, p, nbytes)
                if t is not None and (best is None or t < best[0]):
                    best = (t, a, p)
        if best is None:
            raise ValueError(f"NCCL runs no algorithm for {self.collective} on this machine with these restrictions")
        return best[1], best[2]


def _enabled(s: System, algorithm: str, protocol: str, collective: str) -> bool:
    """Whether NCCL would run this algorithm and protocol at all (tuning.cc:301, 500-536)."""
    if algorithm in ("nvls", "nvlstree"):
        if protocol != "Simple" or not s.nvls:
            return False
        if algorithm == "nvlstree" and (s.nodes == 1 or collective != "allreduce"):
            return False
        if algorithm == "nvls" and s.nodes > 1:
            return False  # NVLS across nodes needs CollNet (SHARP)
    if protocol == "LL128":
        # LL128 needs NVLink (or NVSwitch) inside the node and a NIC next to the GPU; before
        # Hopper also no GPU in between (PXN): with one NIC per GPU both hold, except on PCIe
        return s.intra_link == "nvlink" and s.sm >= 70
    return True


def _latency(s: System, algorithm: str, p: int, collective: str, nsteps: int) -> float:
    """The algorithm's latency at this protocol (tuning.cc:384-435)."""
    intra_hw = "nvlink" if s.intra_link == "nvlink" else "pci"
    base = BASE_LATENCY[algorithm][p]
    intra = HW_LATENCY[intra_hw][algorithm][p]
    inter = HW_LATENCY["net"]["tree" if s.ppn == 1 else algorithm][p]
    if algorithm == "ring":
        if s.nodes > 1:
            overhead = (2.0 if s.cpu == "amd" else 1.0) * (3 if PROTOCOLS[p] == "Simple" else 1)
            intra = max(intra, overhead)
        inter_steps = 0 if s.nodes == 1 else 2 * (s.nodes - 1) if collective == "allreduce" else s.nodes - 1
        return base + (nsteps - inter_steps) * intra + inter_steps * inter
    if algorithm == "tree":
        return base + 2 * ((s.ppn - 1) * intra + _log2i(s.nodes) * inter) if collective == "allreduce" else base
    if algorithm == "nvls":
        return intra + (inter if s.nodes > 1 else 0.0)
    return base + intra + 2 * _log2i(s.nodes) * inter  # nvlstree


def _log2i(n: int) -> int:
    return n.bit_length() - 1
