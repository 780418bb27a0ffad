"""The iteration simulator: one training iteration of a plan, on compute and network
(pipedap.md §4.5), and the lower bound no plan can beat.

Backward compute runs back to back and makes gradients ready layer by layer; ops run FIFO
per lane, and ops moving bytes at once share the network equally while their start-up
(latency) parts overlap; the next forward pass runs layer by layer, each layer waiting for
the ops that synchronise its parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .buckets import TrainingPlan
from .commcost import CommCostModel, CostCache, cached
from ..errors import PlanError
from .profiles import LayerProfile


@dataclass(frozen=True)
class Event:
    """One interval of the timeline: compute ("backward", "forward") or an op ("AR", "RS", "AG")."""

    kind: str
    start_ms: float
    end_ms: float
    lane: int | None = None
    bucket: int | None = None
    layer: int | None = None
    seq: int | None = None


@dataclass(frozen=True)
class Simulation:
    """One iteration: start of backward of iteration i to end of forward of iteration i+1.

    exposed_comm_ms = iteration_ms - compute_ms; link_busy_ms is the time during which at
    least one op is moving bytes (past its latency part).
    """

    iteration_ms: float
    compute_ms: float
    exposed_comm_ms: float
    link_busy_ms: float
    timeline: tuple[Event, ...]


@dataclass(frozen=True)
class IterationRun:
    """Raw times of one iteration, per op (start, end of its latency part, done) and per
    forward layer (start); `simulate` turns them into a timeline."""

    iteration_ms: float
    start: tuple[float, ...]
    latency_end: tuple[float, ...]
    done: tuple[float, ...]
    forward_start: tuple[float, ...]


def _ready_at(start: float, after: Sequence[int], done: Sequence[float | None]) -> float | None:
    """The latest of `start` and the end times of the ops in `after`; None while one is running."""
    for d in after:
        end = done[d]
        if end is None:
            return None
        if end > start:
            start = end
    return start


def run_iteration(plan: TrainingPlan, profile: LayerProfile, cost: CostCache) -> IterationRun:
    """Event loop: compute never waits in backward; each lane runs FIFO; ops moving bytes at
    the same time share the network equally (processor sharing), latency parts overlap."""
    ops = plan.ops
    n = len(ops)
    ready = profile.grad_ready_ms
    bucket_ready = [float(ready[list(b.layers)].max()) for b in plan.buckets]
    lane_of = [op.lane for op in ops]
    host = [bucket_ready[op.bucket] if op.grad_ready else 0.0 for op in ops]
    trigger = [-1 if op.forward_start is None else op.forward_start for op in ops]
    deps = [op.after for op in ops]
    phases = [cost.phases_ms(op.collective, plan.buckets[op.bucket].padded_bytes) for op in ops]
    lat = [p[0] for p in phases]
    work = [p[1] for p in phases]
    fwd = profile.fwd_array.tolist()
    waits = plan.forward_waits
    L = len(fwd)
    nlanes = max(lane_of, default=0) + 1
    lane_ops: list[list[int]] = [[] for _ in range(nlanes)]
    for i, ln in enumerate(lane_of):
        lane_ops[ln].append(i)

    issue: list[float | None] = [None] * n
    start = [math.nan] * n
    lat_end = [math.nan] * n
    done: list[float | None] = [None] * n
    fwd_start: list[float | None] = [None] * L
    lane_ptr = [0] * nlanes
    lane_free = [0.0] * nlanes
    lane_busy = [False] * nlanes
    latent: dict[int, float] = {}
    active: dict[int, float] = {}
    next_issue, last_issue, next_fwd, clock = 0, 0.0, 0, profile.bwd_ms
    t, ndone = 0.0, 0

    def finish(i: int, when: float) -> None:
        nonlocal ndone
        done[i] = when
        ndone += 1
        ln = lane_of[i]
        lane_busy[ln] = False
        lane_free[ln] = when
        lane_ptr[ln] += 1

    while True:
        progressed = True
        while progressed:
            progressed = False
            while next_issue < n:
                f = trigger[next_issue]
                if f >= 0 and fwd_start[f] is None:
                    break
                ti = max(last_issue, host[next_issue], fwd_start[f] if f >= 0 else 0.0)  # type: ignore[type-var]
                issue[next_issue] = last_issue = ti
                next_issue += 1
            while next_fwd < L:
                s = _ready_at(clock, waits[next_fwd], done)
                if s is None:
                    break
                fwd_start[next_fwd] = s
                clock = s + fwd[next_fwd]
                next_fwd += 1
                progressed = True
            future = math.inf
            for ln in range(nlanes):
                if lane_busy[ln] or lane_ptr[ln] >= len(lane_ops[ln]):
                    continue
                i = lane_ops[ln][lane_ptr[ln]]
                s = issue[i]
                if s is None:
                    continue
                s = _ready_at(max(s, lane_free[ln]), deps[i], done)
                if s is None:
                    continue
                if s > t:
                    future = min(future, s)
                    continue
                start[i] = t
                lat_end[i] = t + lat[i]
                latent[i] = t + lat[i]
                lane_busy[ln] = True
                progressed = True
            for i in [i for i, le in latent.items() if le <= t]:
                del latent[i]
                if work[i] > 0.0:
                    active[i] = work[i]
                else:
                    finish(i, t)
                    progressed = True
        if ndone == n and next_fwd == L:
            break
        if latent:
            future = min(future, min(latent.values()))
        k = len(active)
        first = min(active, key=active.__getitem__) if k else -1
        bandwidth_end = t + active[first] * k if k else math.inf
        future = min(future, bandwidth_end)
        if future == math.inf:
            raise PlanError(f"plan {plan.policy!r} deadlocks: {n - ndone} op(s) can never start (check forward_start and after)")
        if k:
            dec = (future - t) / k
            for i in list(active):
                left = active[i] - dec
                if left <= 1e-12 * (1.0 + work[i]) or (i == first and future == bandwidth_end):
                    del active[i]
                    finish(i, future)
                else:
                    active[i] = left
        t = future
    return IterationRun(clock, tuple(start), tuple(lat_end), tuple(d for d in done), tuple(fwd_start))  # type: ignore[arg-type]


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def simulate(plan: TrainingPlan, profile: LayerProfile, cost: CommCostModel) -> Simulation:
    """Time one iteration of `plan` (pipedap.md 4.5) and return its timeline.

    >>> from hipipe_compiler.training.buckets import build_plan
    >>> from hipipe_compiler.training.commcost import AlphaBetaCost
    >>> from hipipe_compiler.training.policies import wfbp_schedule
    >>> from hipipe_compiler.training.profiles import profile_from_document
    >>> profile = profile_from_document({"dtype_bytes": 4, "layers": [
    ...     {"name": "a", "params": 250_000, "fwd_ms": 1, "bwd_ms": 1}]}, "one.yaml")
    >>> plan = build_plan(profile, wfbp_schedule(profile), "wfbp")
    >>> sim = simulate(plan, profile, AlphaBetaCost.ring(2, 1.0, 0.0))
    >>> sim.iteration_ms, sim.exposed_comm_ms, [e.kind for e in sim.timeline]
    (3.0, 1.0, ['backward', 'AR', 'forward'])
    """
    cache = cached(cost)
    run = run_iteration(plan, profile, cache)
    fwd = profile.fwd_array
    bwd_end = np.cumsum(profile.bwd_array[::-1])[::-1]
    events = [Event("backward", float(bwd_end[i] - profile.bwd_array[i]), float(bwd_end[i]), layer=i)
              for i in reversed(range(profile.nlayers))]
    events += [Event(op.kind, run.start[op.seq], run.done[op.seq], op.lane, op.bucket, seq=op.seq) for op in plan.ops]
    events += [Event("forward", s, s + float(fwd[i]), layer=i) for i, s in enumerate(run.forward_start)]
    events.sort(key=lambda e: (e.start_ms, e.end_ms, e.kind != "backward", e.seq if e.seq is not None else -1))
    busy = _union_length((run.latency_end[i], run.done[i]) for i in range(len(plan.ops)) if run.done[i] > run.latency_end[i])
    compute = profile.compute_ms
    return Simulation(run.iteration_ms, compute, run.iteration_ms - compute, busy, tuple(events))


def iteration_lower_bound_ms(profile: LayerProfile, cost: CommCostModel) -> float:
    """A bound no plan of any policy can beat, for costs nondecreasing in bytes whose
    bandwidth part w(c, S) = time - latency is superadditive in S (e.g. α-β).

    With r_l the gradient-ready time of layer l, F_<l and F_>=l the forward time before
    and from layer l, T_b the backward time, f_last the last layer's forward time,
    S_l its gradient bytes and c_l = min(AR(S_l), RS(S_l) + AG(S_l)):

        T >= max( T_b + F,
                  max_l  max(T_b + F_<l, r_l + c_l) + F_>=l,
                  min_l r_l + sum_l min(w(AR, S_l), w(RS, S_l) + w(AG, S_l)) + f_last ).

    Layer l's forward cannot start before its own parameters are synchronised, which takes
    at least c_l after r_l (sharing and FIFO lanes only slow ops down). The network does at
    most one unit of bandwidth work per unit of time, none before the first gradient is
    ready, and every op is done before the forward of some layer, hence before T - f_last.
    """
    cache = cached(cost)
    T_b, fwd, ready = profile.bwd_ms, profile.fwd_array, profile.grad_ready_ms
    nbytes = (profile.params_array * profile.dtype_bytes).tolist()
    f_before = np.concatenate(([0.0], np.cumsum(fwd)[:-1]))
    f_from = profile.fwd_ms - f_before
    bound = T_b + profile.fwd_ms
    work = 0.0
    for l, s in enumerate(nbytes):
        ar, rs, ag = (cache.phases_ms(c, s) for c in ("allreduce", "reducescatter", "allgather"))
        sync = min(sum(ar), sum(rs) + sum(ag))
        bound = max(bound, max(T_b + f_before[l], ready[l] + sync) + f_from[l])
        work += min(ar[1], rs[1] + ag[1])
    return float(max(bound, float(ready.min()) + work + float(fwd[-1])))
