"""`Session`: a compiled model, run like onnxruntime's `InferenceSession`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from knopt.cpu.executor import run_graph
from knopt.errors import InputError, KnoptError
from knopt.ir.bind import bind_symbols, infer_sizes
from knopt.ir.graph import Graph


class Session:
    """A graph prepared for one device. Create it with `knopt.compile`.

    Graphs with symbolic sizes are bound to the actual input shapes at each run; the bound graph
    is kept per distinct set of sizes.
    """

    def __init__(self, graph: Graph, device: str = "cpu") -> None:
        if device != "cpu":
            raise KnoptError(f"device '{device}' is not available (use 'cpu')")
        self.graph = graph
        self.device = device
        self._bound: dict[tuple[tuple[str, int], ...], Graph] = {}

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in order."""
        return self.graph.input_names

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in order."""
        return self.graph.output_names

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, np.ndarray]
    ) -> list[np.ndarray]:
        """Run the model.

        Args:
            output_names: The outputs to return, or None for all of them in order.
            feeds: One array per model input, by name.

        Returns:
            The requested outputs, in the requested order.

        Raises:
            InputError: If a feed is missing, unknown, or of the wrong shape or dtype, or an
                output name is unknown.
        """
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model takes {self.input_names}")
        arrays = {name: np.asarray(value) for name, value in feeds.items()}
        graph = self._graph_for(arrays)
        results = dict(zip(graph.output_names, run_graph(graph, arrays), strict=True))
        if output_names is None:
            return [results[name] for name in self.output_names]
        missing = [name for name in output_names if name not in results]
        if missing:
            raise InputError(f"unknown output(s) {missing}; the model has {self.output_names}")
        return [results[name] for name in output_names]

    def _graph_for(self, feeds: Mapping[str, np.ndarray]) -> Graph:
        if not self.graph.symbols():
            return self.graph
        sizes = infer_sizes(self.graph, {name: a.shape for name, a in feeds.items()})
        key = tuple(sorted(sizes.items()))
        if key not in self._bound:
            self._bound[key] = bind_symbols(self.graph, sizes)
        return self._bound[key]
