"""Property-based testing for knopt and for users' rules: random graphs, inputs, checks.

- `graphs()`, `graph_and_inputs()`: hypothesis strategies for random well-typed IR graphs
  whose compositions are biased toward what the shipped rules rewrite.
- `fuzz_settings(n)`: hypothesis settings for fuzzing a whole pipeline (no deadline).
- `graph_from_seed(seed)`: the same generator driven by a seed, to reproduce a graph.
- `random_inputs(graph, rng)`: random non-zero inputs of moderate magnitude.
- `compare_outputs(actual, expected)`: dtype-aware comparison with magnitude-scaled tolerances.
- `check_rules(...)` (in `knopt.testing.rulecheck`): instantiate every rule's left side and
  compare both sides on the CPU executor.
- `make_mutant(...)` (in `knopt.testing.mutation`) and `run_campaign(...)` (in
  `knopt.testing.trial`): mutants of ONNX models, each loaded, run and optimized in a worker
  process with a timeout and a memory cap, to find what is not a knopt error.
"""

from knopt.testing.arrays import random_array, random_inputs
from knopt.testing.choices import Choices, SeededChoices
from knopt.testing.compare import Comparison, compare_outputs
from knopt.testing.generator import GraphGen
from knopt.testing.strategies import (
    Case,
    fuzz_settings,
    graph_and_inputs,
    graph_from_seed,
    graphs,
    random_graph,
)

__all__ = [
    "Case",
    "Choices",
    "Comparison",
    "GraphGen",
    "SeededChoices",
    "compare_outputs",
    "fuzz_settings",
    "graph_and_inputs",
    "graph_from_seed",
    "graphs",
    "random_array",
    "random_graph",
    "random_inputs",
]
