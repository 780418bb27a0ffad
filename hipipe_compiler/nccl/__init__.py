"""NCCL as it really runs: its own performance model and pick (tuning), its algorithms set up
as it sets them up and timed by our simulator (algorithms, timing), nccl-tests output and
NCCL's topology XML read (logs, topo_xml), and the calibration that fits a topology to
measurements (calibrate)."""

from .tuning import ALGORITHMS, Graph, Model, System

__all__ = ["ALGORITHMS", "Graph", "Model", "System"]
