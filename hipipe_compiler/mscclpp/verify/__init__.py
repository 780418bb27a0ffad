"""The proof that an MSCCL++ execution plan is correct on the executor, or the rules it breaks."""

from .verifier import layouts_of, verify_plan

__all__ = ["layouts_of", "verify_plan"]
