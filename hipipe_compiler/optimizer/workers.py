"""Simulations the search will ask for, run ahead in worker processes (`hipipe compile
--jobs`). The search still asks for every simulation in the same order and takes the same
decisions; a worker's result only stands in for the simulation the search would run itself,
so the choices never depend on the number of workers."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable

from ..errors import InputError

#: Workers `hipipe compile` starts at most by default: the search seldom has more candidates
#: it is sure to ask for next.
MAX_JOBS = 8
#: The search a worker process simulates with (its own caches of lowered programs).
_WORKER: Any = None


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_jobs() -> int:
    """`hipipe compile`'s default --jobs: HIPIPE_JOBS if set, else a worker per usable core
    up to MAX_JOBS. InputError names the variable when it is not a count."""
    value = os.environ.get("HIPIPE_JOBS")
    if value is None:
        return min(usable_cores(), MAX_JOBS)
    if not value.strip().isdigit() or int(value) < 1:
        raise InputError("environment", "HIPIPE_JOBS", f"expected an integer of at least 1, got {value!r}")
    return int(value)


def _start(make: Callable[[], Any]) -> None:
    global _WORKER
    _WORKER = make()


def _simulated(plan: Any, size: int, full: bool) -> float | None:
    return _WORKER.simulated(plan, size, full)


class Workers:
    """A pool of `jobs` processes, each with the search that `make` builds, started on the
    first request and closed by `close`."""

    def __init__(self, jobs: int, make: Callable[[], Any]) -> None:
        self.jobs = jobs
        self.make = make
        self.pool: ProcessPoolExecutor | None = None

    def submit(self, plan: Any, size: int, full: bool) -> Future:
        """The plan's simulated time at size (None: it does not fit the runtime), in a worker."""
        if self.pool is None:
            # fork shares the loaded package, but is safe only from a process with one thread (and on
            # Linux); elsewhere the workers start fresh interpreters
            method = "fork" if sys.platform == "linux" and threading.active_count() == 1 else "spawn"
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context(method),
                                            initializer=_start, initargs=(self.make,))
        return self.pool.submit(_simulated, plan, size, full)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
