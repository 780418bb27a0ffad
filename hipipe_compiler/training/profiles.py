"""Layer profiles: per-layer parameter counts and compute times of one model (pipedap.md 4.2).

A profile is read from a user file (YAML or JSON, schemas/layer-profile.schema.json) or taken
by name from the built-in data (../shared/data/layer-profiles.json). Times the data marks as
synthetic are replaced by times derived from MACs and a stated `DeviceModel`; the profile's
`notes` say which times were derived and how.

>>> profile = profile_from_document({"model": "tiny", "dtype_bytes": 4, "layers": [
...     {"name": "a", "params": 10, "fwd_ms": 1.0, "bwd_ms": 2.0},
...     {"name": "b", "params": 6, "fwd_ms": 0.5, "bwd_ms": 1.0}]}, "tiny.yaml")
>>> profile.params, profile.nbytes, profile.compute_ms, profile.grad_ready_ms.tolist()
(16, 64, 4.5, [3.0, 1.0])
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..documents import load_document, validate_document
from ..errors import InputError
from ..units import MAX_BYTES, format_size

#: Models of ../shared/data/layer-profiles.json, selectable by name.
BUILTIN_PROFILES: tuple[str, ...] = ("vgg16", "resnet50", "densenet201", "bert_base", "gpt2")
SCHEMA_NAME = "layer-profile.schema.json"
#: Environment variable naming the shared directory that holds data/layer-profiles.json.
SHARED_DIR_ENV = "HIPIPE_SHARED_DIR"


@dataclass(frozen=True)
class DeviceModel:
    """The device that derived compute times assume: t_fwd = 2 * MACs * batch / throughput.

    `tflops` is *effective* (achieved) throughput, not peak. `bwd_to_fwd` is t_bwd / t_fwd
    (about 2: backward computes gradients of inputs and of weights). `layer_floor_ms` is the
    forward time of a layer with (almost) no MACs, such as BatchNorm or LayerNorm.
    """

    name: str
    tflops: float
    batch_size: int
    bwd_to_fwd: float = 2.0
    layer_floor_ms: float = 0.005

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tflops) and self.tflops > 0):
            raise InputError(None, "tflops", f"expected a number > 0, got {self.tflops!r}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise InputError(None, "batch_size", f"expected an integer >= 1, got {self.batch_size!r}")
        if not (math.isfinite(self.bwd_to_fwd) and self.bwd_to_fwd > 0):
            raise InputError(None, "bwd_to_fwd", f"expected a number > 0, got {self.bwd_to_fwd!r}")
        if not (math.isfinite(self.layer_floor_ms) and self.layer_floor_ms >= 0):
            raise InputError(None, "layer_floor_ms", f"expected a number >= 0, got {self.layer_floor_ms!r}")

    def describe(self, batch_size: int | None = None) -> str:
        return f"{self.tflops:g} TFLOP/s effective ({self.name}, batch {batch_size or self.batch_size})"


#: Calibrated as pipedap.md 4.3 recommends: NVIDIA's ResNet-50 v1.5 A100-80GB AMP rate of
#: 2,470 img/s is 3 * 2 * 4.09 GFLOP * 2470/s ~= 60 TFLOP/s effective (~0.19 of dense peak).
A100_AMP = DeviceModel("A100 AMP, calibrated on ResNet-50", 60.0, 64)


@dataclass(frozen=True)
class Layer:
    """One parameter-owning module. `bwd_ms` is the gap from the previous gradient-ready event
    to this layer's; `ready_after` names a layer whose backward must also finish first."""

    name: str
    params: int
    fwd_ms: float
    bwd_ms: float
    fwd_macs: int | None = None
    tensors: tuple[tuple[str, int], ...] = ()
    ready_after: str | None = None
    note: str = ""


@dataclass(frozen=True)
class LayerProfile:
    """A model's layers in forward order, with where its times come from (`*_source`, `notes`)."""

    name: str
    layers: tuple[Layer, ...]
    dtype_bytes: int = 4
    batch_size: int | None = None
    seq_len: int | None = None
    fwd_source: str = "given"
    bwd_source: str = "given"
    notes: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        if not self.layers:
            raise InputError(self.source or None, "layers", "expected at least 1 layer, got 0")

    @property
    def nlayers(self) -> int:
        return len(self.layers)

    @cached_property
    def params_array(self) -> np.ndarray:
        """Parameters per layer, in forward order."""
        return _frozen(np.array([layer.params for layer in self.layers], dtype=np.int64))

    @cached_property
    def fwd_array(self) -> np.ndarray:
        return _frozen(np.array([layer.fwd_ms for layer in self.layers], dtype=float))

    @cached_property
    def bwd_array(self) -> np.ndarray:
        return _frozen(np.array([layer.bwd_ms for layer in self.layers], dtype=float))

    @property
    def params(self) -> int:
        return int(self.params_array.sum())

    @property
    def nbytes(self) -> int:
        """Gradient bytes of the whole model."""
        return self.params * self.dtype_bytes

    @property
    def fwd_ms(self) -> float:
        return float(self.fwd_array.sum())

    @property
    def bwd_ms(self) -> float:
        return float(self.bwd_array.sum())

    @property
    def compute_ms(self) -> float:
        """Backward plus forward: the iteration time with free communication."""
        return self.bwd_ms + self.fwd_ms

    @cached_property
    def grad_ready_ms(self) -> np.ndarray:
        """Per layer (forward order), when its gradient is complete, from the start of backward.

        Backward runs layers L-1 .. 0 back to back; a layer with `ready_after` is also
        held until that layer's own event (tied weights wait for their last use).
        """
        ready = np.cumsum(self.bwd_array[::-1])[::-1].copy()
        own = ready.copy()
        index = {layer.name: i for i, layer in enumerate(self.layers)}
        for i, layer in enumerate(self.layers):
            if layer.ready_after is not None:
                ready[i] = max(ready[i], own[index[layer.ready_after]])
        return _frozen(ready)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


# -- reading ------------------------------------------------------------------------------


#: The longest a layer's forward or backward may take: a day, in ms (beyond it, a typing mistake).
MAX_LAYER_MS = 86_400_000.0


def profile_from_document(doc: Any, source: str | None = None, name: str | None = None) -> LayerProfile:
    """A LayerProfile from a parsed layer-profile document, times exactly as written.

    Checks the schema, then what a schema cannot say: unique names, params equal to the sum
    of tensors, finite numbers, `ready_after` naming a layer, and `totals` when present.
    """
    validate_document(doc, SCHEMA_NAME, source)
    layers: list[Layer] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(doc["layers"]):
        where = f"layers[{i}]"
        if raw["name"] in seen:
            raise InputError(source, f"{where}.name", f"expected a unique layer name, {raw['name']!r} is also layers[{seen[raw['name']]}]")
        seen[raw["name"]] = i
        for key in ("fwd_ms", "bwd_ms"):
            if not (math.isfinite(raw[key]) and raw[key] <= MAX_LAYER_MS):
                raise InputError(source, f"{where}.{key}", f"expected a number from 0 to {MAX_LAYER_MS:g} ms, got {raw[key]!r}")
        tensors = tuple((str(t[0]), int(t[1])) for t in raw.get("tensors", ()))
        if tensors and sum(n for _, n in tensors) != raw["params"]:
            total = sum(n for _, n in tensors)
            raise InputError(source, f"{where}.params", f"expected the sum of the layer's tensors ({total}), got {raw['params']}")
        layers.append(Layer(name=raw["name"], params=raw["params"], fwd_ms=float(raw["fwd_ms"]), bwd_ms=float(raw["bwd_ms"]),
                            fwd_macs=raw.get("fwd_macs"), tensors=tensors, ready_after=raw.get("ready_after"),
                            note=raw.get("note", "")))
    for i, layer in enumerate(layers):
        if layer.ready_after is not None and layer.ready_after not in seen:
            raise InputError(source, f"layers[{i}].ready_after", f"expected the name of a layer of this profile, got {layer.ready_after!r}")
    time_source = doc.get("time_source") or {}
    profile = LayerProfile(
        name=name or doc.get("model") or (Path(source).stem if source else "profile"),
        layers=tuple(layers), dtype_bytes=doc["dtype_bytes"], batch_size=doc.get("batch_size"),
        seq_len=doc.get("seq_len"), fwd_source=time_source.get("fwd", "given"), bwd_source=time_source.get("bwd", "given"),
        source=source or "")
    _check_totals(profile, doc.get("totals") or {}, source)
    if profile.params * profile.dtype_bytes > MAX_BYTES:  # every bucket's call must be one the runtime can make
        raise InputError(source, "layers", f"expected at most {format_size(MAX_BYTES)} of gradients (more than any GPU "
                                           f"holds), got {format_size(profile.params * profile.dtype_bytes)}")
    return profile


def _check_totals(profile: LayerProfile, totals: Mapping[str, Any], source: str | None) -> None:
    exact = {"params": profile.params, "layers": profile.nlayers}
    for key, value in exact.items():
        if key in totals and totals[key] != value:
            raise InputError(source, f"totals.{key}", f"expected the sum over layers ({value}), got {totals[key]}")
    approx = {"fwd_ms": profile.fwd_ms, "bwd_ms": profile.bwd_ms}
    macs = [layer.fwd_macs for layer in profile.layers]
    if all(m is not None for m in macs):
        approx["fwd_gmacs"] = sum(macs) / 1e9  # type: ignore[arg-type]
    for key, value in approx.items():
        if totals.get(key) is not None and abs(totals[key] - value) > 1e-3 * max(1.0, abs(value)) + 1e-3:
            raise InputError(source, f"totals.{key}", f"expected the sum over layers ({value:.6g}), got {totals[key]}")


def shared_data_path() -> Path:
    """data/layer-profiles.json under $HIPIPE_SHARED_DIR if set, else under ../shared beside the
    checkout: the working directory's (a checkout with `pip install .`) or the package's own
    (an editable install)."""
    override = os.environ.get(SHARED_DIR_ENV)
    if override:
        return Path(override) / "data" / "layer-profiles.json"
    checkout = Path(__file__).resolve().parents[2]  # hipipe_compiler/training/profiles.py
    candidates = [Path.cwd().parent / "shared", checkout.parent / "shared"]
    paths = [c / "data" / "layer-profiles.json" for c in candidates]
    return next((p for p in paths if p.is_file()), paths[-1])


def builtin_profile(name: str, device: DeviceModel = A100_AMP, keep_measured: bool = True) -> LayerProfile:
    """A built-in model by name, with its synthetic times derived (see `derive_times`).

    >>> builtin_profile("resnet50").nlayers  # doctest: +SKIP
    107
    """
    if name not in BUILTIN_PROFILES:
        raise InputError(name, "model", f"unknown model; expected one of {', '.join(BUILTIN_PROFILES)} or a profile file (.yaml, .json)")
    path = shared_data_path()
    if not path.is_file():
        raise InputError(str(path), None, f"built-in layer profiles not found; expected this file, or set {SHARED_DIR_ENV} "
                                          "to the directory holding data/layer-profiles.json")
    container = load_document(path)
    entry = container.get("models", {}).get(name) if isinstance(container, dict) else None
    if not isinstance(entry, dict):
        raise InputError(str(path), f"models.{name}", "missing; expected this model's profile")
    profile = profile_from_document(_builtin_document(entry), f"{path} (models.{name})", name=name)
    return derive_times(profile, device, keep_measured)


def _builtin_document(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The container's entry as a one-model document; a 'tied' note becomes ready_after the
    first layer, i.e. the end of backward (data/README.md, "Differences")."""
    doc = dict(entry)
    first = entry["layers"][0]["name"] if entry.get("layers") else None
    doc["layers"] = [dict(layer, ready_after=first) if "tied" in str(layer.get("note", "")).lower() else layer
                     for layer in entry.get("layers", [])]
    return doc


def load_profile(spec: str | Path, device: DeviceModel = A100_AMP, keep_measured: bool = True) -> LayerProfile:
    """A built-in profile by name, or a user profile file (YAML or JSON).

    >>> load_profile("resnet5O")
    Traceback (most recent call last):
    ...
    hipipe_compiler.errors.InputError: resnet5O: model: unknown model; expected one of vgg16, resnet50, densenet201, bert_base, gpt2 or a profile file (.yaml, .json)
    """
    text = str(spec)
    if text in BUILTIN_PROFILES:
        return builtin_profile(text, device, keep_measured)
    path = Path(spec)
    if path.is_file() or path.suffix.lower() in (".yaml", ".yml", ".json") or "/" in text:
        return derive_times(profile_from_document(load_document(path), str(path)), device, keep_measured)
    return builtin_profile(text, device, keep_measured)  # raises the unknown-model error


# -- deriving times -----------------------------------------------------------------------


def _synthetic(source: str) -> bool:
    return source.strip().lower().startswith("synthetic")


def derive_times(profile: LayerProfile, device: DeviceModel = A100_AMP, keep_measured: bool = True) -> LayerProfile:
    """Replace times marked synthetic (`fwd_source`/`bwd_source` starting with "synthetic").

    With MACs on every layer: t_fwd = max(floor, 2 * MACs * batch / throughput) and
    t_bwd = bwd_to_fwd * t_fwd. A tied layer's MACs are those of the head that reuses it
    (LM head, MLM decoder), which runs last in forward and first in backward, so that time
    is charged to the last layer's forward and to the first backward gap. Without MACs, a
    synthetic forward becomes bwd / bwd_to_fwd (DenseNet-201). `keep_measured=False`
    derives measured backward times too, so both passes come from one device.
    """
    fwd_synthetic = _synthetic(profile.fwd_source)
    bwd_synthetic = _synthetic(profile.bwd_source) or not keep_measured
    if not (fwd_synthetic or bwd_synthetic):
        return profile
    layers = profile.layers
    batch = profile.batch_size or device.batch_size
    has_macs = all(layer.fwd_macs is not None for layer in layers)
    fwd = np.array([layer.fwd_ms for layer in layers], dtype=float)
    bwd = np.array([layer.bwd_ms for layer in layers], dtype=float)
    notes = list(profile.notes)
    fwd_source, bwd_source = profile.fwd_source, profile.bwd_source
    rate = device.describe(batch)
    if has_macs:
        macs = np.array([layer.fwd_macs for layer in layers], dtype=float)
        tied = np.array([layer.ready_after is not None for layer in layers])
        flops_ms = 2.0 * macs * batch / (device.tflops * 1e9)
        own = np.maximum(flops_ms, device.layer_floor_ms)
        head = float(flops_ms[tied].sum())
        own[tied] = device.layer_floor_ms  # the lookup itself; its MACs are the head's
        if fwd_synthetic:
            fwd = own.copy()
            fwd[-1] += head
            fwd_source = f"derived from MACs at {rate}"
            notes.append(f"fwd_ms derived from MACs at {rate}, t_fwd = 2*MACs*batch/throughput (floor {device.layer_floor_ms:g} ms), "
                         f"because the profile's forward times are {profile.fwd_source!r}")
        if bwd_synthetic:
            bwd = device.bwd_to_fwd * own
            bwd[-1] += device.bwd_to_fwd * head
            why = f"the profile's backward times are {profile.bwd_source!r}" if _synthetic(profile.bwd_source) else "every time was asked to be derived (--derive-all)"
            bwd_source = f"derived from MACs at {rate}, t_bwd = {device.bwd_to_fwd:g} * t_fwd"
            notes.append(f"bwd_ms derived from MACs at {rate} as {device.bwd_to_fwd:g} * t_fwd, because {why}")
        if head and (fwd_synthetic or bwd_synthetic):
            names = ", ".join(layer.name for layer in layers if layer.ready_after is not None)
            notes.append(f"the MACs of tied layer(s) {names} belong to the head that reuses them, which runs last in forward and "
                         f"first in backward: their time is charged to {layers[-1].name}'s forward and to the first backward gap")
    elif fwd_synthetic and not _synthetic(profile.bwd_source):
        fwd = bwd / device.bwd_to_fwd
        fwd_source = f"derived as measured bwd_ms / {device.bwd_to_fwd:g}"
        notes.append(f"fwd_ms derived as bwd_ms / {device.bwd_to_fwd:g} (the measured backward times), because the profile's "
                     f"forward times are {profile.fwd_source!r} and it has no fwd_macs")
    elif _synthetic(profile.bwd_source) and not fwd_synthetic:
        bwd = fwd * device.bwd_to_fwd
        bwd_source = f"derived as fwd_ms * {device.bwd_to_fwd:g}"
        notes.append(f"bwd_ms derived as {device.bwd_to_fwd:g} * fwd_ms, because the profile's backward times are "
                     f"{profile.bwd_source!r} and it has no fwd_macs")
    else:
        notes.append("times are marked synthetic but the profile has no fwd_macs to derive them from; used as given")
    if has_macs and fwd_synthetic and not bwd_synthetic:
        notes.append(f"bwd_ms kept as measured ({profile.bwd_source}); it may come from a different device than the derived fwd_ms")
    new_layers = tuple(replace(layer, fwd_ms=float(f), bwd_ms=float(b)) for layer, f, b in zip(layers, fwd, bwd))
    return replace(profile, layers=new_layers, batch_size=batch if has_macs else profile.batch_size,
                   fwd_source=fwd_source, bwd_source=bwd_source, notes=tuple(notes))


def profile_document(profile: LayerProfile) -> dict[str, Any]:
    """The profile as a layer-profile/v1 document (times as they are now, derived or not)."""
    layers = []
    for layer in profile.layers:
        item: dict[str, Any] = {"name": layer.name, "params": layer.params, "fwd_ms": layer.fwd_ms, "bwd_ms": layer.bwd_ms}
        if layer.fwd_macs is not None:
            item["fwd_macs"] = layer.fwd_macs
        if layer.tensors:
            item["tensors"] = [[n, c] for n, c in layer.tensors]
        if layer.note:
            item["note"] = layer.note
        if layer.ready_after is not None:
            item["ready_after"] = layer.ready_after
        layers.append(item)
    doc: dict[str, Any] = {"schema": "layer-profile/v1", "model": profile.name, "order": "forward", "time_unit": "ms",
                           "dtype_bytes": profile.dtype_bytes, "batch_size": profile.batch_size, "seq_len": profile.seq_len,
                           "time_source": {"fwd": profile.fwd_source, "bwd": profile.bwd_source}, "layers": layers}
    if profile.notes:
        doc["provenance"] = "; ".join(profile.notes)
    return doc
