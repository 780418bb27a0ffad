"""End to end: the `hipipe` command run the way a user runs it."""

import json
import re
import subprocess
import sys

import pytest

from hipipe_compiler.msccl import lexical_issues, read_program
from hipipe_compiler.presets import load_topology, preset
from hipipe_compiler.sim import simulate

from conftest import c1p, SAMPLES, real_xml_files, run_hipipe, shared_path


def test_quick_start_compile_then_verify(tmp_path):
    out = tmp_path / "allreduce.xml"
    done = run_hipipe("compile", SAMPLES / "dgx-h100-8x4.yaml", "--size", "256MiB", "-o", out)
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and out.exists()
    program = read_program(out)
    assert program.ngpus == 32 and program.min_bytes == program.max_bytes == 256 << 20
    assert lexical_issues(out.read_bytes()) == []
    check = run_hipipe("verify", out)
    assert check.returncode == 0, check.stdout
    assert "verified" in check.stdout


@pytest.mark.parametrize("coll", ["allreduce", "reducescatter", "allgather"])
@pytest.mark.parametrize("algo", ["hierarchical", "ring"])
def test_compile_a_range_into_a_directory(tmp_path, coll, algo):
    out = tmp_path / "algos"
    done = run_hipipe("compile", "torus-4x4", "--coll", coll, "--algo", algo, "--sizes", "1KiB:1GiB",
                      "--chunks", "2", "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    files = sorted(p for p in out.iterdir() if p.is_file())
    assert len(files) == len(summary["windows"])
    for f in files:
        assert run_hipipe("verify", f).returncode == 0


def test_every_window_states_its_element_multiple_and_the_cap_holds(tmp_path):
    out = tmp_path / "algos"
    done = run_hipipe("compile", "dgx-h100-8x2", "--sizes", "1MiB:64MiB", "--max-nchunksperloop", "64", "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    windows = json.loads(done.stdout)["windows"]
    assert all(w["element_multiple"] == w["nchunksperloop"] <= 64 for w in windows)
    manifest = json.loads((out / ".hipipe" / "manifest.json").read_text())
    assert manifest["max_nchunksperloop"] == 64
    assert [w["element_multiple"] for w in manifest["windows"]] == [w["element_multiple"] for w in windows]
    assert manifest["max_bucket_nchunksperloop"] == 256 and manifest["bucket_window_bytes"] == 64 << 20
    table = run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "-o", tmp_path / "one.xml")
    assert "elements x" in table.stdout.splitlines()[1]


def test_a_directory_says_when_its_bucket_windows_are_capped(tmp_path):
    topo = tmp_path / "c1p.json"
    topo.write_text(json.dumps(c1p(2).to_document()))
    capped = run_hipipe("compile", topo, "--sizes", "1MiB:4MiB", "-o", tmp_path / "capped")
    fastest = run_hipipe("compile", topo, "--sizes", "1MiB:4MiB", "--max-bucket-nchunksperloop", "0",
                         "-o", tmp_path / "fastest")
    assert capped.returncode == fastest.returncode == 0, capped.stderr + fastest.stderr
    assert "below 64MiB every program of a range of sizes serves element counts in multiples of at most 256" in capped.stdout
    assert "below 64MiB" not in fastest.stdout
    manifests = [json.loads((tmp_path / d / ".hipipe" / "manifest.json").read_text()) for d in ("capped", "fastest")]
    assert [m["max_bucket_nchunksperloop"] for m in manifests] == [256, None]
    assert all(w["element_multiple"] <= 256 for w in manifests[0]["windows"])
    assert any(w["element_multiple"] > 256 for w in manifests[1]["windows"])  # the cap had work to do


def test_a_legacy_directory_says_when_the_runtime_would_skip_files(tmp_path):
    """microsoft/msccl loads at most 4 algorithms: the directory that outgrows that says so."""
    out, notes = tmp_path / "legacy", []
    compile_ = ("compile", "torus-4x4", "--algo", "hierarchical", "--sizes", "1KiB:1GiB", "--chunks", "2", "-o", out)
    for coll in ("allreduce", "allgather", "reducescatter"):
        done = run_hipipe(*compile_, "--coll", coll, "--dialect", "legacy")
        assert done.returncode == 0, done.stderr
        notes.append(done.stderr)
    held = len(list(out.glob("*.xml")))
    assert held > 4 and notes[0] == ""
    assert f"note: microsoft/msccl loads at most 4 algorithms from MSCCL_XML_FILES and {out}/ holds {held} (2 from this run)" in notes[-1]
    as_json = run_hipipe(*compile_, "--dialect", "legacy", "--json")
    assert as_json.stderr == "" and f"holds {held}" in json.loads(as_json.stdout)["notes"][0]
    assert run_hipipe(*compile_, "--dialect", "legacy", "--quiet").stderr == ""
    executor = run_hipipe(*compile_, "--json")
    assert executor.returncode == 0 and json.loads(executor.stdout)["notes"] == []  # the executor loads every file
    one = run_hipipe("compile", "torus-4x4", "--algo", "hierarchical", "--size", "1MiB", "-o", out / "one.xml",
                     "--dialect", "legacy")
    assert one.returncode == 0 and f"{out}/ holds {held + 1} (1 from this run)" in one.stderr  # one file counts too


def test_quiet_prints_nothing(tmp_path):
    done = run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "-o", tmp_path / "a.xml", "--quiet")
    assert done.returncode == 0 and done.stdout == ""


def test_the_command_starts_without_the_libraries_only_some_commands_need():
    """Every call of `hipipe` imports the command line; scipy (half a second) and networkx are
    imported only by the commands that fit, solve an in-switch limit or simulate."""
    probe = "import sys, hipipe_compiler.cli; print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'networkx', 'torch'}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_topo_shows_a_file_and_lists_presets():
    done = run_hipipe("topo", SAMPLES / "torus-4x4x4.yaml")
    assert done.returncode == 0 and "64 ranks" in done.stdout
    doc = json.loads(run_hipipe("topo", "dgx-h100-8x4", "--json").stdout)
    assert doc["ranks"] == 32
    listing = run_hipipe("topo", "--list").stdout
    assert "pod-8x4x8x4" in listing


BAD_TOPOLOGIES = {
    "negative-bandwidth.yaml": "dimensions:\n  - {size: 8, kind: switch, bandwidth: -5, latency: 1}\n",
    "zero-bandwidth.yaml": "dimensions:\n  - {size: 8, kind: switch, bandwidth: 0, latency: 1}\n",
    "size-one.yaml": "dimensions:\n  - {size: 1, kind: switch, bandwidth: 5, latency: 1}\n",
    "unknown-kind.yaml": "dimensions:\n  - {size: 8, kind: mesh, bandwidth: 5, latency: 1}\n",
    "missing-field.yaml": "dimensions:\n  - {size: 8, kind: switch, latency: 1}\n",
    "malformed.yaml": "dimensions: [ {size: 8, kind: switch\n",
    "malformed.json": '{"dimensions": [',
    # 2048 ranks: the runtime's reader would write past its 1024-entry array of <gpu> elements
    "2048-ranks.yaml": "dimensions:\n  - {size: 8, kind: switch, bandwidth: 300, latency: 1}\n"
                       "  - {size: 256, kind: switch, bandwidth: 50, latency: 5}\n",
}


@pytest.mark.parametrize("name", sorted(BAD_TOPOLOGIES))
def test_bad_topology_exits_2_with_one_line_and_no_output(tmp_path, name):
    topo = tmp_path / name
    topo.write_text(BAD_TOPOLOGIES[name])
    out = tmp_path / "out.xml"
    done = run_hipipe("compile", topo, "--size", "1MiB", "-o", out)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert name in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("args,needle", [
    (["--size", "1000"], "not a multiple"),
    (["--size", "0"], "--size"),
    (["--size", "12XB"], "--size"),
    (["--sizes", "4GiB:1KiB"], "--sizes"),
    (["--size", "1MiB", "--chunks", "0"], "--chunks"),
    (["--size", "1MiB", "--algo", "magic"], "--algo"),
    (["--size", "1MiB", "--max-nchunksperloop", "16"], "--max-nchunksperloop: expected at least 32 (one chunk per rank), got 16"),
    (["--size", "1MiB", "--algo", "ring", "--chunks", "4", "--max-nchunksperloop", "64"], "over the cap 64"),
    (["--size", "1MiB", "--max-bucket-nchunksperloop", "-1"], "--max-bucket-nchunksperloop"),
    (["--sizes", "1MiB:4MiB", "--max-bucket-nchunksperloop", "16"], "--max-bucket-nchunksperloop: expected at least 32"),
])
def test_bad_arguments_exit_2(tmp_path, args, needle):
    out = tmp_path / "out.xml"
    done = run_hipipe("compile", "dgx-h100-8x4", *args, "-o", out)
    assert done.returncode == 2, done.stdout
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_rccl_directories_fit_its_threadblock_limit(tmp_path):
    """RCCL parses every file of the world size at init and refuses more than 64 threadblocks:
    the windows that take 72 on the executor get plans that fit (the fastest plans: uncapped)."""
    fastest = ("--max-bucket-nchunksperloop", "0")
    done = run_hipipe("compile", "torus-4x4", "--sizes", "16MiB:64MiB", *fastest, "--runtime", "rccl", "-o", tmp_path / "rccl",
                      "--json")
    assert done.returncode == 0, done.stderr
    windows = json.loads(done.stdout)["windows"]
    assert windows and all(w["threadblocks"] <= 64 for w in windows)
    manifest = json.loads((tmp_path / "rccl" / ".hipipe" / "manifest.json").read_text())
    assert manifest["runtime"] == "rccl"
    for xml in sorted((tmp_path / "rccl").glob("*.xml")):
        assert run_hipipe("verify", xml, "--runtime", "rccl").returncode == 0
    executor = run_hipipe("compile", "torus-4x4", "--sizes", "16MiB:64MiB", *fastest, "-o", tmp_path / "exec", "--json")
    widest = max(json.loads(executor.stdout)["windows"], key=lambda w: w["threadblocks"])
    assert widest["threadblocks"] > 64  # what the issue found: fine on the executor, refused by RCCL
    refused = [run_hipipe("verify", x, "--runtime", "rccl") for x in sorted((tmp_path / "exec").glob("*.xml"))]
    assert any(r.returncode == 1 and "tb.count" in r.stdout for r in refused)


def test_unwritable_output_exits_2(tmp_path):
    done = run_hipipe("compile", "dgx-h100-8x4", "--size", "1MiB", "-o", tmp_path / "no" / "such" / "dir.xml")
    assert done.returncode == 2 and "parent directory" in done.stderr
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    done = run_hipipe("compile", "dgx-h100-8x4", "--size", "1MiB", "-o", blocker / "a.xml")
    assert done.returncode == 2 and "not a directory" in done.stderr
    done = run_hipipe("compile", "dgx-h100-8x4", "--sizes", "1MiB:4MiB", "-o", blocker)
    assert done.returncode == 2 and "a file is there" in done.stderr
    done = run_hipipe("compile", "dgx-h100-8x4", "--size", "1MiB", "-o", "/proc/hipipe-test.xml")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_verify_reports_broken_rules_with_exit_1(tmp_path):
    out = tmp_path / "a.xml"
    assert run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "-o", out).returncode == 0
    text = out.read_text()
    # drop one receive: the connection's sends and receives no longer match
    lines = text.splitlines()
    idx = next(i for i, line in enumerate(lines) if 'type="r"' in line)
    del lines[idx]
    broken = tmp_path / "broken.xml"
    broken.write_text("\n".join(lines) + "\n")
    done = run_hipipe("verify", broken, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert not report["ok"]
    rules = {v["rule"] for v in report["violations"]}
    assert "connection.count" in rules or "step.index" in rules
    plain = run_hipipe("verify", broken)
    assert plain.returncode == 1 and "violation" in plain.stdout


def test_verify_flags_lexical_rules_the_runtime_would_trip_on(tmp_path):
    out = tmp_path / "a.xml"
    run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "-o", out)
    tabbed = tmp_path / "tabbed.xml"
    tabbed.write_text(out.read_text().replace("    <tb", "\t<tb"))
    done = run_hipipe("verify", tabbed)
    assert done.returncode == 1 and "lexical.tab" in done.stdout


@pytest.mark.parametrize("content", [
    b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><algo name="&e;"/>',
    b'<algo name="a" proto="Simple" nchannels="x"/>',
    b"\x00garbage",
])
def test_verify_refuses_hostile_or_broken_xml_with_exit_2(tmp_path, content):
    bad = tmp_path / "bad.xml"
    bad.write_bytes(content)
    done = run_hipipe("verify", bad)
    assert done.returncode == 2
    assert "bad.xml" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_verify_accepts_the_real_files():
    files = real_xml_files()
    if not files:
        pytest.skip("../shared/msccl-algorithms is absent beside this clone")
    for f in files[:6]:
        done = run_hipipe("verify", f)
        assert done.returncode == 0, done.stdout


def test_verify_and_simulate_read_the_dialect_the_runtime_loads(tmp_path):
    """A legacy microsoft/msccl file does not pass for the executor, which refuses it at
    communicator init: one line says why and how to read it as legacy."""
    legacy = tmp_path / "legacy.xml"
    made = run_hipipe("compile", "dgx-h100-8x2", "--algo", "hierarchical", "--coll", "reducescatter", "--size", "1MiB",
                      "-o", legacy, "--dialect", "legacy", "--quiet")
    assert made.returncode == 0, made.stderr
    for command in (("verify", legacy), ("simulate", legacy, "--topo", "dgx-h100-8x2", "--size", "1MiB")):
        refused = run_hipipe(*command)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.count("\n") == 1 and "legacy.xml: algo.coll:" in refused.stderr
        assert "--dialect legacy" in refused.stderr
        assert run_hipipe(*command, "--dialect", "legacy").returncode == 0


def test_simulate_says_when_the_runtime_would_not_run_the_program_for_the_size(tmp_path):
    out = tmp_path / "a.xml"
    run_hipipe("compile", "dgx-h100-8x2", "--algo", "hierarchical", "--size", "1MiB", "-o", out, "--quiet")
    inside = run_hipipe("simulate", out, "--topo", "dgx-h100-8x2", "--size", "1MiB")
    assert inside.returncode == 0 and inside.stderr == ""
    outside = run_hipipe("simulate", out, "--topo", "dgx-h100-8x2", "--size", "2MiB")
    assert outside.returncode == 0 and "time" in outside.stdout  # timed all the same
    assert outside.stderr == ("note: the runtime would not run this program for a call of 2MiB (float32): "
                              "2097152 bytes are outside the window 1048576..1048576\n")
    ragged = json.loads(run_hipipe("simulate", out, "--topo", "dgx-h100-8x2", "--size", "1000001", "--json").stdout)
    assert ragged["notes"] and "not a whole number of 4-byte elements" in ragged["notes"][0]


def test_simulate_refuses_a_program_that_cannot_run(tmp_path):
    """A time for a program with no <gpu>, or a step of cnt 0, would mean nothing: one line
    names the first broken rule and points at verify."""
    good = tmp_path / "a.xml"
    run_hipipe("compile", "dgx-h100-8x2", "--algo", "hierarchical", "--size", "1MiB", "-o", good, "--quiet")
    text = good.read_text()
    cases = {"cnt0.xml": re.sub(r' cnt="\d+"', ' cnt="0"', text, count=1), "nogpu.xml": text[:text.index("  <gpu")] + "</algo>\n"}
    for name, broken in cases.items():
        (tmp_path / name).write_text(broken)
        done = run_hipipe("simulate", tmp_path / name, "--topo", "dgx-h100-8x2", "--size", "1MiB")
        assert done.returncode == 2 and done.stdout == "", (name, done.stderr)
        assert done.stderr.count("\n") == 1 and f"{name}: cannot be simulated:" in done.stderr
        assert "hipipe verify names every broken rule" in done.stderr


def test_impossible_sizes_and_paths_are_one_line_and_exit_2(tmp_path):
    for command in (("compile", "torus-4x4", "--size", "99999999999TiB", "-o", tmp_path / "a.xml"),
                    ("compile", "torus-4x4", "--sizes", "1KiB:2TiB", "-o", tmp_path / "d"),
                    ("topo", tmp_path / ("a" * 300 + ".yaml")),
                    ("compile", "torus-4x4", "--algo", "ring", "--size", "1MiB", "-o", "/dev/null"),
                    ("bench", "--topo", "torus-4x4", "--sizes", "1KiB", "--algos", "ring", "--csv", tmp_path / "b.csv",
                     "--plot", tmp_path / "b.txt")):
        done = run_hipipe(*command)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, command
    assert not any(tmp_path.iterdir())  # the bench's --plot is checked before its CSV is written


@pytest.mark.slow
def test_every_sample_compiles_and_verifies(tmp_path):
    for sample in sorted(SAMPLES.iterdir()):
        if load_topology(sample).nranks > 256:
            continue
        out = tmp_path / f"{sample.stem}.xml"
        done = run_hipipe("compile", sample, "--size", "4MiB", "-o", out, "--quiet")
        assert done.returncode == 0, (sample, done.stderr)


def test_simulate_prints_time_and_json(tmp_path):
    out = tmp_path / "a.xml"
    run_hipipe("compile", "dgx-h100-8x4", "--size", "64MiB", "-o", out)
    done = run_hipipe("simulate", out, "--topo", SAMPLES / "dgx-h100-8x4.yaml", "--size", "64MiB")
    assert done.returncode == 0 and "busbw" in done.stdout and "utilisation" in done.stdout
    data = json.loads(run_hipipe("simulate", out, "--topo", "dgx-h100-8x4", "--size", "64MiB", "--json").stdout)
    for key in ("time_us", "lower_bound_us", "utilisation", "algbw_GBps", "busbw_GBps", "iterations"):
        assert key in data
    assert 0 < data["utilisation"] <= 1
    # timed on rank 0 alone (every rank runs its schedule shifted): what every rank's run gives
    every = simulate(read_program(str(out)), preset("dgx-h100-8x4"), 64 << 20)
    assert data["time_us"] == pytest.approx(every.time_us, rel=1e-9)
    wrong = run_hipipe("simulate", out, "--topo", "torus-4x4", "--size", "64MiB")
    assert wrong.returncode == 2 and "32 ranks" in wrong.stderr


def test_bench_writes_table_csv_json_and_plot(tmp_path):
    done = run_hipipe("bench", "--topo", "torus-4x4", "--sizes", "1MiB", "64MiB", "--algos", "hierarchical", "ring",
                      "--csv", tmp_path / "b.csv", "--json", tmp_path / "b.json", "--plot", tmp_path / "b.png",
                      "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "hierarchical" in done.stdout and "U1" in done.stdout
    assert len(json.loads((tmp_path / "b.json").read_text())) == 4
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_hipipe("bench", "--topo", "torus-4x4", "--algos", "magic", "--no-progress")
    assert bad.returncode == 2 and "unknown algorithm" in bad.stderr


# -- hipipe plan ------------------------------------------------------------------------------

TOY_PROFILE = """\
model: toy
dtype_bytes: 4
layers:
""" + "".join(f"  - {{name: l{i}, params: {p}, fwd_ms: 0.2, bwd_ms: 0.4}}\n" for i, p in enumerate([300_000, 5_000, 1_200_000, 800_000, 64]))


@pytest.mark.slow
def test_plan_writes_a_plan_and_verified_programs(tmp_path):
    profile = tmp_path / "toy.yaml"
    profile.write_text(TOY_PROFILE)
    out = tmp_path / "plan"
    done = run_hipipe("plan", "--profile", profile, "--topo", "dgx-h100-8x2", "-o", out, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert set(summary["policies"]) == {"wfbp", "ddp", "dear", "pipedap", "hipipe"}
    ours = summary["policies"]["hipipe"]["iteration_ms"]
    assert all(ours <= p["iteration_ms"] + 1e-9 for p in summary["policies"].values())
    assert all(p["exposed_comm_ms"] >= -1e-9 and p["iteration_ms"] >= summary["compute_ms"] - 1e-9
               for p in summary["policies"].values())
    plan = json.loads((out / "plan.json").read_text())
    assert plan["policy"] == "hipipe" and plan["world_size"] == 16
    assert plan["predicted"]["iteration_ms"] == pytest.approx(ours)
    algo_dir = out / "msccl-algorithms"
    files = {p.name for p in algo_dir.iterdir() if p.is_file()}
    assert files == {p["xml"].split("/")[-1] for p in plan["programs"]}
    by_id = {p["id"]: p for p in plan["programs"]}
    for op in plan["ops"]:
        program = read_program(algo_dir / f"{op['program']}.xml")
        coll = {"AR": "allreduce", "RS": "reducescatter", "AG": "allgather"}[op["op"]]
        assert program.collective == coll and program.ngpus == 16
        # the runtime selects this program for the call: inside its window, whole chunks
        assert program.min_bytes <= op["call_bytes"] < program.max_bytes + 1
        assert op["call_bytes"] % (program.nchunksperloop * 4) == 0 and op["call_bytes"] >= op["bytes"]
        assert op["call_bytes"] in by_id[op["program"]]["sizes"]
    for f in sorted(files):
        assert run_hipipe("verify", algo_dir / f).returncode == 0


def test_plan_table_names_every_policy_and_the_synthetic_times(tmp_path):
    shared_path("data", "layer-profiles.json")
    done = run_hipipe("plan", "--profile", "bert_base", "--topo", "torus-4x4", "--algo", "hierarchical")
    assert done.returncode == 0, done.stderr
    for policy in ("wfbp", "ddp", "dear", "pipedap", "hipipe"):
        assert policy in done.stdout
    assert "derived from MACs" in done.stdout and "simulated hierarchical programs on torus-4x4" in done.stdout


@pytest.mark.parametrize("body, field", [
    ("model: bad\ndtype_bytes: 4\nlayers: []\n", "layers"),
    ("model: bad\ndtype_bytes: 4\nlayers:\n  - {name: a, params: 10, fwd_ms: -1, bwd_ms: 1}\n", "fwd_ms"),
    ("model: bad\ndtype_bytes: 4\nlayers:\n  - {name: a, params: 10, fwd_ms: 1, bwd_ms: 1\n", None),
])
def test_plan_rejects_bad_profiles(tmp_path, body, field):
    profile = tmp_path / "bad.yaml"
    profile.write_text(body)
    out = tmp_path / "plan"
    done = run_hipipe("plan", "--profile", profile, "--topo", "dgx-h100-8x2", "-o", out)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and str(profile) in done.stderr
    if field:
        assert field in done.stderr
    assert not out.exists()


def test_plan_rejects_an_unknown_model():
    done = run_hipipe("plan", "--profile", "resnet5O", "--topo", "dgx-h100-8x2")
    assert done.returncode == 2 and "unknown model" in done.stderr and "Traceback" not in done.stderr


def test_a_new_plan_replaces_the_programs_of_the_old_one(tmp_path):
    out = tmp_path / "plan"
    big = tmp_path / "big.yaml"
    big.write_text(TOY_PROFILE)
    small = tmp_path / "small.yaml"
    small.write_text("model: small\ndtype_bytes: 4\nlayers:\n  - {name: a, params: 1000, fwd_ms: 1, bwd_ms: 2}\n")
    for profile in (big, small):
        done = run_hipipe("plan", "--profile", profile, "--topo", "dgx-h100-8x2", "--algo", "hierarchical", "-o", out)
        assert done.returncode == 0, done.stderr
    plan = json.loads((out / "plan.json").read_text())
    on_disk = {p.name for p in (out / "msccl-algorithms").iterdir() if p.is_file()}
    assert on_disk == {p["xml"].split("/")[-1] for p in plan["programs"]}  # nothing left over to compete


def test_recompiling_a_collective_replaces_its_windows_and_keeps_the_others(tmp_path):
    out = tmp_path / "algos"
    for args in (("--sizes", "1MiB:64MiB"), ("--coll", "reducescatter", "--sizes", "1MiB:4MiB"), ("--sizes", "1MiB:4MiB")):
        done = run_hipipe("compile", "dgx-h100-8x2", "--algo", "hierarchical", *args, "-o", out, "--quiet")
        assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in out.iterdir() if p.is_file())
    assert [n.split("-")[0] for n in names] == ["allreduce", "reducescatter"]
    assert read_program(out / names[0]).max_bytes == (4 << 20)


def test_writes_that_fail_late_are_one_line_and_exit_2(tmp_path):
    xml = tmp_path / "a.xml"
    assert run_hipipe("compile", "dgx-h100-8x2", "--size", "1MiB", "-o", xml, "--quiet").returncode == 0
    (tmp_path / "plan" / "plan.json").mkdir(parents=True)
    cases = [
        ("plan", "--profile", SAMPLES.parent / "profiles" / "mlp.yaml", "--topo", "dgx-h100-8x2", "--algo", "hierarchical",
         "-o", tmp_path / "plan"),
        ("simulate", xml, "--topo", "dgx-h100-8x2", "--size", "1MiB", "--timeline", tmp_path / "a.xml" / "t.png"),
        ("plan", "--profile", SAMPLES.parent / "profiles" / "mlp.yaml", "--topo", "dgx-h100-8x2", "-o", ""),
    ]
    for args in cases:
        done = run_hipipe(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
