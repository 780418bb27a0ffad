"""Calibration: the topology that makes NCCL as our simulator runs it (timing.py: the
algorithm the log forced, or NCCL's own pick) reproduce nccl-tests measurements of a machine.

It fits each dimension's bandwidth, the per-protocol latencies of each dimension, the
per-protocol per-call costs and, where the switch reduces, its efficiency and per-call cost.
Each starts from its default (the GPU's NVLink figure, NCCL's own per-hop and base
latencies, NCCL's NVLS efficiency), and a weak pull toward it keeps what the logs cannot tell
apart where it was. The fit minimises the squared log error of every measured time by
Levenberg-Marquardt; a per-call cost adds to every time of its protocol, so its derivative is
exact, and the others' come from simulating with each group changed.

>>> from hipipe_compiler.nccl.logs import Row, TestLog
>>> log = TestLog("x", "allreduce", 8, 8, "H100", None, None, (Row(8, 20.0, 1), Row(1 << 20, 30.0, 2)))
>>> template(log_machines([log])).dimensions[0].bandwidth
370.8
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import InputError, PlanError
from ..hardware import NVLINK, PROTOCOLS, Latencies, gpu_model
from ..topology import Dimension, Nvls, Topology
from .logs import TestLog, same_machine
from .timing import NcclRun, NcclTimer

#: How strongly a fitted quantity is pulled toward its default, per unit of log ratio, against
#: one measured point's log error: enough to pin what no log moves, not enough to resist data.
PRIOR_WEIGHT = 0.05
#: Relative step of the finite differences (in the log of the quantity).
STEP = 0.05
#: A quantity counts as fitted when some prediction moves by more than this fraction of its
#: change (a tenth of it moves the prediction by a percent).
MOVES = 0.1
#: The largest change of a quantity's log in one step.
MAX_STEP = 0.5
#: Levenberg-Marquardt iterations at most, and the relative gain below which it stops.
ITERATIONS = 12
GAIN = 1e-3
#: Derivatives taken by simulation only where they are not nil: latencies up to this size,
#: bandwidths from that one (the per-call costs' are exact everywhere).
LATENCY_UP_TO = 256 << 20
BANDWIDTH_FROM_BYTES = 64 << 10
#: Sizes above this are left out of the fit when the log has a row between BANDWIDTH_FROM and
#: it: beyond, the pipeline only repeats its steady state, and each simulation takes long.
#: The report times them all.
FIT_UP_TO = 1 << 30
BANDWIDTH_FROM = 64 << 20
#: NCCL's base latencies of its ring (tuning.cc baseLat): the default per-call costs.
NCCL_CALL = Latencies(6.6, 14.0, 8.4)
#: NCCL's NVLS latency on one node (hwLat NVLINK NVLS Simple): a call pays the per-call cost,
#: then two in-switch hops; the rest is the default of the switch's own per-call cost.
NCCL_NVLS_LATENCY = 25.0


@dataclass(frozen=True)
class Machine:
    """What the logs say about the machine: GPU model, GPUs per node, and the node counts,
    collectives and NCCL settings of its runs."""

    gpu: str | None
    ppn: int
    logs: tuple[TestLog, ...]

    @property
    def multi_node(self) -> bool:
        return any(log.nodes > 1 for log in self.logs)


def log_machines(logs: Sequence[TestLog]) -> Machine:
    """The machine of a set of logs; InputError when they are of different machines."""
    if not logs:
        raise InputError(None, "LOG", "expected at least one nccl-tests log")
    same_machine(list(logs))
    return Machine(logs[0].gpu, logs[0].ranks_per_node, tuple(logs))


def template(machine: Machine, base: Topology | None = None, net_GBps: float | None = None) -> Topology:
    """The topology the fit starts from: `base` where given (its dimensions' kinds, links and
    starting values), else a node of the machine's GPUs on an NVSwitch (with in-switch
    reduction from Hopper on) and, where some log spans nodes, a network of one NIC per GPU."""
    if base is not None:
        return base
    model = gpu_model(machine.gpu or "H100")
    nvls = None
    if model.sm >= 90 and model.nvlink_links >= 12 and machine.ppn >= 2:
        hops = 2 * NVLINK.Simple
        nvls = Nvls(model.nvls_efficiency, max(0.0, NCCL_NVLS_LATENCY - NCCL_CALL.Simple - hops))
    nvlink = model.nvlink_GBps if model.nvlink_links else 24.0
    link = "nvlink" if model.nvlink_links else "pcie"
    dims = [Dimension(machine.ppn, "switch", nvlink, link=link, name=link, nvls=nvls)]
    if machine.multi_node:
        dims.append(Dimension(2, "switch", net_GBps or 50.0, link="network", name="net"))
    return Topology(tuple(dims), name=f"{(machine.gpu or 'gpu').lower()}-{machine.ppn}", call_latency=NCCL_CALL,
                    gpu=model.name)


@dataclass(frozen=True)
class Quantity:
    """One fitted number of the topology: where it sits, its default and its bounds."""

    name: str  # as the report shows it: "nvlink bandwidth", "net latency LL", "call latency Simple", ...
    group: str  # quantities changed together for a derivative: "alpha:D", "bandwidth:D", "call", "nvls", "nvls_call"
    dim: int | None
    protocol: str | None
    prior: float
    lower: float
    upper: float


def quantities(topology: Topology, machine: Machine) -> list[Quantity]:
    """The quantities the logs can move: a dimension's numbers where some log spans it."""
    out: list[Quantity] = []
    spans = [0] + ([1] if machine.multi_node and topology.ndims > 1 else [])
    for d in spans:
        dim = topology.dimensions[d]
        name = topology.dim_name(d)
        out.append(Quantity(f"{name} bandwidth", f"bandwidth:{d}", d, None, dim.bandwidth, 1e-3, 1e5))
        for p in PROTOCOLS:
            out.append(Quantity(f"{name} latency {p}", f"alpha:{d}", d, p, max(dim.alpha(p), 0.01), 1e-3, 1e4))
        if d == 0 and dim.nvls is not None:
            out.append(Quantity(f"{name} in-switch efficiency", "nvls", d, None, dim.nvls.efficiency, 0.05, 1.0))
            out.append(Quantity(f"{name} in-switch call latency", "nvls_call", d, None, max(dim.nvls.call_latency, 0.1),
                                1e-3, 1e4))
    for p in PROTOCOLS:
        out.append(Quantity(f"call latency {p}", "call", None, p, max(topology.call_cost(p), 0.1), 1e-3, 1e4))
    out.append(Quantity("NCCL channel throughput", "engine", None, None, topology.nccl_channel_scale or 1.0, 0.2, 5.0))
    return out


def apply(topology: Topology, qs: Sequence[Quantity], values: Sequence[float]) -> Topology:
    """The topology with the quantities set to `values`."""
    dims = list(topology.dimensions)
    alphas: dict[int, dict[str, float]] = {}
    call = {p: topology.call_cost(p) for p in PROTOCOLS}
    engine = topology.nccl_channel_scale
    for q, v in zip(qs, values):
        if q.group.startswith("bandwidth"):
            # NCCL keeps deciding from the hardware's rating, whatever bandwidth the fit finds
            dims[q.dim] = replace(dims[q.dim], bandwidth=float(v), rated_bandwidth=dims[q.dim].rating)  # type: ignore[index]
        elif q.group.startswith("alpha"):
            alphas.setdefault(q.dim, {p: dims[q.dim].alpha(p) for p in PROTOCOLS})[q.protocol] = float(v)  # type: ignore[index]
        elif q.group == "nvls":
            dims[0] = replace(dims[0], nvls=replace(dims[0].nvls, efficiency=float(v)))  # type: ignore[arg-type]
        elif q.group == "nvls_call":
            dims[0] = replace(dims[0], nvls=replace(dims[0].nvls, call_latency=float(v)))  # type: ignore[arg-type]
        elif q.group == "engine":
            engine = float(v)
        else:
            call[q.protocol] = float(v)  # type: ignore[index]
    for d, values_by_protocol in alphas.items():
        dims[d] = replace(dims[d], latency=Latencies(**values_by_protocol))
    return replace(topology, dimensions=tuple(dims), call_latency=Latencies(**call), nccl_channel_scale=engine)


@dataclass(frozen=True)
class Point:
    """One measured time of one log, and what the fitted model says of it."""

    log: str
    collective: str
    nodes: int
    nbytes: int
    measured_us: float
    predicted_us: float
    run: str  # the algorithm/protocol NCCL ran, as we time it

    @property
    def error(self) -> float:
        return self.predicted_us / self.measured_us - 1


@dataclass(frozen=True)
class Fitted:
    """A fitted quantity: its default and value, and whether any log moved it (its value
    changes some prediction by more than a percent when it changes by a tenth)."""

    quantity: Quantity
    value: float
    constrained: bool


@dataclass(frozen=True)
class Calibration:
    """The fitted topology, each fitted quantity and each measured point."""

    topology: Topology
    fitted: tuple[Fitted, ...]
    points: tuple[Point, ...]
    evaluations: int = field(default=0, compare=False)

    @property
    def rms_error(self) -> float:
        return math.sqrt(sum(math.log1p(p.error) ** 2 for p in self.points) / max(1, len(self.points)))


#: Programs lowered in this process, shared by every evaluation (and by each worker process).
_PROGRAMS: dict = {}


def _time_point(job: tuple) -> NcclRun:
    """One point timed (in a worker process, or here): NCCL's pick, or the held one."""
    topology, collective, nbytes, algorithms, protocols, pick = job
    timer = NcclTimer(topology, collective, _PROGRAMS)
    if pick is not None:
        return timer.run(nbytes, *pick)
    return timer.pick(nbytes, algorithms, protocols)


def weight(nbytes: int) -> float:
    """How much a measured time counts in the fit: the bandwidth-bound sizes most (their
    times are the most stable and the model is held to 10 % there), then the sizes from a
    MiB, and least the smallest, whose times are mostly one per-call cost."""
    return 2.0 if nbytes >= 64 << 20 else 1.0 if nbytes >= 1 << 20 else 0.5


class _Evaluator:
    """Predicts the points of the logs on a topology, on every core."""

    def __init__(self, machine: Machine, fit_only: bool, pool: Executor | None = None) -> None:
        self.points: list[tuple[TestLog, int, float]] = []
        for log in machine.logs:
            rows = list(log.rows)
            if fit_only and any(BANDWIDTH_FROM <= r.nbytes <= FIT_UP_TO for r in rows):
                rows = [r for r in rows if r.nbytes <= FIT_UP_TO]
            self.points.extend((log, r.nbytes, r.time_us) for r in rows)
        self.pool = pool
        self.simulations = 0
        self.sensitivity = np.zeros(0)

    def topology_for(self, topology: Topology, log: TestLog) -> Topology:
        return topology.with_outer_size(log.nodes) if topology.ndims > 1 else topology

    def runs(self, topology: Topology, picks: Sequence[tuple[str, str]] | None = None,
             only: Sequence[int] | None = None) -> list[NcclRun]:
        """Each point (or the `only` ones) as NCCL runs it on `topology`: the algorithm and
        protocol the log forced or NCCL picks (or `picks`, one per point run, held while
        taking derivatives)."""
        chosen = range(len(self.points)) if only is None else only
        jobs = [(self.topology_for(topology, self.points[i][0]), self.points[i][0].collective, self.points[i][1],
                 self.points[i][0].algorithms, self.points[i][0].protocols,
                 None if picks is None else picks[k]) for k, i in enumerate(chosen)]
        self.simulations += len(jobs)
        try:
            if self.pool is None:
                return [_time_point(job) for job in jobs]
            # the largest first, spread over the workers
            order = sorted(range(len(jobs)), key=lambda i: -jobs[i][2])
            done = dict(zip(order, self.pool.map(_time_point, [jobs[i] for i in order])))
            return [done[i] for i in range(len(jobs))]
        except PlanError as exc:
            raise InputError(", ".join(sorted({log.source for log, _n, _t in self.points})), None,
                             f"cannot time NCCL here: {exc}") from None


@contextmanager
def _workers() -> Iterator[Executor | None]:
    """A pool of one worker per core (None on one core): the points' simulations are
    independent, and forked workers start with what this process has lowered."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield None
        return
    pool = ProcessPoolExecutor(max_workers=cores, mp_context=multiprocessing.get_context("fork"))
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def calibrate(logs: Sequence[TestLog], base: Topology | None = None, net_GBps: float | None = None,
              progress: Callable[[int], None] | None = None) -> Calibration:
    """Fit the machine of `logs` (one machine: node counts, collectives and NCCL settings may
    differ between them).

    Levenberg-Marquardt on the log of each quantity: the derivatives are taken by simulation
    once, then updated from each step's outcome (Broyden), and taken anew when a step fails;
    every simulation of one round runs on its own core."""
    machine = log_machines(logs)
    start = template(machine, base, net_GBps)
    qs = quantities(start, machine)
    with _workers() as pool:
        evaluator = _Evaluator(machine, fit_only=True, pool=pool)
        u = _fit(start, qs, evaluator, progress)
        fitted_topology = apply(start, qs, np.exp(u))
        report = _Evaluator(machine, fit_only=False, pool=pool)
        points = _predicted(report, fitted_topology)
    moved = np.abs(u - np.log([q.prior for q in qs])) > 0.01
    fitted = tuple(Fitted(q, float(v), bool(s > MOVES or m)) for q, v, s, m in zip(qs, np.exp(u), evaluator.sensitivity, moved))
    return Calibration(fitted_topology, fitted, points, evaluator.simulations + report.simulations)


def predict(topology: Topology, logs: Sequence[TestLog], source: str | None = None) -> tuple[Point, ...]:
    """Every measured time of `logs` beside what NCCL, as simulated on `topology` (with as many
    nodes as each log ran), takes: how well a calibrated machine predicts other runs. Errors
    name `source`, the topology's file."""
    machine = log_machines(logs)
    source = source or topology.label
    if machine.multi_node and topology.ndims < 2:
        raise InputError(source, "dimensions", "expected a network dimension: some log spans nodes")
    per_node = topology.nranks // topology.dimensions[-1].size if topology.ndims > 1 else topology.nranks
    if per_node != machine.ppn:
        raise InputError(source, "dimensions", f"expected {machine.ppn} ranks per node, as the logs ran; "
                         f"the topology has {per_node}")
    with _workers() as pool:
        return _predicted(_Evaluator(machine, fit_only=False, pool=pool), topology)


def _predicted(evaluator: _Evaluator, topology: Topology) -> tuple[Point, ...]:
    runs = evaluator.runs(topology)
    return tuple(Point(log.source, log.collective, log.nodes, n, t, r.time_us, r.label)
                 for (log, n, t), r in zip(evaluator.points, runs))


#: The fit's stages: bandwidths first, on the sizes bytes decide (Levenberg-Marquardt); then
#: latencies and per-call costs on the sizes up to LATENCY_FIT_UP_TO, where a time is a sum of
#: them (linear least squares); then everything on everything, a few steps. A single joint fit
#: trades the few large sizes for the many small ones, and takes long.
BANDWIDTH_GROUPS = ("bandwidth", "nvls", "engine")
LATENCY_GROUPS = ("alpha", "call", "nvls_call")
LATENCY_FIT_UP_TO = 32 << 20
POLISH = 2


def _fit(start: Topology, qs: Sequence[Quantity], evaluator: _Evaluator,
         progress: Callable[[int], None] | None) -> np.ndarray:
    """The log of each quantity at the fit's end."""
    u = np.log([q.prior for q in qs])
    sizes = np.array([n for _l, n, _t in evaluator.points])
    evaluator.sensitivity = np.zeros(len(qs))
    done = [0]

    def tick(_i: int) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0])

    def members(groups: tuple[str, ...]) -> list[int]:
        return [j for j, q in enumerate(qs) if q.group.split(":")[0] in groups]
    large = [i for i, n in enumerate(sizes) if n >= BANDWIDTH_FROM]
    small = [i for i, n in enumerate(sizes) if n <= LATENCY_FIT_UP_TO]
    if len(large) >= 2:
        u = _stage(start, qs, evaluator, u, large, members(BANDWIDTH_GROUPS), tick)
    if small:
        for _round in range(2):  # the hop counts of the second round are those of the fitted latencies
            u = _latencies(start, qs, evaluator, u, small, members(LATENCY_GROUPS))
            tick(0)
    return _stage(start, qs, evaluator, u, list(range(len(sizes))), list(range(len(qs))), tick, POLISH)


def _latencies(start: Topology, qs: Sequence[Quantity], evaluator: _Evaluator, u: np.ndarray, points: list[int],
               moving: list[int]) -> np.ndarray:
    """Per-call costs and latencies by linear least squares: at these sizes a time is its
    protocol's per-call cost, plus each dimension's latency times the hops of its longest
    chain there (found by simulating with the latencies moved), plus what its bytes take."""
    from scipy.optimize import lsq_linear

    values = np.exp(u)
    runs = evaluator.runs(apply(start, qs, values), None, points)
    base = np.array([r.time_us for r in runs])
    picks = [(r.algorithm, r.protocol) for r in runs]
    hops: dict[int, np.ndarray] = {}
    dims = sorted({qs[j].dim for j in moving if qs[j].group.startswith("alpha")})
    for d in dims:
        moved = values.copy()
        for j, q in enumerate(qs):
            if q.group == f"alpha:{d}":
                moved[j] *= 1 + STEP
        shifted = np.array([r.time_us for r in evaluator.runs(apply(start, qs, moved), picks, points)])
        alpha = np.array([values[_index(qs, f"alpha:{d}", r.protocol)] for r in runs])
        hops[d] = (shifted - base) / (STEP * alpha)
    measured = np.array([evaluator.points[i][2] for i in points])
    a = np.zeros((len(points), len(moving)))
    known = base.copy()
    for col, j in enumerate(moving):
        q = qs[j]
        for row, r in enumerate(runs):
            if q.group == "call" and r.protocol == q.protocol:
                a[row, col] = 1.0
            elif q.group == "nvls_call" and r.algorithm in ("nvls", "nvlstree"):
                a[row, col] = 1.0
            elif q.group.startswith("alpha") and r.protocol == q.protocol:
                a[row, col] = hops[q.dim][row]  # type: ignore[index]
        known -= a[:, col] * values[j]  # what the bytes take, left when the latencies are taken away
    scale = 1 / measured * np.array([weight(evaluator.points[i][1]) for i in points])
    prior = np.array([qs[j].prior for j in moving])
    lhs = np.vstack([a * scale[:, None], PRIOR_WEIGHT * np.diag(1 / prior)])
    rhs = np.concatenate([(measured - known) * scale, PRIOR_WEIGHT * np.ones(len(moving))])
    bounds = (np.array([qs[j].lower for j in moving]), np.array([qs[j].upper for j in moving]))
    solution = lsq_linear(lhs, rhs, bounds=bounds).x
    evaluator.sensitivity[moving] = np.maximum(evaluator.sensitivity[moving],
                                               np.max(np.abs(a) * solution / np.maximum(measured, 1e-9)[:, None], axis=0))
    out = u.copy()
    out[moving] = np.log(np.maximum(solution, 1e-9))
    return out


def _index(qs: Sequence[Quantity], group: str, protocol: str) -> int:
    return next(j for j, q in enumerate(qs) if q.group == group and q.protocol == protocol)


def _stage(start: Topology, qs: Sequence[Quantity], evaluator: _Evaluator, u: np.ndarray, points: list[int],
           moving: list[int], progress: Callable[[int], None], iterations: int = ITERATIONS) -> np.ndarray:
    """Levenberg-Marquardt on the `moving` quantities against the measured times of `points`."""
    measured = np.log([evaluator.points[i][2] for i in points])
    weights = np.array([weight(evaluator.points[i][1]) for i in points])
    sizes = np.array([evaluator.points[i][1] for i in points])
    lo, hi = np.log([q.lower for q in qs]), np.log([q.upper for q in qs])
    prior = np.log([q.prior for q in qs])
    sub = [qs[j] for j in moving]

    def predict(values: np.ndarray, picks=None, only=None) -> tuple[np.ndarray, list[NcclRun]]:
        full = u.copy()
        full[moving] = values
        chosen = points if only is None else [points[k] for k in only]
        runs = evaluator.runs(apply(start, qs, np.exp(full)), picks, chosen)
        return np.log([r.time_us for r in runs]), runs

    def cost(pred: np.ndarray, values: np.ndarray) -> float:
        return float(np.sum((weights * (pred - measured)) ** 2) + PRIOR_WEIGHT ** 2 * np.sum((values - prior[moving]) ** 2))

    x = u[moving].copy()
    pred, runs = predict(x)
    best = cost(pred, x)
    damping, failures, fresh = 0.05, 0, True
    jac: np.ndarray | None = None
    for iteration in range(iterations):
        if jac is None:
            picks = [(r.algorithm, r.protocol) for r in runs]
            jac = _jacobian(sub, x, pred, runs, picks,
                            lambda v, held, only: predict(v, None if held is None else [held[k] for k in only], only),
                            sizes)
            evaluator.sensitivity[moving] = np.maximum(evaluator.sensitivity[moving], np.max(np.abs(jac), axis=0))
            fresh = True
        residual = np.concatenate([weights * (pred - measured), PRIOR_WEIGHT * (x - prior[moving])])
        full = np.vstack([weights[:, None] * jac, PRIOR_WEIGHT * np.eye(len(moving))])
        normal = full.T @ full
        step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -full.T @ residual)
        largest = float(np.max(np.abs(step)))
        if largest > MAX_STEP:  # a trust region: no quantity changes by more than e^MAX_STEP at once
            step *= MAX_STEP / largest
        candidate = np.clip(x + step, lo[moving], hi[moving])
        cand_pred, cand_runs = predict(candidate)
        cand_cost = cost(cand_pred, candidate)
        progress(iteration + 1)
        if cand_cost < best:
            gain = (best - cand_cost) / max(best, 1e-12)
            moved = candidate - x
            # Broyden's update: the derivatives that explain the step's outcome
            jac = jac + np.outer((cand_pred - pred) - jac @ moved, moved) / max(float(moved @ moved), 1e-30)
            x, pred, runs, best = candidate, cand_pred, cand_runs, cand_cost
            damping = max(damping / 2, 1e-4)
            fresh, failures = False, 0
            if gain < GAIN:
                break
        else:
            damping *= 4
            failures += 1
            if fresh and damping > 1e3:
                break
            if not fresh and failures >= 2:
                jac = None  # the updated derivatives mislead: take them anew
    out = u.copy()
    out[moving] = x
    return out


def _jacobian(qs: Sequence[Quantity], u: np.ndarray, pred: np.ndarray, runs: Sequence[NcclRun],
              picks: Sequence[tuple[str, str]], predict, sizes: np.ndarray) -> np.ndarray:
    """d log(predicted time) / d log(quantity) for every point and quantity: exact for the
    per-call costs (each adds to every time of its protocol), by simulating each group of
    quantities changed together otherwise (a latency of one protocol moves only that
    protocol's points, so one simulation serves a dimension's three). Latencies are not
    simulated at sizes where bytes alone decide (LATENCY_UP_TO), bandwidths not where
    latency alone does (BANDWIDTH_FROM_BYTES): their derivatives there are nil."""
    jac = np.zeros((len(pred), len(qs)))
    times = np.exp(pred)
    groups: dict[str, list[int]] = {}
    for j, q in enumerate(qs):
        if q.group == "call":
            value = math.exp(u[j])
            jac[:, j] = [value / t if r.protocol == q.protocol else 0.0 for r, t in zip(runs, times)]
        elif q.group == "nvls_call":
            value = math.exp(u[j])
            jac[:, j] = [value / t if r.algorithm in ("nvls", "nvlstree") else 0.0 for r, t in zip(runs, times)]
        else:
            groups.setdefault(q.group, []).append(j)
    for group, members in groups.items():
        if group.startswith("alpha"):
            only = [i for i, n in enumerate(sizes) if n <= LATENCY_UP_TO]
        elif group == "nvls":
            only = [i for i, r in enumerate(runs) if r.algorithm in ("nvls", "nvlstree") and sizes[i] >= BANDWIDTH_FROM_BYTES]
        elif group == "engine":
            only = [i for i, r in enumerate(runs) if (r.algorithm, r.protocol) not in (("ring", "Simple"), ("nvls", "Simple"))
                    and sizes[i] >= BANDWIDTH_FROM_BYTES]
        else:
            only = [i for i, n in enumerate(sizes) if n >= BANDWIDTH_FROM_BYTES]
        if not only:
            continue
        # a quantity at its upper bound (an efficiency of 1) is differentiated downward
        step = -STEP if any(math.exp(u[j] + STEP) > qs[j].upper for j in members) else STEP
        moved = u.copy()
        moved[members] += step
        changed, _runs = predict(moved, picks, only)
        column = np.zeros(len(pred))
        column[only] = (changed - pred[only]) / step
        for j in members:
            q = qs[j]
            jac[:, j] = column if q.protocol is None else [c if r.protocol == q.protocol else 0.0
                                                           for c, r in zip(column, runs)]
    return jac
