"""PyTorch integration (the `torch` extra; the rest of the package never imports torch).

`padding`: a DDP communication hook and helpers that pad each collective call to an element
count the compiled programs serve, so that the runtime really runs them.
"""

from .padding import (
    PaddingState,
    padded_all_gather,
    padded_all_reduce,
    padded_allreduce_hook,
    padded_reduce_scatter,
)

__all__ = ["PaddingState", "padded_all_gather", "padded_all_reduce", "padded_allreduce_hook", "padded_reduce_scatter"]
