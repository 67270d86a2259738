"""cuDNN convolutions through the cuDNN frontend's graph API, one plan per convolution shape.

A graph is the conv, then the bias, residual and RELU the step fuses, over tensors stored NCHW
or channels last (their strides say which). A `ConvPlan` is made once per `ConvKey` (pattern,
shapes, dtype and layout, no tensors); its engine is the fastest of the heuristic's first few
plans, timed on scratch memory on the executor's stream and remembered on disk per GPU and
cuDNN version (`knopt.cuda.tuning`), so a later process builds only the chosen plan.

Strict f32 leaves out the engines whose numerical notes break f32 results: TF32 tensor cores,
inputs converted down, reduced-precision reductions, FFT, and Winograd with large tiles.
One-dimensional convolutions run as two-dimensional ones of height 1.

The same handle serves cuDNN's fused attention (`knopt.cuda.sdpa`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cudnn

from knopt.cuda import nvrtc, tuning
from knopt.cuda.sdpa import SdpaPlan
from knopt.cuda.steps import Conv, Sdpa, describe_step
from knopt.errors import CudaError
from knopt.ir.dtype import DType

# Heuristic plans built and timed per convolution shape. Building one can take a good part of
# a second (runtime-fusion engines compile a kernel), so only the first few.
TOP_PLANS = 3
SCRATCH_FILL = 0x3C  # bytes of timing operands: finite in every float type
STRICT_F32_NOTES = (
    "TENSOR_CORE",
    "DOWN_CONVERT_INPUTS",
    "REDUCED_PRECISION_REDUCTION",
    "FFT",
    "WINOGRAD_TILE_4x4",
    "WINOGRAD_TILE_6x6",
    "WINOGRAD_TILE_13x13",
)

_TYPES = {
    DType.F32: cudnn.data_type.FLOAT,
    DType.F16: cudnn.data_type.HALF,
    DType.BF16: cudnn.data_type.BFLOAT16,
}


def dense_strides(dims: list[int], channels_last: bool = False) -> list[int]:
    """Strides of dense N, C, spatial... dims, stored in that order or channels last.

    cuDNN wants real strides for size-1 axes too, not knopt's canonical 0.
    """
    order = [0, *range(2, len(dims)), 1] if channels_last and len(dims) > 2 else range(len(dims))
    strides = [0] * len(dims)
    step = 1
    for axis in reversed(list(order)):
        strides[axis] = step
        step *= max(dims[axis], 1)
    return strides


@dataclass(frozen=True)
class ConvKey:
    """What a convolution's graph and engine depend on (no tensors).

    Attributes:
        strict: Whether f32 must stay strict (no TF32; always False for other dtypes).
    """

    x: tuple[int, ...]
    w: tuple[int, ...]
    y: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]
    groups: int
    dtype: DType
    strict: bool
    bias: bool
    residual: bool
    relu: bool
    channels_last: bool

    def text(self) -> str:
        """The key as stable text (the tuning file's key)."""
        pattern = "+".join(
            name
            for name, present in (
                ("conv", True),
                ("bias", self.bias),
                ("add", self.residual),
                ("relu", self.relu),
            )
            if present
        )
        return tuning.key_text(
            pattern,
            f"x{list(self.x)} w{list(self.w)} y{list(self.y)}",
            f"s{list(self.strides)} p{[list(p) for p in self.pads]} d{list(self.dilations)}",
            f"g{self.groups} {self.dtype.short}{' strict' if self.strict else ''}",
            "nhwc" if self.channels_last else "nchw",
        )


def conv_key(step: Conv, fused: bool) -> ConvKey:
    """The key of `step` as planned with (`fused`) or without its epilogue."""
    return ConvKey(
        tuple(step.x_shape),
        tuple(step.w_shape),
        tuple(step.y_shape),
        tuple(step.strides),
        tuple(tuple(p) for p in step.pads),  # type: ignore[misc]
        tuple(step.dilations),
        step.groups,
        step.dtype,
        step.dtype is DType.F32 and step.precision == "f32",
        fused and step.bias is not None,
        fused and step.residual is not None,
        fused and step.relu,
        step.channels_last,
    )


def _lift(key: ConvKey) -> tuple[list[int], ...]:
    """Dims and attributes as cuDNN takes them: 1-D convolutions become 2-D of height 1."""
    x, w, y = list(key.x), list(key.w), list(key.y)
    pre = [p[0] for p in key.pads]
    post = [p[1] for p in key.pads]
    strides, dilations = list(key.strides), list(key.dilations)
    if len(x) == 3:
        x, w, y = [*x[:2], 1, *x[2:]], [*w[:2], 1, *w[2:]], [*y[:2], 1, *y[2:]]
        pre, post, strides, dilations = [0, *pre], [0, *post], [1, *strides], [1, *dilations]
    return x, w, y, pre, post, strides, dilations, [1, y[1]] + [1] * (len(y) - 2)


def _describe(key: ConvKey) -> str:
    return f"conv {key.text()}"


class ConvPlan:
    """A built cuDNN graph for one `ConvKey`, with its chosen engine.

    Attributes:
        workspace: Bytes of workspace the chosen plan needs.
        name: The chosen plan's (engine's) name.
        times: Seconds per call of each timed plan, by plan index (empty when not timed).

    Raises:
        Exception: Whatever the frontend raises for a graph it cannot serve.
    """

    def __init__(self, handle: Any, key: ConvKey) -> None:
        self.handle = handle
        self.key = key
        io = _TYPES[key.dtype]
        x_dims, w_dims, y_dims, pre, post, strides, dilations, bias_dims = _lift(key)
        last = key.channels_last
        graph = cudnn.pygraph(
            io_data_type=io,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        self.x = graph.tensor(
            name="X", dim=x_dims, stride=dense_strides(x_dims, last), data_type=io
        )
        self.w = graph.tensor(
            name="W", dim=w_dims, stride=dense_strides(w_dims, last), data_type=io
        )
        y = graph.conv_fprop(
            image=self.x,
            weight=self.w,
            pre_padding=pre,
            post_padding=post,
            stride=strides,
            dilation=dilations,
            compute_data_type=cudnn.data_type.FLOAT,
        )
        self.bias = self.residual = None
        if key.bias:
            self.bias = graph.tensor(
                name="B", dim=bias_dims, stride=dense_strides(bias_dims, last), data_type=io
            )
            y = graph.bias(input=y, bias=self.bias)
        if key.residual:
            self.residual = graph.tensor(
                name="Z", dim=y_dims, stride=dense_strides(y_dims, last), data_type=io
            )
            y = graph.add(a=y, b=self.residual)
        if key.relu:
            y = graph.relu(input=y)
        y.set_output(True).set_data_type(io).set_dim(y_dims).set_stride(dense_strides(y_dims, last))
        self.y = y
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        if key.strict:
            notes = [getattr(cudnn.numerical_note, n, None) for n in STRICT_F32_NOTES]
            graph.deselect_numeric_notes([n for n in notes if n is not None])
        graph.check_support()
        self.graph = graph
        self.times: dict[int, float] = {}
        self.index = -1  # the chosen plan; -1: the one `build_plans` selected
        self.name = ""
        self.workspace = 0

    def build_first(self) -> None:
        """Build the heuristic's first buildable plan (no timing)."""
        self.graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
        self.index = -1
        self.workspace = int(self.graph.get_workspace_size())

    def build_named(self, name: str) -> bool:
        """Build and select the plan called `name`; False if there is none or it fails."""
        for index in range(self.graph.get_execution_plan_count()):
            try:
                if self.graph.get_plan_name_at_index(index) != name:
                    continue
                self.select(index)
                return True
            except Exception:  # barred by a note filter, or declined at build time
                return False
        return False

    def build_top(self, count: int) -> list[int]:
        """Build the first `count` plans that build (by heuristic rank); their indices."""
        built: list[int] = []
        for index in range(self.graph.get_execution_plan_count()):
            if len(built) == count:
                break
            try:
                self.graph.build_plan_at_index(index)
            except Exception:  # barred by a note filter, or declined at build time
                continue
            built.append(index)
        return built

    def plan_workspace(self, index: int) -> int:
        """Bytes of workspace plan `index` needs (it must be built)."""
        return int(self.graph.get_workspace_size_plan_at_index(index))

    def select(self, index: int, *, build: bool = True) -> None:
        """Run plan `index` from now on (building it first unless it is built)."""
        if build:
            self.graph.build_plan_at_index(index)
        self.index = index
        self.name = self.graph.get_plan_name_at_index(index)
        self.workspace = self.plan_workspace(index)

    def execute(
        self, pack: dict[Any, int], workspace: int, stream: int, index: int | None = None
    ) -> None:
        """Queue the chosen plan (or plan `index`) on `stream`."""
        index = self.index if index is None else index
        try:
            cudnn.set_stream(self.handle, stream)
            if index < 0:  # the plan the heuristic walk built
                self.graph.execute(pack, workspace, handle=self.handle)
            else:
                self.graph.execute_plan_at_index(pack, workspace, index=index, handle=self.handle)
        except Exception as err:  # the frontend raises RuntimeError and its own types
            raise CudaError("cudnn.execute", None, f"{_describe(self.key)}: {err}") from err


class BoundConv:
    """A `ConvPlan` applied to one step's tensors: what the executor enqueues.

    Attributes:
        fused: Whether bias, residual and RELU run inside (else the caller applies the step's
            fallback kernel after a plain convolution).
    """

    def __init__(self, plan: ConvPlan, step: Conv, fused: bool) -> None:
        self.plan = plan
        self.step = step
        self.fused = fused

    @property
    def workspace(self) -> int:
        """Bytes of workspace the chosen plan needs."""
        return self.plan.workspace

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue the convolution on `stream` (addresses by plan tensor id)."""
        step, plan = self.step, self.plan
        pack = {plan.x: addresses[step.x], plan.w: addresses[step.w], plan.y: addresses[step.y]}
        if plan.bias is not None:
            assert step.bias is not None
            pack[plan.bias] = addresses[step.bias]
        if plan.residual is not None:
            assert step.residual is not None
            pack[plan.residual] = addresses[step.residual]
        plan.execute(pack, workspace, stream)


def _numel(dims: tuple[int, ...]) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


class Dnn:
    """A cuDNN handle and the plans built with it, one per `ConvKey` or attention shape.

    Args:
        gpu: The GPU whose stream times the candidate plans (None: no timing, the
            heuristic's first plan that builds, as with `KNOPT_TUNE=0`).

    Attributes:
        declined: Why cuDNN declined a step's graph, by step (those run a direct kernel).
            For attention, the step as planned (its tensors numbered by the executor).
    """

    def __init__(self, gpu: Any = None) -> None:
        try:
            self.handle = cudnn.create_handle()
        except Exception as err:
            raise CudaError("cudnn.create_handle", None, str(err)) from err
        self.gpu = gpu
        self._plans: dict[ConvKey, ConvPlan | None] = {}
        self._failures: dict[ConvKey, str] = {}
        self._cache: tuning.TuningCache | None = None
        self.declined: dict[Conv | Sdpa, str] = {}

    def plan(self, step: Conv | Sdpa) -> BoundConv | SdpaPlan | None:
        """The plan of `step`: fused if cuDNN takes the epilogue, else plain.

        Must be called outside any stream capture (it may time candidate plans).

        Returns:
            None if cuDNN has no engine for the convolution or attention at all (the caller
            then runs the step's direct kernel).
        """
        if isinstance(step, Sdpa):
            return self._plan_attention(step)
        fusing = step.bias is not None or step.residual is not None or step.relu
        attempts = [True, False] if fusing and step.fallback is not None else [fusing]
        reasons = []
        for fused in attempts:
            plan = self.plan_key(conv_key(step, fused))
            if plan is not None:
                return BoundConv(plan, step, fused)
            reasons.append(f"(fused={fused}): {self._failures[conv_key(step, fused)]}")
        self.declined[step] = f"{_describe(conv_key(step, False))} " + "; ".join(reasons)
        return None

    def _plan_attention(self, step: Sdpa, blob: bytes | None = None) -> SdpaPlan | None:
        try:
            return SdpaPlan(self.handle, step, blob)
        except Exception as err:  # cuDNN reports unsupported graphs by exceptions
            self.declined[step] = f"{describe_step(step)}: {err}"
            return None

    def load_attention(self, step: Sdpa, blob: bytes) -> SdpaPlan | None:
        """The attention plan of `step` from the bytes the helper process serialized.

        Returns:
            None if the plan cannot be loaded here (`declined` says why).
        """
        return self._plan_attention(step, blob)

    def plan_key(self, key: ConvKey) -> ConvPlan | None:
        """The plan of `key` with its engine chosen, or None if cuDNN cannot serve it."""
        if key not in self._plans:
            self._plans[key] = None
            try:
                plan = ConvPlan(self.handle, key)
                if self.gpu is not None and tuning.tuning_enabled():
                    self._tune(plan)
                else:
                    plan.build_first()
                self._plans[key] = plan
            except Exception as err:  # cuDNN reports unsupported graphs by exceptions
                self._failures[key] = str(err)
        return self._plans[key]

    def _tuning_cache(self) -> tuning.TuningCache:
        if self._cache is None:
            version = cudnn.backend_version()
            path = tuning.cache_file(nvrtc.cache_dir(), "cudnn", version, self.gpu.name)
            self._cache = tuning.TuningCache(path)
        return self._cache

    def _tune(self, plan: ConvPlan) -> None:
        cache = self._tuning_cache()
        text = plan.key.text()
        stored = cache.get(text)
        name = stored.get("name") if stored is not None else None
        if isinstance(name, str) and plan.build_named(name):
            return
        built = plan.build_top(TOP_PLANS)
        if not built:
            plan.build_first()  # raises the frontend's reason
            return
        if len(built) == 1:
            plan.select(built[0], build=False)
        else:
            times = self._time(plan, built)
            plan.select(built[tuning.fastest(times)], build=False)
            plan.times = dict(zip(built, times, strict=True))
        cache.put(
            text,
            {
                "name": plan.name,
                "seconds": {
                    plan.graph.get_plan_name_at_index(i): (t if t != float("inf") else None)
                    for i, t in plan.times.items()
                },
            },
        )

    def _time(self, plan: ConvPlan, indices: list[int]) -> list[float]:
        """Seconds per call of each built plan, on scratch tensors shaped like the key's."""
        key = plan.key
        item = key.dtype.itemsize
        sizes = {
            plan.x: _numel(key.x) * item,
            plan.w: _numel(key.w) * item,
            plan.y: _numel(key.y) * item,
        }
        if plan.bias is not None:
            sizes[plan.bias] = key.y[1] * item
        if plan.residual is not None:
            sizes[plan.residual] = _numel(key.y) * item
        pack_offsets, total = {}, 0
        for tensor, size in sizes.items():
            pack_offsets[tensor] = total
            total += -(-size // 256) * 256
        workspace = max(plan.plan_workspace(i) for i in indices)
        gpu = self.gpu
        scratch = gpu.device.allocate(total + max(workspace, 256), stream=gpu.stream)
        try:
            base = int(scratch.handle)
            gpu.fill(base, SCRATCH_FILL, total)
            pack = {tensor: base + offset for tensor, offset in pack_offsets.items()}
            stream = gpu.stream_handle

            def candidate(index: int) -> Any:
                return lambda: plan.execute(pack, base + total, stream, index)

            return tuning.time_candidates(gpu, [candidate(i) for i in indices])
        finally:
            gpu.sync()
            scratch.close(gpu.stream)
