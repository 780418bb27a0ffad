"""A PyTorch module's layers as the planner sees them, and its layer profile measured here.

A layer is a module that runs its own forward and owns parameters: its direct ones, and those
of descendants that never run a forward of their own (nn.MultiheadAttention uses its
`out_proj` weights without calling it). Layers are named by their qualified names and ordered
by when their forward first runs. `layer_profile` measures each layer's forward time and the
gap between gradient-ready events with hooks, and returns a layer-profile/v1 document that
`hipipe plan --profile` reads.
"""

# no `from __future__ import annotations`: torch inspects some hook signatures
import platform
import time
from typing import Any, Sequence

import torch

from ..documents import validate_document
from ..errors import InputError

#: Parameters in one layer: (qualified parameter name, tensor), in registration order.
LayerParams = list[tuple[str, torch.nn.Parameter]]


def called_modules(module: torch.nn.Module, example_input: Any) -> list[str]:
    """Qualified names of the submodules whose forward runs on `example_input`, in the order
    they first start (the root is '')."""
    order: dict[str, None] = {}

    def seen(name: str) -> None:  # a pre-hook that returns something replaces the input
        order.setdefault(name, None)

    handles = [m.register_forward_pre_hook(lambda _m, _a, name=name: seen(name)) for name, m in module.named_modules()]
    try:
        _call(module, example_input)  # with gradients, as in training (some modules take other paths without)
    finally:
        for h in handles:
            h.remove()
    return list(order)


def layer_params(module: torch.nn.Module, layers: Sequence[str]) -> dict[str, LayerParams]:
    """Each named layer's parameters: its own, and those of descendants that are not layers
    themselves. Raises InputError naming a layer the module lacks; parameters outside every
    layer are returned under the key None."""
    modules = dict(module.named_modules())
    missing = [name for name in layers if name not in modules]
    if missing:
        raise InputError(None, "layers", f"the module has no submodule {missing[0]!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    chosen = set(layers)
    out: dict[Any, LayerParams] = {name: [] for name in layers}
    for pname, param in module.named_parameters():
        owner = pname.rpartition(".")[0]
        while owner not in chosen and owner:
            owner = owner.rpartition(".")[0]
        out.setdefault(owner if owner in chosen else None, []).append((pname, param))
    return out


def model_layers(module: torch.nn.Module, example_input: Any) -> list[str]:
    """The planner's layers of a module (see the module docstring), in forward order."""
    called = called_modules(module, example_input)
    position = {name: i for i, name in enumerate(called)}
    owners: dict[str, int] = {}
    for pname, _param in module.named_parameters():
        owner = pname.rpartition(".")[0]
        while owner not in position and owner:
            owner = owner.rpartition(".")[0]
        if owner not in position:
            raise InputError(None, "module", f"parameter {pname!r} belongs to no module that runs on the example input")
        owners[owner] = position[owner]
    return sorted(owners, key=owners.__getitem__)


def layer_profile(module: torch.nn.Module, example_input: Any, iterations: int = 3, model: str | None = None) -> dict:
    """Measure a layer profile of `module` on `example_input` (a tensor, or a tuple of
    arguments): forward time per layer and backward gaps between gradient-ready events,
    averaged over `iterations` after one warm-up, on this machine. The result validates
    against schemas/layer-profile.schema.json.

    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> doc = layer_profile(net, torch.randn(16, 4), iterations=1)
    >>> [(layer["name"], layer["params"]) for layer in doc["layers"]]
    [('0', 40), ('2', 18)]
    """
    if iterations < 1:
        raise InputError(None, "iterations", f"expected an integer >= 1, got {iterations}")
    names = model_layers(module, example_input)
    params = layer_params(module, names)
    dtypes = {p.dtype for _n, p in module.named_parameters()}
    if len(dtypes) != 1:
        raise InputError(None, "module", f"expected parameters of one dtype, got {sorted(map(str, dtypes))}")
    cuda = any(p.is_cuda for p in module.parameters())
    fwd = {name: 0.0 for name in names}
    bwd = {name: 0.0 for name in names}
    for it in range(iterations + 1):
        starts, ready = _measure(module, example_input, names, params, cuda)
        if it == 0:
            continue  # warm-up
        order = [starts[n] for n in names] + [starts["end"]]
        for i, name in enumerate(names):
            fwd[name] += (order[i + 1] - order[i]) * 1e3 / iterations
        previous = starts["backward"]
        for name in reversed(names):
            bwd[name] += max(0.0, ready[name] - previous) * 1e3 / iterations
            previous = max(previous, ready[name])
    device = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    batch = example_input.shape[0] if isinstance(example_input, torch.Tensor) and example_input.dim() else None
    where = (f"measured by hipipe_compiler.torch.layer_profile on {platform.node() or 'this machine'} ({device}), "
             f"torch {torch.__version__}, mean of {iterations} iteration(s) after a warm-up")
    doc = {
        "schema": "layer-profile/v1", "model": model or type(module).__name__, "provenance": where,
        "order": "forward", "time_unit": "ms", "dtype_bytes": next(iter(dtypes)).itemsize,
        "batch_size": batch, "time_source": {"fwd": where, "bwd": where},
        "layers": [{"name": name, "params": sum(p.numel() for _n, p in params[name]),
                    "fwd_ms": round(fwd[name], 6), "bwd_ms": round(bwd[name], 6),
                    "tensors": [[pname, p.numel()] for pname, p in params[name]]} for name in names],
    }
    validate_document(doc, "layer-profile.schema.json", "layer_profile")
    return doc


def _call(module: torch.nn.Module, example_input: Any) -> Any:
    return module(*example_input) if isinstance(example_input, tuple) else module(example_input)


def _measure(module: torch.nn.Module, example_input: Any, names: list[str], params: dict[str, LayerParams],
             cuda: bool) -> tuple[dict[str, float], dict[str, float]]:
    """One forward and backward: when each layer's forward started (and the forward's end and
    the backward's start), and when each layer's last gradient was ready."""
    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    modules = dict(module.named_modules())
    starts: dict[str, float] = {}
    ready: dict[str, float] = {}
    def started(name: str) -> None:  # a pre-hook that returns something replaces the input
        starts.setdefault(name, now())

    def finished(name: str) -> None:
        ready[name] = now()

    handles = [modules[name].register_forward_pre_hook(lambda _m, _a, name=name: started(name)) for name in names]
    for name in names:
        for _pname, p in params[name]:
            handles.append(p.register_post_accumulate_grad_hook(lambda _p, name=name: finished(name)))
    try:
        module.zero_grad(set_to_none=True)
        out = _call(module, example_input)
        starts["end"] = now()
        loss = sum(o.float().sum() for o in (out if isinstance(out, (tuple, list)) else [out]))
        starts["backward"] = now()
        loss.backward()
    finally:
        for h in handles:
            h.remove()
        module.zero_grad(set_to_none=True)
    for name in names:
        ready.setdefault(name, starts["backward"])  # a layer whose parameters got no gradient
    return starts, ready
