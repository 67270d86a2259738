"""Run a Plan: size-generic kernels, library plans, memory, one eager run, then a CUDA graph.

The plans of one program (one per set of sizes) share a `Runtime`: its compiled kernels
(size-generic, `knopt.cuda.generic`: a plan at a new size reuses them with other launch
arguments), the weights (uploaded once: the constant region is the same in every plan),
cuBLASLt and cuDNN plans (keyed by the call's shape, not its tensors), and memory pools for
the arena, the outputs and the library workspace, which grow to the largest plan. Each
`Executable` (one plan) has its input region of its own. Its first run with given input
addresses launches eagerly; the second captures the launch list into a CUDA graph and replays
it, and every later one replays it. A first run (a size seen once) so costs no capture.

Inputs come as numpy arrays (copied into the plan's input buffers) or as GPU arrays through
DLPack or the CUDA array interface, used in place: a graph is captured for each set of their
addresses run twice (a few captures are kept), and again when a pool has grown. Results are numpy
arrays, or `DeviceArray`s over the output buffers, valid until the next run.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from knopt.cuda import nvrtc
from knopt.cuda.driver import DEFAULT_SHARED_LIMIT, Gpu
from knopt.cuda.generic import KernelLibrary, Template
from knopt.cuda.planner import Plan
from knopt.cuda.steps import Buf, Conv, Gemm, Launch, describe_step, kernel_launches
from knopt.errors import CudaError, InputError
from knopt.ir.shape import format_shape

if TYPE_CHECKING:
    from knopt.cuda.blas import Blas
    from knopt.cuda.dnn import Dnn

MODULE_KERNELS = 24  # kernels per NVRTC translation unit: headers parse once per unit
GRAPHS_KEPT = 2  # CUDA graphs per plan (one per way the inputs were bound)
EAGER_KEPT = 8  # bindings run once (eagerly) remembered per plan, to capture on the second
ALIGNMENT = 16  # bytes an external input must be aligned to for vector loads
GROWTH = 1.25  # a pool that must grow takes this much more than asked, for the next size
POOLS = ("arena", "output", "workspace")
Binding = tuple[tuple[int, int], ...]  # (input buffer, external address) pairs
_FALLBACK = Launch("fallback", "", (1, 1, 1), (1, 1, 1), ())  # stands for any fallback launch


@dataclass(frozen=True)
class DeviceArray:
    """A result left on the GPU (valid until the session's next run).

    It speaks the CUDA array interface, so `torch.as_tensor(a, device="cuda")` and
    `cupy.asarray(a)` take it without a copy.
    """

    address: int
    shape: tuple[int, ...]
    dtype: np.dtype
    stream: int
    gpu: Gpu

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3)."""
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.address, False),
            "version": 3,
            "strides": None,
            "stream": self.stream,
        }

    def numpy(self) -> np.ndarray:
        """A host copy."""
        return self.gpu.download(self.address, np.empty(self.shape, self.dtype))


class Pool:
    """Device memory that the plans of a runtime share, grown for the largest plan.

    Attributes:
        generation: Counts the moves: a CUDA graph captured at another generation is stale.
    """

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.address = 0
        self.nbytes = 0
        self.generation = 0

    def reserve(self, nbytes: int) -> None:
        """Make the pool at least `nbytes` long (moving it if it grows)."""
        if nbytes <= self.nbytes:
            return
        if self.address:
            self.gpu.release(self.address)
        self.nbytes = -(-int(nbytes * GROWTH) // 256) * 256
        self.address = self.gpu.allocate(self.nbytes)
        self.generation += 1


@dataclass
class RuntimeStats:
    """What a runtime has made.

    Attributes:
        templates: Size-generic kernels compiled (or read from NVRTC's disk cache).
        library_plans: cuBLASLt and cuDNN plans built (one per shape).
    """

    templates: int = 0
    library_plans: int = 0


class Runtime:
    """What the plans of one program share on one GPU (see the module's docstring).

    Args:
        gpu: The GPU (a new one when not given).
        lift: Size-generic kernels (see `KernelLibrary`).

    Raises:
        CudaError: If the GPU cannot be used.
    """

    def __init__(self, gpu: Gpu | None = None, lift: bool = True) -> None:
        self.gpu = gpu or Gpu()
        self.library = KernelLibrary(lift)
        self.kernels: dict[str, Any] = {}
        self.stats = RuntimeStats()
        self.pools = {name: Pool(self.gpu) for name in POOLS}
        self.weights = 0
        self.resident = 0
        self.resident_generation = 0  # the resident region moves when caches grow
        self._shared: dict[str, int] = {}
        self.blas: Blas | None = None  # made when a plan first calls cuBLASLt
        self.dnn: Dnn | None = None  # made when a plan first calls cuDNN
        self._library_plans: dict[Gemm | Conv, Any] = {}

    # ---- kernels ----------------------------------------------------------------------------

    def templates(self, plan: Plan) -> dict[Launch, tuple[Template, tuple[np.generic, ...]]]:
        """Each launch of `plan` as a size-generic kernel and its extra arguments.

        Templates made for it are compiled by `compile_new`.
        """
        found: dict[Launch, tuple[Template, tuple[np.generic, ...]]] = {}
        for step in plan.steps:
            for launch in kernel_launches(step):
                if launch not in found:
                    found[launch] = self.library.arguments(launch)
        return found

    def compile_new(self) -> None:
        """Compile the templates made so far that are not compiled yet (in parallel).

        Raises:
            CudaError: If NVRTC fails.
        """
        self._compile([t for t in self.library.made if t.name not in self.kernels])

    def allow_shared(self, launches: dict[Launch, tuple[Template, tuple[np.generic, ...]]]) -> None:
        """Let each kernel use the dynamic shared memory its launches ask for."""
        for launch, (template, _) in launches.items():
            if launch.shared > self._shared.get(template.name, DEFAULT_SHARED_LIMIT):
                self.gpu.allow_shared(self.kernels[template.name], launch.shared)
                self._shared[template.name] = launch.shared

    def _compile(self, templates: list[Template]) -> None:
        templates = list({t.name: t for t in templates}.values())  # a name is its source's hash
        if not templates:
            return
        groups = [
            templates[i : i + MODULE_KERNELS] for i in range(0, len(templates), MODULE_KERNELS)
        ]

        def build(group: list[Template]) -> bytes:
            source = '#include "common.cuh"\n' + "\n".join(t.source for t in group)
            return nvrtc.compile_cubin(source, self.gpu.arch)

        with ThreadPoolExecutor(max_workers=8) as pool:
            cubins = list(pool.map(build, groups))
        for group, cubin in zip(groups, cubins, strict=True):
            self.kernels.update(self.gpu.load(cubin, [t.name for t in group]))
        self.stats.templates += len(templates)

    # ---- library calls ---------------------------------------------------------------------

    def library_plan(self, step: Gemm | Conv) -> tuple[Any, dict[int, int]]:
        """The cuBLASLt or cuDNN plan of a step's shape, and its tensors by the plan's ids.

        Plans are keyed by the call's shape and type, so equal calls of other tensors or other
        plans share one. The plan's tensor ids are 0, 1, ...; the map gives each the step's.

        Raises:
            CudaError: If the library fails (not when it merely declines to fuse).
        """
        canonical, ids = _canonical(step)
        if canonical not in self._library_plans:
            self.stats.library_plans += 1
            if isinstance(canonical, Gemm):
                if self.blas is None:
                    from knopt.cuda.blas import Blas

                    self.blas = Blas(self.gpu)  # times candidates on the stream
                self._library_plans[canonical] = self.blas.plan(canonical)
            else:
                if self.dnn is None:
                    from knopt.cuda.dnn import Dnn

                    self.dnn = Dnn(self.gpu)
                self._library_plans[canonical] = self.dnn.plan(canonical)
        return self._library_plans[canonical], ids

    # ---- memory ----------------------------------------------------------------------------

    def upload_weights(self, plan: Plan) -> None:
        """Upload the program's constants, once (every plan lays them out alike)."""
        if self.weights:
            return
        self.weights = self.gpu.allocate(plan.region_bytes.get("constant", 0))
        for buffer_id, data in plan.constants.items():
            buffer = plan.buffers[buffer_id]
            if buffer.region == "constant":
                self.gpu.upload(self.weights + buffer.offset, data)

    def close(self) -> None:
        """Free the memory the runtime holds (its plans' executables are closed first)."""
        for address in (self.weights, self.resident, *(p.address for p in self.pools.values())):
            if address:
                self.gpu.release(address)
        self.weights = self.resident = 0
        self.pools = {name: Pool(self.gpu) for name in POOLS}

    def generations(self) -> tuple[int, ...]:
        """The pools' and resident region's generations (part of a captured graph's key)."""
        return (*(self.pools[name].generation for name in POOLS), self.resident_generation)


def _canonical(step: Gemm | Conv) -> tuple[Gemm | Conv, dict[int, int]]:
    """The step with its tensors numbered 0, 1, ... and its fallbacks replaced by a marker."""
    if isinstance(step, Gemm):
        ids = {0: step.a.tensor, 1: step.b.tensor, 2: step.d.tensor}
        residual = None
        if step.residual is not None:
            ids[3] = step.residual.tensor
            residual = step.residual.with_tensor(3)
        if step.bias is not None:
            ids[4] = step.bias
        gemm = dataclasses.replace(
            step,
            a=step.a.with_tensor(0),
            b=step.b.with_tensor(1),
            d=step.d.with_tensor(2),
            residual=residual,
            bias=4 if step.bias is not None else None,
            fallback=_FALLBACK if step.fallback is not None else None,
        )
        return gemm, ids
    ids = {0: step.x, 1: step.w, 2: step.y}
    if step.bias is not None:
        ids[3] = step.bias
    if step.residual is not None:
        ids[4] = step.residual
    conv = dataclasses.replace(
        step,
        x=0,
        w=1,
        y=2,
        bias=3 if step.bias is not None else None,
        residual=4 if step.residual is not None else None,
        fallback=_FALLBACK if step.fallback is not None else None,
        direct=_FALLBACK if step.direct is not None else None,
    )
    return conv, ids


class Executable:
    """A plan made ready on one GPU.

    Args:
        plan: The plan (all sizes static).
        gpu: The GPU of a new runtime.
        runtime: What the plans of its program share; a new one when not given.

    Raises:
        CudaError: If compiling, planning a library call or allocating fails.
    """

    def __init__(
        self, plan: Plan, gpu: Gpu | None = None, *, runtime: Runtime | None = None
    ) -> None:
        self.plan = plan
        self.runtime = runtime or Runtime(gpu)
        self.gpu = self.runtime.gpu
        self.launches = self.runtime.templates(plan)
        self.runtime.compile_new()
        self.runtime.allow_shared(self.launches)
        self.library = {
            i: self.runtime.library_plan(s)
            for i, s in enumerate(plan.steps)
            if isinstance(s, Gemm | Conv)
        }
        workspace = max([getattr(p, "workspace", 0) for p, _ in self.library.values() if p] + [0])
        self.workspace_bytes = workspace
        pools = self.runtime.pools
        pools["workspace"].reserve(workspace)
        pools["arena"].reserve(plan.region_bytes.get("arena", 0))
        pools["output"].reserve(plan.region_bytes.get("output", 0))
        self.runtime.upload_weights(plan)
        self.inputs = self.gpu.allocate(plan.region_bytes.get("input", 0))
        for buffer_id, data in plan.constants.items():
            if plan.buffers[buffer_id].region == "input":
                self.gpu.upload(self.inputs + plan.buffers[buffer_id].offset, data)
        self.input_buffers = {name: plan.tensors[tid].buffer for name, tid in plan.inputs}
        self._graphs: OrderedDict[tuple[Binding, tuple[int, ...]], Any] = OrderedDict()
        self._eager: OrderedDict[tuple[Binding, tuple[int, ...]], None] = OrderedDict()
        self._last: tuple[tuple[Binding, tuple[int, ...]], dict[int, int]] | None = None

    @property
    def kernels(self) -> dict[str, Any]:
        """The compiled kernels this plan launches, by name."""
        names = {template.name for template, _ in self.launches.values()}
        return {name: self.runtime.kernels[name] for name in sorted(names)}

    @property
    def blas(self) -> Blas | None:
        """The runtime's cuBLASLt plans (None before any GEMM)."""
        return self.runtime.blas

    @property
    def dnn(self) -> Dnn | None:
        """The runtime's cuDNN plans (None before any convolution)."""
        return self.runtime.dnn

    def close(self) -> None:
        """Free what this plan holds alone (its input region and CUDA graphs)."""
        for graph in self._graphs.values():
            self.gpu.release_graph(graph)
        self._graphs.clear()
        if self.inputs:
            self.gpu.release(self.inputs)
            self.inputs = 0

    # ---- addresses -------------------------------------------------------------------------

    def _bases(self) -> dict[str, int]:
        pools = self.runtime.pools
        return {
            "constant": self.runtime.weights,
            "input": self.inputs,
            "output": pools["output"].address,
            "arena": pools["arena"].address,
            "resident": self.runtime.resident,
        }

    def _buffer_address(
        self,
        buffer_id: int,
        bound: Mapping[int, int] | None = None,
        bases: Mapping[str, int] | None = None,
    ) -> int:
        if bound and buffer_id in bound:
            return bound[buffer_id]
        buffer = self.plan.buffers[buffer_id]
        return (bases or self._bases())[buffer.region] + buffer.offset

    def _address(
        self, tid: int, bound: Mapping[int, int], bases: Mapping[str, int] | None = None
    ) -> int:
        tensor = self.plan.tensors[tid]
        return (
            self._buffer_address(tensor.buffer, bound, bases)
            + tensor.layout.offset * tensor.dtype.itemsize
        )

    def _enqueuers(self, bound: Mapping[int, int]) -> list[Callable[[], None]]:
        """One closure per step, with every address resolved."""
        calls: list[Callable[[], None]] = []
        workspace = self.runtime.pools["workspace"].address
        bases = self._bases()
        for index, step in enumerate(self.plan.steps):
            if isinstance(step, Launch):
                calls.append(self._launcher(step, bound, bases))
                continue
            library, ids = self.library[index]
            addresses = {mine: self._address(theirs, bound, bases) for mine, theirs in ids.items()}
            after = (
                [step.fallback]
                if step.fallback is not None and not (library is not None and library.fused)
                else []
            )
            if library is None:
                assert isinstance(step, Conv) and step.direct is not None
                calls.append(self._launcher(step.direct, bound, bases))
            else:
                calls.append(_library_call(library, addresses, workspace, self.gpu.stream_handle))
            calls += [self._launcher(launch, bound, bases) for launch in after]
        return calls

    def _launcher(
        self, launch: Launch, bound: Mapping[int, int], bases: Mapping[str, int]
    ) -> Callable[[], None]:
        template, extra = self.launches[launch]
        kernel = self.runtime.kernels[template.name]
        args = [
            self._address(a.tensor, bound, bases) if isinstance(a, Buf) else a for a in launch.args
        ]
        args += extra
        gpu = self.gpu

        def call() -> None:
            gpu.launch(kernel, launch.grid, launch.block, launch.shared, args)

        return call

    # ---- running -----------------------------------------------------------------------

    def run(self, feeds: Mapping[str, Any], *, device_outputs: bool = False) -> list[Any]:
        """Run the plan on `feeds` (by input name); returns the outputs in order.

        The first run with these input addresses launches eagerly; the second captures a
        CUDA graph (then replays it), and later ones replay it.

        Raises:
            InputError: If a feed is missing or of the wrong shape or dtype.
            CudaError: If a CUDA call fails.
        """
        bound = self._bind(feeds)
        key = (tuple(sorted(bound.items())), self.runtime.generations())
        self._last = key, bound
        if key in self._graphs:
            self._graphs.move_to_end(key)
            self.gpu.replay(self._graphs[key])
        elif key in self._eager:
            del self._eager[key]
            self._capture(key, bound)
            self.gpu.replay(self._graphs[key])
        else:
            for call in self._enqueuers(bound):
                call()
            self._eager[key] = None
            while len(self._eager) > EAGER_KEPT:
                self._eager.popitem(last=False)
        return self._results(device_outputs)

    def replay(self) -> None:
        """Replay the graph of the last run's inputs (for timing), captured if need be.

        Raises:
            InputError: If the executable has not run yet.
        """
        if self._last is None:
            raise InputError("run the executable once before replaying it")
        key, bound = self._last
        if key not in self._graphs:
            self._eager.pop(key, None)
            self._capture(key, bound)
        self.gpu.replay(self._graphs[key])

    def _capture(self, key: tuple[Binding, tuple[int, ...]], bound: Mapping[int, int]) -> None:
        calls = self._enqueuers(bound)
        self.gpu.begin_capture()
        try:
            for call in calls:
                call()
        except BaseException:
            self.gpu.abort_capture()
            raise
        self._graphs[key] = self.gpu.end_capture()
        while len(self._graphs) > GRAPHS_KEPT:
            _, old = self._graphs.popitem(last=False)
            self.gpu.release_graph(old)

    def _bind(self, feeds: Mapping[str, Any]) -> dict[int, int]:
        bound: dict[int, int] = {}
        for name, tid in self.plan.inputs:
            tensor = self.plan.tensors[tid]
            if name not in feeds:
                raise InputError(
                    f"input '{name}' is missing (expected "
                    f"{tensor.dtype.numpy}{format_shape(tensor.shape)})"
                )
            value = feeds[name]
            address = _device_address(
                value, tensor.shape, tensor.dtype.numpy, name, self.gpu.stream_handle
            )
            if address is not None and address % ALIGNMENT == 0:
                bound[tensor.buffer] = address
                continue
            if address is not None:
                self.gpu.copy(
                    self._buffer_address(tensor.buffer),
                    address,
                    tensor.layout.numel * tensor.dtype.itemsize,
                )
                continue
            array = np.asarray(value)
            if array.shape != tensor.shape or array.dtype != tensor.dtype.numpy:
                raise InputError(
                    f"input '{name}' is {array.dtype}{list(array.shape)}, expected "
                    f"{tensor.dtype.numpy}{format_shape(tensor.shape)}"
                )
            self.gpu.upload(self._buffer_address(tensor.buffer), array)
        return bound

    def _results(self, device_outputs: bool) -> list[Any]:
        results: list[Any] = []
        for _, tid in self.plan.outputs:
            tensor = self.plan.tensors[tid]
            address = self._address(tid, {})
            if device_outputs:
                results.append(
                    DeviceArray(
                        address, tensor.shape, tensor.dtype.numpy, self.gpu.stream_handle, self.gpu
                    )
                )
            else:
                results.append(
                    self.gpu.download(address, np.empty(tensor.shape, tensor.dtype.numpy))
                )
        if device_outputs:
            self.gpu.sync()
        return results

    def describe(self) -> str:
        """The steps, one per line, with what the libraries decided."""
        lines = []
        for index, step in enumerate(self.plan.steps):
            line = describe_step(step)
            if isinstance(step, Gemm | Conv):
                library = self.library[index][0]
                line += (
                    " [fused]"
                    if library is not None and library.fused
                    else (" [direct]" if library is None else " [plain + epilogue kernel]")
                )
            lines.append(line)
        return "\n".join(lines)


def _library_call(
    library: Any, addresses: dict[int, int], workspace: int, stream: int
) -> Callable[[], None]:
    def call() -> None:
        library.enqueue(addresses, workspace, stream)

    return call


def _device_address(
    value: Any, shape: Sequence[int], dtype: np.dtype, name: str, stream: int
) -> int | None:
    """The address of a GPU array feed (checked against the expected type), else None."""
    if isinstance(value, np.ndarray | np.generic | list | tuple | float | int):
        return None
    if not (hasattr(value, "__dlpack__") or hasattr(value, "__cuda_array_interface__")):
        return None
    from cuda.core.utils import StridedMemoryView

    try:
        view = StridedMemoryView.from_any_interface(value, stream_ptr=stream)
    except Exception as err:  # BufferError, or the producer's own error
        raise InputError(f"input '{name}': cannot view it as a GPU array ({err})") from err
    if not view.is_device_accessible:
        return None
    if tuple(view.shape) != tuple(shape) or np.dtype(view.dtype) != dtype:
        raise InputError(
            f"input '{name}' is {view.dtype}{list(view.shape)}, expected "
            f"{dtype}{format_shape(tuple(shape))}"
        )
    strides = view.strides
    if strides is not None and tuple(strides) not in (
        _dense(shape, 1),
        _dense(shape, dtype.itemsize),
    ):
        raise InputError(f"input '{name}' is strided {tuple(strides)}; pass a contiguous array")
    return int(view.ptr)


def _dense(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


__all__ = ["CudaError", "DeviceArray", "Executable", "Runtime"]
