"""PyTorch integration (the `torch` extra; the rest of the package never imports torch).

- `padding`: a DDP communication hook and helpers that pad each collective call to an element
  count the compiled programs serve, so that the runtime really runs them (docs/pytorch.md).
- `layers`: a module's layers as the planner sees them, and `layer_profile`, which measures
  them for `hipipe plan --profile`.
- `planned`: `PlannedDataParallel`, which runs a plan of `hipipe plan` (docs/training.md).
"""

from .layers import layer_profile
from .padding import (
    PaddingState,
    padded_all_gather,
    padded_all_reduce,
    padded_allreduce_hook,
    padded_reduce_scatter,
)
from .planned import PlannedDataParallel

__all__ = ["PaddingState", "PlannedDataParallel", "layer_profile", "padded_all_gather", "padded_all_reduce",
           "padded_allreduce_hook", "padded_reduce_scatter"]
