"""A safe reader of any MSCCL XML file: no entity expansion, no DTD, no network, bounded
size, and one InputError naming the first bad field of a malformed file. Elements the
runtime would skip are skipped here too (msccl-runtime.md sections 1-6).

>>> from hipipe_compiler.msccl.program import Program
>>> from hipipe_compiler.msccl.writer import write_program
>>> program = Program("demo", "allreduce", "Simple", 1, 2, 2, True, True, 0, 1024, ())
>>> read_program(write_program(program).encode()) == program
True
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Iterable, Literal

from lxml import etree

from ..errors import InputError
from .program import (BUFFERS, COLLECTIVES, LEGACY_COLLECTIVES, LEGACY_ONLY, PROTOCOLS, STEP_TYPES, Gpu, Program, Step,
                      Threadblock)


#: Files larger than this are refused unread (a 1024-rank program is far smaller).
MAX_XML_BYTES = 512 << 20


_INT = re.compile(r"-?(0|[1-9][0-9]*)\Z")
#: Chunks a file may count (nchunksperloop, a buffer's chunks): step offsets are 16-bit, so
#: the runtime reaches chunks 0..32767 only; far more is a hostile file, which would make the
#: verifier's model of the buffers take gigabytes.
MAX_CHUNKS = 1 << 20
_TOO_MANY_CHUNKS = "expected at most 1048576 chunks (step offsets reach 32767), got {}"
_ALGO_REQUIRED = ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace")


class _Reader:
    """Turns the parsed element stream into a Program, naming the first bad field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, message: str) -> InputError:
        return InputError(self.source, field, message)

    def integer(self, attrs: dict[str, str], key: str, where: str, default: int | None = None) -> int:
        if key not in attrs:
            if default is not None:
                return default
            raise self.fail(f"{where}.{key}", "missing; this attribute is required")
        value = attrs[key]
        if not _INT.match(value):
            if re.fullmatch(r"-?0[0-9]+", value):
                raise self.fail(f"{where}.{key}", f"expected a plain decimal integer, got {value!r} (the runtime reads a leading zero as octal)")
            raise self.fail(f"{where}.{key}", f"expected a plain decimal integer, got {value[:40]!r}")
        number = int(value)
        if abs(number) > (1 << 62):
            raise self.fail(f"{where}.{key}", f"expected an integer of at most 62 bits, got {value[:40]!r}")
        return number

    def choice(self, attrs: dict[str, str], key: str, where: str, allowed: Iterable[str]) -> str:
        allowed = tuple(allowed)
        if key not in attrs:
            raise self.fail(f"{where}.{key}", "missing; this attribute is required")
        value = attrs[key]
        if value not in allowed:
            raise self.fail(f"{where}.{key}", f"expected one of {', '.join(allowed)}, got {value[:40]!r}")
        return value

    def flag(self, attrs: dict[str, str], key: str, where: str, default: int | None = None) -> bool:
        value = self.integer(attrs, key, where, default)
        return value != 0


def read_program(source: str | Path | bytes, dialect: Literal["auto", "executor", "legacy"] = "auto",
                 name: str | None = None) -> Program:
    """Parse MSCCL XML (a path, or the bytes of a file) into a Program.

    The parser never expands entities, never loads a DTD or touches the network, refuses
    DOCTYPEs and files over MAX_XML_BYTES, and names the first bad field of a malformed
    file in an InputError. Elements the runtime would skip are skipped here too.
    """
    if isinstance(source, (bytes, bytearray)):
        data, label = bytes(source), name or "<xml>"
        if len(data) > MAX_XML_BYTES:
            raise InputError(label, None, f"file is larger than {MAX_XML_BYTES >> 20} MiB")
    else:
        label = name or str(source)
        try:
            with open(source, "rb") as fh:
                data = fh.read(MAX_XML_BYTES + 1)  # a device such as /dev/zero has no size to check first
            if len(data) > MAX_XML_BYTES:
                raise InputError(label, None, f"file is larger than {MAX_XML_BYTES >> 20} MiB")
        except OSError as exc:
            raise InputError(label, None, f"cannot read file: {exc.strerror or exc}") from None
    return _parse(data, label, dialect)


#: Bytes a header-only read looks at: the <algo> element comes first, after a comment or two.
HEADER_BYTES = 64 << 10


def read_header(path: str | Path, dialect: Literal["auto", "executor", "legacy"] = "auto") -> Program:
    """The <algo> attributes of an MSCCL file as a Program with no gpus: what the runtime
    reads at communicator setup and matches calls against (msccl/selection.py). Reads only
    the file's first HEADER_BYTES."""
    label = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEADER_BYTES)
    except OSError as exc:
        raise InputError(label, None, f"cannot read file: {exc.strerror or exc}") from None
    return _parse(data, label, dialect, header_only=True)


def _parse(data: bytes, label: str, dialect: str, header_only: bool = False) -> Program:
    reader = _Reader(label)
    if re.search(rb"<!DOCTYPE|<!ENTITY", data, re.I):
        raise reader.fail("", "DOCTYPE and entity declarations are not allowed in MSCCL XML")
    events = etree.iterparse(
        io.BytesIO(data), events=("start", "end"), resolve_entities=False, no_network=True, load_dtd=False,
        huge_tree=False, remove_comments=True, remove_pis=True, dtd_validation=False, recover=False,
    )
    algo: dict[str, str] | None = None
    gpus: list[Gpu] = []
    gpu_attrs: tuple[int, int, int, int] | None = None
    tbs: list[Threadblock] = []
    tb_attrs: tuple[int, int, int, int] | None = None
    steps: list[Step] = []
    depth, skip_below = 0, None
    #: Steps read so far, by their attributes (strings, in document order): ranks repeat each
    #: other's steps (a 1024-rank file has 450 thousand and 24 thousand distinct), so each
    #: distinct one is checked and built once and shared.
    known: dict[tuple[tuple[str, str], ...], Step] = {}
    gi = ti = si = -1
    try:
        for event, elem in events:
            if event == "start":
                depth += 1
                if skip_below is not None:
                    continue
                tag = elem.tag
                if depth == 1:
                    if tag != "algo":
                        raise reader.fail("", f"expected the first element to be <algo>, got <{tag}>")
                    algo = dict(elem.attrib)
                    if header_only:
                        break
                elif depth == 2 and tag == "gpu":
                    gi += 1
                    ti = -1
                    w = f"gpu[{gi}]"
                    ga = elem.attrib
                    gpu_attrs = (reader.integer(ga, "id", w), reader.integer(ga, "i_chunks", w),
                                 reader.integer(ga, "o_chunks", w), reader.integer(ga, "s_chunks", w))
                    for key, value in zip(("i_chunks", "o_chunks", "s_chunks"), gpu_attrs[1:]):
                        if value > MAX_CHUNKS:
                            raise reader.fail(f"{w}.{key}", _TOO_MANY_CHUNKS.format(value))
                    tbs = []
                elif depth == 3 and tag == "tb":
                    ti += 1
                    si = -1
                    w = f"gpu[{gi}].tb[{ti}]"
                    ta = elem.attrib
                    tb_attrs = (reader.integer(ta, "id", w), reader.integer(ta, "send", w),
                                reader.integer(ta, "recv", w), reader.integer(ta, "chan", w))
                    steps = []
                elif depth == 4 and tag == "step":
                    si += 1
                    sa = elem.attrib
                    seen = tuple(sa.items())
                    step = known.get(seen)
                    if step is None:
                        w = f"gpu[{gi}].tb[{ti}].step[{si}]"
                        step = known[seen] = _step(reader, sa, w)
                    steps.append(step)
                else:
                    skip_below = depth  # the runtime skips unknown elements with their subtree
            else:
                if skip_below is not None:
                    if depth == skip_below:
                        skip_below = None
                elif depth == 4:
                    elem.clear()
                elif depth == 3 and tb_attrs is not None:
                    tbs.append(Threadblock(*tb_attrs, tuple(steps)))
                    tb_attrs = None
                    elem.clear()
                elif depth == 2 and gpu_attrs is not None:
                    gpus.append(Gpu(*gpu_attrs, tuple(tbs)))
                    gpu_attrs = None
                    elem.clear()
                    parent = elem.getparent()
                    if parent is not None:
                        while elem.getprevious() is not None:
                            del parent[0]
                depth -= 1
    except etree.XMLSyntaxError as exc:
        line = f" at line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        msg = " ".join(str(getattr(exc, "msg", exc)).split(", line")[0].split())  # libxml2 ends some with a newline
        raise reader.fail("", f"malformed XML{line}: {msg}") from None
    if algo is None:
        raise reader.fail("", "no <algo> element")
    return _program(reader, algo, dialect, tuple(gpus))


def _program(reader: _Reader, a: dict[str, str], dialect: str, gpus: tuple[Gpu, ...]) -> Program:
    names = {"executor": COLLECTIVES, "legacy": LEGACY_COLLECTIVES}.get(dialect, (*COLLECTIVES, *LEGACY_ONLY))
    if dialect == "executor" and a.get("coll") in LEGACY_ONLY:
        raise reader.fail("algo.coll", f"{a['coll']!r} is a name of the legacy microsoft/msccl runtime; the executor "
                                       f"expects one of {', '.join(COLLECTIVES)} (a legacy file: --dialect legacy)")
    coll_raw = reader.choice(a, "coll", "algo", names)
    # auto: the legacy runtime has its own reduce-scatter name and no outofplace attribute
    is_legacy = dialect == "legacy" or (dialect == "auto" and (coll_raw in LEGACY_ONLY or "outofplace" not in a))
    collective = "reducescatter" if coll_raw == "reduce_scatter" else coll_raw
    for key in _ALGO_REQUIRED:
        if key not in a:
            raise reader.fail(f"algo.{key}", "missing; this attribute is required")
    if not is_legacy:
        for key in ("outofplace", "minBytes", "maxBytes"):
            if key not in a:
                raise reader.fail(f"algo.{key}", "missing; msccl-executor-nccl and RCCL require it (files for the "
                                                 "legacy microsoft/msccl runtime lack it: --dialect legacy)")
    protocol = reader.choice(a, "proto", "algo", PROTOCOLS)
    ngpus = reader.integer(a, "ngpus", "algo")
    nchannels = reader.integer(a, "nchannels", "algo")
    nchunks = reader.integer(a, "nchunksperloop", "algo")
    inplace = reader.flag(a, "inplace", "algo")
    if is_legacy:
        outofplace = not inplace
        min_bytes = reader.integer(a, "minBytes", "algo", 0)
        legacy_max = reader.integer(a, "maxBytes", "algo", 128 << 20)
        if legacy_max <= min_bytes:
            # its range is [minBytes, maxBytes): empty, so the runtime never selects the file
            raise reader.fail("algo.maxBytes", f"expected more than minBytes ({min_bytes}): the legacy runtime selects "
                                               f"calls of minBytes up to maxBytes exclusive, so {legacy_max} selects none")
        max_bytes = legacy_max - 1
    else:
        outofplace = reader.flag(a, "outofplace", "algo")
        min_bytes = reader.integer(a, "minBytes", "algo")
        max_bytes = reader.integer(a, "maxBytes", "algo")
    if not 1 <= ngpus <= 65536:
        raise reader.fail("algo.ngpus", f"expected 1 to 65536 ranks, got {ngpus}")
    if nchunks < 1:
        raise reader.fail("algo.nchunksperloop", f"expected an integer >= 1, got {nchunks}")
    if nchunks > MAX_CHUNKS:
        raise reader.fail("algo.nchunksperloop", _TOO_MANY_CHUNKS.format(nchunks))
    if nchannels < 1:
        raise reader.fail("algo.nchannels", f"expected an integer >= 1, got {nchannels}")
    if min_bytes < 0:
        raise reader.fail("algo.minBytes", f"expected a byte count >= 0, got {min_bytes}")
    if max_bytes < 0:
        raise reader.fail("algo.maxBytes", f"expected a byte count >= 0, got {max_bytes}")
    return Program(
        name=a.get("name", ""), collective=collective, protocol=protocol, nchannels=nchannels,
        nchunksperloop=nchunks, ngpus=ngpus, inplace=inplace, outofplace=outofplace,
        min_bytes=min_bytes, max_bytes=max_bytes, gpus=gpus,
    )


def _step(reader: _Reader, sa: dict[str, str], w: str) -> Step:
    """One step element; its attributes alone decide it (or the error naming `w`)."""
    return Step(
        s=reader.integer(sa, "s", w),
        type=reader.choice(sa, "type", w, STEP_TYPES),
        srcbuf=reader.choice(sa, "srcbuf", w, BUFFERS),
        srcoff=reader.integer(sa, "srcoff", w),
        dstbuf=reader.choice(sa, "dstbuf", w, BUFFERS),
        dstoff=reader.integer(sa, "dstoff", w),
        cnt=reader.integer(sa, "cnt", w),
        depid=reader.integer(sa, "depid", w),
        deps=reader.integer(sa, "deps", w),
        hasdep=_hasdep(reader, sa, w),
    )


def _hasdep(reader: _Reader, attrs: dict[str, str], where: str) -> bool:
    value = reader.integer(attrs, "hasdep", where)
    if value not in (0, 1):
        raise reader.fail(f"{where}.hasdep", f"expected 0 or 1, got {value}")
    return bool(value)
