"""`Session`: a compiled model, run like onnxruntime's `InferenceSession`.

A session optimizes its model once, on the symbolic graph, and binds the result to the
actual sizes of each run: binding and planning take milliseconds, so a new batch size or
sequence length costs no optimizer run (and on cuda no kernel compile). What is made per set of
sizes (a bound graph on cpu; a plan, library plans and a CUDA graph on cuda) is kept for the
SIZES_KEPT sets used most recently.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from knopt.cache import ProgramCache, open_cache
from knopt.cpu.executor import run_graph
from knopt.cpu.opaque import cpu_refusal
from knopt.errors import InputError, KnoptError, UsageError
from knopt.ir import op as ops
from knopt.ir.bind import bind_symbols, infer_sizes
from knopt.ir.dims import SizeProfile
from knopt.ir.graph import Graph
from knopt.ir.kvcache import (
    CacheLayout,
    CacheStep,
    CacheSteps,
    HostCaches,
    decoding_steps,
    describe_cache,
)
from knopt.ir.kvcache import widen_mask as widen_cache_mask
from knopt.ir.shape import symbols_of
from knopt.onnx.load import import_model, input_sizes, input_symbols
from knopt.opt.cost import DeviceProfile, find_profile
from knopt.opt.optimize import OptimizeResult
from knopt.opt.optimize import optimize as optimize_graph

if TYPE_CHECKING:
    from onnx import ModelProto

DEVICES = ("cpu", "cuda", "best")
PRECISIONS = ("f32", "tf32", "fp16", "bf16")  # the keys of knopt.cuda.precision.PRECISIONS
SIZES_KEPT = 32  # sets of sizes whose bound graph (cpu) or plan and CUDA graph (cuda) are kept
NAMES_KEPT = 64  # (feed names, output names) pairs whose check `Session.run` remembers

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: OrderedDict[K, V], key: K, make: Callable[[], V], limit: int) -> V:
    """`cache[key]`, made by `make()` if missing; the least recently used beyond `limit` go."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    while len(cache) > limit:
        cache.popitem(last=False)
    return value


def _shape(value: Any) -> tuple[int, ...]:
    # GPU arrays (torch, cupy) have a shape but should not pass through numpy.
    shape = getattr(value, "shape", None)
    if shape is None:
        return np.shape(value)
    return shape if type(shape) is tuple else tuple(map(int, shape))


@dataclass
class SessionStats:
    """What a session has done so far (for tests and benchmarks).

    Attributes:
        optimizer_runs: Optimizations run (one per model and precision, however many sizes).
        bindings: Sets of sizes the model was bound (cpu) or planned (cuda) for.
    """

    optimizer_runs: int = 0
    bindings: int = 0


class Session:
    """A graph prepared for one device. Create it with `knopt.compile`.

    The graph may have symbolic sizes (a dynamic batch or sequence): it is optimized once, with
    kernels costed at the profile's "opt" sizes, and bound to the actual sizes at each run.

    Args:
        device: "cpu", "cuda", or "best" (cuda when a GPU is usable, else cpu).
        precision: On cuda: "f32" (strict), "tf32", "fp16" or "bf16"; only "f32" on the CPU
            (refused on "cpu", a warning on "best" without a GPU).
        optimize: Optimize the graph first (default: on cuda only).
        profile: The cost model for optimizing: a built-in name, a `knopt calibrate` file or
            a `DeviceProfile` (default: "h200-graph" on cuda, "cpu" on cpu).
        dims: The range of symbolic sizes, by name: `(min, opt, max)` or an int that fixes
            the size. Runs outside the ranges are refused; sizes not named are free.
        resident: Outputs to keep after each run and feed back as inputs of the next, by
            output name (`{"present.0.key": "past_key_values.0.key"}`): see `knopt.ir.kvcache`.
        cache_mask: With `resident`, the attention mask input (1 = attend) that lets the caches
            be static: preallocated for the largest sizes of `dims`, with one plan serving a
            bucket of cached lengths (see `knopt.ir.kvcache`).
        cache: A `knopt.cache.ProgramCache` or its folder: the optimized program (one for every
            size) is read from it when present and written to it when made; on cuda it also
            holds NVRTC's cubins.

    Raises:
        UsageError: If the device or precision is unknown, or the precision is not f32 on
            "cpu" (on "best" without a GPU, that is a warning and the run is in f32).
        KnoptError: If "cuda" has no usable GPU, or the resident pairs are not caches.
        InputError: If `dims` names a size the model does not have or a range is malformed.
        UnsupportedOpError: If the graph holds an op knopt keeps as it is (an opaque op) that
            the device cannot run: any on "cuda"; on "cpu", one onnx's reference evaluator
            lacks.
    """

    def __init__(
        self,
        graph: Graph,
        device: str = "cpu",
        *,
        precision: str = "f32",
        optimize: bool | None = None,
        profile: str | os.PathLike[str] | DeviceProfile | None = None,
        dims: Mapping[str, object] | None = None,
        resident: Mapping[str, str] | None = None,
        cache_mask: str | None = None,
        cache: str | os.PathLike[str] | ProgramCache | None = None,
    ) -> None:
        self.graph = graph
        self.dims = SizeProfile.parse(dims, graph.symbols())
        self._prepare(device, precision, optimize, profile, cache)
        _check_opaque_ops(graph, self.device)
        if self._cuda is not None:
            self._cuda.dims = self.dims
            self._cuda.stats = self.stats
        self._cache: CacheLayout | None = None
        self._host_caches: HostCaches | None = None
        if resident:
            self._cache = describe_cache(graph, resident, cache_mask, self.dims)
            self._steps = CacheSteps(graph, self._cache)
            if self._cuda is None:
                self._host_caches = HostCaches(graph, self._cache)
        elif cache_mask is not None:
            raise KnoptError("cache_mask needs resident caches (resident={output: input})")

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
            raise UsageError(f"device '{device}' is unknown (use {', '.join(DEVICES)})")
        if precision not in PRECISIONS:
            raise UsageError(f"precision '{precision}' is unknown (use {', '.join(PRECISIONS)})")
        requested = device
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
        if device == "cpu" and precision != "f32":
            _check_cpu_precision(requested, precision)
        self.device = device
        self.precision = precision
        self.stats = SessionStats()
        self._bound: OrderedDict[tuple[tuple[str, int], ...], Graph] = OrderedDict()
        self._cuda: Any = None
        if device == "cuda":
            from knopt.cuda.runner import CudaRunner

            self._cuda = CudaRunner(precision)
        self.optimize = device == "cuda" if optimize is None else optimize
        self._optimized: OrderedDict[Graph, OptimizeResult] = OrderedDict()
        self.profile: str | os.PathLike[str] | DeviceProfile = profile or (
            "h200-graph" if device == "cuda" else "cpu"
        )
        if self.optimize:
            self.profile = find_profile(self.profile)  # a bad name or file fails here, not later
        self.cache: ProgramCache | None = None
        if cache is not None:
            self.cache = open_cache(cache, device)
        self._checked: dict[tuple[Any, ...], list[str]] = {}  # see `_wanted`
        self._source: tuple[Graph, Any] | None = None  # see `_program`

    def __repr__(self) -> str:
        optimized = "optimized" if self.optimize else "not optimized"
        return (
            f"<{type(self).__name__} {self.device} {self.precision}, {optimized}, "
            f"inputs {self.input_names}, outputs {self.output_names}>"
        )

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in order."""
        return self.graph.input_names

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in order."""
        return self.graph.output_names

    @property
    def optimized(self) -> OptimizeResult | None:
        """What the optimizer made of the model (made on first use), or None without it."""
        return self._optimize(self.graph) if self.optimize else None

    def wait_for_plans(self, timeout: float | None = None) -> bool:
        """Wait for what a new size left to build in the background, then runs use it.

        On "cuda", cuDNN's attention plans for a size after the first are built in a helper
        process while that size runs knopt's own attention kernel (so a new size costs
        milliseconds, not cuDNN's compile); the first run after they arrive switches to them.
        Call this before timing steady latency.

        Args:
            timeout: Seconds to wait at most; None waits as long as it takes.

        Returns:
            Whether nothing is still being built (always True on the CPU).
        """
        return self._cuda.wait_for_plans(timeout) if self._cuda is not None else True

    def reset(self) -> None:
        """Forget the resident caches: the next run starts from empty ones."""
        if self._host_caches is not None:
            self._host_caches.reset()
        if self._cuda is not None:
            self._cuda.reset_caches()

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
                Resident inputs may be left out: the kept outputs of the last run are used.
            device_outputs: On "cuda", return the results as `knopt.cuda.executor.DeviceArray`s
                left on the GPU (valid until the next run) instead of numpy arrays, and do not
                wait for the GPU: the run is queued and `run` returns. Take the results with
                DLPack (`torch.from_dlpack(result)`), which makes the consumer's current
                stream wait for the run; the next run waits for what that stream queued
                before it. The run reads GPU feeds later, on knopt's stream (which DLPack
                orders after their producer's writes): write to a fed array on another
                stream only once that stream has waited for the run, as taking a result
                with DLPack on it does. Resident outputs come back as numpy arrays either
                way.

        Returns:
            The requested outputs, in the requested order.

        Raises:
            InputError: If a feed is missing, unknown, or of the wrong shape or dtype, a size
                is outside the session's range, or an output name is unknown.
        """
        wanted = self._wanted(feeds, output_names)
        if self._cache is not None:
            return self._run_cached(wanted, feeds, device_outputs)
        sizes = self._sizes({name: _shape(value) for name, value in feeds.items()})
        results = self._run_sized(sizes, feeds, device_outputs)
        return [results[name] for name in wanted]

    def _wanted(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None) -> list[str]:
        """The outputs to return, once the names of the feeds and outputs are found right.

        The answer is remembered for each pair of feed names and output names: a loop that
        feeds the same names pays one lookup, not a walk over the model's inputs.

        Raises:
            InputError: If a feed is missing or unknown, or an output name is unknown.
        """
        asked = None if output_names is None else tuple(output_names)
        key = (tuple(feeds), asked)
        wanted = self._checked.get(key)
        if wanted is None:
            wanted = self._check_names(feeds, asked)
            if len(self._checked) >= NAMES_KEPT:
                self._checked.clear()
            self._checked[key] = wanted
        return wanted

    def _check_names(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None
    ) -> list[str]:
        """The outputs to return (see `_wanted`)."""
        input_names = self.input_names
        unknown = sorted(set(feeds) - set(input_names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model takes {input_names}")
        optional = self._cache.inputs if self._cache is not None else frozenset()
        missing = [n for n in input_names if n not in feeds and n not in optional]
        if missing:
            raise InputError(f"missing input(s) {missing}; the model takes {input_names}")
        wanted = self.output_names if output_names is None else list(output_names)
        not_outputs = [name for name in wanted if name not in self.output_names]
        if not_outputs:
            raise InputError(f"unknown output(s) {not_outputs}; the model has {self.output_names}")
        return wanted

    def _sizes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The named sizes of a run, checked against the profile.

        Only the inputs' shapes are read: walking the whole graph's values on every run costs
        about a millisecond on BERT-base, more than the GPU takes for a short sequence.
        """
        if not any(symbols_of(value.shape) for value in self.graph.inputs):
            return {}
        sizes = infer_sizes(self.graph, shapes)
        self.dims.check(sizes)
        return sizes

    def _run_sized(
        self, sizes: Mapping[str, int], feeds: Mapping[str, Any], device_outputs: bool
    ) -> dict[str, Any]:
        """Every output of a run at `sizes`, by name."""
        if self._cuda is not None:
            outputs = self._cuda.run(self._program(), sizes, feeds, device_outputs)
        else:
            arrays = {name: np.asarray(value) for name, value in feeds.items()}
            outputs = run_graph(self._graph_for(sizes), arrays)
        return dict(zip(self.output_names, outputs, strict=True))

    def _run_cached(
        self, wanted: list[str], feeds: Mapping[str, Any], device_outputs: bool
    ) -> list[Any]:
        """A run that appends to the resident caches (`knopt.ir.kvcache`)."""
        layout = self._cache
        assert layout is not None
        if self._host_caches is not None:
            self._host_caches.load(feeds)
            length = self._host_caches.length
        else:
            length = self._cuda.load_caches(self._program(), layout, self.graph, feeds)
        run_feeds = {n: v for n, v in feeds.items() if n not in layout.inputs}
        step = self._steps.step({n: _shape(v) for n, v in run_feeds.items()}, length)
        self.dims.check(step.actual)
        if layout.mask is not None:
            run_feeds[layout.mask] = widen_cache_mask(feeds[layout.mask], step)
        return self._append(wanted, run_feeds, step, device_outputs)

    def _append(
        self, wanted: list[str], feeds: dict[str, Any], step: CacheStep, device_outputs: bool
    ) -> list[Any]:
        layout = self._cache
        assert layout is not None
        if self._host_caches is not None:
            feeds.update(self._host_caches.inputs(step))
            results = self._run_sized(step.sizes, feeds, False)
            self._host_caches.update(results, step)
            kept = {name: self._host_caches.output(name) for name in layout.outputs}
        else:
            program = self._program()
            outputs = self._cuda.run(program, step.sizes, feeds, device_outputs, step)
            results = dict(zip(self.output_names, outputs, strict=True))
            if step.added != 1 and layout.mask is not None:
                # A prefill: prepare the decoding steps' kernels now, not at the first step.
                self._cuda.warm_steps(program, decoding_steps(self.graph, layout, step))
            kept = {
                name: self._cuda.cache_output(program, name)
                for name in layout.outputs.intersection(wanted)
            }
        return [kept[name] if name in layout.outputs else results[name] for name in wanted]

    # ---- what is made once, and per set of sizes ----------------------------------------

    def _optimized_graph(self) -> Graph:
        """The graph as it runs: the optimizer's result (made once) or the graph itself."""
        if not self.optimize:
            return self.graph
        return self._optimize(self.graph).graph

    def _optimize(self, graph: Graph) -> OptimizeResult:
        """The optimized form of a graph, made once, costed at the profile's opt sizes."""

        def run() -> OptimizeResult:
            self.stats.optimizer_runs += 1
            sizes = self.dims.representative
            if self.cache is not None:
                profile = find_profile(self.profile)
                return self.cache.optimize(
                    graph, profile, device=self.device, precision=self.precision, sizes=sizes
                )
            return optimize_graph(graph, profile=self.profile, sizes=sizes)

        return remember(self._optimized, graph, run, SIZES_KEPT)

    def _program(self) -> Any:
        """What the cuda runner runs: the optimized Program, or the graph itself.

        Kept for the graph it was made for: a run asks for it twice or more.
        """
        if self._source is None or self._source[0] is not self.graph:
            program = self._optimize(self.graph).program if self.optimize else self.graph
            self._source = (self.graph, program)
        return self._source[1]

    def _graph_for(self, sizes: Mapping[str, int]) -> Graph:
        """The graph to run on the cpu, bound to `sizes` (kept for SIZES_KEPT sets)."""
        graph = self._optimized_graph()
        if not sizes:
            return graph

        def bind() -> Graph:
            self.stats.bindings += 1
            return bind_symbols(graph, sizes)

        return remember(self._bound, tuple(sorted(sizes.items())), bind, SIZES_KEPT)


def _check_opaque_ops(graph: Graph, device: str) -> None:
    """Refuse, before any work, an opaque op (an ONNX node knopt keeps) the device cannot run.

    Raises:
        UnsupportedOpError: On "cuda", for any opaque op; on "cpu", for one that onnx's
            reference evaluator lacks or whose output sizes no input gives.
    """
    if device == "cpu":
        problem = cpu_refusal(graph)
        if problem is not None:
            raise problem
        return
    opaque = next((n.op for n in graph.nodes if isinstance(n.op, ops.Opaque)), None)
    if opaque is not None:
        from knopt.cuda.lower import gpu_refusal

        raise gpu_refusal(opaque.call)


def _check_cpu_precision(requested: str, precision: str) -> None:
    """The CPU executor computes in f32 only: refuse another precision asked of it.

    Asked of "best", which fell back to the CPU, it is a warning: the same code runs with or
    without a GPU, in f32 where there is none.

    Raises:
        UsageError: If `requested` is "cpu".
    """
    if requested == "cpu":
        raise UsageError(
            f"precision '{precision}' is for device 'cuda'; the CPU executor computes in f32 "
            "(leave precision at 'f32', or run on 'cuda')"
        )
    warnings.warn(
        f"device '{requested}' found no usable GPU: running on the CPU in f32, not {precision}",
        stacklevel=4,
    )


class PerSizeSession(Session):
    """A model imported once per set of input sizes, for models that only import with fixed sizes.

    `knopt.compile` makes one when importing with symbolic sizes raises `SymbolicSizeError`:
    an LSTM unrolled over a dynamic sequence, or two dynamic axes that the exporter named
    apart but that meet where they must be equal. Each run fixes the sizes from the actual
    inputs and imports the model with them (once per distinct set), so it runs wherever a
    static export of it would; such a model is optimized once per set of sizes. `graph` is
    the graph of the latest run's sizes.

    Args:
        model: The ONNX model.
        device, precision, optimize, profile, cache: As for `Session`.
        dims: As for `Session`; the ranges apply to the model's input sizes.

    Raises:
        KnoptError: If the device or precision is unknown, or "cuda" has no usable GPU.
        InputError: If `dims` names a size the model's inputs do not have.
    """

    def __init__(
        self,
        model: ModelProto,
        device: str = "cpu",
        *,
        precision: str = "f32",
        optimize: bool | None = None,
        profile: str | os.PathLike[str] | DeviceProfile | None = None,
        dims: Mapping[str, object] | None = None,
        cache: str | os.PathLike[str] | ProgramCache | None = None,
    ) -> None:
        initializers = {t.name for t in model.graph.initializer}
        self.model = model
        self._input_names = [i.name for i in model.graph.input if i.name not in initializers]
        self._output_names = [o.name for o in model.graph.output]
        self.dims = SizeProfile.parse(dims, input_symbols(model))
        self._prepare(device, precision, optimize, profile, cache)
        if self._cuda is not None:
            self._cuda.dims = self.dims
            self._cuda.stats = self.stats
        self._cache = None
        self._host_caches = None

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in order."""
        return self._input_names

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in order."""
        return self._output_names

    def _sizes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        sizes = input_sizes(self.model, shapes)
        self.dims.check(sizes)
        return sizes

    def _run_sized(
        self, sizes: Mapping[str, int], feeds: Mapping[str, Any], device_outputs: bool
    ) -> dict[str, Any]:
        key = tuple(sorted(sizes.items()))

        def load() -> Graph:
            self.stats.bindings += 1
            graph = import_model(self.model, sizes)
            _check_opaque_ops(graph, self.device)
            return graph

        self.graph = remember(self._bound, key, load, SIZES_KEPT)
        if self._cuda is not None:
            source = self._optimize(self.graph).program if self.optimize else self.graph
            outputs = self._cuda.run(source, {}, feeds, device_outputs)
        else:
            graph = self._optimize(self.graph).graph if self.optimize else self.graph
            arrays = {name: np.asarray(value) for name, value in feeds.items()}
            outputs = run_graph(graph, arrays)
        return dict(zip(self.output_names, outputs, strict=True))
