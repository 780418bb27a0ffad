"""Estimates of a plan: the alpha-beta cost of each stage, a time floor no run can beat, and
the list schedule built from the stage costs that orders a plan's work when the plan does
not give its own (`events`).

>>> from hipipe_compiler.schedule.baselines import hierarchical_plan
>>> from hipipe_compiler.presets import preset
>>> plan = hierarchical_plan(preset("dgx-h100-8x4"), chunks=2, nominal_bytes=1 << 28)
>>> events(plan)  # (chunk, stage): chunk 1 reduce-scatters on nvlink while chunk 0 is on ib
((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (1, 2))
"""

from __future__ import annotations

import heapq

from ..hardware import WIRE_EFFICIENCY
from ..topology import Topology
from .fold import folded_limits
from .plan import RING_ALGORITHMS, Plan, Stage, ring_axis, stage_algorithm, stage_bytes
from .trees import stage_tree, tree_depth


def stage_cost(plan: Plan, k: int, stage: Stage, nbytes: float) -> float:
    """alpha-beta estimate (microseconds) of one stage of chunk k when the call moves nbytes."""
    data = stage_bytes(plan, k, stage, nbytes)
    n = plan.axis_size(stage.axis)
    if plan.flat:
        alpha = max(d.alpha(plan.protocol) for d in plan.topology.dimensions)
        bw = min(d.bandwidth / (2 if d.uses_both_directions else 1) for d in plan.topology.dimensions)
    else:
        dim = plan.topology.dimensions[stage.axis]
        alpha = dim.alpha(plan.protocol)
        bw = dim.bandwidth / (2 if dim.uses_both_directions else 1)
    bpus = bw * 1e3  # bytes per microsecond
    alg = stage_algorithm(plan, stage)
    if alg == "oneshot":
        # switch: one exchange; ring: n // 2 flooding rounds, each link carrying half the copies
        return (n // 2 if ring_axis(plan, stage.axis) else 1) * alpha + (n - 1) * data / bpus
    if alg == "tree":  # up to the root and back down; each rank's data once each way
        depth = tree_depth(stage_tree(plan, stage.axis, plan.chunks[k].direction)[0])
        return 2 * depth * alpha + 2 * data / bpus
    if alg == "ring":
        one = (n - 1) * (alpha + data / n / bpus)
    elif alg == "bidir":  # the longer chain's latencies; the two directions' links share the bytes
        one = n // 2 * alpha + (n - 1) * data / n / bpus
    else:
        one = alpha + (n - 1) / n * data / bpus
    return 2 * one if stage.kind == "ar" else one


def time_floor_us(plan: Plan, nbytes: float, network: Topology | None = None) -> float:
    """A time no run of `plan` at nbytes can beat: the per-call cost of its protocol, then the
    larger of its busiest dimension's wire bytes per rank over that dimension's bandwidth,
    and its longest chain of message latencies (every byte of a chunk passes its stages one
    after another). The optimizer
    skips a candidate whose floor already loses to the best plan it has simulated.

    A folded plan (plan.fold) runs on `network`, the topology before folding: its folded
    axis's messages leave through any of the folded dimensions, so that axis is charged their
    summed bandwidth and their smallest latency.

    >>> from hipipe_compiler.schedule.baselines import hierarchical_plan
    >>> from hipipe_compiler.presets import preset
    >>> plan = hierarchical_plan(preset("torus-4x4"), chunks=2, nominal_bytes=1 << 30)
    >>> round(time_floor_us(plan, 1 << 30), 1)  # 3/4 of the call twice through x, at 100 GB/s
    16106.1
    """
    topo = plan.topology
    # a flat ring's links lie in any dimension: it gets the fastest latency and all of them
    alphas = ([min(d.alpha(plan.protocol) for d in topo.dimensions)] if plan.flat
              else [d.alpha(plan.protocol) for d in topo.dimensions])
    capacity = [sum(d.bandwidth for d in topo.dimensions)] if plan.flat else [d.bandwidth for d in topo.dimensions]
    if plan.fold:
        if network is None:
            raise ValueError(f"plan {plan.name} folds dimensions: its time floor needs the network it runs on")
        alphas[0], capacity[0] = folded_limits(network, plan.fold, plan.protocol)
    wire = [0.0] * len(capacity)
    chain = 0.0
    for k in range(len(plan.chunks)):
        path = 0.0
        for st in plan.stages(k):
            data = stage_bytes(plan, k, st, nbytes)
            n = plan.axis_size(st.axis)
            alg = stage_algorithm(plan, st)
            if alg == "oneshot":  # every rank's block reaches n - 1 peers
                sent, hops = (n - 1) * data, (n // 2 if ring_axis(plan, st.axis) else 1)
            elif alg == "tree":  # every rank but the root sends its data up, the root sends it down
                sent, hops = data, 2 * tree_depth(stage_tree(plan, st.axis, plan.chunks[k].direction)[0])
            else:
                passes = 2 if st.kind == "ar" else 1
                sent, hops = passes * (n - 1) / n * data, passes * {"ring": n - 1, "bidir": n // 2}.get(alg, 1)
            wire[st.axis] += sent / WIRE_EFFICIENCY[plan.protocol]
            path += hops * alphas[st.axis]
        chain = max(chain, path)
    load = max(b / (c * 1e3) for b, c in zip(wire, capacity))
    return topo.call_cost(plan.protocol) + max(load, chain)


def default_schedule(plan: Plan) -> tuple[tuple[int, int], ...]:
    """A list schedule of all stages over the axes, later stages first (drain first).

    Each (axis, lane, ring direction) is one queue; a stage becomes ready when the chunk's
    previous stage ends. The start order of the simulated list schedule is the emission
    order, so every threadblock receives its work in the order it can run it.
    """
    nbytes = float(plan.nominal_bytes or plan.max_bytes or (1 << 20))
    nchunks = len(plan.chunks)
    stages = [plan.stages(k) for k in range(nchunks)]

    def resource(k: int, j: int) -> tuple[int, int, int]:
        c = plan.chunks[k]
        st = stages[k][j]
        ring_dir = c.direction if plan.algorithms[st.axis] in RING_ALGORITHMS else 0
        return (st.axis, c.lane_of(j), ring_dir)

    # per resource: stages not ready yet (by ready time) and stages ready once it is free
    # (later stages first, then lower chunks)
    free: dict[tuple[int, int, int], float] = {}
    pending: dict[tuple[int, int, int], list[tuple[float, int, int]]] = {}
    waiting: dict[tuple[int, int, int], list[tuple[int, int, float]]] = {}

    def add(res: tuple[int, int, int], ready: float, j: int, k: int) -> None:
        if ready <= free.get(res, 0.0):
            heapq.heappush(waiting.setdefault(res, []), (-j, k, ready))
        else:
            heapq.heappush(pending.setdefault(res, []), (ready, -j, k))

    def head(res: tuple[int, int, int]) -> tuple[float, int, int] | None:
        """The (start, -stage, chunk) of the stage res runs next, if any."""
        f = free.get(res, 0.0)
        if waiting.get(res):
            negj, k, _ready = waiting[res][0]
            return (f, negj, k)
        if pending.get(res):
            ready, negj, k = pending[res][0]
            return (max(ready, f), negj, k)
        return None

    # candidates: (head, resource), pushed whenever a resource's head may have changed; an
    # entry whose head is no longer the resource's is stale (heads are unique: a stage
    # belongs to one resource)
    heap: list[tuple[tuple[float, int, int], tuple[int, int, int]]] = []

    def offer(res: tuple[int, int, int]) -> None:
        key = head(res)
        if key is not None:
            heapq.heappush(heap, (key, res))

    for k in range(nchunks):
        add(resource(k, 0), 0.0, 0, k)
    for res in set(pending) | set(waiting):
        offer(res)
    out: list[tuple[int, int]] = []
    while heap:
        key, res = heapq.heappop(heap)
        if head(res) != key:
            continue
        start, negj, k = key
        if waiting.get(res) and waiting[res][0][:2] == (negj, k):
            heapq.heappop(waiting[res])
        else:
            heapq.heappop(pending[res])
        j = -negj
        end = start + stage_cost(plan, k, stages[k][j], nbytes)
        free[res] = end
        # stages that were waiting for this resource to become free at `end` or earlier
        while pending.get(res) and pending[res][0][0] <= end:
            ready, nj, kk = heapq.heappop(pending[res])
            heapq.heappush(waiting.setdefault(res, []), (nj, kk, ready))
        out.append((k, j))
        offer(res)
        if j + 1 < len(stages[k]):
            nxt = resource(k, j + 1)
            add(nxt, end, j + 1, k)
            offer(nxt)
    return tuple(out)


def events(plan: Plan) -> tuple[tuple[int, int], ...]:
    """(chunk, stage index) pairs in emission order: the plan's own schedule, or the default one."""
    return plan.schedule or default_schedule(plan)
