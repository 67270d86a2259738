"""Run a Plan: compile, build library plans, allocate, run once eagerly, then replay a CUDA graph.

The whole launch list is captured in one graph after the eager run.

Inputs come as numpy arrays (copied into the plan's input buffers) or as GPU arrays through
DLPack or the CUDA array interface, used in place: the graph is captured again whenever their
addresses change (a few captures are kept). Results are numpy arrays, or `DeviceArray`s over
the output buffers, valid until the next run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.cuda import nvrtc
from knopt.cuda.blas import Blas
from knopt.cuda.context import REGIONS
from knopt.cuda.dnn import Dnn
from knopt.cuda.driver import Gpu
from knopt.cuda.planner import Plan
from knopt.cuda.steps import Buf, Conv, Gemm, Launch, Step, describe_step
from knopt.errors import CudaError, InputError
from knopt.ir.shape import format_shape

MODULE_KERNELS = 24  # kernels per NVRTC translation unit: headers parse once per unit
GRAPHS_KEPT = 4
ALIGNMENT = 16  # bytes an external input must be aligned to for vector loads
Binding = tuple[tuple[int, int], ...]  # (input buffer, external address) pairs


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


def _kernel_launches(step: Step) -> list[Launch]:
    if isinstance(step, Launch):
        return [step]
    found = [step.fallback] if step.fallback is not None else []
    if isinstance(step, Conv) and step.direct is not None:
        found.append(step.direct)
    return found


class Executable:
    """A plan made ready on one GPU.

    Raises:
        CudaError: If compiling, planning a library call or allocating fails.
    """

    def __init__(self, plan: Plan, gpu: Gpu | None = None) -> None:
        self.plan = plan
        self.gpu = gpu or Gpu()
        self.kernels = self._compile()
        # Library plans are made (and their algorithms timed) on this GPU's stream, before
        # anything is captured.
        self.blas = Blas(self.gpu) if any(isinstance(s, Gemm) for s in plan.steps) else None
        self.dnn = Dnn(self.gpu) if any(isinstance(s, Conv) for s in plan.steps) else None
        self.library = {
            i: self._library_plan(s) for i, s in enumerate(plan.steps) if isinstance(s, Gemm | Conv)
        }
        workspace = max([getattr(p, "workspace", 0) for p in self.library.values() if p] + [0])
        self.workspace_bytes = workspace
        self.bases = {
            region: self.gpu.allocate(plan.region_bytes.get(region, 0)) for region in REGIONS
        }
        self.workspace = self.gpu.allocate(workspace)
        for buffer_id, data in plan.constants.items():
            self.gpu.upload(self._buffer_address(buffer_id), data)
        self.input_buffers = {name: plan.tensors[tid].buffer for name, tid in plan.inputs}
        self._graphs: OrderedDict[Binding, Any] = OrderedDict()
        self._ran_eagerly: set[Binding] = set()

    # ---- preparation ---------------------------------------------------------------------

    def _compile(self) -> dict[str, Any]:
        sources: dict[str, Launch] = {}
        for step in self.plan.steps:
            for launch in _kernel_launches(step):
                sources.setdefault(launch.name, launch)
        names = sorted(sources)
        groups = [names[i : i + MODULE_KERNELS] for i in range(0, len(names), MODULE_KERNELS)]

        def build(group: list[str]) -> bytes:
            source = '#include "common.cuh"\n' + "\n".join(sources[n].source for n in group)
            return nvrtc.compile_cubin(source, self.gpu.arch)

        with ThreadPoolExecutor(max_workers=8) as pool:
            cubins = list(pool.map(build, groups))
        kernels: dict[str, Any] = {}
        for group, cubin in zip(groups, cubins, strict=True):
            kernels.update(self.gpu.load(cubin, group))
        for name, launch in sources.items():
            self.gpu.allow_shared(kernels[name], launch.shared)
        return kernels

    def _library_plan(self, step: Gemm | Conv) -> Any:
        if isinstance(step, Gemm):
            assert self.blas is not None
            return self.blas.plan(step)
        assert self.dnn is not None
        return self.dnn.plan(step)

    # ---- addresses -------------------------------------------------------------------------

    def _buffer_address(self, buffer_id: int, bound: Mapping[int, int] | None = None) -> int:
        if bound and buffer_id in bound:
            return bound[buffer_id]
        buffer = self.plan.buffers[buffer_id]
        return self.bases[buffer.region] + buffer.offset

    def _address(self, tid: int, bound: Mapping[int, int]) -> int:
        tensor = self.plan.tensors[tid]
        return (
            self._buffer_address(tensor.buffer, bound)
            + tensor.layout.offset * tensor.dtype.itemsize
        )

    def _enqueuers(self, bound: Mapping[int, int]) -> list[Callable[[], None]]:
        """One closure per step, with every address resolved."""
        calls: list[Callable[[], None]] = []
        for index, step in enumerate(self.plan.steps):
            if isinstance(step, Launch):
                calls.append(self._launcher(step, bound))
                continue
            library = self.library[index]
            addresses = {t: self._address(t, bound) for t in _step_tensor_ids(step)}
            after = (
                [step.fallback]
                if step.fallback is not None and not (library is not None and library.fused)
                else []
            )
            if library is None:
                assert isinstance(step, Conv) and step.direct is not None
                calls.append(self._launcher(step.direct, bound))
            else:
                calls.append(
                    _library_call(library, addresses, self.workspace, self.gpu.stream_handle)
                )
            calls += [self._launcher(launch, bound) for launch in after]
        return calls

    def _launcher(self, launch: Launch, bound: Mapping[int, int]) -> Callable[[], None]:
        kernel = self.kernels[launch.name]
        args = [self._address(a.tensor, bound) if isinstance(a, Buf) else a for a in launch.args]
        gpu = self.gpu

        def call() -> None:
            gpu.launch(kernel, launch.grid, launch.block, launch.shared, args)

        return call

    # ---- running -----------------------------------------------------------------------

    def run(self, feeds: Mapping[str, Any], *, device_outputs: bool = False) -> list[Any]:
        """Run the plan on `feeds` (by input name); returns the outputs in order.

        Raises:
            InputError: If a feed is missing or of the wrong shape or dtype.
            CudaError: If a CUDA call fails.
        """
        bound = self._bind(feeds)
        key = tuple(sorted(bound.items()))
        if key not in self._ran_eagerly:
            for call in self._enqueuers(bound):
                call()
            self.gpu.sync()
            self._ran_eagerly.add(key)
            self._capture(key, bound)
        else:
            self._graphs.move_to_end(key)
            self.gpu.replay(self._graphs[key])
        return self._results(device_outputs)

    def replay(self) -> None:
        """Replay the most recently used graph (for timing; inputs stay as last bound)."""
        self.gpu.replay(next(reversed(self._graphs.values())))

    def _capture(self, key: Binding, bound: Mapping[int, int]) -> None:
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
            library = self.library.get(index)
            if isinstance(step, Gemm | Conv):
                line += (
                    " [fused]"
                    if library is not None and library.fused
                    else (" [direct]" if library is None else " [plain + epilogue kernel]")
                )
            lines.append(line)
        return "\n".join(lines)


def _step_tensor_ids(step: Gemm | Conv) -> list[int]:
    if isinstance(step, Gemm):
        ids = [step.a.tensor, step.b.tensor, step.d.tensor]
        ids += [step.residual.tensor] if step.residual is not None else []
        ids += [step.bias] if step.bias is not None else []
        return ids
    return [t for t in (step.x, step.w, step.y, step.bias, step.residual) if t is not None]


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


__all__ = ["CudaError", "DeviceArray", "Executable"]
