"""hipipe_compiler.torch.padding run for real: gloo process groups of 2 and 4 CPU processes
train a small model with DDP, with and without the padding hook, on programs compiled for
their world size; and the reduce-scatter and all-gather helpers against torch's own."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from hipipe_compiler.coverage import directory_headers
from hipipe_compiler.msccl.selection import serving

from conftest import run_hipipe
from gloo import require_gloo

torch, dist, mp = require_gloo()
#: one worker runs this module, so its process groups and compiled fixtures are made once
pytestmark = pytest.mark.xdist_group("padding")

#: The windows the test directories cover; a call above them falls back to NCCL.
SIZES = "1KiB:1MiB"
LARGEST = 1 << 20
#: Layer widths chosen so that no bucket's element count is a multiple of a program's.
WIDTHS = (12, 37, 30, 5)
STEPS = 3


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[int, Path]:
    """A directory per world size with all-reduce, reduce-scatter and all-gather programs."""
    out = {}
    for world, dims in ((2, "2"), (4, "2x2")):
        topo = tmp_path_factory.mktemp("topo") / f"t{world}.yaml"
        shape = [{"name": f"d{i}", "size": 2, "kind": "switch", "bandwidth": 100, "latency": 1.0}
                 for i, _size in enumerate(dims.split("x"))]
        topo.write_text(json.dumps({"name": f"t{world}", "dimensions": shape}))
        directory = tmp_path_factory.mktemp(f"algos{world}")
        for coll in ("allreduce", "reducescatter", "allgather"):
            # every window keeps its program (the test is of the hook, not of which sizes NCCL runs faster)
            done = run_hipipe("compile", topo, "--coll", coll, "--sizes", SIZES, "-o", directory, "--quiet",
                              "--min-speedup", "0")
            assert done.returncode == 0, done.stderr
        out[world] = directory
    return out


def _model() -> "torch.nn.Module":
    torch.manual_seed(0)
    layers = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def _train(rank: int, directory: str | None) -> tuple[dict, dict | None]:
    """STEPS of SGD under DDP (small buckets, so there are several), with the padding hook
    when `directory` is given; the final parameters and the hook's counters."""
    from torch.nn.parallel import DistributedDataParallel

    from hipipe_compiler.torch import PaddingState, padded_allreduce_hook

    model = DistributedDataParallel(_model(), bucket_cap_mb=0.002)
    state = None
    if directory is not None:
        state = PaddingState.from_directory(directory)
        model.register_comm_hook(state, padded_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, WIDTHS[0], generator=gen), torch.randn(8, WIDTHS[-1], generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    params = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    counters = None if state is None else {
        "calls": state.calls, "served_calls": state.served_calls, "padded_elements": state.padded_elements,
        "fallback_calls": state.fallback_calls, "sent": [[c, n, k] for (c, n), k in state.sent.items()]}
    return params, counters


def _helpers(rank: int, world: int, directory: str) -> dict:
    """The padded helpers against torch's own collectives on the same data."""
    from hipipe_compiler.torch import PaddingState, padded_all_gather, padded_all_reduce, padded_reduce_scatter

    state = PaddingState.from_directory(directory)
    gen = torch.Generator().manual_seed(7 + rank)
    n = 301  # elements per rank: not a multiple of any program's
    inp = torch.randn(world * n, generator=gen)
    mine, theirs = torch.empty(n), torch.empty(n)
    padded_reduce_scatter(state, mine, inp.clone())
    getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(theirs, inp.clone())
    part = torch.randn(n, generator=gen)
    gathered_mine, gathered_theirs = torch.empty(world * n), torch.empty(world * n)
    padded_all_gather(state, gathered_mine, part)
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(gathered_theirs, part)
    grid = torch.randn(7, 11, generator=gen)
    reduced = grid.clone()
    padded_all_reduce(state, reduced)
    expected = grid.clone()
    dist.all_reduce(expected)
    huge = torch.ones(LARGEST // 4 + 1)  # above every window: falls back, unpadded
    padded_all_reduce(state, huge)
    return {"reduce_scatter": torch.allclose(mine, theirs), "all_gather": torch.equal(gathered_mine, gathered_theirs),
            "all_reduce": torch.allclose(reduced, expected), "fallback_value": float(huge[0]),
            "fallback_calls": state.fallback_calls, "calls": state.calls,
            "sent": [[c, k, m] for (c, k), m in state.sent.items()]}


def _worker(rank: int, world: int, rendezvous: str, directory: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        plain, _ = _train(rank, None)
        padded, counters = _train(rank, directory)
        helpers = _helpers(rank, world, directory)
        if rank == 0:
            torch.save({"plain": plain, "padded": padded, "counters": counters, "helpers": helpers}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_with_the_padding_hook_trains_like_ddp_and_every_call_is_served(world, programs):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pt"
        mp.spawn(_worker, args=(world, str(Path(tmp) / "rendezvous"), str(programs[world]), str(out)), nprocs=world)
        result = torch.load(out)
    for name, value in result["plain"].items():
        assert torch.allclose(value, result["padded"][name], rtol=1e-5, atol=1e-6), name
    counters = result["counters"]
    assert counters["calls"] > STEPS and counters["served_calls"] == counters["calls"]  # several buckets a step
    assert counters["padded_elements"] > 0 and counters["fallback_calls"] == 0
    headers = [p for _name, p in directory_headers(programs[world])]
    for collective, count, _times in counters["sent"]:
        assert serving(headers, collective, world, count, 4), f"{count} elements: no program serves the padded call"

    helpers = result["helpers"]
    assert helpers["reduce_scatter"] and helpers["all_gather"] and helpers["all_reduce"]
    assert helpers["fallback_calls"] == 1 and helpers["fallback_value"] == world  # summed, unpadded
    for collective, count, _times in helpers["sent"]:
        if count * 4 <= LARGEST:
            assert serving(headers, collective, world, count, 4), f"{collective} of {count} elements is not served"


def test_a_directory_without_programs_for_the_world_size_is_refused(programs, tmp_path):
    from hipipe_compiler.errors import InputError
    from hipipe_compiler.torch import PaddingState

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with pytest.raises(InputError, match="no program for 1 ranks; its programs are for 2"):
            PaddingState.from_directory(programs[2])
    finally:
        dist.destroy_process_group()
