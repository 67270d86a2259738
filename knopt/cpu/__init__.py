"""The numpy CPU executor: simple, obviously right, and the oracle for every other path."""

from knopt.cpu.executor import run_graph, run_node
from knopt.cpu.kernels import KERNELS

__all__ = ["KERNELS", "run_graph", "run_node"]
