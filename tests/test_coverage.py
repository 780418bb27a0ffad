"""coverage.py and `hipipe coverage`: which calls of a training job a directory serves, DDP's
buckets as DDP builds them, and bad input refused in one line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipipe_compiler.coverage import coverage, ddp_buckets, directory_headers, directory_programs, read_counts
from hipipe_compiler.errors import InputError
from hipipe_compiler.msccl.program import Program

from conftest import examples, run_hipipe, shared_path

TOPO = {"name": "t4", "dimensions": [{"name": "a", "size": 2, "kind": "switch", "bandwidth": 100, "latency": 1.0},
                                     {"name": "b", "size": 2, "kind": "switch", "bandwidth": 50, "latency": 2.0}]}


def header(nch: int, lo: int, hi: int, ngpus: int = 4, coll: str = "allreduce") -> Program:
    return Program("p", coll, "Simple", 1, nch, ngpus, True, True, lo, hi, ())


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """A compiled all-reduce directory for 4 ranks, 1 KiB to 4 MiB."""
    root = tmp_path_factory.mktemp("cov")
    (root / "t4.json").write_text(json.dumps(TOPO))
    done = run_hipipe("compile", root / "t4.json", "--sizes", "1KiB:4MiB", "-o", root / "algos", "--quiet")
    assert done.returncode == 0, done.stderr
    return root / "algos"


def test_each_call_is_decided_and_padded():
    files = [("small.xml", header(64, 1024, (1 << 20) - 1)), ("large.xml", header(256, 1 << 20, 1 << 24))]
    report = coverage(files, [64 * 100, 64 * 100 + 1, 256 * 2048, 256 * 2048 + 8, 1 << 23], dtype_bytes=4, world_size=4)
    assert [c.file for c in report.calls_detail] == ["small.xml", None, "large.xml", None, None]
    assert report.calls_detail[1].why_not == "6401 elements are not a multiple of nchunksperloop 64"
    assert report.calls_detail[4].why_not == f"no window holds {4 << 23} bytes"
    assert [c.padded_count for c in report.calls_detail] == [6400, 6464, 524288, 524544, None]
    assert report.padded_served_calls == 4 and report.padded_extra_bytes == 4 * (63 + 248)
    doc = report.to_dict()
    assert {"calls", "served_calls", "bytes", "served_bytes", "padded"} <= set(doc)
    assert doc["padded"] == {"served_calls": 4, "extra_bytes": 4 * (63 + 248)}


@settings(max_examples=examples(100))
@given(st.lists(st.integers(1, 5_000_000), min_size=1, max_size=60), st.integers(1, 64), st.integers(1, 8))
def test_ddp_buckets_are_ddps_own(numels, cap_mib_16ths, first_mib_16ths):
    """Against torch's own assignment (reducer.cpp), where torch is installed."""
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]'")
    import torch.distributed as dist
    cap, first = cap_mib_16ths << 16, first_mib_16ths << 16
    mine = ddp_buckets([(f"t{i}", n) for i, n in enumerate(numels)], 4, cap, first)
    tensors = [torch.empty(n) for n in reversed(numels)]  # DDP hands its parameters over in reverse
    theirs, _limits = dist._compute_bucket_assignment_by_size(tensors, [first, cap])
    assert [count for _label, count in mine] == [sum(numels[len(numels) - 1 - i] for i in bucket) for bucket in theirs]


def test_directory_programs_refuses_what_the_runtime_could_not_use(tmp_path, directory):
    with pytest.raises(InputError, match="no allreduce program among its 0 file"):
        directory_programs(tmp_path)
    files, world = directory_programs(directory)
    assert world == 4 and files and all(p.ngpus == 4 for _n, p in files)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in directory.iterdir():
        if f.is_file():
            (mixed / f.name).write_bytes(f.read_bytes())
            (mixed / f"x8-{f.name}").write_bytes(f.read_bytes().replace(b'ngpus="4"', b'ngpus="8"'))
    with pytest.raises(InputError, match="are for 4, 8 ranks; pick one with --world-size"):
        directory_programs(mixed)
    assert directory_programs(mixed, world_size=4)[1] == 4


def test_read_counts_names_the_bad_line(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("# bucket counts\n1024\n\n2048  # second\n")
    assert read_counts(good) == [1024, 2048]
    bad = tmp_path / "bad.txt"
    bad.write_text("1024\n12.5\n")
    with pytest.raises(InputError, match=r"line 2: expected a whole number of elements >= 1, got '12.5'"):
        read_counts(bad)
    for text, words in (("1024\n2²\n", ">= 1"), ("1024\n" + "9" * 5000 + "\n", "18 digits")):  # not ASCII, too long
        bad.write_text(text)
        with pytest.raises(InputError, match=f"line 2: expected a whole number of elements .*{words}"):
            read_counts(bad)
    bad.write_bytes(b"1024\n\x80\x81\n")
    with pytest.raises(InputError, match="not UTF-8 text"):
        read_counts(bad)


def test_hipipe_coverage_reports_served_calls_and_padding(tmp_path, directory):
    counts = tmp_path / "counts.txt"
    counts.write_text("65536\n65537\n262144\n")
    done = run_hipipe("coverage", directory, "--counts", counts, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["calls"] == 3 and doc["bytes"] == 4 * (65536 + 65537 + 262144)
    assert doc["served_calls"] == 2 and doc["padded"]["served_calls"] == 3 and 0 < doc["padded"]["extra_bytes"] < 4096
    assert doc["detail"][1]["why_not"].startswith("65537 elements are not a multiple of nchunksperloop")
    text = run_hipipe("coverage", directory, "--counts", counts)
    assert text.returncode == 0 and "served: 2 of 3 calls" in text.stdout and "65537" in text.stdout
    assert doc["scratch_bytes_at_most"] is None and "scratch" not in text.stdout  # MSCCL XML: the runtime's own


@pytest.mark.parametrize("case", ["empty", "mixed", "legacy", "profile", "count"])
def test_hipipe_coverage_bad_input_is_one_line_and_exit_2(case, tmp_path, directory):
    counts = tmp_path / "counts.txt"
    counts.write_text("1024\n")
    target, args, expected = directory, ["--counts", str(counts)], ""
    if case == "empty":
        (tmp_path / "empty").mkdir()
        target, expected = tmp_path / "empty", "no allreduce program among its 0 file(s)"
    elif case == "mixed":
        target = tmp_path / "mixed"
        target.mkdir()
        for f in directory.iterdir():
            if f.is_file():
                (target / f"x8-{f.name}").write_bytes(f.read_bytes().replace(b'ngpus="4"', b'ngpus="8"'))
                (target / f.name).write_bytes(f.read_bytes())
        expected = "--world-size: its allreduce programs are for 4, 8 ranks"
    elif case == "legacy":  # the executor, which reads MSCCL_ALGO_DIR, refuses a legacy file at init
        target = tmp_path / "legacy"
        target.mkdir()
        for f in directory.iterdir():
            if f.is_file():
                (target / f.name).write_bytes(f.read_bytes().replace(b' outofplace="1"', b"").replace(b' outofplace="0"', b""))
        expected = "algo.outofplace: missing; msccl-executor-nccl and RCCL require it"
    elif case == "profile":
        args, expected = ["--profile", "no-such-model"], "no-such-model"
    else:
        counts.write_text("1024\nmany\n")
        expected = "line 2: expected a whole number of elements >= 1, got 'many'"
    done = run_hipipe("coverage", target, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr and "Traceback" not in done.stderr


def test_the_profiles_buckets_match_the_issue_measurements():
    """DDP's bucket counts of the five profiles (fp32, 1 MiB then 25 MiB), as measured for the issue."""
    shared_path("data", "layer-profiles.json")
    from hipipe_compiler.coverage import profile_tensors
    from hipipe_compiler.training.profiles import load_profile
    expected = {"vgg16": 6, "resnet50": 5, "densenet201": 4, "bert_base": 14, "gpt2": 13}
    for name, buckets in expected.items():
        assert len(ddp_buckets(profile_tensors(load_profile(name)), 4)) == buckets, name


def test_coverage_of_a_directory_of_mscclpp_plans(tmp_path):
    out = tmp_path / "plans"
    assert run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--sizes", "1MiB:4MiB", "--min-speedup", "0",
                      "-o", out).returncode == 0
    counts = tmp_path / "counts.txt"
    counts.write_text("262144\n262145\n4194304\n")  # 1 MiB; one element more; 16 MiB, past every window
    done = run_hipipe("coverage", out, "--counts", counts, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    first, odd, large = report["detail"]
    assert first["file"] and first["file"].endswith("-inplace.json")  # DDP all-reduces in place
    assert odd["file"] is None and "multiple" in odd["why_not"] and odd["padded_count"] > odd["count"]
    assert large["file"] is None and "outside" in large["why_not"] and large["padded_count"] is None
    # each served call holds its plan's scratch per context at most; calls NCCL serves hold none
    manifest = {e["file"]: e for e in json.loads((out / ".hipipe" / "manifest.json").read_text())["plans"]}
    assert first["scratch_bytes"] == manifest[first["file"]]["scratch_bytes_per_context"] > 0
    assert odd["scratch_bytes"] is None and large["scratch_bytes"] is None
    assert report["scratch_bytes_at_most"] == first["scratch_bytes"]
    text = run_hipipe("coverage", out, "--counts", counts)
    assert text.returncode == 0 and "scratch the executor keeps per GPU for these calls: at most" in text.stdout


def test_a_missing_directory_is_named_for_what_each_reader_takes(tmp_path):
    counts = tmp_path / "counts.txt"
    counts.write_text("1024\n")
    done = run_hipipe("coverage", tmp_path / "absent", "--counts", counts)
    assert done.returncode == 2 and "MSCCL++ plans" in done.stderr and done.stderr.count("\n") == 1
    with pytest.raises(InputError) as err:  # the runtime's MSCCL_ALGO_DIR takes MSCCL programs only
        directory_headers(tmp_path / "absent")
    assert "MSCCL_ALGO_DIR" in str(err.value) and "MSCCL++" not in str(err.value)
