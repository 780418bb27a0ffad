"""Execution plans from JSON, safely: bounded size and nesting, every field type-checked, and
one InputError naming the file and the field (as `gpus[3].threadblocks[0].ops[5].src_buff[1].index`)
where the executor's loader would throw, read garbage or crash (mscclpp.md 2 and 6).

>>> plan = read_plan_text('{"name": "x", "collective": "allreduce", "protocol": "Simple", "inplace": false, "gpus": []}')
>>> plan.name, plan.ngpus
('x', 0)
>>> read_plan_text('{"name": "x", "collective": "allreduce", "protocol": "Simple", "inplace": 1, "gpus": []}')
Traceback (most recent call last):
...
hipipe_compiler.errors.InputError: <plan>: inplace: expected true or false, got 1
"""

from __future__ import annotations

import json
import marshal
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..collector import paused
from ..errors import InputError
from .plan import (BUFFER_TYPES, MAX_MESSAGE_SIZE, Channel, ExecutionPlan, GpuPlan, Op, Operand, RemoteBuffer,
                   TbBuffers, TbChannels, Threadblock)

MAX_FILE_BYTES = 256 << 20
MAX_DEPTH = 32
MAX_INT = (1 << 64) - 1


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        #: Operations read so far, by their marshalled JSON: ranks repeat each other's operations
        #: (a 1024-rank plan has 1.7 million and 40 thousand distinct), so each distinct one is
        #: checked and built once and shared. Equal bytes mean equal values of equal types
        #: (marshal tells 1 from true and from 1.0), so a repeat is exactly what was accepted.
        self.ops: dict[bytes, Op] = {}
        #: Threadblocks' operation lists, likewise: ranks running the same list share it, and
        #: later passes can tell so at a glance.
        self.op_lists: dict[bytes, tuple[Op, ...]] = {}

    def fail(self, field: str, message: str) -> InputError:
        return InputError(self.source, field or None, message)

    def obj(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected an object, got {_kind(value)}")
        return value

    def list(self, value: Any, field: str) -> list:
        if not isinstance(value, list):
            raise self.fail(field, f"expected a list, got {_kind(value)}")
        return value

    def int(self, doc: dict, key: str, field: str, default: int | None = None, low: int = 0, high: int = MAX_INT) -> int:
        value = doc.get(key, default)
        if type(value) is int and low <= value <= high:
            return value
        where = f"{field}.{key}" if field else key
        if value is None:
            raise self.fail(where, "expected an integer; the loader requires it")
        raise self.fail(where, f"expected an integer from {low} to {high}, got {_short(value)}")

    def str(self, doc: dict, key: str, field: str, default: str | None = None, choices: tuple[str, ...] | None = None) -> str:
        value = doc.get(key, default)
        if type(value) is str and (choices is None or value in choices):
            return value
        where = f"{field}.{key}" if field else key
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string; got {_short(value)}")
        raise self.fail(where, f"expected one of {', '.join(choices or ())}, got {_short(value)}")

    def bool(self, doc: dict, key: str, field: str, default: bool | None = None) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{field}.{key}" if field else key, f"expected true or false, got {_short(value)}")
        return value

    def ints(self, doc: dict, key: str, field: str, high: int = MAX_INT) -> tuple[int, ...]:
        values = doc.get(key)
        if type(values) is not list:
            raise self.fail(f"{field}.{key}", f"expected a list, got {_kind(values)}")
        for i, v in enumerate(values):
            if type(v) is not int or not 0 <= v <= high:
                raise self.fail(f"{field}.{key}[{i}]", f"expected an integer from 0 to {high}, got {_short(v)}")
        return tuple(values)

    # -- the format ---------------------------------------------------------------------------
    def plan(self, doc: Any) -> ExecutionPlan:
        doc = self.obj(doc, "")
        gpus = self.list(doc.get("gpus"), "gpus")
        return ExecutionPlan(
            name=self.str(doc, "name", ""), collective=self.str(doc, "collective", ""),
            protocol=self.str(doc, "protocol", ""), inplace=self.bool(doc, "inplace", ""),
            gpus=tuple(self.gpu(g, f"gpus[{i}]") for i, g in enumerate(gpus)),
            num_threads_per_block=self.int(doc, "num_threads_per_block", "", 1024, 1, 1 << 31),
            min_message_size=self.int(doc, "min_message_size", "", 0),
            max_message_size=self.int(doc, "max_message_size", "", MAX_MESSAGE_SIZE),
            buffer_alignment=self.int(doc, "buffer_alignment", "", 16, 1, 1 << 31),
            reuse_resources=self.bool(doc, "reuse_resources", "", False),
            use_double_scratch_buffer=self.bool(doc, "use_double_scratch_buffer", "", False),
        )

    def gpu(self, doc: Any, field: str) -> GpuPlan:
        doc = self.obj(doc, field)
        head = (self.int(doc, "id", field), self.int(doc, "input_chunks", field, None, 0, 1 << 31),
                self.int(doc, "output_chunks", field, None, 0, 1 << 31), self.int(doc, "scratch_chunks", field, None, 0, 1 << 31))
        channels = []
        for i, c in enumerate(self.list(doc.get("channels"), f"{field}.channels")):
            where = f"{field}.channels[{i}]"
            c = self.obj(c, where)
            kind = self.str(c, "channel_type", where, choices=("memory", "port", "switch"))
            if kind == "switch":
                groups = []
                for k, grp in enumerate(self.list(c.get("rank_groups"), f"{where}.rank_groups")):
                    groups.append(self.ints(self.obj(grp, f"{where}.rank_groups[{k}]"), "ranks", f"{where}.rank_groups[{k}]"))
                channels.append(Channel(kind, (), self.str(c, "buffer_type", where, choices=BUFFER_TYPES), tuple(groups)))
            else:
                channels.append(Channel(kind, self.ints(c, "connected_to", where)))
        buffers = []
        for i, b in enumerate(self.list(doc.get("remote_buffers"), f"{field}.remote_buffers")):
            where = f"{field}.remote_buffers[{i}]"
            b = self.obj(b, where)
            kinds = self.list(b.get("access_channel_types"), f"{where}.access_channel_types")
            if not all(k in ("memory", "port") for k in kinds):
                raise self.fail(f"{where}.access_channel_types", "expected memory or port entries")
            buffers.append(RemoteBuffer(self.int(b, "rank", where), self.str(b, "type", where, choices=BUFFER_TYPES),
                                        tuple(kinds)))
        sems = []
        for i, s in enumerate(self.list(doc.get("semaphores", []), f"{field}.semaphores")):
            sems.append(self.int(self.obj(s, f"{field}.semaphores[{i}]"), "init_value", f"{field}.semaphores[{i}]", 0, 0, 1 << 20))
        tbs = tuple(self.threadblock(tb, f"{field}.threadblocks[{i}]")
                    for i, tb in enumerate(self.list(doc.get("threadblocks"), f"{field}.threadblocks")))
        return GpuPlan(*head, tbs, tuple(channels), tuple(buffers), tuple(sems))

    def threadblock(self, doc: Any, field: str) -> Threadblock:
        doc = self.obj(doc, field)
        channels = []
        for i, c in enumerate(self.list(doc.get("channels"), f"{field}.channels")):
            where = f"{field}.channels[{i}]"
            c = self.obj(c, where)
            channels.append(TbChannels(self.str(c, "channel_type", where, choices=("memory", "port", "switch")),
                                       self.ints(c, "channel_ids", where)))
        refs = []
        for i, b in enumerate(self.list(doc.get("remote_buffer_refs", []), f"{field}.remote_buffer_refs")):
            where = f"{field}.remote_buffer_refs[{i}]"
            b = self.obj(b, where)
            refs.append(TbBuffers(self.str(b, "access_channel_type", where, choices=("memory", "port")),
                                  self.ints(b, "remote_buffer_ids", where)))
        raw = self.list(doc.get("ops"), f"{field}.ops")
        key = marshal.dumps(raw)
        ops = self.op_lists.get(key)
        if ops is None:
            ops = self.op_lists[key] = tuple([self.known_op(o, f"{field}.ops[{i}]") for i, o in enumerate(raw)])
        return Threadblock(self.int(doc, "id", field), ops, tuple(channels), tuple(refs))

    def known_op(self, doc: Any, field: str) -> Op:
        """A threadblock's operation: the one already built from the same JSON, or a new one."""
        key = marshal.dumps(doc)
        op = self.ops.get(key)
        if op is None:
            op = self.ops[key] = self.op(doc, field, True)
        return op

    def op(self, doc: Any, field: str, top: bool) -> Op:
        doc = self.obj(doc, field)
        name = self.str(doc, "name", field)
        if name == "pipeline":
            if not top:
                raise self.fail(f"{field}.name", "pipelines do not nest")
            ctx = self.obj(doc.get("iter_context"), f"{field}.iter_context")
            nested = tuple(self.op(o, f"{field}.ops[{i}]", False) for i, o in enumerate(self.list(doc.get("ops"), f"{field}.ops")))
            return Op(name, unit_size=self.int(ctx, "unit_size", f"{field}.iter_context", None, 1, 1 << 32),
                      num_chunks=self.int(ctx, "num_chunks", f"{field}.iter_context", None, 1, 1 << 31), ops=nested)
        if name == "barrier":
            return Op(name, barrier_id=self.int(doc, "barrier_id", field, None, 0, 1 << 16),
                      num_threadblocks=self.int(doc, "num_threadblocks", field, None, 1, 1 << 16))
        if name in ("sem_acquire", "sem_release"):
            return Op(name, semaphore_ids=self.ints(doc, "semaphore_ids", field))
        tbg = None
        if "tbg_info" in doc:
            info = self.obj(doc["tbg_info"], f"{field}.tbg_info")
            tbg = (self.int(info, "tb_id", f"{field}.tbg_info"), self.int(info, "tbg_size", f"{field}.tbg_info", None, 1))
        return Op(
            name, self.str(doc, "channel_type", field, "none", ("memory", "port", "switch", "none")),
            self.ints(doc, "channel_ids", field) if "channel_ids" in doc else (),
            self.operands(doc, "src_buff", field), self.operands(doc, "dst_buff", field), tbg=tbg)

    def operands(self, doc: dict, key: str, field: str) -> tuple[Operand, ...]:
        if key not in doc:
            return ()
        out = []
        for i, o in enumerate(self.list(doc[key], f"{field}.{key}")):
            where = f"{field}.{key}[{i}]"
            o = self.obj(o, where)
            index, size = self.int(o, "index", where, None, 0, 1 << 32), self.int(o, "size", where, None, 0, 1 << 32)
            if "type" in o:
                out.append(Operand(self.str(o, "type", where, choices=BUFFER_TYPES), index, size))
            elif "buffer_id" in o:
                out.append(Operand(None, index, size, buffer_id=self.int(o, "buffer_id", where, None, 0, 1 << 16)))
            elif "switch_channel_id" in o:
                out.append(Operand(None, index, size, switch_channel_id=self.int(o, "switch_channel_id", where, None, 0, 1 << 16)))
            else:
                raise self.fail(where, "expected one of type, buffer_id or switch_channel_id")
        return tuple(out)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (set, bytes)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: A JSON string, escapes included (the unrolled form, which the regex engine runs fast).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
#: Every byte but the four brackets, for bytes.translate to delete; and but them and the quote.
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_NOT_MARKS = bytes(c for c in range(256) if c not in b'[]{}"')


def _depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings, found before json.loads recurses into
    it; a string left open runs to the end. In C-speed passes: a plan may be 100 MB."""
    return _depth_unescaped(text) if "\\" not in text else _depth_escaped(text)


def _depth_unescaped(text: str) -> int:
    """`_depth` of a text with no backslash, where a string runs from a quote to the next."""
    marks = np.frombuffer(text.encode("utf-8", "surrogatepass").translate(None, _NOT_MARKS), dtype=np.uint8)
    opens = (marks == ord("[")) | (marks == ord("{"))
    steps = opens.astype(np.int8) - ((marks == ord("]")) | (marks == ord("}")))
    steps[(np.cumsum(marks == ord('"'), dtype=np.int32) & 1).astype(bool)] = 0  # from an opening quote to its close
    return int(max(0, np.cumsum(steps, dtype=np.int32).max(initial=0)))


def _depth_escaped(text: str) -> int:
    """`_depth` of any text: strings, escapes included, are cut out first."""
    bare = _STRING.sub("", text)
    cut = bare.find('"')
    brackets = (bare if cut < 0 else bare[:cut]).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    marks = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((marks == ord("[")) | (marks == ord("{")), 1, -1)
    return int(max(0, np.cumsum(steps).max()))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) < len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return out


def read_plan_text(text: str, source: str = "<plan>") -> ExecutionPlan:
    if _depth(text) > MAX_DEPTH:
        raise InputError(source, None, f"nested deeper than {MAX_DEPTH} levels; an execution plan needs 8")
    with paused():  # a plan is millions of JSON values, none in a cycle: collections would walk them all
        try:
            doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise InputError(source, None, f"not valid JSON: {exc}") from None
        return _Reader(source).plan(doc)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_plan(path: str | Path) -> ExecutionPlan:
    """Read an execution plan file; InputError (exit 2) naming the file and field when it is bad."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InputError(str(path), None, f"{size} bytes; plans over {MAX_FILE_BYTES >> 20} MiB are refused")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")  # nlohmann, the loader's parser, skips a byte order mark too
    except UnicodeDecodeError:
        raise InputError(str(path), None, "not UTF-8 text") from None
    return read_plan_text(text, str(path))


def looks_like_plan(path: str | Path) -> bool:
    """Whether a file is meant as a JSON plan rather than MSCCL XML: its first non-blank
    character opens a JSON value ('{' or '['), or it is named .json and does not open a tag, so
    that a broken plan is reported as bad JSON rather than as bad XML."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512).removeprefix(b"\xef\xbb\xbf").lstrip()
    except OSError:
        return False
    return head.startswith((b"{", b"[")) or Path(path).suffix.lower() == ".json" and not head.startswith(b"<")
