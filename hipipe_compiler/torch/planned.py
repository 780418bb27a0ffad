"""Run a training plan (plan.json of `hipipe plan`) in PyTorch, PipeDAP style.

Each bucket's gradients are copied into one flat buffer, padded to the size the plan's
programs serve. As buckets complete in backward, their reduce-scatters (or all-reduces) are
issued in the plan's order. Each rank keeps the optimizer state of its shard of every
reduce-scattered bucket only (ZeRO-1), updates that shard once the bucket is reduced, and
all-gathers the updated shard where the plan says: in backward right after the reduce, or in
the next forward, just before the first layer that needs it (`forward_waits`).

    pdp = PlannedDataParallel(model, "plan/plan.json", lambda params: torch.optim.Adam(params, lr=1e-3))
    for x, y in loader:
        loss_fn(pdp(x), y).backward()
        pdp.step()
        pdp.zero_grad()

One backward per step: a bucket whose all-gather the plan puts in backward is updated as soon
as it is reduced, so gradients cannot be accumulated over several backward passes. Ops run in
the plan's order; on GPUs each lane is a CUDA stream, on CPU they run one after the other.
"""

# no `from __future__ import annotations`: torch inspects some hook signatures
import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist

from ..documents import load_document, validate_document
from ..errors import InputError
from .layers import layer_params
from .padding import all_gather_flat, reduce_scatter_flat

PLAN_SCHEMA = "plan.schema.json"


@dataclass(frozen=True)
class _Bucket:
    """One plan bucket bound to the module: its parameters in layout order and buffer sizes."""

    id: int
    primitive: str  # "allreduce" or "rs+ag"
    layers: tuple[str, ...]
    params: tuple[tuple[str, torch.nn.Parameter], ...]
    offsets: tuple[int, ...]
    elems: int
    length: int  # flat buffer elements: the largest call the plan makes for it


@dataclass(frozen=True)
class _Op:
    seq: int
    kind: str  # AR, RS, AG
    bucket: int
    lane: int
    phase: str
    grad_ready: tuple[int, ...]
    forward_start: tuple[str, ...]
    op_done: tuple[int, ...]


class PlannedDataParallel(torch.nn.Module):
    """Data-parallel training of `module` by a plan of `hipipe plan` (see the module docstring).

    `plan` is a plan.json path or its dict; `optimizer_factory(params)` builds the optimizer
    over this rank's shards (and the whole buffers of all-reduced buckets). With `trace`, every
    op and forward layer start is recorded in `self.trace` with its times."""

    def __init__(self, module: torch.nn.Module, plan: "str | Path | dict", optimizer_factory: Callable[[list], Any],
                 process_group: Any = None, trace: bool = False) -> None:
        super().__init__()
        source = str(plan) if not isinstance(plan, dict) else "plan"
        doc = plan if isinstance(plan, dict) else load_document(plan)
        validate_document(doc, PLAN_SCHEMA, source)
        self.group = process_group
        self.world = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        buckets = _bind(module, doc, self.world, source)  # every check before anything changes
        self.module = module
        self.plan = doc
        self.buckets = buckets
        self.ops = tuple(_Op(o["seq"], o["op"], o["bucket"], o["lane"], o["phase"],
                             tuple(a["grad_ready"] for a in o["after"] if "grad_ready" in a),
                             tuple(a["forward_start"] for a in o["after"] if "forward_start" in a),
                             tuple(a["op_done"] for a in o["after"] if "op_done" in a)) for o in doc["ops"])
        self.forward_waits = {layer: tuple(w["op_done"] for w in waits) for layer, waits in doc["forward_waits"].items()}
        ref = next(p for _n, p in buckets[0].params)
        self.flat_params = [ref.new_zeros(b.length) for b in buckets]
        self.flat_grads = [ref.new_zeros(b.length) for b in buckets]
        with torch.no_grad():
            for b, flat in zip(buckets, self.flat_params):
                for (_name, p), off in zip(b.params, b.offsets):
                    flat[off:off + p.numel()].copy_(p.reshape(-1))
                dist.broadcast(flat, dist.get_global_rank(process_group, 0) if process_group is not None else 0,
                               group=process_group)
                for (_name, p), off in zip(b.params, b.offsets):
                    p.data = flat[off:off + p.numel()].view_as(p)
        # what the optimizer steps: this rank's shard of a reduce-scattered bucket, the whole
        # buffer of an all-reduced one
        self.opt_params = [torch.nn.Parameter(self._shard(i).clone() if b.primitive == "rs+ag" else flat,
                                              requires_grad=False)
                           for i, (b, flat) in enumerate(zip(buckets, self.flat_params))]
        self.optimizer = optimizer_factory(self.opt_params)
        self.trace: list[dict] | None = [] if trace else None
        self.comm_seconds = 0.0  # in collectives
        self.wait_seconds = 0.0  # forward layers waiting for their ops
        self.emulated_reduce_scatter = False
        self._streams = _Lanes(ref.is_cuda, 1 + max(op.lane for op in self.ops))
        self._index = [{id(p): k for k, (_n, p) in enumerate(b.params)} for b in buckets]
        self._reset()
        self._active = False
        self._stepped = False
        self._hooks = []
        modules = dict(module.named_modules())
        for i, b in enumerate(buckets):
            for _name, p in b.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad(i, p)))
            for layer in b.layers:
                self._hooks.append(modules[layer].register_forward_pre_hook(lambda _m, _a, layer=layer: self._forward(layer)))

    # -- the training loop's calls ------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def step(self) -> None:
        """Finish this iteration's reduces and update every shard not updated yet; the
        remaining all-gathers follow in the plan's order (some from the next forward)."""
        if not self._active:
            return
        for i, b in enumerate(self.buckets):  # parameters that got no gradient count as zero
            if i not in self._ready:
                self._fill(i)
                self._ready.add(i)
        self._advance()
        self._stepped = True
        self._update([i for i in range(len(self.buckets)) if i not in self._updated])
        self._advance()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad(set_to_none=set_to_none)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The current full parameters by name (a copy). Between a step and the next forward it
        first completes the pending all-gathers, so call it on every rank."""
        if self._active and not self._stepped:
            raise RuntimeError("the gradients of this iteration are not reduced yet: call step() before full_parameters()")
        self._finish()
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}

    def checkpoint(self, gather_optimizer: bool = False) -> dict[str, Any]:
        """Full parameters and the optimizer state: this rank's shard, or with
        `gather_optimizer` (on every rank) the whole state, as one rank-independent dict."""
        params = self.full_parameters()
        state = copy.deepcopy(self.optimizer.state_dict())  # its tensors are the live state otherwise
        if gather_optimizer:
            state = {**state, "state": {k: {name: self._gathered(k, v) for name, v in entry.items()}
                                        for k, entry in state["state"].items()}}
        return {"parameters": params, "optimizer": state, "optimizer_gathered": gather_optimizer,
                "world_size": self.world, "rank": self.rank, "plan_policy": self.plan["policy"]}

    def load_checkpoint(self, ckpt: dict[str, Any]) -> None:
        """Restore a checkpoint of `checkpoint()`: a gathered one on any rank of a group of the
        same plan, a sharded one only on the rank and world size that wrote it."""
        if not ckpt.get("optimizer_gathered") and (ckpt.get("world_size"), ckpt.get("rank")) != (self.world, self.rank):
            raise InputError("checkpoint", "optimizer", f"a sharded state of rank {ckpt.get('rank')} of "
                             f"{ckpt.get('world_size')}; this is rank {self.rank} of {self.world} (save with gather_optimizer=True)")
        self._finish()
        own = dict(self.module.named_parameters())
        missing = sorted(set(own) - set(ckpt["parameters"]))
        if missing:
            raise InputError("checkpoint", "parameters", f"no value for {missing[0]!r}")
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(ckpt["parameters"][name])
            for i, b in enumerate(self.buckets):
                if b.primitive == "rs+ag":
                    self.opt_params[i].copy_(self._shard(i))
        state = ckpt["optimizer"]
        if ckpt.get("optimizer_gathered"):
            state = {**state, "state": {k: {name: self._sliced(k, v) for name, v in entry.items()}
                                        for k, entry in state["state"].items()}}
        self.optimizer.load_state_dict(state)

    # -- events ---------------------------------------------------------------------------------

    def _grad(self, i: int, p: torch.nn.Parameter) -> None:
        """A parameter's gradient is complete: copy it into its bucket; a full bucket is ready."""
        if not self._active or self._stepped:  # a new iteration: the last one's ops end first
            self._finish()
            self._reset()
            self._active, self._stepped = True, False
        if self._pending[i] == 0:
            raise RuntimeError("a second backward before step(): PlannedDataParallel runs one backward per step")
        b = self.buckets[i]
        off = b.offsets[self._index[i][id(p)]]
        self.flat_grads[i][off:off + p.numel()].copy_(p.grad.reshape(-1))
        self._pending[i] -= 1
        if self._pending[i] == 0:
            self._ready.add(i)
            self._advance()

    def _forward(self, layer: str) -> None:
        """A layer's forward starts: issue what waited for it, then wait for its ops."""
        if self._active:
            self._started.add(layer)
            self._advance()
            waits = self.forward_waits.get(layer, ())
            if waits:
                if any(seq >= self._cursor for seq in waits):
                    if not self._stepped:
                        raise RuntimeError(f"layer {layer!r} runs forward after backward but before step()")
                    self._advance(until=max(waits))
                start = time.perf_counter()
                for seq in waits:
                    self._streams.wait(self._done[seq])
                self.wait_seconds += time.perf_counter() - start
        if self.trace is not None:
            self.trace.append({"kind": "forward", "layer": layer, "time": time.perf_counter()})

    # -- the plan's ops -------------------------------------------------------------------------

    def _reset(self) -> None:
        self._cursor = 0
        self._ready: set[int] = set()
        self._started: set[str] = set()
        self._updated: set[int] = set()
        self._done: dict[int, Any] = {}
        self._pending = [len(b.params) for b in self.buckets]

    def _advance(self, until: int | None = None) -> None:
        """Issue ops in the plan's order while their events have happened (up to `until`,
        whatever the forward_start events)."""
        while self._cursor < len(self.ops):
            op = self.ops[self._cursor]
            forced = until is not None and op.seq <= until
            if not all(b in self._ready for b in op.grad_ready):
                return
            if not forced and not all(layer in self._started for layer in op.forward_start):
                return
            self._issue(op)
            self._cursor += 1

    def _issue(self, op: _Op) -> None:
        i = op.bucket
        deps = [self._done[s] for s in op.op_done]
        start = time.perf_counter()
        if op.kind == "AG":
            self._streams.wait_all(deps)
            self._update([i])
            self._done[op.seq] = self._streams.run(op.lane, deps, lambda: all_gather_flat(
                self.flat_params[i], self.opt_params[i].detach().clone(), group=self.group))
        elif op.kind == "RS":
            def reduce_scatter() -> None:
                out = self.flat_grads[i].new_empty(self.buckets[i].length // self.world)
                self.emulated_reduce_scatter = reduce_scatter_flat(out, self.flat_grads[i], group=self.group,
                                                                   emulate=self.emulated_reduce_scatter)
                self.opt_params[i].grad = out.div_(self.world)
            self._done[op.seq] = self._streams.run(op.lane, deps, reduce_scatter)
        else:
            def all_reduce() -> None:
                dist.all_reduce(self.flat_grads[i], group=self.group)
                self.opt_params[i].grad = self.flat_grads[i].div(self.world)
            self._done[op.seq] = self._streams.run(op.lane, deps, all_reduce)
        end = time.perf_counter()
        self.comm_seconds += end - start
        if self.trace is not None:
            self.trace.append({"kind": "op", "seq": op.seq, "op": op.kind, "bucket": i, "lane": op.lane,
                               "phase": op.phase, "start": start, "end": end})

    def _update(self, indices: Iterable[int]) -> None:
        """Step the optimizer on these buckets' shards (their reduces done), once per iteration."""
        todo = [i for i in indices if i not in self._updated]
        if not todo:
            return
        for i, op in ((op.bucket, op) for op in self.ops if op.kind in ("RS", "AR") and op.bucket in todo):
            self._streams.wait(self._done[op.seq])
        grads = {i: self.opt_params[i].grad for i in range(len(self.opt_params))}
        for i, p in enumerate(self.opt_params):
            p.grad = grads[i] if i in todo else None
        with torch.no_grad():
            self.optimizer.step()
        for i, p in enumerate(self.opt_params):
            p.grad = None if i in todo else grads[i]
        self._updated.update(todo)

    def _finish(self) -> None:
        """Issue and complete every op left in this iteration."""
        if self._active:
            self._advance(until=len(self.ops) - 1)
            self._streams.synchronize()
            self._active = False

    def _fill(self, i: int) -> None:
        """Copy the gradients a bucket has into its buffer; missing ones are zeros."""
        b = self.buckets[i]
        self.flat_grads[i].zero_()
        for (_name, p), off in zip(b.params, b.offsets):
            if p.grad is not None:
                self.flat_grads[i][off:off + p.numel()].copy_(p.grad.reshape(-1))

    # -- shards -----------------------------------------------------------------------------------

    def _shard(self, i: int) -> torch.Tensor:
        n = self.buckets[i].length // self.world
        return self.flat_params[i][self.rank * n:(self.rank + 1) * n]

    def _gathered(self, k: int, value: Any) -> Any:
        """An optimizer state entry of parameter k, whole (shards gathered from every rank)."""
        if not isinstance(value, torch.Tensor) or self.buckets[k].primitive != "rs+ag" or value.shape != self.opt_params[k].shape:
            return value
        out = value.new_empty(self.buckets[k].length)
        all_gather_flat(out, value.contiguous(), group=self.group)
        return out

    def _sliced(self, k: int, value: Any) -> Any:
        """This rank's shard of a whole optimizer state entry of parameter k."""
        if not isinstance(value, torch.Tensor) or self.buckets[k].primitive != "rs+ag" or value.shape != (self.buckets[k].length,):
            return value
        n = self.buckets[k].length // self.world
        return value[self.rank * n:(self.rank + 1) * n].clone()


class _Lanes:
    """Where ops run: on CPU in issue order, each to its end; on GPUs a CUDA stream per lane,
    ordered by events."""

    def __init__(self, cuda: bool, nlanes: int) -> None:
        self.cuda = cuda
        self.streams = [torch.cuda.Stream() for _ in range(nlanes)] if cuda else []

    def run(self, lane: int, deps: list, work: Callable[[], None]) -> Any:
        if not self.cuda:
            work()
            return None
        stream = self.streams[lane]
        stream.wait_stream(torch.cuda.current_stream())
        for event in deps:
            if event is not None:
                stream.wait_event(event)
        with torch.cuda.stream(stream):
            work()
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def wait(self, event: Any) -> None:
        if self.cuda and event is not None:
            torch.cuda.current_stream().wait_event(event)

    def wait_all(self, events: list) -> None:
        for event in events:
            self.wait(event)

    def synchronize(self) -> None:
        for stream in self.streams:
            stream.synchronize()


def _bind(module: torch.nn.Module, doc: dict, world: int, source: str) -> list[_Bucket]:
    """The plan's buckets bound to the module's parameters; InputError (one line) when the
    plan is for another world size, dtype or model."""
    if doc["world_size"] != world:
        raise InputError(source, "world_size", f"the plan is for {doc['world_size']} ranks; this process group has {world}")
    params = list(module.parameters())
    if not params:
        raise InputError(source, "buckets", "the module has no parameters")
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1 or next(iter(dtypes)).itemsize != doc["dtype_bytes"]:
        raise InputError(source, "dtype_bytes", f"the plan is for {doc['dtype_bytes']}-byte elements; the module's "
                         f"parameters are {', '.join(sorted(str(d).replace('torch.', '') for d in dtypes))}")
    layers = [layer for b in doc["buckets"] for layer in b["layers"]]
    if len(set(layers)) != len(layers):
        raise InputError(source, "buckets", "a layer is in more than one bucket")
    try:
        owned = layer_params(module, layers)
    except InputError as exc:
        raise InputError(source, "buckets.layers", exc.message) from None
    if owned.get(None):
        raise InputError(source, "buckets", f"parameter {owned[None][0][0]!r} of the module is in no bucket: "
                         "the plan is for another model")
    seqs = {o["seq"] for o in doc["ops"]}
    if [o["seq"] for o in doc["ops"]] != list(range(len(doc["ops"]))):
        raise InputError(source, "ops", "expected seq 0, 1, 2, ... in issue order")
    for o in doc["ops"]:
        if not 0 <= o["bucket"] < len(doc["buckets"]) or any(a.get("op_done", -1) >= o["seq"] for a in o["after"]):
            raise InputError(source, f"ops[{o['seq']}]", "expected a bucket that exists and dependencies on earlier ops")
    waiting = next((o["seq"] for o in doc["ops"] if any("forward_start" in a for a in o["after"])), None)
    late = next((o["seq"] for o in doc["ops"] if o["op"] in ("RS", "AR") and waiting is not None and o["seq"] > waiting), None)
    if late is not None:
        raise InputError(source, f"ops[{late}]", f"expected every reduce before op {waiting}, which waits for the next "
                         "forward: the step needs every reduce done")
    for layer, waits in doc["forward_waits"].items():
        if layer not in set(layers) or any(w["op_done"] not in seqs for w in waits):
            raise InputError(source, f"forward_waits.{layer}", "expected a layer of the plan waiting for ops that exist")
    out = []
    for idx, b in enumerate(doc["buckets"]):
        if b["id"] != idx:
            raise InputError(source, f"buckets[{idx}].id", f"expected {idx} (buckets in issue order)")
        members = [pair for layer in b["layers"] for pair in owned[layer]]
        elems = sum(p.numel() for _n, p in members)
        if elems != b["elems"]:
            raise InputError(source, f"buckets[{idx}].elems", f"the plan has {b['elems']} elements; the module's layers "
                             f"{', '.join(b['layers'][:3])}{'...' if len(b['layers']) > 3 else ''} have {elems}: "
                             "the plan is for another model")
        calls = [o["call_bytes"] // doc["dtype_bytes"] for o in doc["ops"] if o["bucket"] == idx and "call_bytes" in o]
        length = max([b["padded_elems"], elems, *calls])
        if b["primitive"] == "rs+ag" and length % world:
            raise InputError(source, f"buckets[{idx}].padded_elems", f"expected a multiple of the world size {world}, got {length}")
        offsets, off = [], 0
        for _n, p in members:
            offsets.append(off)
            off += p.numel()
        out.append(_Bucket(idx, b["primitive"], tuple(b["layers"]), tuple(members), tuple(offsets), elems, length))
    return out
