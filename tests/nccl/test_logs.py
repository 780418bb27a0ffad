"""nccl-tests output in every layout, with NCCL's debug lines and mpirun's prefixes mixed in, is
read into rows; a log a calibration cannot use is one line naming the file and the fault."""

from __future__ import annotations

import pytest

from hipipe_compiler.errors import InputError
from hipipe_compiler.nccl.logs import allowed, parse_log, read_log, PROTOCOL_NAMES

from conftest import SHARED, shared_path
from nccl_logs import nccl_tests_log

LOGS = SHARED / "data" / "nccl-tests"


@pytest.mark.parametrize("name,collective,ranks,per_node,gpu,rows,first,last", [
    ("h100-1n-dgx-all_reduce.log", "allreduce", 8, 8, "H100", 32, 8, 16 << 30),
    ("h100-2n-ib400-xe9680-all_reduce.log", "allreduce", 16, 8, "H100", 32, 8, 16 << 30),
    ("a3mega-2node-h100-all_reduce_perf.log", "allreduce", 16, 8, "H100", 31, 8, 8 << 30),
    ("superbench-a100-8gpu-all_gather_perf.log", "allgather", 8, 8, "A100", 29, 32, 8 << 30),
    ("oci-bm-gpu4.8-a100-8gpu-all_reduce_perf.log", "allreduce", 8, 8, "A100", 1, 10 << 30, 10 << 30),
    ("a100-1n-azure-reduce_scatter.log", "reducescatter", 8, 8, "A100", 29, 32, 8 << 30),
])
def test_the_shared_logs_read_as_their_machines(name, collective, ranks, per_node, gpu, rows, first, last):
    log = read_log(shared_path("data", "nccl-tests", name))
    assert (log.collective, log.nranks, log.ranks_per_node, log.gpu, len(log.rows)) == (collective, ranks, per_node, gpu, rows)
    assert (log.rows[0].nbytes, log.rows[-1].nbytes) == (first, last)
    assert all(r.time_us > 0 for r in log.rows)


def test_a_forced_algorithm_is_read_from_the_command_not_from_prose():
    ring = read_log(shared_path("data", "nccl-tests", "h100-2n-ib400-clusterB-all_reduce-ring.log"))
    prose = read_log(shared_path("data", "nccl-tests", "h100-2n-ib400-xe9680-all_reduce.log"))
    assert ring.algorithms == ("ring",) and prose.algorithms is None  # it only says "use NCCL_ALGO=Ring"


def test_settings_that_move_nccls_times_are_kept_and_nvls_disabled_is_honoured():
    ring = read_log(shared_path("data", "nccl-tests", "h100-2n-ib400-clusterB-all_reduce-ring.log"))
    assert ring.unmodelled == ("NCCL_IB_QPS_PER_CONNECTION=2", "NCCL_MIN_CTAS=24")
    rows = [(1024, 20.0), (2048, 21.0)]
    text = nccl_tests_log(rows, nodes=2, ppn=2, env="NCCL_NVLS_ENABLE=0, NCCL_DEBUG=INFO, NCCL_BUFFSIZE=8388608")
    log = parse_log(text, "x.log")
    assert log.algorithms == ("ring", "tree") and log.unmodelled == ("NCCL_BUFFSIZE=8388608",)
    prose = parse_log(nccl_tests_log(rows, nodes=2, ppn=2).replace("#  Rank  0", "# try NCCL_MIN_CTAS=8\n#  Rank  0"),
                      "y.log")
    assert prose.unmodelled == ()


def test_the_faster_half_of_each_row_is_the_time():
    log = read_log(shared_path("data", "nccl-tests", "h100-1n-dgx-all_reduce.log"))
    assert log.rows[2].nbytes == 32 and log.rows[2].time_us == 13.5  # 68.1 out-of-place is a warm-up outlier


def test_debug_lines_prefixes_and_timestamps_are_noise():
    text = nccl_tests_log([(1024, 20.0), (2048, 21.0)], nodes=2, ppn=2)
    lines = text.splitlines()
    noisy = []
    for line in lines:
        noisy.append(f"[1,0]<stdout>:{line}")
        if line.startswith("    "):
            noisy.append("node0:123:456 [0] NCCL INFO Channel 00/02 : 0 1 2 3")
            noisy.append("NCCL version 2.21.5+cuda12.4")
            noisy.append("node0:123:456 [0] NCCL INFO NCCL_PROTO set by environment to LL,Simple")
    log = parse_log("\n".join(noisy), "noisy.log")
    assert [r.nbytes for r in log.rows] == [1024, 2048] and log.nranks == 4 and log.ranks_per_node == 2
    assert log.protocols == ("LL", "Simple")


@pytest.mark.parametrize("text,field,message", [
    ("# nothing here\n", None, "no nccl-tests table"),
    (nccl_tests_log([(8, 10.0)], nodes=1, ppn=1), "Rank lines", "at least 2 ranks"),
    (nccl_tests_log([(8, 10.0)], nodes=2, ppn=2).replace("node1 device  1 [0000:01:00] NVIDIA H100",
                                                         "node1 device  1 [0000:01:00] NVIDIA A100"), "Rank lines", "mixed GPUs"),
    (nccl_tests_log([(8, 10.0)], nodes=2, ppn=2).replace("on      node1 device  1", "on      node2 device  1"),
     "Rank lines", "different numbers of ranks"),
    (nccl_tests_log([(8, 10.0)], nodes=1, ppn=2).replace("   10.0  ", "   abc  ", 1), "line", "expected a time"),
    (nccl_tests_log([(8, 10.0)], nodes=1, ppn=2).replace("   10.0  ", "   -3.0  ", 1), "line", "positive time"),
    (nccl_tests_log([(8, 10.0)], nodes=1, ppn=2, env="NCCL_ALGO=Hypercube"), "NCCL_ALGO", "expected names"),
    (nccl_tests_log([(8, 10.0)], nodes=1, ppn=2).replace("       0     10.0", "       3     10.0"), "line",
     "3 wrong elements in the out-of-place run"),
    (nccl_tests_log([(8, 10.0)], nodes=1, ppn=2).replace("       0\n# Out", "  1.2e+06\n# Out"), "line",
     "1.2e+06 wrong elements in the in-place run"),
])
def test_a_log_a_calibration_cannot_use_is_one_line_naming_the_fault(text, field, message):
    with pytest.raises(InputError) as err:
        parse_log(text, "bad.log")
    assert str(err.value).startswith("bad.log") and message in str(err.value) and "\n" not in str(err.value)
    if field:
        assert field in str(err.value)


def test_unvalidated_rows_and_older_error_magnitudes_are_read():
    text = nccl_tests_log([(8, 10.0), (16, 11.0)], nodes=1, ppn=2)
    unchecked = parse_log(text.replace("       0 ", "     N/A "), "x.log")  # -c 0
    assert [r.time_us for r in unchecked.rows] == [10.0, 11.0]
    older = text.replace("#wrong", " error").replace("       0 ", "   1e-03 ")  # 2.10's max abs error, not a count
    assert [r.time_us for r in parse_log(older, "y.log").rows] == [10.0, 11.0]


def test_nccl_algo_and_proto_lists_and_exclusions():
    assert allowed("^LL128", PROTOCOL_NAMES, None, "NCCL_PROTO") == ("LL", "Simple")
    assert allowed("LL128", PROTOCOL_NAMES, None, "NCCL_PROTO") == ("LL128",)
    assert allowed(None, PROTOCOL_NAMES, None, "NCCL_PROTO") is None


def test_a_log_that_cannot_be_read_names_the_file(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_log(tmp_path / "missing.log")
    big = tmp_path / "big.log"
    big.write_bytes(b"#" * (17 << 20))
    with pytest.raises(InputError, match="larger than"):
        read_log(big)
