"""Training planner: every policy on one layer profile and network, the plan document
(plan.json) and the directory of MSCCL programs a plan needs.

`plan_training` runs the policies (policies.py) and times each iteration (iteration.py) with
collective costs from a `CommCostModel` (commcost.py); `write_plan` writes one policy's plan.

>>> from hipipe_compiler.training.commcost import AlphaBetaCost
>>> from hipipe_compiler.training.profiles import profile_from_document
>>> profile = profile_from_document({"model": "toy", "dtype_bytes": 4, "layers": [
...     {"name": f"l{i}", "params": 1 << 20, "fwd_ms": 1.0, "bwd_ms": 2.0} for i in range(4)]})
>>> report = plan_training(profile, AlphaBetaCost.ring(8, 10.0, 5.0), world_size=8)
>>> report.compute_ms, round(report["wfbp"].iteration_ms, 3), report.best
(12.0, 12.804, 'wfbp')
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ..compiler import CompiledWindow, VerificationFailed, verify_options, write_directory
from ..documents import validate_document
from ..errors import InputError
from ..files import check_output_path, write_atomic, writing
from ..msccl.verify import verify
from ..units import format_size
from ..windows import window_of
from .buckets import TrainingPlan, build_plan
from .commcost import COLLECTIVES, CommCostModel, SimulatedCost, cached
from .iteration import Simulation, simulate
from .policies import baseline_schedules, hipipe_schedule
from .profiles import LayerProfile

#: Every policy, in report order; `hipipe` (ours) is searched from the best of the others.
POLICIES: tuple[str, ...] = ("wfbp", "ddp", "dear", "pipedap", "hipipe")
PLAN_SCHEMA = "plan.schema.json"
#: Where `write_plan` puts the programs, inside the plan directory (point MSCCL_ALGO_DIR here).
PROGRAMS_DIR = "msccl-algorithms"


@dataclass(frozen=True)
class ProgramNeed:
    """One MSCCL program a plan calls: a collective over the compiler's size window
    [min_bytes, max_bytes], and the exact call sizes (after padding) it serves."""

    collective: str
    min_bytes: int
    max_bytes: int
    sizes: tuple[int, ...]

    @property
    def id(self) -> str:
        """Also the program's file name (with .xml) in the plan's msccl-algorithms/."""
        return f"{self.collective}-{format_size(self.min_bytes)}-{format_size(self.max_bytes + 1)}"


def programs_needed(plan: TrainingPlan, cost: CommCostModel) -> tuple[ProgramNeed, ...]:
    """Collectives and call sizes (nccl-tests convention) of a plan, grouped by size window."""
    sizes: dict[tuple[str, int, int], set[int]] = {}
    for op in plan.ops:
        nbytes = cost.call_bytes(op.collective, plan.buckets[op.bucket].padded_bytes)
        w = window_of(nbytes)
        sizes.setdefault((op.collective, w.min_bytes, w.max_bytes), set()).add(nbytes)
    order = {c: i for i, c in enumerate(COLLECTIVES)}
    return tuple(ProgramNeed(c, lo, hi, tuple(sorted(s)))
                 for (c, lo, hi), s in sorted(sizes.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])))


@dataclass(frozen=True)
class PolicyResult:
    """One policy's plan, its simulation and the programs it needs."""

    policy: str
    plan: TrainingPlan
    simulation: Simulation
    programs: tuple[ProgramNeed, ...]

    @property
    def call_bytes(self) -> tuple[int, ...]:
        """Per op, the size the call is made with: its bucket's size, padded for its programs."""
        return tuple(self.plan.buckets[op.bucket].padded_bytes for op in self.plan.ops)

    @property
    def iteration_ms(self) -> float:
        return self.simulation.iteration_ms

    @property
    def exposed_comm_ms(self) -> float:
        return self.simulation.exposed_comm_ms


@dataclass(frozen=True)
class TrainingReport:
    """Every requested policy on one profile and cost model, in `POLICIES` order."""

    profile: LayerProfile
    world_size: int
    pad_multiple: int
    results: tuple[PolicyResult, ...]
    cost_model: str = ""

    def __getitem__(self, policy: str) -> PolicyResult:
        for result in self.results:
            if result.policy == policy:
                return result
        raise KeyError(policy)

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(r.policy for r in self.results)

    @property
    def compute_ms(self) -> float:
        return self.profile.compute_ms

    @property
    def best(self) -> str:
        """The policy with the lowest iteration time (the earliest listed on ties)."""
        return min(self.results, key=lambda r: r.iteration_ms).policy

    def summary(self) -> dict[str, dict[str, float]]:
        """policy -> iteration_ms, exposed_comm_ms, link_busy_ms (the `--json` shape)."""
        return {r.policy: {"iteration_ms": r.iteration_ms, "exposed_comm_ms": r.exposed_comm_ms,
                           "link_busy_ms": r.simulation.link_busy_ms} for r in self.results}


def bucket_call_bytes(cost: CommCostModel, collectives: Sequence[str], nbytes: int) -> int:
    """The least size >= nbytes that the programs of every collective of a bucket accept, so
    that its reduce-scatter and all-gather cut the bucket into the same shards."""
    size = nbytes
    while True:
        padded = size
        for collective in collectives:
            padded = cost.call_bytes(collective, padded)
        if padded == size:
            return size
        size = padded


def padded_to_programs(plan: TrainingPlan, cost: CommCostModel) -> TrainingPlan:
    """`plan` with every bucket padded to a size all its ops' programs accept."""
    colls: dict[int, list[str]] = {}
    for op in plan.ops:
        colls.setdefault(op.bucket, []).append(op.collective)
    buckets = tuple(replace(b, padded_bytes=bucket_call_bytes(cost, colls[b.id], b.padded_bytes)) for b in plan.buckets)
    return replace(plan, buckets=buckets)


def plan_training(profile: LayerProfile, cost: CommCostModel, world_size: int, policies: Sequence[str] | None = None,
                  pad_multiple: int = 1, search_evals: int = 400) -> TrainingReport:
    """Plan and simulate each policy (default: all of `POLICIES`) for one training iteration.

    Bucket element counts are padded to a multiple of lcm(pad_multiple, world_size), since a
    reduce-scatter splits a bucket over the ranks. `hipipe` always starts from the best of
    the other four, whether or not they are requested.
    """
    wanted = tuple(POLICIES if policies is None else policies)
    unknown = [p for p in wanted if p not in POLICIES]
    if unknown:
        raise InputError(None, "policy", f"expected one of {', '.join(POLICIES)}, got {unknown[0]!r}")
    if not (isinstance(world_size, int) and world_size >= 1):
        raise InputError(None, "world_size", f"expected an integer >= 1, got {world_size!r}")
    if not (isinstance(pad_multiple, int) and pad_multiple >= 1):
        raise InputError(None, "pad_multiple", f"expected an integer >= 1, got {pad_multiple!r}")
    pad = math.lcm(pad_multiple, world_size)
    cache = cached(cost)
    schedules = baseline_schedules(profile, cache, pad)
    if "hipipe" in wanted:
        schedules["hipipe"] = hipipe_schedule(profile, cache, list(schedules.values()), pad, search_evals)
    results = []
    for policy in POLICIES:
        if policy in wanted:
            plan = padded_to_programs(build_plan(profile, schedules[policy], policy, pad), cache)
            results.append(PolicyResult(policy, plan, simulate(plan, profile, cache), programs_needed(plan, cache)))
    return TrainingReport(profile, world_size, pad, tuple(results), describe_cost(cost))


def describe_cost(cost: CommCostModel) -> str:
    """Where a cost model's times come from, for reports."""
    if isinstance(cost, SimulatedCost):
        name = cost.topology.name or f"{cost.topology.nranks}-rank topology"
        return f"simulated {cost.algorithm} programs on {name}"
    return type(cost).__name__


def plan_document(report: TrainingReport, policy: str = "hipipe", topology: str | None = None) -> dict[str, Any]:
    """The plan.json dict of one policy (schemas/plan.schema.json), validated."""
    try:
        result = report[policy]
    except KeyError:
        raise InputError(None, "policy", f"expected one of {', '.join(report.policies)}, got {policy!r}") from None
    plan, profile, sim = result.plan, report.profile, result.simulation
    names = [layer.name for layer in profile.layers]
    program_of = {(need.collective, size): need.id for need in result.programs for size in need.sizes}
    ready = profile.grad_ready_ms
    buckets = [{"id": b.id, "layers": [names[i] for i in b.layers], "elems": b.params, "padded_elems": b.padded_bytes // profile.dtype_bytes,
                "bytes": b.bytes, "padded_bytes": b.padded_bytes, "primitive": plan.primitives[b.id],
                "grad_ready_ms": float(ready[list(b.layers)].max())} for b in plan.buckets]
    ops = []
    for op in plan.ops:
        after: list[dict[str, Any]] = [{"grad_ready": op.bucket}] if op.grad_ready else []
        if op.forward_start is not None:
            after.append({"forward_start": names[op.forward_start]})
        after += [{"op_done": seq} for seq in op.after]
        call = result.call_bytes[op.seq]
        ops.append({"seq": op.seq, "op": op.kind, "bucket": op.bucket, "program": program_of[(op.collective, call)],
                    "bytes": plan.buckets[op.bucket].padded_bytes, "call_bytes": call, "lane": op.lane, "phase": op.phase,
                    "after": after})
    doc: dict[str, Any] = {
        "schema": "schedule-plan/v1", "profile": profile.name, "world_size": report.world_size,
        "pad_multiple": plan.pad_multiple, "dtype_bytes": profile.dtype_bytes, "policy": policy,
        "options": {"barrier": plan.schedule.barrier, "prefetch": plan.schedule.prefetch, "ag_lane": plan.schedule.ag_lane},
        "buckets": buckets,
        "programs": [{"id": n.id, "coll": n.collective, "min_bytes": n.min_bytes, "max_bytes": n.max_bytes, "sizes": list(n.sizes),
                      "xml": f"{PROGRAMS_DIR}/{n.id}.xml"} for n in result.programs],
        "ops": ops,
        "forward_waits": {names[l]: [{"op_done": seq} for seq in w] for l, w in enumerate(plan.forward_waits) if w},
        "predicted": {"iteration_ms": sim.iteration_ms, "exposed_comm_ms": sim.exposed_comm_ms,
                      "link_busy_ms": sim.link_busy_ms, "compute_ms": sim.compute_ms},
        "notes": list(profile.notes),
    }
    if topology:
        doc["topology"] = topology
    if report.cost_model:
        doc["cost_model"] = report.cost_model
    validate_document(doc, PLAN_SCHEMA, f"plan ({policy})")
    return doc


def plan_programs(result: PolicyResult, cost: SimulatedCost) -> list[tuple[ProgramNeed, CompiledWindow]]:
    """The verified program of every window a plan calls, compiled for the cost's topology.

    Raises VerificationFailed if one does not verify (a compiler bug: nothing is written)."""
    out = []
    for need in result.programs:
        cw = cost.compiled(need.collective, need.max_bytes)
        report = verify(cw.program, verify_options(cost.options.limits))
        if not report.ok:
            raise VerificationFailed(cw.window, report)
        out.append((need, cw))
    return out


def write_plan(report: TrainingReport, policy: str, cost: SimulatedCost, path: str | Path,
               topology: str | None = None) -> dict[str, Any]:
    """Write DIR/plan.json and DIR/msccl-algorithms/ (one verified XML per program the plan
    calls, ready for MSCCL_ALGO_DIR); everything is built before the first file is written.
    Returns the plan document."""
    path = check_output_path(path, directory=True)
    if (path / "plan.json").is_dir():
        raise InputError(str(path / "plan.json"), None, "expected to write the plan here, but a directory is there")
    doc = plan_document(report, policy, topology)
    programs = plan_programs(report[policy], cost)
    text = json.dumps(doc, indent=2) + "\n"
    manifest = {"plan": "../../plan.json", "policy": policy, "profile": report.profile.name,
                "runtime": cost.options.limits.runtime}
    with writing(path):
        path.mkdir(exist_ok=True)
    # the directory holds this plan's programs only: older ones would compete for selection
    write_directory([cw for _, cw in programs], path / PROGRAMS_DIR, manifest,
                    names=[f"{need.id}.xml" for need, _ in programs], replaces=lambda name: True)
    with writing(path / "plan.json"):
        write_atomic(path / "plan.json", text)
    return doc
