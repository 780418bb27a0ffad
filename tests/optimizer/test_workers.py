"""Worker processes simulate ahead of the search (optimizer/workers.py, judge.py): the search's
choices, times and evaluation counts must not depend on them."""

from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.optimizer.judge import program_key
from hipipe_compiler.optimizer import Knobs, Search, build_plan, optimize
from hipipe_compiler.optimizer.workers import default_jobs
from hipipe_compiler.presets import preset

from conftest import COLLECTIVES, examples, run_hipipe, topologies


def outcome(choices):
    return [(c.plan, c.knobs, c.times_us, c.evaluations, c.alternatives) for c in choices]


@settings(max_examples=examples(4), deadline=None)
@given(topologies(max_ranks=16), st.sampled_from(COLLECTIVES), st.integers(12, 24))
def test_workers_change_no_choice(topo, coll, log_size):
    """Two neighbouring windows (the second starts from the first's choice) searched alone and
    with two workers: the same plans, times, evaluations and alternatives."""
    windows = [(1 << log_size, (2 << log_size) - 1), (2 << log_size, (8 << log_size) - 1)]
    assert outcome(optimize(topo, coll, windows, jobs=2)) == outcome(optimize(topo, coll, windows))


def test_a_time_run_ahead_stands_in_only_for_the_same_lowering():
    """The search lowers a plan as its first judge asked: rank 0 alone for a candidate, every
    rank for a baseline whose ranks differ. A time run ahead for the other lowering is not
    taken; one for the same lowering is, and counts as the evaluation it replaces."""
    topo = preset("torus-4x4")
    plan = build_plan(topo, "allreduce", 1 << 20, 1 << 20, Knobs(2))
    alone = Search(topo, "allreduce").judge(plan, (1 << 20,), Knobs(2))
    search = Search(topo, "allreduce", jobs=2)
    try:
        key = program_key(plan)
        planted: Future = Future()
        planted.set_result(-1.0)
        search.pending[key, 1 << 20] = (True, planted)  # as if run ahead for a baseline's lowering
        ev = search.judge(plan, (1 << 20,), Knobs(2))
        assert ev.times_us == alone.times_us and search.evaluations == 1 and not search.pending
        other = Future()
        other.set_result(-2.0)
        search.pending[key, 1 << 21] = (False, other)  # run ahead for the candidate's own lowering
        assert search.judge(plan, (1 << 21,), Knobs(2)).times_us == (-2.0,) and search.evaluations == 2
    finally:
        search.close()


@pytest.mark.slow
def test_compile_writes_the_same_files_with_any_number_of_jobs(tmp_path):
    """`hipipe compile --jobs` changes when the files are ready, not what they hold; a count
    below one is refused in one line."""
    outs = []
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        done = run_hipipe("compile", "dgx-h100-8x2", "--sizes", "256KiB:16MiB", "--jobs", jobs, "-o", out, "--quiet")
        assert done.returncode == 0, done.stderr
        outs.append({p.name: p.read_text() for p in sorted(out.glob("*.xml"))})
    assert outs[0] == outs[1] and len(outs[0]) >= 2
    bad = run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "--jobs", "0", "-o", tmp_path / "x.xml")
    assert bad.returncode == 2 and "--jobs" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.xml").exists()


def test_hipipe_jobs_sets_the_default_and_a_bad_value_is_one_line(tmp_path, monkeypatch):
    """HIPIPE_JOBS is the default of --jobs (the tests set it to 1: xdist already runs a test
    per core); a value that is not a count is refused before anything is written."""
    monkeypatch.setenv("HIPIPE_JOBS", "2")
    assert default_jobs() == 2
    monkeypatch.setenv("HIPIPE_JOBS", "many")
    bad = run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "-o", tmp_path / "x.xml")
    assert bad.returncode == 2 and "HIPIPE_JOBS" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.xml").exists() and "Traceback" not in bad.stderr
