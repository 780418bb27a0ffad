"""Work a compile can leave to forked children while it goes on: the proofs of a directory's
final programs, each in its own child, at most `jobs` at once (as many as the search's
workers), while the parent lowers the next window and, once it waits for a result, takes
queued work itself. A child shares the parent's memory (fork), so a 1,024-rank program is never
copied to it; only the result comes back.

The result never depends on the children: where no child can be forked (one job, a platform
without fork, a parent that runs threads, or too little free memory for the work's stated
footprint beside the children already running) or a child gives no result (it raised, ran
out of memory or was killed), the parent does the work itself.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from contextlib import ExitStack
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Generic, Hashable, TypeVar

from .collector import settling

T = TypeVar("T")


def can_fork() -> bool:
    """Whether a child may be forked here: Linux, from a process with one thread (a lock
    another thread held at the fork would stay held in the child) that is not itself a
    daemonic worker (which multiprocessing forbids to have children)."""
    return (sys.platform == "linux" and threading.active_count() == 1
            and not multiprocessing.current_process().daemon)


def available_memory() -> int:
    """Bytes this process can still take without swapping: the machine's MemAvailable (free
    pages where the kernel does not say), or less where a cgroup (a container, a Slurm job)
    caps its memory."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        cap = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if cap != "max":
            free = min(free, int(cap) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return free


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
        self.waiting: dict[Hashable, int] = {}  # work not started yet: its footprint, in submit order
        self.running: dict[Hashable, tuple[Any, Connection, int]] = {}  # (child, pipe, footprint), in start order
        self.done: dict[Hashable, T] = {}
        self.stack = ExitStack()  # collector.settling, left by close
        self.settle = self.stack.enter_context(settling())

    def submit(self, key: Hashable, work: Callable[[], T], footprint: int = 0) -> None:
        """Queue `work`; it starts in a child as soon as fewer than `jobs` run and the memory
        the running children may still take leaves `footprint` bytes (the most the work
        allocates) free. Never waits: work still queued when its result is asked for is done
        by the parent then. A key submitted before keeps its first work: its result serves both."""
        if key in self.work:
            return
        self.work[key] = work
        if self.jobs >= 2:
            self.waiting[key] = footprint
        self._start()

    def result(self, key: Hashable) -> T:
        """The result of the work submitted under key: its child's, or computed here. While
        its child runs, the parent does the last queued work rather than wait."""
        while key in self.running and self.waiting and not self.running[key][1].poll():
            last, footprint = next(reversed(self.waiting.items()))
            if not self._fits(footprint):
                break
            del self.waiting[last]
            try:
                self.done[last] = self.work[last]()
            except Exception:  # noqa: BLE001 - it is raised again to whoever asks for that result
                pass
            self._start()
        if key in self.running:
            self._collect(key)
        self.waiting.pop(key, None)
        self._start()  # the children go on with the rest while the parent works or waits
        if key not in self.done:
            self.done[key] = self.work[key]()
        return self.done[key]

    def poll(self) -> None:
        """Collect the children that have finished and start queued work in their place: for a
        parent that goes on with long work of its own between submits."""
        self._start()

    def close(self) -> None:
        """Stop the children still running (a compile that failed does not wait for them)."""
        for child, receive, _footprint in self.running.values():
            child.kill()
            child.join()
            receive.close()
        self.running.clear()
        self.stack.close()

    def __enter__(self) -> Background[T]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _start(self) -> None:
        """Collect the children that have finished, and start waiting work while there is room."""
        for key in [k for k, (_c, receive, _f) in self.running.items() if receive.poll()]:
            self._collect(key)
        for key, footprint in list(self.waiting.items()):  # in order, past any that does not fit yet
            if len(self.running) >= self.jobs or not can_fork():
                return
            if not self._fits(footprint):
                continue
            del self.waiting[key]
            for stream in (sys.stdout, sys.stderr):  # else the child would write the parent's buffered text again
                stream.flush()
            # else the parent's collections would write to every object it shares with the child, and the
            # kernel would copy every page of its heap after each fork
            self.settle()
            try:
                receive, send = multiprocessing.Pipe(duplex=False)
            except OSError:
                return  # no descriptors left: the parent does this work, and the rest, itself
            try:
                child = multiprocessing.get_context("fork").Process(target=_child, args=(self.work[key], send),
                                                                    daemon=True)
                child.start()
            except OSError:  # no memory or processes left for a child: the parent does it
                receive.close()
                continue
            finally:
                send.close()
            self.running[key] = (child, receive, footprint)

    def capacity(self) -> int:
        """Bytes one piece of work could have once the running children end: what is free now,
        and what they reserved (some of which they already hold, so this errs high)."""
        return available_memory() + self._reserved()

    def _fits(self, footprint: int) -> bool:
        """Whether footprint bytes stay free beside all the running children may still take."""
        return available_memory() - self._reserved() >= footprint

    def _reserved(self) -> int:
        return sum(f for _c, _r, f in self.running.values())

    def _collect(self, key: Hashable) -> None:
        child, receive, _footprint = self.running.pop(key)
        try:
            self.done[key] = receive.recv()  # before join: a large result fills the pipe until it is read
        except Exception:  # noqa: BLE001 - no result (the child died, or sent what does not load): `result` does the work
            pass
        except BaseException:  # interrupted: the child must not outlive the wait
            child.kill()
            raise
        finally:
            receive.close()
            child.join()
