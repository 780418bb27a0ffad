"""Work left to forked children: the same results as in the parent, whatever the children do."""

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
@given(st.integers(1, 3), st.lists(st.integers(-50, 50), min_size=1, max_size=6))
def test_children_give_what_the_parent_would(jobs, values):
    parent = os.getpid()
    with Background[tuple](jobs) as work:
        for i, v in enumerate(values):
            work.submit(i, lambda v=v: (v * v, _in_child(parent)))
            assert len(work.running) <= (jobs if jobs > 1 else 0)
        results = [work.result(i) for i in range(len(values))]
    assert [r[0] for r in results] == [v * v for v in values]
    assert all(r[1] for r in results) == (jobs > 1)  # with one job, nothing is forked


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
    (child, _pipe), = work.running.values()
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
