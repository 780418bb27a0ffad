"""Work left to forked children: the same results as in the parent, whatever the children do."""

import gc
import multiprocessing
import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler import background
from hipipe_compiler.background import Background, can_fork

needs_fork = pytest.mark.skipif(not can_fork(), reason="forking children needs Linux and a process with one thread")


def _in_child(parent: int) -> bool:
    return os.getpid() != parent


@needs_fork
@settings(max_examples=8, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(-50, 50), min_size=1, max_size=6))
def test_children_give_what_the_parent_would(jobs, values):
    parent = os.getpid()
    with Background[tuple](jobs) as work:
        for i, v in enumerate(values):
            work.submit(i, lambda v=v: (v * v, _in_child(parent)))
            assert len(work.running) <= (jobs if jobs > 1 else 0)
        results = [work.result(i) for i in range(len(values))]
    assert [r[0] for r in results] == [v * v for v in values]
    assert results[0][1] == (jobs > 1)  # with one job, nothing is forked; else the first starts at once
    assert not work.running and not work.waiting


@needs_fork
def test_poll_starts_queued_work_once_a_child_is_done_without_a_submit_or_a_wait():
    parent = os.getpid()
    def slow() -> bool:
        time.sleep(1.0)  # the first two still run when the third is submitted
        return _in_child(parent)

    with Background[bool](2) as work:
        for key in range(3):
            work.submit(key, slow)
        assert list(work.waiting) == [2]
        deadline = time.monotonic() + 30
        while work.waiting and time.monotonic() < deadline:  # the parent busy with work of its own
            work.poll()
            time.sleep(0.01)
        assert not work.waiting  # the third started in a child as soon as one of the first two was done
        assert [work.result(k) for k in range(3)] == [True, True, True]


@needs_fork
def test_a_child_that_dies_or_raises_leaves_the_work_to_the_parent():
    parent = os.getpid()

    def dies() -> str:
        if _in_child(parent):
            os._exit(3)
        return "parent"

    def raises() -> str:
        if _in_child(parent):
            raise MemoryError
        return "parent too"

    def unpicklable():
        return (lambda: None) if _in_child(parent) else "parent as well"

    with Background[str](2) as work:
        for key, fn in (("dies", dies), ("raises", raises), ("unpicklable", unpicklable)):
            work.submit(key, fn)
        assert [work.result(k) for k in ("dies", "raises", "unpicklable")] == ["parent", "parent too", "parent as well"]


@needs_fork
def test_an_error_of_the_work_itself_reaches_the_caller():
    with Background[int](2) as work:
        work.submit("bad", lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            work.result("bad")


@needs_fork
def test_closing_stops_the_children_still_running():
    parent = os.getpid()
    work = Background[int](2)
    work.submit("slow", lambda: time.sleep(600) if _in_child(parent) else 0)
    (child, _pipe, _footprint), = work.running.values()
    start = time.monotonic()
    work.close()
    assert time.monotonic() - start < 60 and not child.is_alive() and not work.running


def test_no_child_is_forked_while_another_thread_runs(monkeypatch):
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not can_fork()
        with Background[int](4) as work:
            work.submit(1, lambda: os.getpid())
            assert not work.running
            assert work.result(1) == os.getpid()
    finally:
        stop.set()
        thread.join()
    monkeypatch.setattr(background.sys, "platform", "darwin")
    assert not can_fork()


@needs_fork
def test_a_child_is_forked_only_where_memory_leaves_room_for_its_footprint(monkeypatch):
    monkeypatch.setattr(background, "available_memory", lambda: 10)
    parent = os.getpid()
    held, release = os.pipe()

    def until_released() -> bool:  # still running when the third is submitted, however loaded the machine
        os.read(held, 1)
        return _in_child(parent)

    with Background[bool](2) as work:
        work.submit("too large", lambda: _in_child(parent), footprint=11)
        assert not work.running
        work.submit("fits", until_released, footprint=6)
        assert list(work.running) == ["fits"]
        work.submit("fits once the first is done", lambda: _in_child(parent), footprint=6)
        assert list(work.running) == ["fits"] and list(work.waiting) == ["too large", "fits once the first is done"]
        os.write(release, b"x")
        work.running["fits"][0].join(60)
        assert work.result("fits")
        assert list(work.running) == ["fits once the first is done"]  # started as the first was collected
        assert [work.result(k) for k in ("fits once the first is done", "too large")] == [True, False]
    os.close(held)
    os.close(release)


@needs_fork
def test_while_a_child_runs_the_parent_takes_the_last_queued_work():
    parent = os.getpid()
    a, b = os.pipe(), os.pipe()

    def release() -> bool:
        os.write(a[1], b"x")
        os.write(b[1], b"x")
        return _in_child(parent)

    with Background[bool](2) as work:
        work.submit("waits for a", lambda: os.read(a[0], 1) == b"x" and _in_child(parent))
        work.submit("waits for b", lambda: os.read(b[0], 1) == b"x" and _in_child(parent))
        work.submit("queued first", lambda: _in_child(parent))
        work.submit("fails", lambda: 1 // 0)
        work.submit("queued last", release)
        assert list(work.running) == ["waits for a", "waits for b"]
        # the parent does the last queued work, which lets the children finish, then collects the first
        assert work.result("waits for a")
        assert work.result("queued last") is False
        assert work.result("waits for b")
        work.result("queued first")  # by a child or by the parent, as the race of the two falls
        with pytest.raises(ZeroDivisionError):  # whoever did it, its error reaches the one who asks for it
            work.result("fails")
    for fd in (*a, *b):
        os.close(fd)


@needs_fork
def test_the_parent_takes_queued_work_only_where_memory_leaves_room(monkeypatch):
    monkeypatch.setattr(background, "available_memory", lambda: 10)
    parent = os.getpid()
    release = os.pipe()
    with Background[bool](2) as work:
        work.submit("waits", lambda: os.read(release[0], 1) == b"x" and _in_child(parent), footprint=4)
        work.submit("too large beside it", lambda: os.write(release[1], b"x") == 1 and _in_child(parent), footprint=7)
        assert list(work.running) == ["waits"] and list(work.waiting) == ["too large beside it"]
        os.write(release[1], b"x")
        assert work.result("waits")  # waited for its child rather than take the other work
        assert list(work.running) == ["too large beside it"]
        assert work.result("too large beside it")
    for fd in release:
        os.close(fd)


@needs_fork
def test_a_failed_fork_leaves_the_work_to_the_parent(monkeypatch):
    def refused(_self):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(multiprocessing.get_context("fork").Process, "start", refused)
    parent = os.getpid()
    with Background[bool](2) as work:
        work.submit("a", lambda: _in_child(parent))
        assert not work.running and not work.waiting
        assert work.result("a") is False


@needs_fork
def test_an_interrupted_wait_stops_the_child_and_gc_is_left_as_it_was(monkeypatch):
    parent = os.getpid()
    gc.unfreeze()  # what an earlier test froze: from none, every object frozen for the fork is handed back
    work = Background[int](2)
    work.submit("slow", lambda: time.sleep(600) if _in_child(parent) else 0)
    (child, pipe, _footprint), = work.running.values()
    assert gc.get_freeze_count() > 0

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipe, "recv", interrupted)
    monkeypatch.setattr(pipe, "poll", lambda *_: True)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        work.result("slow")
    assert time.monotonic() - start < 60 and not child.is_alive()
    work.close()
    assert gc.get_freeze_count() == 0


def test_the_machine_reports_some_memory_free():
    assert 0 < background.available_memory() < 1 << 50
