"""The proof's memory, estimated before it starts: near what the proof takes, and a proof that
cannot fit is refused at once, as one line with exit 2."""

from __future__ import annotations

import tracemalloc

import pytest

from hipipe_compiler import background, cli, plan_commands
from hipipe_compiler.compiler import CompileOptions
from hipipe_compiler.mscclpp.reader import read_plan
from hipipe_compiler.mscclpp.writer import save_plan
from hipipe_compiler.mscclpp.verify import verify_plan
from hipipe_compiler.mscclpp.verify.footprint import ENVELOPE, proof_footprint, room_shortfall
from hipipe_compiler.plan_compiler import compile_plans
from hipipe_compiler.plan_fitting import fit
from hipipe_compiler.presets import preset
from hipipe_compiler.schedule import hierarchical_plan

from plan_mutations import _too_many_ops


def _searched(topology: str, size: int):
    """The plan the search picks, as `hipipe compile --backend mscclpp --size` emits it."""
    options = CompileOptions(check=False)
    return compile_plans(preset(topology), options, size, size, in_switch=False)[0].plans[-1]


def _hierarchical(topology: str, chunks: int, protocol: str, collective: str = "allreduce"):
    topo = preset(topology)
    return fit(hierarchical_plan(topo, collective, chunks=chunks, protocol=protocol), topo, "t")[1]


@pytest.mark.parametrize("build", [
    lambda: _searched("dgx-h100-8x4", 256 << 10),
    lambda: _hierarchical("dgx-h100-8x4", 4, "Simple"),
    lambda: _hierarchical("torus-4x4", 2, "LL"),
    lambda: _hierarchical("dgx-h100-8x2", 8, "Simple", "reducescatter"),
], ids=["hipipe-8x4-256KiB", "hierarchical-8x4", "hierarchical-torus-LL", "hierarchical-8x2-reducescatter"])
def test_the_estimate_is_near_what_the_proof_takes(build):
    plan = build()
    footprint = proof_footprint(plan)
    tracemalloc.start()
    try:
        assert verify_plan(plan).ok
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert footprint.threadblocks == sum(len(g.threadblocks) for g in plan.gpus)
    assert peak <= footprint.reserve, (peak, footprint)
    assert footprint.estimate <= 2 * peak, (peak, footprint)


def test_the_shortfall_names_the_memory_and_what_drives_it():
    plan = _hierarchical("dgx-h100-8x2", 2, "Simple")
    one = proof_footprint(plan)
    assert room_shortfall(one, one.estimate) is None
    why = room_shortfall(one, one.estimate - 1)
    assert why and f"{one.threadblocks:,} threadblocks take" in why and " MB of memory" in why
    assert one.reserve == int(one.estimate * ENVELOPE)


def test_verify_refuses_a_plan_this_machine_cannot_prove(tmp_path, monkeypatch, capsys):
    path = tmp_path / "ar.json"
    assert cli.main(["compile", "dgx-h100-8x1", "--backend", "mscclpp", "--size", "1MiB", "-o", str(path),
                     "--quiet"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(plan_commands, "available_memory", lambda: 1000)
    assert cli.main(["verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hipipe: error: {path}: proving it takes about"), err
    assert "more memory" in err
    monkeypatch.setattr(plan_commands, "available_memory", lambda: proof_footprint(read_plan(path)).estimate)
    assert cli.main(["verify", str(path)]) == 0
    capsys.readouterr()
    save_plan(_too_many_ops(read_plan(path)), path)  # broken in structure: that report takes no memory to find
    monkeypatch.setattr(plan_commands, "available_memory", lambda: 1000)
    assert cli.main(["verify", str(path)]) == 1
    assert "operations" in capsys.readouterr().out


def test_compile_refuses_before_a_proof_that_cannot_fit_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(background, "available_memory", lambda: 1000)
    out = tmp_path / "ar.json"
    assert cli.main(["compile", "dgx-h100-8x1", "--backend", "mscclpp", "--size", "1MiB", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot compile this plan" in err and "B of memory" in err, err
    assert not out.exists() and not list(tmp_path.iterdir())
