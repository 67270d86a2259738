"""`Session`: a compiled model, run like onnxruntime's `InferenceSession`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from knopt.cache import ProgramCache, open_cache
from knopt.cpu.executor import run_graph
from knopt.errors import InputError, KnoptError
from knopt.ir.bind import bind_symbols, infer_sizes
from knopt.ir.graph import Graph
from knopt.onnx.load import import_model, input_sizes
from knopt.opt.cost import DeviceProfile, find_profile
from knopt.opt.optimize import OptimizeResult
from knopt.opt.optimize import optimize as optimize_graph

if TYPE_CHECKING:
    from onnx import ModelProto

DEVICES = ("cpu", "cuda", "best")


def _shape(value: Any) -> tuple[int, ...]:
    # GPU arrays (torch, cupy) have a shape but should not pass through numpy.
    shape = getattr(value, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else np.shape(value)


class Session:
    """A graph prepared for one device. Create it with `knopt.compile`.

    Graphs with symbolic sizes are bound to the actual input shapes at each run; the bound graph
    is kept per distinct set of sizes (and on "cuda", its compiled GPU program).

    Args:
        device: "cpu", "cuda", or "best" (cuda when a GPU is usable, else cpu).
        precision: On cuda: "f32" (strict), "tf32", "fp16" or "bf16".
        optimize: Optimize each bound graph first (default: on cuda only).
        profile: The cost model for optimizing: a built-in name, a `knopt calibrate` file or
            a `DeviceProfile` (default: "h200-graph" on cuda, "cpu" on cpu).
        cache: A `knopt.cache.ProgramCache` or its folder: optimized programs are read from it
            when present and written to it when made; on cuda it also holds NVRTC's cubins.

    Raises:
        KnoptError: If the device or precision is unknown, or "cuda" has no usable GPU.
    """

    def __init__(
        self,
        graph: Graph,
        device: str = "cpu",
        *,
        precision: str = "f32",
        optimize: bool | None = None,
        profile: str | os.PathLike[str] | DeviceProfile | None = None,
        cache: str | os.PathLike[str] | ProgramCache | None = None,
    ) -> None:
        self.graph = graph
        self._symbolic = bool(graph.symbols())
        self._prepare(device, precision, optimize, profile, cache)

    def _prepare(
        self,
        device: str,
        precision: str,
        optimize: bool | None,
        profile: str | os.PathLike[str] | DeviceProfile | None,
        cache: str | os.PathLike[str] | ProgramCache | None = None,
    ) -> None:
        """Set up the device, the caches and the optimizer options (everything but the graph)."""
        if device not in DEVICES:
            raise KnoptError(f"device '{device}' is unknown (use {', '.join(DEVICES)})")
        if device != "cpu":
            import knopt.cuda

            if knopt.cuda.is_available():
                device = "cuda"
            elif device == "cuda":
                raise KnoptError(
                    "device 'cuda' is not available: no usable NVIDIA GPU or the "
                    "CUDA packages are missing (pip install knopt[cuda])"
                )
            else:
                device = "cpu"
        self.device = device
        self.precision = precision
        self._bound: dict[tuple[tuple[str, int], ...], Graph] = {}
        self._cuda: Any = None
        if device == "cuda":
            from knopt.cuda.runner import CudaRunner

            self._cuda = CudaRunner(precision)
        self.optimize = device == "cuda" if optimize is None else optimize
        self._optimized: dict[Graph, OptimizeResult] = {}
        self.profile: str | os.PathLike[str] | DeviceProfile = profile or (
            "h200-graph" if device == "cuda" else "cpu"
        )
        if self.optimize:
            self.profile = find_profile(self.profile)  # a bad name or file fails here, not later
        self.cache: ProgramCache | None = None
        if cache is not None:
            self.cache = open_cache(cache, device)

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in order."""
        return self.graph.input_names

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in order."""
        return self.graph.output_names

    def run(
        self,
        output_names: Sequence[str] | None,
        feeds: Mapping[str, Any],
        *,
        device_outputs: bool = False,
    ) -> list[Any]:
        """Run the model.

        Args:
            output_names: The outputs to return, or None for all of them in order.
            feeds: One array per model input, by name: numpy arrays, or on "cuda" also GPU
                arrays (torch, cupy: anything with `__dlpack__`), which are read in place.
            device_outputs: On "cuda", return the results as `knopt.cuda.executor.DeviceArray`s
                left on the GPU (valid until the next run) instead of numpy arrays.

        Returns:
            The requested outputs, in the requested order.

        Raises:
            InputError: If a feed is missing, unknown, or of the wrong shape or dtype, or an
                output name is unknown.
        """
        unknown = sorted(set(feeds) - set(self.input_names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model takes {self.input_names}")
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model takes {self.input_names}")
        wanted = self.output_names if output_names is None else list(output_names)
        not_outputs = [name for name in wanted if name not in self.output_names]
        if not_outputs:
            raise InputError(f"unknown output(s) {not_outputs}; the model has {self.output_names}")
        if self._cuda is not None:
            graph = self._graph_for({name: _shape(value) for name, value in feeds.items()})
            source = self._optimize(graph).program if self.optimize else graph
            outputs = self._cuda.run(source, feeds, device_outputs)
            results = dict(zip(graph.output_names, outputs, strict=True))
        else:
            arrays = {name: np.asarray(value) for name, value in feeds.items()}
            graph = self._graph_for({name: a.shape for name, a in arrays.items()})
            if self.optimize:
                graph = self._optimize(graph).graph
            results = dict(zip(graph.output_names, run_graph(graph, arrays), strict=True))
        return [results[name] for name in wanted]

    def _optimize(self, graph: Graph) -> OptimizeResult:
        """The optimized form of a bound graph, made once (the device's cost model)."""
        if graph not in self._optimized:
            if self.cache is not None:
                self._optimized[graph] = self.cache.optimize(
                    graph, find_profile(self.profile), device=self.device, precision=self.precision
                )
            else:
                self._optimized[graph] = optimize_graph(graph, profile=self.profile)
        return self._optimized[graph]

    def _graph_for(self, shapes: Mapping[str, Sequence[int]]) -> Graph:
        if not self._symbolic:
            return self.graph
        sizes = infer_sizes(self.graph, {name: tuple(shape) for name, shape in shapes.items()})
        key = tuple(sorted(sizes.items()))
        if key not in self._bound:
            self._bound[key] = bind_symbols(self.graph, sizes)
        return self._bound[key]


class PerSizeSession(Session):
    """A model imported once per set of input sizes, for models that only import with fixed sizes.

    `knopt.compile` makes one when importing with symbolic sizes raises `SymbolicSizeError`:
    an LSTM unrolled over a dynamic sequence, or two dynamic axes that the exporter named
    apart but that meet where they must be equal. Each run fixes the sizes from the actual
    inputs and imports the model with them (once per distinct set), so it runs wherever a
    static export of it would. `graph` is the graph of the latest run's sizes.

    Args:
        model: The ONNX model.
        device, precision, optimize, profile, cache: As for `Session`.

    Raises:
        KnoptError: If the device or precision is unknown, or "cuda" has no usable GPU.
    """

    def __init__(
        self,
        model: ModelProto,
        device: str = "cpu",
        *,
        precision: str = "f32",
        optimize: bool | None = None,
        profile: str | os.PathLike[str] | DeviceProfile | None = None,
        cache: str | os.PathLike[str] | ProgramCache | None = None,
    ) -> None:
        initializers = {t.name for t in model.graph.initializer}
        self.model = model
        self._input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self._output_names = [o.name for o in model.graph.output]
        self._prepare(device, precision, optimize, profile, cache)

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in order."""
        return self._input_names

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in order."""
        return self._output_names

    def _graph_for(self, shapes: Mapping[str, Sequence[int]]) -> Graph:
        sizes = input_sizes(self.model, {name: tuple(s) for name, s in shapes.items()})
        key = tuple(sorted(sizes.items()))
        if key not in self._bound:
            self._bound[key] = import_model(self.model, sizes)
        self.graph = self._bound[key]
        return self.graph
