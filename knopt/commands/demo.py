"""`knopt demo`: knopt's main job on the small model it ships with.

Loads the demo CNN (conv, BatchNormalization, ReLU6, residual, pooling, Gemm, a written-out
LayerNorm and GELU), optimizes it with `--explain`, and checks the optimized program against the
original on the CPU executor.
"""

from __future__ import annotations

import argparse
from importlib import resources

import numpy as np

import knopt
from knopt.cpu.program import run_program
from knopt.errors import KnoptError
from knopt.opt.explain import format_report


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo", help="optimize the small model knopt ships with and check the result"
    )
    parser.add_argument(
        "--device-profile",
        default="h200",
        metavar="NAME|FILE",
        help="cost model guiding extraction: a built-in name or a `knopt calibrate` file "
        "(default: h200)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Optimize, explain and verify the demo model."""
    model = resources.files("knopt") / "data" / "demo.onnx"
    graph = knopt.load(model.read_bytes())
    print(f"demo model: {model} ({len(graph.nodes)} IR nodes, input {graph.input_names[0]})")
    result = knopt.optimize(graph, profile=args.device_profile)
    print(format_report(result.report))
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    feeds = {graph.input_names[0]: x}
    (expected,) = knopt.compile(graph).run(None, feeds)
    (optimized,) = run_program(result.program, feeds)
    error = float(np.max(np.abs(optimized - expected)))
    if not np.allclose(optimized, expected, rtol=1e-4, atol=1e-5):
        raise KnoptError(f"the optimized demo differs from the original (max error {error:.2e})")
    print(
        f"checked: the {result.report.kernels}-kernel program matches the original "
        f"{len(graph.nodes)}-node graph on the CPU executor (max error {error:.1e})"
    )
    print(f"next: knopt optimize {model} -o demo.opt.onnx --html demo.html")
    return 0
