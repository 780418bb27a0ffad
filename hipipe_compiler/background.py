"""Work a compile can leave to forked children while it goes on: the proofs of a directory's
final programs, each in its own child, at most `jobs` at once, while the parent lowers the
next window. A child shares the parent's memory (fork), so a 1,024-rank program is never
copied to it; only the result comes back.

The result never depends on the children: where no child can be forked (one job, a platform
without fork, or a parent that runs threads) or a child gives no result (it raised, ran out
of memory or was killed), the parent does the work itself.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


def can_fork() -> bool:
    """Whether a child may be forked here: Linux, from a process with one thread (a lock
    another thread held at the fork would stay held in the child)."""
    return sys.platform == "linux" and threading.active_count() == 1


def _child(work: Callable[[], Any], conn: Connection) -> None:
    try:
        conn.send(work())
    except BaseException:  # noqa: BLE001 - the parent does the work again and meets the error itself
        pass
    finally:
        conn.close()


class Background(Generic[T]):
    """Results of work started by `submit` and collected by `result`, keyed by the caller.

    >>> jobs = Background(jobs=2)
    >>> jobs.submit("a", lambda: 6 * 7)
    >>> jobs.result("a")
    42
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.work: dict[Hashable, Callable[[], T]] = {}
        self.running: dict[Hashable, tuple[Any, Connection]] = {}  # in start order
        self.done: dict[Hashable, T] = {}

    def submit(self, key: Hashable, work: Callable[[], T]) -> None:
        """Start `work` in a child, after the oldest running child ends if `jobs` are running."""
        self.work[key] = work
        if self.jobs < 2 or not can_fork():
            return
        while len(self.running) >= self.jobs:
            self._collect(next(iter(self.running)))
        for stream in (sys.stdout, sys.stderr):  # else the child would write the parent's buffered text again
            stream.flush()
        receive, send = multiprocessing.Pipe(duplex=False)
        child = multiprocessing.get_context("fork").Process(target=_child, args=(work, send), daemon=True)
        child.start()
        send.close()
        self.running[key] = (child, receive)

    def result(self, key: Hashable) -> T:
        """The result of the work submitted under key: its child's, or computed here."""
        if key in self.running:
            self._collect(key)
        if key not in self.done:
            self.done[key] = self.work[key]()
        return self.done.pop(key)

    def close(self) -> None:
        """Stop the children still running (a compile that failed does not wait for them)."""
        for child, receive in self.running.values():
            child.kill()
            child.join()
            receive.close()
        self.running.clear()

    def __enter__(self) -> Background[T]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _collect(self, key: Hashable) -> None:
        child, receive = self.running.pop(key)
        try:
            self.done[key] = receive.recv()  # before join: a large result fills the pipe until it is read
        except (EOFError, OSError):
            pass  # no result: `result` does the work here
        finally:
            receive.close()
            child.join()
