"""Optimize an ONNX model, save it, and check it computes what the original does.

    python examples/optimize_model.py [MODEL.onnx] [OUT.onnx]

Without arguments it uses the small CNN that ships with knopt and writes `demo.opt.onnx` here.
Inputs are random, of the shapes the model declares (a symbolic size counts as 1).
"""

from __future__ import annotations

import sys
from importlib import resources

import numpy as np

import knopt
from knopt.cpu.executor import run_graph
from knopt.opt.explain import format_report


def main() -> None:
    """Optimize, explain, save and compare on random inputs."""
    model = sys.argv[1] if len(sys.argv) > 1 else str(resources.files("knopt") / "data/demo.onnx")
    output = sys.argv[2] if len(sys.argv) > 2 else "demo.opt.onnx"
    graph = knopt.load(model)
    result = knopt.optimize(graph, profile="cpu")
    print(format_report(result.report))
    knopt.save(result, output)
    print(f"{result!r}; wrote {output}")

    rng = np.random.default_rng(0)
    feeds = {}
    for name, value in zip(graph.input_names, graph.inputs, strict=True):
        shape = [d if isinstance(d, int) else 1 for d in value.shape]
        feeds[name] = rng.standard_normal(shape).astype(value.dtype.numpy)
    expected = run_graph(graph, feeds)
    optimized = knopt.compile(output).run(None, feeds)
    for name, want, got in zip(graph.output_names, expected, optimized, strict=True):
        error = float(np.max(np.abs(want - got)))
        print(f"{name}: saved model matches the original (max error {error:.1e})")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    main()
