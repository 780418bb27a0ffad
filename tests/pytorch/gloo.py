"""What the PyTorch tests need: torch with a gloo backend, or a skip that says why."""

from __future__ import annotations

from types import ModuleType

import pytest


def require_gloo() -> tuple[ModuleType, ModuleType, ModuleType]:
    """torch, torch.distributed and torch.multiprocessing; skips the calling module without them."""
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install '.[torch]' (CPU build: torch==2.13.0+cpu)")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch build has no gloo backend", allow_module_level=True)
    return torch, dist, pytest.importorskip("torch.multiprocessing")
