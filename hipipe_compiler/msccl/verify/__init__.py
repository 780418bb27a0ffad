"""The verifier: proves an MSCCL program correct under the runtime's semantics, or names
each broken rule. `verify` is the entry point; the checks live one per module."""

from .execution import fifo_model
from .report import Report, StepRef, VerifyOptions, Violation
from .verifier import structural_violations, verify

__all__ = ["Report", "StepRef", "VerifyOptions", "Violation", "fifo_model", "structural_violations", "verify"]
