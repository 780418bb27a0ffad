"""`hipipe compile --backend mscclpp`, `hipipe verify` and `hipipe simulate` of plans, run as a user runs them."""

from __future__ import annotations

import json

import pytest

from hipipe_compiler.mscclpp.reader import read_plan
from hipipe_compiler.mscclpp.verify import verify_plan
from hipipe_compiler.presets import preset
from hipipe_compiler.sim.plans import time_plan

from conftest import run_hipipe


def test_one_plan_compiles_verifies_and_simulates(tmp_path):
    out = tmp_path / "ar.json"
    done = run_hipipe("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--size", "1MiB", "-o", out)
    assert done.returncode == 0, done.stderr
    plan = read_plan(out)
    assert plan.collective == "allreduce" and plan.ngpus == 16 and not plan.inplace
    checked = run_hipipe("verify", out)
    assert checked.returncode == 0 and "MSCCL++ plan" in checked.stdout and "verified" in checked.stdout
    timed = run_hipipe("simulate", out, "--topo", "dgx-h100-8x2", "--size", "1MiB", "--json")
    assert timed.returncode == 0, timed.stderr
    result = json.loads(timed.stdout)
    assert result["format"] == "mscclpp" and result["time_us"] >= result["lower_bound_us"] > 0
    every = time_plan(plan, preset("dgx-h100-8x2"), 1 << 20, orbits=False)  # rank 0 alone stands for them
    assert result["time_us"] == pytest.approx(every.time_us, rel=1e-9)


def test_a_directory_holds_a_plan_per_buffer_mode_and_a_manifest(tmp_path):
    out = tmp_path / "plans"
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--coll", "allgather", "--sizes", "1MiB:4MiB",
                      "--min-speedup", "0", "-o", out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / ".hipipe" / "manifest.json").read_text())
    assert manifest["backend"] == "mscclpp" and manifest["ranks_per_node"] == 8
    entries = manifest["plans"]
    assert {e["inplace"] for e in entries} == {False, True}
    for e in entries:
        plan = read_plan(out / e["file"])
        assert (plan.name, plan.inplace, plan.min_message_size, plan.max_message_size) == (
            e["name"], e["inplace"], e["min_message_size"], e["max_message_size"])
        assert e["size_multiple"] % (16 * plan.gpus[0].input_chunks) == 0
        assert verify_plan(plan).ok
    assert len({e["name"] for e in entries}) == len(entries)  # the shim keys its map by name


def test_bad_plans_and_options_are_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "collective": "allreduce", "protocol": "Simple", "inplace": false, "gpus": [{"id": "0"}]}')
    for args in (("verify", bad), ("simulate", bad, "--topo", "dgx-h100-8x1", "--size", "1MiB")):
        done = run_hipipe(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert str(bad) in done.stderr and "gpus[0].id" in done.stderr
    for text, message in (("[]", "expected an object"), ("", "not valid JSON")):
        bad.write_text(text)
        done = run_hipipe("verify", bad)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--proto", "LL128", "--algo", "hierarchical",
                      "--size", "1MiB", "-o", tmp_path / "x.json")
    assert done.returncode == 2 and "LL128" in done.stderr and not (tmp_path / "x.json").exists()
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--algo", "hierarchical", "--chunks", "2",
                      "--size", "1000000", "-o", tmp_path / "y.json")
    assert done.returncode == 2 and "multiple" in done.stderr and not (tmp_path / "y.json").exists()


def test_a_broken_plan_fails_verification_with_exit_1(tmp_path):
    out = tmp_path / "ar.json"
    assert run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--algo", "hierarchical", "--proto", "Simple",
                      "--size", "1MiB", "-o", out).returncode == 0
    doc = json.loads(out.read_text())
    ops = doc["gpus"][0]["threadblocks"][0]["ops"]
    doc["gpus"][0]["threadblocks"][0]["ops"] = [o for o in ops if o["name"] != "signal"]
    out.write_text(json.dumps(doc))
    done = run_hipipe("verify", out)
    assert done.returncode == 1 and "deadlock" in done.stdout + done.stderr


def test_a_plan_above_the_executors_limits_is_refused_naming_the_limit(tmp_path):
    out = tmp_path / "x.json"
    done = run_hipipe("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--size", "64MiB", "--max-tbs", "1", "-o", out)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "threadblocks" in done.stderr and not out.exists()


def test_a_directory_on_one_nvls_node_serves_large_all_reduces_in_the_switch(tmp_path):
    """The compiler keeps the in-switch plan where it is faster, names it in the manifest, and
    the files verify and simulate from the command line as written."""
    out = tmp_path / "plans"
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--sizes", "64MiB:256MiB", "--min-speedup", "0",
                      "-o", out)
    assert done.returncode == 0, done.stderr
    entries = json.loads((out / ".hipipe" / "manifest.json").read_text())["plans"]
    switched = [e for e in entries if e["in_switch"]]
    assert {e["inplace"] for e in switched} == {False, True}
    for e in switched:
        plan = read_plan(out / e["file"])
        assert any(op.name == "glres" for tb in plan.gpus[0].threadblocks for op in tb.ops)
        assert run_hipipe("verify", out / e["file"]).returncode == 0
    timed = run_hipipe("simulate", out / switched[0]["file"], "--topo", "dgx-h100-8x1", "--size", "256MiB", "--json")
    assert timed.returncode == 0, timed.stderr
    result = json.loads(timed.stdout)
    assert result["utilisation"] >= 0.9


def test_no_in_switch_compiles_gpu_side_plans_only(tmp_path):
    out = tmp_path / "plans"
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--sizes", "64MiB:256MiB", "--min-speedup", "0",
                      "--no-in-switch", "-o", out)
    assert done.returncode == 0, done.stderr
    entries = json.loads((out / ".hipipe" / "manifest.json").read_text())["plans"]
    assert entries and not any(e["in_switch"] for e in entries)


def test_in_switch_parts_keep_a_gpu_side_fallback_for_jobs_without_symmetric_memory(tmp_path):
    """On four H100 nodes the pipelines serve large all-reduces and address peers' buffers; each
    part keeps the window's GPU-side plan behind it (listed after every plan, same sizes,
    proven), which the selector and `hipipe coverage` run unless the job promises symmetric memory."""
    out = tmp_path / "plans"
    done = run_hipipe("compile", "dgx-h100-8x4", "--backend", "mscclpp", "--sizes", "256MiB:480MiB", "-o", out)
    assert done.returncode == 0, done.stderr
    assert "MSCCLPP_NCCL_SYMMETRIC_MEMORY=1" in done.stdout and "fallback" in done.stdout
    entries = json.loads((out / ".hipipe" / "manifest.json").read_text())["plans"]
    switched = [e for e in entries if e["in_switch"]]
    fallbacks = [e for e in entries if e["fallback"]]
    assert switched and all(e["symmetric_memory"] for e in switched)
    assert entries[-len(fallbacks):] == fallbacks  # after every plan: the selector takes the first that serves
    assert sorted((e["min_message_size"], e["max_message_size"], e["inplace"]) for e in fallbacks) == sorted(
        (e["min_message_size"], e["max_message_size"], e["inplace"]) for e in switched)
    for e in fallbacks:
        plan = read_plan(out / e["file"])
        assert not plan.needs_symmetric_memory and not e["symmetric_memory"]
        assert verify_plan(plan).ok
    counts = tmp_path / "counts.txt"
    counts.write_text(f"{(300 << 20) // 4}\n")
    for flag, served in (((), fallbacks), (("--symmetric-memory",), switched)):
        report = run_hipipe("coverage", out, "--counts", counts, *flag, "--json")
        assert report.returncode == 0, report.stderr
        [call] = json.loads(report.stdout)["detail"]
        assert call["file"] in {e["file"] for e in served if e["inplace"]}


def test_one_node_leaves_in_switch_sizes_to_nccl_without_symmetric_memory(tmp_path):
    """On one node NCCL's own NVLS beats the GPU-side plan, so no fallback is kept there."""
    out = tmp_path / "plans"
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--sizes", "64MiB:256MiB", "-o", out)
    assert done.returncode == 0, done.stderr
    entries = json.loads((out / ".hipipe" / "manifest.json").read_text())["plans"]
    assert entries and all(e["in_switch"] and not e["fallback"] for e in entries)
    assert "the shim runs NCCL for 64MiB..256MiB" in done.stdout


def test_sizes_past_the_executors_uint32_offsets_are_refused_or_left_to_nccl(tmp_path):
    """A 4 GiB all-reduce plan would need 8 GiB of scratch offsets: one size is refused naming
    the limit, and a directory stops where its plans' offsets stop."""
    out = tmp_path / "big.json"
    done = run_hipipe("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--algo", "hierarchical", "--size", "4GiB",
                      "-o", out)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "uint32" in done.stderr, done.stderr
    assert not out.exists()
    plans = tmp_path / "plans"
    done = run_hipipe("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--algo", "hierarchical", "--sizes", "1GiB:4GiB",
                      "-o", plans)
    assert done.returncode == 0, done.stderr
    assert "the shim runs NCCL" in done.stdout and "uint32" in done.stdout
    entries = json.loads((plans / ".hipipe" / "manifest.json").read_text())["plans"]
    assert entries and max(e["max_message_size"] for e in entries) < 4 << 30
    for e in entries:
        assert verify_plan(read_plan(plans / e["file"])).ok


def _context_scratch(plan_json: dict) -> int:
    """mscclpp.md 2.6 (calScratchBufferSize): the scratch of a context whose send buffer's
    allocation is at least max_message_size, per rank, at most over the ranks."""
    factor = (2 if plan_json["protocol"] == "LL" else 1) * (2 if plan_json.get("use_double_scratch_buffer") else 1)
    align = plan_json.get("buffer_alignment", 16)
    sizes = [-(-plan_json["max_message_size"] // g["input_chunks"]) * g["scratch_chunks"] * factor
             for g in plan_json["gpus"]]
    return max(-(-s // align) * align for s in sizes)


def test_max_scratch_bounds_every_plans_scratch_and_leaves_larger_calls_to_nccl(tmp_path):
    budget = 128 << 20
    free, bounded = tmp_path / "free", tmp_path / "bounded"
    base = ("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--algo", "hierarchical", "--proto", "Simple",
            "--sizes", "64MiB:1GiB")
    assert run_hipipe(*base, "-o", free).returncode == 0
    done = run_hipipe(*base, "--max-scratch", "128MiB", "-o", bounded)
    assert done.returncode == 0, done.stderr
    assert "the shim runs NCCL" in done.stdout and "--max-scratch 128MiB" in done.stdout
    unbounded = json.loads((free / ".hipipe" / "manifest.json").read_text())
    manifest = json.loads((bounded / ".hipipe" / "manifest.json").read_text())
    assert unbounded["max_scratch"] is None and manifest["max_scratch"] == budget
    assert max(e["scratch_bytes_per_context"] for e in unbounded["plans"]) > budget  # the bound binds
    for e in unbounded["plans"]:  # docs/mscclpp.md: on dgx-h100-8x2, Simple, twice the largest call per context
        assert e["scratch_bytes_per_context"] == pytest.approx(2 * e["max_message_size"], rel=1e-6)
    top = max(e["max_message_size"] for e in manifest["plans"])
    assert top < max(e["max_message_size"] for e in unbounded["plans"])
    for e in manifest["plans"]:
        plan_json = json.loads((bounded / e["file"]).read_text())
        assert e["scratch_bytes_per_context"] == _context_scratch(plan_json) <= budget
        assert verify_plan(read_plan(bounded / e["file"])).ok
    # the largest plan could serve no more: one size more and its scratch would pass the budget
    largest = next(e for e in manifest["plans"] if e["max_message_size"] == top)
    wider = {**json.loads((bounded / largest["file"]).read_text()), "max_message_size": top + largest["size_multiple"]}
    assert _context_scratch(wider) > budget


def test_max_scratch_below_any_plans_need_or_on_xml_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "x.json"
    done = run_hipipe("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--algo", "hierarchical", "--size", "256MiB",
                      "--max-scratch", "1MiB", "-o", out)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--max-scratch 1MiB" in done.stderr, done.stderr
    assert not out.exists()
    # a budget under the smallest size the plan runs: nothing to serve, said the same way
    done = run_hipipe("compile", "dgx-h100-8x2", "--backend", "mscclpp", "--algo", "hierarchical", "--proto", "LL",
                      "--sizes", "1:1GiB", "--max-scratch", "1KiB", "-o", tmp_path / "tiny")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--max-scratch 1KiB" in done.stderr, done.stderr
    assert not (tmp_path / "tiny").exists()
    done = run_hipipe("compile", "dgx-h100-8x2", "--algo", "hierarchical", "--size", "256MiB", "--max-scratch", "1GiB",
                      "-o", tmp_path / "x.xml")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--backend mscclpp" in done.stderr, done.stderr
    assert not (tmp_path / "x.xml").exists()
