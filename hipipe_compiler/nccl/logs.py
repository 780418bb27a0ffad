"""nccl-tests output (nccl-formats.md part B): every layout from 2.10 to 2.19, NCCL debug lines
and mpirun prefixes mixed in, read into the measurements a calibration fits. Bad input is an
InputError naming the file, the line and what was expected.

>>> text = '''# Collective test starting: all_reduce_perf
... #  Rank  0 Group  0 Pid 1 on a device  0 [0000:04:00] NVIDIA H100 80GB HBM3
... #  Rank  1 Group  0 Pid 2 on b device  0 [0000:04:00] NVIDIA H100 80GB HBM3
... #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
...      1048576        262144     float     sum      -1     93.2   11.24   11.24      0     83.0   12.64   12.64      0
... '''
>>> log = parse_log(text, "x.log")
>>> log.collective, log.nranks, log.ranks_per_node, log.gpu, log.rows[0].time_us
('allreduce', 2, 1, 'H100', 83.0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..hardware import gpu_from_description

#: Largest log read, in bytes: a log of every size is a few kB.
MAX_LOG_BYTES = 16 << 20
#: nccl-tests binaries and the collectives they time.
BINARIES = {"all_reduce": "allreduce", "reduce_scatter": "reducescatter", "all_gather": "allgather",
            "alltoall": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv"}
#: NCCL_ALGO / NCCL_PROTO names and ours.
ALGORITHM_NAMES = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvlstree", "nvls_tree": "nvlstree"}
PROTOCOL_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}

_PREFIX = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?")  # mpirun --tag-output
_STAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d[T ][\d:.,]+\]?\s*")  # NCCL_DEBUG_TIMESTAMP_FORMAT and the like
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$")
_COLLECTIVE = re.compile(r"Collective test (?:starting|concluded):\s*(\w+?)(?:_perf)?(?:_mpi)?\s*$")
_ENV = re.compile(r"NCCL_(ALGO|PROTO)(?:\s+set by environment to\s+|\s*=\s*)([A-Za-z0-9_,]+)")
_SETTING = re.compile(r"\b(NCCL_[A-Z0-9_]+)(?:\s+set by environment to\s+|=)([^\s,;]+)")
#: Settings that leave NCCL's timing alone (or that the log's own fields carry).
HARMLESS = re.compile(r"NCCL_(ALGO|PROTO|DEBUG\w*|SOCKET_IFNAME|IB_HCA|IB_GID_INDEX|TOPO_DUMP_FILE|HOSTID|"
                      r"IB_SL|IB_TC|IB_DISABLE|TOPO_FILE|NET_SHARED_BUFFERS|COMM_ID|ASYNC_ERROR_HANDLING|LAUNCH_MODE|\w*TIMEOUT\w*|\w*RETRY\w*)$")


@dataclass(frozen=True)
class Row:
    """One size of a log: the nccl-tests size in bytes, and the faster of its out-of-place
    and in-place times (a warm-up outlier lands in one of them)."""

    nbytes: int
    time_us: float
    line: int


@dataclass(frozen=True)
class TestLog:
    """One nccl-tests run: its collective, ranks, GPUs per node (ranks per host), the GPU
    model, NCCL_ALGO / NCCL_PROTO where the log or the user says, and its rows."""

    source: str
    collective: str
    nranks: int
    ranks_per_node: int
    gpu: str | None
    algorithms: tuple[str, ...] | None  # NCCL_ALGO: the algorithms NCCL may pick from (None: all)
    protocols: tuple[str, ...] | None  # NCCL_PROTO likewise
    rows: tuple[Row, ...]
    #: other NCCL settings the log records that can move NCCL's times and that the simulation
    #: does not model ("NCCL_MIN_CTAS=24")
    unmodelled: tuple[str, ...] = ()

    @property
    def nodes(self) -> int:
        return self.nranks // self.ranks_per_node


def read_log(path: str | Path, collective: str | None = None, algorithm: str | None = None,
             protocol: str | None = None) -> TestLog:
    """A log file; `collective`, `algorithm` and `protocol` (NCCL_ALGO / NCCL_PROTO values:
    names, comma lists, or ^names to leave out) say what the log does not."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_LOG_BYTES:
        raise InputError(str(path), None, f"larger than {MAX_LOG_BYTES >> 20} MiB; an nccl-tests log is a few kB")
    text = data.decode("utf-8", errors="replace")
    return parse_log(text, str(path), collective, algorithm, protocol)


def parse_log(text: str, source: str, collective: str | None = None, algorithm: str | None = None,
              protocol: str | None = None) -> TestLog:
    """A log's text; see read_log."""
    header: list[str] | None = None
    ranks: dict[int, tuple[str, str]] = {}
    rows: list[Row] = []
    found_collective: str | None = None
    env: dict[str, str] = {}
    others: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = _STAMP.sub("", _PREFIX.sub("", raw)).rstrip()
        if not line.strip():
            continue
        if _states_settings(line):
            for kind, value in _ENV.findall(line):
                env[kind] = value
            for name, value in _SETTING.findall(line):
                if not HARMLESS.match(name):
                    others[name] = value
        if line.lstrip().startswith("#"):
            m = _RANK.match(line.strip())
            if m:
                ranks[int(m.group(1))] = (m.group(2), m.group(4).strip())
                continue
            m = _COLLECTIVE.search(line)
            if m:
                found_collective = _collective_name(m.group(1), source, number)
                continue
            words = line.lstrip("#").split()
            if words[:2] == ["size", "count"] and "time" in words:
                header = words
            continue
        if header is None:
            continue
        tokens = line.split()
        if not tokens or not tokens[0].isdigit():
            continue  # an NCCL INFO or WARN line, a version line, a progress line
        row = _row(tokens, header, source, number)
        if row is not None:
            rows.append(row)
    if header is None or not rows:
        raise InputError(source, None, "no nccl-tests table: expected a '#  size  count  type ...' header and rows of "
                         "results under it")
    name = found_collective or collective or _collective_from_name(source)
    if name is None:
        raise InputError(source, None, "cannot tell which collective this log times (no 'Collective test starting' "
                         "line, no binary name in the file name); say it with --coll")
    if len(ranks) < 2:
        raise InputError(source, "Rank lines", f"{len(ranks)} rank(s) listed; a calibration needs a run of at least "
                         "2 ranks, with their '#  Rank N ... on HOST device D [..] GPU' lines")
    hosts: dict[str, int] = {}
    models = set()
    for host, description in ranks.values():
        hosts[host] = hosts.get(host, 0) + 1
        model = gpu_from_description(description)
        models.add(model.name if model else description or None)
    per_node = set(hosts.values())
    if len(per_node) > 1:
        raise InputError(source, "Rank lines", f"hosts run different numbers of ranks ({sorted(per_node)}): expected "
                         "one machine with the same GPUs in every node")
    if len(models) > 1:
        raise InputError(source, "Rank lines", f"mixed GPUs {sorted(map(str, models))}: expected one machine")
    gpu = next(iter(models))
    algorithms = allowed(env.get("ALGO") or algorithm, ALGORITHM_NAMES, source, "NCCL_ALGO")
    if others.pop("NCCL_NVLS_ENABLE", None) == "0":  # NCCL then never runs NVLS or NVLSTree
        algorithms = tuple(a for a in (algorithms or ("ring", "tree", "nvls", "nvlstree")) if a not in ("nvls", "nvlstree"))
    return TestLog(source, name, len(ranks), per_node.pop(), gpu, algorithms,
                   allowed(env.get("PROTO") or protocol, PROTOCOL_NAMES, source, "NCCL_PROTO"),
                   tuple(sorted(rows, key=lambda r: r.nbytes)), tuple(f"{k}={v}" for k, v in sorted(others.items())))


def _states_settings(line: str) -> bool:
    """Whether a line states how NCCL was run: NCCL's own INFO line, or a comment that records
    the environment or the command (not prose that merely mentions a setting)."""
    if "set by environment to" in line:
        return True
    words = line.lstrip("#").split()
    if not line.lstrip().startswith("#") or not words:
        return False
    return words[0].lower().rstrip(":") in ("env", "environment", "command", "cmd") or any(
        w in ("mpirun", "srun", "export", "-x", "env") for w in words)


def _row(tokens: list[str], header: list[str], source: str, number: int) -> Row | None:
    """A result row, or None for a row that times nothing (size 0)."""
    try:
        size = int(tokens[0])
    except ValueError:
        return None
    times = [i for i, name in enumerate(header) if name in ("time", "cputime")]
    if len(tokens) < len(header) or not times:
        raise InputError(source, f"line {number}", f"expected {len(header)} columns as the header names "
                         f"({' '.join(header)}), got {len(tokens)}")
    values = []
    for i in times:
        try:
            value = float(tokens[i])
        except ValueError:
            raise InputError(source, f"line {number}", f"expected a time in microseconds in column {i + 1}, "
                             f"got {tokens[i]!r}") from None
        if not 0 < value < 1e12:
            raise InputError(source, f"line {number}", f"expected a positive time in microseconds, got {tokens[i]!r}")
        wrong = _wrong(tokens, header, i)
        if wrong:
            half = "in-place" if i != times[0] else "out-of-place" if len(times) > 1 else "only"
            raise InputError(source, f"line {number}", f"nccl-tests counted {wrong} wrong elements in the {half} run: "
                             "a run that computed wrong results measures no working NCCL; rerun it or drop the row")
        values.append(value)
    if size <= 0:
        return None
    return Row(size, min(values), number)


def _wrong(tokens: list[str], header: list[str], time: int) -> str | None:
    """The `#wrong` cell of the half whose time is in column `time`, when it counts any wrong
    elements (N/A, with validation off, counts none); older layouts' `error`, a magnitude, is
    not a count and is left alone."""
    for j in range(time + 1, len(header)):
        if header[j] in ("time", "cputime"):
            return None
        if header[j] == "#wrong":
            try:
                return tokens[j] if float(tokens[j]) > 0 else None
            except ValueError:
                return None
    return None


def _collective_name(binary: str, source: str, number: int) -> str:
    name = BINARIES.get(binary)
    if name is None:
        raise InputError(source, f"line {number}", f"unknown nccl-tests binary {binary!r}")
    return name


def _collective_from_name(source: str) -> str | None:
    stem = Path(source).name.lower()
    for binary, name in sorted(BINARIES.items(), key=lambda kv: -len(kv[0])):
        if binary in stem or binary.replace("_", "") in stem:
            return name
    return None


def allowed(value: str | None, names: dict[str, str], source: str | None, what: str) -> tuple[str, ...] | None:
    """What NCCL_ALGO or NCCL_PROTO lets NCCL pick from: a comma list of names, or of names
    after ^ to leave out (NCCL's syntax); None when unset.

    >>> allowed("^LL128", PROTOCOL_NAMES, None, "NCCL_PROTO"), allowed("Ring,tree", ALGORITHM_NAMES, None, "NCCL_ALGO")
    (('LL', 'Simple'), ('ring', 'tree'))
    """
    if value is None:
        return None
    text = value.strip()
    exclude = text.startswith("^")
    parts = [p.strip().lower() for p in text.lstrip("^").replace(";", ",").split(",") if p.strip()]
    unknown = [p for p in parts if p not in names]
    if not parts or unknown:
        raise InputError(source, what, f"expected names among {', '.join(sorted(set(names.values())))} (a comma list, "
                         f"or ^ and the ones to leave out), got {value!r}")
    chosen = {names[p] for p in parts}
    every = list(dict.fromkeys(names.values()))
    return tuple(n for n in every if (n not in chosen) == exclude)


def same_machine(logs: list[TestLog]) -> None:
    """InputError unless every log ran on the same kind of node (GPU model, GPUs per node)."""
    first = logs[0]
    for log in logs[1:]:
        if (log.gpu, log.ranks_per_node) != (first.gpu, first.ranks_per_node):
            raise InputError(log.source, "Rank lines", f"{log.ranks_per_node} x {log.gpu} per node, but {first.source} "
                             f"has {first.ranks_per_node} x {first.gpu}: expected logs of one machine")
