"""`knopt demo`: load the small model shipped with knopt and run it on the CPU."""

from __future__ import annotations

import argparse
from importlib import resources

import numpy as np

import knopt


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `demo` subcommand."""
    parser = subparsers.add_parser("demo", help="run knopt on the small model it ships with")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Load, run and summarize the demo model."""
    path = resources.files("knopt") / "data" / "demo.onnx"
    graph = knopt.load(path.read_bytes())
    print(f"demo model: {len(graph.nodes)} IR nodes, inputs {graph.input_names}")
    session = knopt.compile(graph)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (out,) = session.run(None, {session.input_names[0]: x})
    print(
        f"output {session.output_names[0]}: shape {list(out.shape)}, mean {float(out.mean()):.4f}"
    )
    return 0
