"""Lowering: a Plan becomes a Program, pass by pass (lowering.py names them)."""

from .lowering import lower, lowering_key, same_schedule

__all__ = ["lower", "lowering_key", "same_schedule"]
