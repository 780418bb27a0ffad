"""The baselines of algorithms.md section 5 as plans: the flat ring, the hierarchical
all-reduce with uniform chunks, and Themis-like greedy dimension orders; and the defaults
every plan builder shares (algorithms per dimension, layouts, orders, chunk pairs).

>>> from hipipe_compiler.presets import preset
>>> plan = hierarchical_plan(preset("dgx-h100-8x4"), "allreduce", chunks=2, nominal_bytes=1 << 28)
>>> [c.order for c in plan.chunks], plan.algorithms
([(0, 1), (0, 1)], ('direct', 'direct'))
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from ..errors import InputError, PlanError
from ..msccl.runtime import piece_count
from ..topology import Topology
from .plan import RING_ALGORITHMS, ChunkPlan, Plan, check_plan, largest_blocks
from .trees import nccl_tree_fits


#: Switch dimensions up to this size use direct exchange by default; larger ones a ring.
DIRECT_MAX_SIZE = 16


def default_algorithms(topology: Topology, flat: bool = False) -> tuple[str, ...]:
    """Ring inside ring dimensions; direct exchange inside switch dimensions up to DIRECT_MAX_SIZE."""
    if flat:
        return ("ring",) if topology.nranks > 2 else ("direct",)
    return tuple(
        "direct" if d.size == 2 or (d.kind == "switch" and d.size <= DIRECT_MAX_SIZE) else "ring"
        for d in topology.dimensions
    )


def auto_layouts(topology: Topology, flat: bool, chunks: Sequence[ChunkPlan], algorithms: Sequence[str],
                 protocol: str, max_bytes: int) -> tuple[str, ...]:
    """Fused threadblocks per axis unless the deadlock-safe piece limit would shred its blocks.

    A fused threadblock sends before it receives, so at the window's largest size each such
    send must fit the connection FIFO (runtime.piece_count). When an axis's blocks are larger
    than that, separate send and receive threadblocks ("split") move them in full steps.
    """
    naxes = 1 if flat else topology.ndims
    size = (lambda a: topology.nranks) if flat else (lambda a: topology.dimensions[a].size)
    nch = sum(c.units for c in chunks) * topology.nranks
    largest = largest_blocks(topology, flat, chunks, algorithms)
    out = []
    for a in range(naxes):
        limit = piece_count(protocol, max_bytes, nch, ring=algorithms[a] in RING_ALGORITHMS and size(a) > 2)
        out.append("fused" if largest[a] <= limit else "split")
    return tuple(out)


def bandwidth_order(topology: Topology) -> tuple[int, ...]:
    """Dimensions fastest first (ties: innermost first): the conventional hierarchical order."""
    return tuple(sorted(range(topology.ndims), key=lambda d: (-topology.dimensions[d].bandwidth, d)))


def needs_both_directions(topology: Topology, flat: bool, algorithms: Sequence[str]) -> bool:
    """Whether chunks come in pairs, one per ring direction: some ring of more than two ranks
    runs a ring algorithm, or one-shot (whose other stages run as rings), or an axis runs a
    tree (the pair takes the two complementary trees); a flat ring uses one direction."""
    if flat:
        return tuple(algorithms) == ("tree",)
    return any((d.uses_both_directions and alg in (*RING_ALGORITHMS, "oneshot")) or alg == "tree"
               for d, alg in zip(topology.dimensions, algorithms))


def uniform_chunks(k: int, orders: Sequence[tuple[int, ...]], both_directions: bool, lanes: int = 1) -> tuple[ChunkPlan, ...]:
    """k chunks of one unit each (two halves, one per ring direction, when rings are present)."""
    chunks = []
    for i in range(k):
        order = tuple(orders[i % len(orders)])
        lane = i % lanes
        if both_directions:
            chunks.append(ChunkPlan(1, order, 1, lane))
            chunks.append(ChunkPlan(1, order, -1, lane))
        else:
            chunks.append(ChunkPlan(1, order, 1, lane))
    return tuple(chunks)


def hierarchical_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 1,
    protocol: str = "Simple",
    orders: Iterable[tuple[int, ...]] | None = None,
    algorithms: Sequence[str] | None = None,
    layouts: Sequence[str] | None = None,
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    lanes: int = 1,
    label: str = "",
) -> Plan:
    """Reduce-scatter down the dimensions, all-gather back up, with `chunks` uniform chunks.

    One chunk is the unpipelined hierarchical baseline; more chunks pipeline through the
    dimensions. Without `orders`, every chunk goes fastest dimension first.
    """
    if chunks < 1:
        raise InputError(None, "chunks", f"expected an integer >= 1, got {chunks}")
    algs = tuple(algorithms) if algorithms is not None else default_algorithms(topology)
    order_list = list(orders) if orders is not None else [bandwidth_order(topology)]
    plan_chunks = uniform_chunks(chunks, order_list, needs_both_directions(topology, False, algs), lanes)
    lays = tuple(layouts) if layouts is not None else auto_layouts(topology, False, plan_chunks, algs, protocol, max_bytes)
    plan = Plan(
        topology=topology, collective=collective, chunks=plan_chunks, algorithms=algs, layouts=lays, protocol=protocol, min_bytes=min_bytes, max_bytes=max_bytes,
        nominal_bytes=nominal_bytes or max_bytes,
        label=label or ("hierarchical" if chunks == 1 else f"hierarchical-k{chunks}"),
        name=f"{collective}-hierarchical-k{chunks}-{topology.label}",
    )
    check_plan(plan)
    return plan


def ring_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 1,
    protocol: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    label: str = "",
    channels: int = 1,
) -> Plan:
    """One ring through every rank (the NCCL-style flat ring), with `chunks` pipelined chunks;
    with `channels`, that many rings side by side, each through the cycle translated by
    another rank's coordinates, so that they cross each dimension through different ports,
    as NCCL's channels do (chunks take the channels in turn)."""
    if chunks < 1:
        raise InputError(None, "chunks", f"expected an integer >= 1, got {chunks}")
    if channels < 1:
        raise InputError(None, "channels", f"expected an integer >= 1, got {channels}")
    algs = default_algorithms(topology, flat=True)
    plan_chunks = tuple(ChunkPlan(1, (0,), 1, i % channels) for i in range(chunks))
    plan = Plan(
        topology=topology, collective=collective, chunks=plan_chunks, algorithms=algs,
        layouts=auto_layouts(topology, True, plan_chunks, algs, protocol, max_bytes), protocol=protocol, flat=True,
        min_bytes=min_bytes, max_bytes=max_bytes, nominal_bytes=nominal_bytes or max_bytes,
        label=label or ("ring" if chunks == 1 else f"ring-k{chunks}"),
        name=f"{collective}-ring-k{chunks}{_channel_tag(channels)}-{topology.label}",
    )
    check_plan(plan)
    return plan


#: Most rings NCCL's ring baseline runs side by side (NCCL runs up to 32 channels; 16 keeps
#: a 64-rank program within the runtime's XML reader).
NCCL_CHANNELS = 16


def nccl_channels(topology: Topology) -> int:
    """The channels of NCCL's ring on this topology: one per rank of a node (the dimensions
    inside the outermost), as NCCL gives each NIC of a node a ring of its own, at most
    NCCL_CHANNELS; a one-dimensional topology is one node. (Channel l leaves a node from
    another GPU than it enters the next by: the cost model's network is one switch per
    dimension, without rails, so that costs nothing.)"""
    per_node = topology.nranks // topology.dimensions[-1].size if topology.ndims > 1 else topology.nranks
    return max(1, min(NCCL_CHANNELS, per_node))


def nccl_plan(
    topology: Topology,
    algorithm: str,
    collective: str = "allreduce",
    protocol: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    channels: int | None = None,
) -> Plan:
    """NCCL's `algorithm` as NCCL runs it on `channels` channels (nccl_channels by default):
    "ring", one ring through every rank per channel, one chunk each; "tree", one tree of a
    double binary tree per channel, so channels // 2 chunk pairs. Each channel is translated to
    cross the dimensions through other ports."""
    channels = nccl_channels(topology) if channels is None else channels
    if algorithm == "ring":
        return ring_plan(topology, collective, channels, protocol, min_bytes, max_bytes, nominal_bytes,
                         label=f"nccl-ring-{protocol}", channels=channels)
    if algorithm == "tree":
        pairs = max(1, channels // 2)
        return tree_plan(topology, collective, pairs, protocol, min_bytes, max_bytes, nominal_bytes,
                         label=f"nccl-tree-{protocol}", channels=pairs)
    raise InputError(None, "algorithm", f"expected NCCL's ring or tree, got {algorithm!r}")


def _channel_tag(channels: int) -> str:
    """The part of a plan's name that says how many channels it runs on (none for one)."""
    return f"-c{channels}" if channels > 1 else ""


def tree_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 1,
    protocol: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    label: str = "",
    channels: int = 1,
) -> Plan:
    """NCCL's tree all-reduce: a chain through each node's GPUs and NCCL's double binary tree
    across the nodes (schedule/trees.py), `chunks` pairs of chunks, one per tree, reduced up
    and broadcast back down. Latency-bound: 2 (chain + log2 nodes) hops, the whole buffer
    over every link of the trees. With `channels`, the pairs take that many channels in turn,
    each with the trees translated as a ring's channels are (other GPUs join the nodes)."""
    if chunks < 1:
        raise InputError(None, "chunks", f"expected an integer >= 1, got {chunks}")
    if channels < 1:
        raise InputError(None, "channels", f"expected an integer >= 1, got {channels}")
    if not nccl_tree_fits(topology):
        raise PlanError(f"NCCL's tree needs links {topology.label} lacks: its outer dimensions must be switches")
    plan_chunks = tuple(ChunkPlan(1, (0,), d, i % channels) for i in range(chunks) for d in (1, -1))
    plan = Plan(
        topology=topology, collective=collective, chunks=plan_chunks, algorithms=("tree",), layouts=("split",),
        protocol=protocol, flat=True, min_bytes=min_bytes, max_bytes=max_bytes, nominal_bytes=nominal_bytes or max_bytes,
        label=label or f"nccl-tree-{protocol}",
        name=f"{collective}-nccl-tree-k{chunks}{_channel_tag(channels)}-{topology.label}",
    )
    check_plan(plan)
    return plan


def themis_orders(topology: Topology, chunks: int, chunk_bytes: float) -> list[tuple[int, ...]]:
    """Themis' OfflineGreedy dimension orders (algorithms.md 5.3), one per chunk.

    Each chunk reduce-scatters through the dimensions in ascending accumulated load, so the
    least loaded dimension carries the most data; loads are times normalised to dimension
    0's bandwidth. When the load gap is below 1/16 of a chunk, the default order is kept.
    """
    dims = topology.dimensions
    load = [0.0] * len(dims)
    default = tuple(range(len(dims)))
    orders = []
    for _ in range(chunks):
        gap_bytes = (max(load) - min(load)) * dims[0].bandwidth * 1e3
        order = default if gap_bytes < chunk_bytes / 16 else tuple(sorted(range(len(dims)), key=lambda d: (load[d], d)))
        size = chunk_bytes
        for d in order:
            n = dims[d].size
            load[d] += size * (n - 1) / n / (dims[d].bandwidth / dims[0].bandwidth) / (dims[0].bandwidth * 1e3)
            size /= n
        orders.append(order)
    return orders


def themis_plan(
    topology: Topology,
    collective: str = "allreduce",
    chunks: int = 16,
    protocol: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = 0,
    nominal_bytes: int = 0,
    label: str = "",
) -> Plan:
    """Themis-like: uniform chunks, each with its dimension order chosen greedily by load."""
    nbytes = nominal_bytes or max_bytes or (1 << 20)
    orders = themis_orders(topology, chunks, nbytes / chunks)
    plan = hierarchical_plan(topology, collective, chunks, protocol, orders=orders, min_bytes=min_bytes,
                             max_bytes=max_bytes, nominal_bytes=nbytes, label=label or f"themis-k{chunks}")
    return replace(plan, name=f"{collective}-themis-k{chunks}-{topology.label}")
