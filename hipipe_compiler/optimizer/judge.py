"""The search's judge: candidate plans lowered and simulated (rank 0 alone where that is
exact), their times cached per program shape and size (`program_key`), and counted, since the
count is the search's budget; with workers, simulations run ahead of the search's asking
(workers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Sequence

from ..bounds import lower_bound_us
from ..errors import PlanError
from ..lower import lower, lowering_key, same_schedule
from ..msccl.program import Program
from ..msccl.runtime import Limits
from ..msccl.selection import count_multiple
from ..schedule.plan import Plan, plan_shape
from ..sim.simulate import SimulationError, probe_ranks, simulate
from ..topology import Topology
from .knobs import Knobs
from .workers import Workers


def program_key(plan: Plan) -> tuple:
    """Equal for plans that lower to one program up to names and the numbering of lanes (a
    spread, or all-gather lanes under `fan`): they run in the same time, so one simulation
    serves them all."""
    return lowering_key(plan_shape(plan))


@dataclass(frozen=True)
class Evaluation:
    """One candidate plan and its simulated times at the sizes it was judged at."""

    knobs: Knobs | None
    plan: Plan
    times_us: tuple[float, ...]
    score: float  # mean of T / T_LB over the judged sizes (lower is better)


class Search:
    """Judges candidate plans with the quotient simulator, caching lowered programs."""

    def __init__(self, topology: Topology, collective: str, limits: Limits | None = None, dtype_bytes: int = 4,
                 max_nchunksperloop: int | None = None, jobs: int = 1) -> None:
        self.topology = topology
        self.collective = collective
        self.limits = limits or Limits()
        self.dtype_bytes = dtype_bytes
        self.max_nchunksperloop = max_nchunksperloop
        self.programs: dict = {}
        self.symmetric: dict = {}
        self.times: dict = {}
        self.evaluations = 0
        self.simulations = 0  # what evaluations cost: plans of one shape share one
        self.counted: set = set()  # (lowering key, size): the budget counts each lowering once, shared or not
        self.whole: dict = {}  # program key -> whether its first judge simulated every rank's program (a baseline's)
        self.unfit: set = set()  # (program key, whole) that do not fit the runtime
        self.pending: dict = {}  # (program key, size) -> (whole, the worker's future time)
        self.workers = Workers(jobs, partial(Search, topology, collective, self.limits)) if jobs > 1 else None

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self.workers is not None:
            self.workers.close()

    def _lowered(self, plan: Plan, baseline: bool) -> tuple[Program, bool] | None:
        """The program to simulate and whether rank 0 alone stands for every rank, or None
        when the plan does not fit the runtime. A flat ring is never the same on every rank;
        a baseline whose ranks differ (see `exact`) is simulated in full, since HiPIPE must
        beat its real time."""
        try:
            if plan.flat:
                return lower(plan, self.limits), False
            rank0 = lower(plan, self.limits, ranks=[0])  # fails fast when the plan does not fit
            if baseline and not self.exact(plan):
                return lower(plan, self.limits), False
            return rank0, True
        except PlanError:
            return None

    def divides(self, plan: Plan, nbytes: int) -> bool:
        """The runtime only runs a program when nchunksperloop divides the element count."""
        return nbytes % (plan.nchunksperloop * self.dtype_bytes) == 0

    def allowed(self, plan: Plan, cap: int | None = None) -> bool:
        """Whether the plan's nchunksperloop is within the user's cap (--max-nchunksperloop),
        and the element multiple its calls need within the window's own `cap`, if any."""
        if self.max_nchunksperloop is not None and plan.nchunksperloop > self.max_nchunksperloop:
            return False
        return cap is None or count_multiple(plan.collective, self.topology.nranks, plan.nchunksperloop) <= cap

    def exact(self, plan: Plan) -> bool:
        """Whether rank 0 alone times `plan` exactly: every probe rank runs rank 0's schedule
        shifted. Checked only for candidates that could win."""
        if plan.flat:
            return True  # simulated in full
        key = program_key(plan)
        if key not in self.symmetric:
            try:
                self.symmetric[key] = same_schedule(plan, probe_ranks(self.topology), self.limits)
            except PlanError:
                self.symmetric[key] = False
        return self.symmetric[key]

    def simulated(self, plan: Plan, size: int, baseline: bool) -> float | None:
        """The plan's simulated time at size (inf when the simulation fails), or None when it
        does not fit the runtime; `baseline` as in `_lowered`. Not counted as an evaluation."""
        key = (program_key(plan), baseline)
        if key not in self.programs:
            self.programs[key] = self._lowered(plan, baseline)
        entry = self.programs[key]
        if entry is None:
            return None
        program, quotient = entry
        try:
            return simulate(program, self.topology, size, quotient=quotient).time_us
        except SimulationError:
            return math.inf

    def prefetch(self, plan: Plan, sizes: Sequence[int], knobs: Knobs | None = None) -> None:
        """Start the simulations `judge(plan, sizes, knobs)` would run, in the workers (if any)."""
        if self.workers is None:
            return
        key = program_key(plan)
        whole = self.whole.get(key, knobs is None)
        if (key, whole) in self.unfit:
            return
        for size in sizes:
            if (key, size) not in self.times and (key, size) not in self.pending:
                self.pending[key, size] = (whole, self.workers.submit(plan, size, whole))

    def drop_pending(self) -> None:
        """Forget the simulations run ahead that were not asked for (those not started yet stop)."""
        for _whole, future in self.pending.values():
            future.cancel()
        self.pending.clear()

    def judge(self, plan: Plan, sizes: Sequence[int], knobs: Knobs | None = None) -> Evaluation | None:
        """Simulate `plan` at each size (rank 0 alone when that is exact); None when the plan
        does not fit the runtime or is not the same on every rank. A plan lowers as its
        first judge asked (a baseline's every rank, where they differ), whoever asks later."""
        key = program_key(plan)
        whole = self.whole.setdefault(key, knobs is None)
        if (key, whole) in self.unfit:
            return None
        lowered = lowering_key(plan)  # what the budget counts: each lowering once, shared or not
        times = []
        for size in sizes:
            tkey = (key, size)
            if tkey not in self.times:
                ahead = self.pending.pop(tkey, None)
                taken = ahead is not None and ahead[0] == whole  # run ahead for the same lowering
                time = ahead[1].result() if taken else self.simulated(plan, size, whole)  # type: ignore[index]
                if time is None:
                    self.unfit.add((key, whole))
                    return None
                self.times[tkey] = time
                self.simulations += 1
            if (lowered, size) not in self.counted:  # a time shared with a plan of one shape costs as before
                self.counted.add((lowered, size))
                self.evaluations += 1
            times.append(self.times[tkey])
        bounds = (lower_bound_us(self.topology, self.collective, s, in_switch=False) or 1.0 for s in sizes)
        score = sum(t / b for t, b in zip(times, bounds)) / len(sizes)
        return Evaluation(knobs, plan, tuple(times), score)
