"""Errors that the command line turns into one clear line and an exit code."""

from __future__ import annotations


class InputError(Exception):
    """Bad input (exit 2): names the source file, the field and what was expected.

    >>> str(InputError("topo.yaml", "dimensions[0].size", "expected an integer >= 2, got 1"))
    'topo.yaml: dimensions[0].size: expected an integer >= 2, got 1'
    """

    def __init__(self, source: str | None, field: str | None, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        return ": ".join([*parts, self.message])


class PlanError(Exception):
    """A plan that cannot be lowered within the runtime's limits; the message says why."""
