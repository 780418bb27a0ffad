"""What the verifier reports: each broken rule with where it broke, the options it checks
against, and the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..runtime import MAX_STEPS, Runtime, runtime

#: A step of a program: (rank, threadblock id, step position).
StepRef = tuple[int, int, int]


@dataclass(frozen=True)
class Violation:
    """One broken rule: a stable rule name, where (rank, threadblock, step) and what was expected."""

    rule: str
    message: str
    rank: int | None = None
    tb: int | None = None
    step: int | None = None

    def __str__(self) -> str:
        where = " ".join(f"{k} {v}" for k, v in (("rank", self.rank), ("tb", self.tb), ("step", self.step)) if v is not None)
        return f"{self.rule}: {where + ': ' if where else ''}{self.message}"

    def to_dict(self) -> dict:
        return {"rule": self.rule, "rank": self.rank, "tb": self.tb, "step": self.step, "message": self.message}


@dataclass(frozen=True)
class VerifyOptions:
    """What to check against: the runtime that will load the file (its threadblock and channel
    limits, unless given tighter), and `nbytes`, the call size for the FIFO model (default:
    maxBytes).

    >>> VerifyOptions(runtime="rccl").threadblock_limit, VerifyOptions(max_threadblocks=108).threadblock_limit
    (64, 108)
    """

    max_steps: int = MAX_STEPS
    max_threadblocks: int | None = None
    max_channels: int | None = None
    rendezvous: bool = False
    nbytes: int | None = None
    max_violations: int = 200
    runtime: str = "executor"

    @property
    def target(self) -> Runtime:
        return runtime(self.runtime)

    @property
    def threadblock_limit(self) -> int:
        limit = self.target.max_threadblocks
        return limit if self.max_threadblocks is None else min(limit, self.max_threadblocks)

    @property
    def channel_limit(self) -> int:
        limit = self.target.max_channels
        return limit if self.max_channels is None else min(limit, self.max_channels)


@dataclass(frozen=True)
class Report:
    """The verdict. `ok` means every checked rule holds; `skipped` names checks that could not run."""

    violations: tuple[Violation, ...]
    checked: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    stats: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    def rules(self) -> set[str]:
        return {v.rule for v in self.violations}

    def summary(self) -> str:
        if self.ok:
            return (f"verified: {', '.join(self.checked)} hold"
                    + (f" ({'; '.join(self.skipped)})" if self.skipped else ""))
        return f"{len(self.violations)} violation(s) of {len(self.rules())} rule(s): {', '.join(sorted(self.rules()))}"


class Collector:
    """Gathers violations, up to a limit, as the checks find them."""

    def __init__(self, limit: int) -> None:
        self.items: list[Violation] = []
        self.limit = limit

    def add(self, rule: str, message: str, rank: int | None = None, tb: int | None = None, step: int | None = None) -> None:
        if len(self.items) < self.limit:
            self.items.append(Violation(rule, message, rank, tb, step))

    def __len__(self) -> int:
        return len(self.items)
