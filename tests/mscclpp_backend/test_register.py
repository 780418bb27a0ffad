"""Registration with MSCCL++'s shim: what the selector picks for a call, from the manifest of a
compiled directory; the mscclpp call itself needs a GPU build of MSCCL++ and skips here."""

from __future__ import annotations

import json

import pytest

from hipipe_compiler.errors import InputError
from hipipe_compiler.mscclpp.register import (PlanEntry, Registration, choose, decide, load_manifest, register, select,
                                              symmetric_memory_promised)

from conftest import run_hipipe


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans") / "ag"
    done = run_hipipe("compile", "dgx-h100-8x1", "--backend", "mscclpp", "--coll", "allgather", "--sizes", "1MiB:4MiB",
                      "--min-speedup", "0", "-o", out)
    assert done.returncode == 0, done.stderr
    return out


def test_the_manifest_lists_every_plan(directory):
    entries = load_manifest(directory)
    assert entries and all((directory / e.file).is_file() for e in entries)
    assert {e.world_size for e in entries} == {8} and {e.ranks_per_node for e in entries} == {8}


def test_the_selector_follows_the_shims_sizes_and_buffer_modes(directory):
    entries = load_manifest(directory)
    per_rank = (2 << 20) // 8  # an all-gather of 2 MiB in all: the shim reports the per-rank bytes
    out_buf = 1 << 40
    rank = 3

    def pick(inp: int, size: int = per_rank, dtype: str = "bfloat16") -> PlanEntry | None:
        return choose(entries, "allgather", size, 8, 8, rank=rank, input_buffer=inp, output_buffer=out_buf, dtype=dtype)
    separate = pick(1 << 20)
    aliased = pick(out_buf + rank * per_rank)  # NCCL's in-place all-gather
    assert separate is not None and not separate.inplace
    assert aliased is not None and aliased.inplace
    assert pick(1 << 20, size=per_rank + 2) is None  # the chunks do not divide it: NCCL runs it
    assert pick(1 << 20, size=(8 << 20) // 8) is None  # beyond every window
    assert pick(1 << 20, dtype="float8_e4m3") is None and pick(1 << 20, dtype="float64") is None
    assert choose(entries, "allgather", per_rank, 16, 8, rank, 1 << 20, out_buf, "float32") is None  # another world


def test_bad_manifests_are_one_error(tmp_path):
    with pytest.raises(InputError, match="cannot read the manifest"):
        load_manifest(tmp_path)
    (tmp_path / ".hipipe").mkdir()
    (tmp_path / ".hipipe" / "manifest.json").write_text(json.dumps({"backend": "msccl", "files": []}))
    with pytest.raises(InputError, match="MSCCL\\+\\+ plans"):
        load_manifest(tmp_path)
    (tmp_path / ".hipipe" / "manifest.json").write_text(json.dumps({"backend": "mscclpp", "plans": [
        {"name": "x", "collective": "allreduce", "world_size": 8, "ranks_per_node": 8, "inplace": False,
         "min_message_size": 0, "max_message_size": 1, "size_multiple": 16, "file": "../../etc/passwd"}]}))
    with pytest.raises(InputError, match="inside the directory"):
        load_manifest(tmp_path)


def test_the_selector_counts_what_it_serves_and_what_it_leaves(directory):
    entries = load_manifest(directory)
    registration = Registration([e.name for e in entries])
    per_rank = (2 << 20) // 8

    class Request:  # what MSCCL++ hands the selector (CollectiveRequest's Python binding)
        def __init__(self, size: int, dtype: str) -> None:
            self.collective, self.message_size, self.world_size, self.n_ranks_per_node = "allgather", size, 8, 8
            self.rank, self.input_buffer, self.output_buffer, self.dtype = 0, 1 << 20, 1 << 40, dtype
    served = choose(entries, "allgather", per_rank, 8, 8, 0, 1 << 20, 1 << 40, "float32")
    algorithms = {"allgather": {served.name: "the algorithm"}}
    assert select(registration, entries, algorithms, Request(per_rank, "float32")) == "the algorithm"
    assert select(registration, entries, algorithms, Request(per_rank + 2, "float32")) is None
    assert select(registration, entries, algorithms, Request(per_rank, "float64")) is None
    assert registration.served == {served.name: 1}
    assert sorted(registration.left) == ["dtype float64", f"size not a multiple of {served.size_multiple} bytes"]


def test_plans_on_peers_buffers_serve_only_with_symmetric_memory():
    """An in-switch plan reads peers' buffers at this rank's offset in its allocation: without
    the job's promise, the call goes to the fallback listed after it, or to NCCL."""
    switched = PlanEntry("switch", "allreduce", 16, 8, False, 1 << 26, 1 << 28, 4096, "s.json", symmetric_memory=True)
    gpu = PlanEntry("gpu", "allreduce", 16, 8, False, 1 << 26, 1 << 28, 4096, "g.json")
    call = ("allreduce", 1 << 27, 16, 8, 0, 1 << 20, 1 << 40, "float32")
    assert decide([switched, gpu], *call, symmetric_memory=True)[0] is switched
    assert decide([switched, gpu], *call, symmetric_memory=False)[0] is gpu
    entry, why = decide([switched], *call)
    assert entry is None and "MSCCLPP_NCCL_SYMMETRIC_MEMORY=1" in why
    assert decide([gpu], *call)[0] is gpu  # a plan on peers' scratch alone needs no promise


@pytest.mark.parametrize("environ, promised", [({}, False), ({"MSCCLPP_NCCL_SYMMETRIC_MEMORY": "0"}, False),
                                               ({"MSCCLPP_NCCL_SYMMETRIC_MEMORY": "1"}, True),
                                               ({"MSCCLPP_NCCL_SYMMETRIC_MEMORY": "true"}, True)])
def test_the_promise_is_read_as_the_shim_reads_it(environ, promised):
    assert symmetric_memory_promised(environ) is promised


def test_an_older_manifest_marks_its_in_switch_plans_as_needing_symmetric_memory(tmp_path):
    (tmp_path / ".hipipe").mkdir()
    plans = [{"name": n, "collective": "allreduce", "world_size": 8, "ranks_per_node": 8, "inplace": False,
              "min_message_size": 0, "max_message_size": 1, "size_multiple": 16, "file": f"{n}.json", "in_switch": s}
             for n, s in (("a", True), ("b", False))]
    (tmp_path / ".hipipe" / "manifest.json").write_text(json.dumps({"backend": "mscclpp", "plans": plans}))
    assert [e.symmetric_memory for e in load_manifest(tmp_path)] == [True, False]


def test_registering_needs_mscclpp(directory):
    pytest.importorskip("mscclpp.ext", reason="MSCCL++ needs CUDA and a GPU build; this machine has neither")
    registration = register(directory, rank=0)
    assert registration.names == [e.name for e in load_manifest(directory)]
