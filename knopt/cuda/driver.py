"""The CUDA device: cuda.core for device, stream, memory and launches; cuda.bindings for the rest.

Copies, events and stream capture use cuda.bindings. Every driver status passes through
`check()`, which names the call.

Work is only queued on the stream, never waited for, except where the host needs its result
(a download, `sync`). Other streams are ordered against it with events (`wait_for`,
`make_wait`), and host objects that queued work reads (GPU arrays of other libraries, whose
memory their allocator would reuse once freed) are kept until that work is done (`hold`).

On sm_90 and later, knopt's own kernels launch with programmatic dependent launch: a kernel's
blocks may be scheduled while the kernel ahead of it on the stream still runs, to shorten the
gap between the small kernels of a batch-1 program. Every kernel knopt compiles opens with
`KN_PDL_BEGIN()` (codegen/common.cuh), which waits for the kernel ahead to complete before it
touches memory, so results are unchanged. Only `Gpu.launch` sets the attribute, and only knopt's
kernels go through it: library kernels (cuBLASLt, cuDNN) are launched by their libraries as
before. Set `KNOPT_PDL=0` to launch every kernel after the one ahead has finished, as on older
GPUs (to compare the two, or to rule PDL out when chasing a bug).
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from cuda import core
from cuda.bindings import driver as cu
from cuda.core.utils import StridedMemoryView

from knopt.errors import CudaError

DEFAULT_SHARED_LIMIT = 48 * 1024  # bytes of dynamic shared memory a kernel gets unasked
VIEWS_KEPT = 64  # descriptions of device memory that `Gpu.dlpack` keeps for the next call
STAGING_BYTES = 2 << 20  # pinned host memory that small uploads pass through (two halves)
STAGED_MAX = 64 << 10  # uploads up to this size are staged; larger ones copy from where they are
PAGE = 4096  # bytes of a host page (pinned memory starts on one)
PDL_ENV = "KNOPT_PDL"
PDL_ARCH = 90  # the first architecture with programmatic dependent launch (Hopper)


def check(call: str, result: Any) -> Any:
    """Unpack a cuda.bindings result `(status, *values)`.

    Returns:
        The single value, a tuple of several, or None.

    Raises:
        CudaError: Naming `call`, if the status is not success.
    """
    if isinstance(result, tuple):
        status, *values = result
    else:
        status, values = result, []
    if int(status) != 0:
        raise CudaError(call, getattr(status, "name", status), _describe(status))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _describe(status: Any) -> str:
    if isinstance(status, cu.CUresult):
        error, text = cu.cuGetErrorString(status)
        if int(error) == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    return ""


def pdl_enabled(arch: int) -> bool:
    """Whether knopt's kernels launch with programmatic dependent launch on `arch` (such as 90).

    On sm_90 and later, unless `KNOPT_PDL` is "0".
    """
    return arch >= PDL_ARCH and os.environ.get(PDL_ENV, "1").strip() != "0"


def launch_config(
    grid: tuple[int, int, int], block: tuple[int, int, int], shared: int, pdl: bool
) -> core.LaunchConfig:
    """The launch configuration of one of knopt's kernels.

    Args:
        grid: Blocks.
        block: Threads per block.
        shared: Bytes of dynamic shared memory.
        pdl: Launch with programmatic stream serialization: only for a kernel that opens with
            `KN_PDL_BEGIN()` (or `KN_PDL_OPEN`), on a device where `pdl_enabled`.
    """
    return core.LaunchConfig(
        grid=grid, block=block, shmem_size=shared, programmatic_stream_serialization=pdl
    )


class Gpu:
    """One device with one stream: everything runs in order on it.

    Raises:
        CudaError: If there is no usable device.
    """

    def __init__(self, index: int = 0) -> None:
        try:
            self.device = core.Device(index)
            self.device.set_current()
            self.stream = self.device.create_stream()
        except Exception as err:  # cuda.core raises its own types; keep the message
            raise CudaError(f"cuda.core.Device({index})", None, str(err)) from err
        self.index = index
        self.arch = f"sm_{self.device.arch}"
        self.pdl = pdl_enabled(int(self.device.arch))  # read once: KNOPT_PDL applies per Gpu
        self.stream_handle = int(self.stream.handle)
        self._cu_device = check("cuDeviceGet", cu.cuDeviceGet(index))
        self._buffers: list[Any] = []
        self._marker: Any = None  # an event recorded, waited on, recorded again (wait_for)
        self._held: deque[tuple[Any, tuple[Any, ...]]] = deque()  # (event, objects) of `hold`
        self._spare: list[Any] = []  # events of `hold` whose work is done
        self._views: dict[tuple[int, tuple[int, ...], np.dtype], Any] = {}  # see `dlpack`
        self._staging: _Staging | None = None  # made at the first small upload

    @property
    def name(self) -> str:
        """The device's name (such as "NVIDIA H200")."""
        return str(self.device.name)

    def allocate(self, nbytes: int) -> int:
        """Device memory of `nbytes` (kept until the Gpu goes away); returns its address."""
        try:
            buffer = self.device.allocate(max(nbytes, 256), stream=self.stream)
        except Exception as err:
            raise CudaError("Device.allocate", None, f"{nbytes} bytes: {err}") from err
        self._buffers.append(buffer)
        return int(buffer.handle)

    def release(self, address: int) -> None:
        """Free memory that `allocate` returned, once the work queued on the stream is done."""
        for index, buffer in enumerate(self._buffers):
            if int(buffer.handle) == address:
                del self._buffers[index]
                buffer.close(self.stream)
                return

    def upload(self, address: int, array: np.ndarray) -> None:
        """Copy a host array to device memory at `address`, without waiting for the GPU.

        `array` may change as soon as this returns. A small array passes through pinned
        memory: a copy from pageable memory may wait for the stream's queued work first.
        """
        array = np.ascontiguousarray(array)
        if not array.nbytes:
            return
        if array.nbytes <= STAGED_MAX:
            if self._staging is None:
                self._staging = _Staging()
            source = self._staging.place(array, self.stream.handle)
        else:
            source = array.ctypes.data
        check(
            "cuMemcpyHtoDAsync",
            cu.cuMemcpyHtoDAsync(address, source, array.nbytes, self.stream.handle),
        )

    def download(self, address: int, array: np.ndarray) -> np.ndarray:
        """Fill contiguous host `array` from device memory at `address` (waits for the copy)."""
        if array.nbytes:
            check(
                "cuMemcpyDtoHAsync",
                cu.cuMemcpyDtoHAsync(array.ctypes.data, address, array.nbytes, self.stream.handle),
            )
        self.sync()
        return array

    def copy(self, target: int, source: int, nbytes: int) -> None:
        """Device-to-device copy on the stream."""
        if nbytes:
            check(
                "cuMemcpyDtoDAsync",
                cu.cuMemcpyDtoDAsync(target, source, nbytes, self.stream.handle),
            )

    def fill(self, address: int, byte: int, nbytes: int) -> None:
        """Set `nbytes` at `address` to `byte`."""
        if nbytes:
            check("cuMemsetD8Async", cu.cuMemsetD8Async(address, byte, nbytes, self.stream.handle))

    def load(self, cubin: bytes, names: Sequence[str]) -> dict[str, Any]:
        """Load a cubin and get its kernels by name."""
        try:
            module = core.ObjectCode.from_cubin(cubin)
            return {name: module.get_kernel(name) for name in names}
        except Exception as err:
            raise CudaError("ObjectCode.get_kernel", None, str(err)) from err

    def allow_shared(self, kernel: Any, nbytes: int) -> None:
        """Let `kernel` use `nbytes` of dynamic shared memory (needed above 48 KiB)."""
        if nbytes > DEFAULT_SHARED_LIMIT:
            attribute = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(
                "cuKernelSetAttribute",
                cu.cuKernelSetAttribute(attribute, nbytes, kernel.handle, self._cu_device),
            )

    def launch(
        self,
        kernel: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        args: Sequence[Any],
    ) -> None:
        """Launch one of knopt's kernels on the stream (args: int addresses and numpy scalars).

        With programmatic dependent launch where `pdl` is on: `kernel` must be compiled from
        codegen/, whose kernels wait for the one ahead before they touch memory.
        """
        config = launch_config(grid, block, shared, self.pdl)
        try:
            core.launch(self.stream, config, kernel, *args)
        except Exception as err:
            raise CudaError("cuda.core.launch", None, str(err)) from err

    def sync(self) -> None:
        """Wait for everything queued on the stream."""
        check("cuStreamSynchronize", cu.cuStreamSynchronize(self.stream.handle))
        while self._held:
            self._spare.append(self._held.popleft()[0])

    # ---- ordering against other streams ----------------------------------------------------

    def wait_for(self, stream: int) -> None:
        """Make the stream wait for the work queued on `stream` (a handle) so far.

        The handles 1 and 2 are CUDA's legacy and per-thread default streams.
        """
        if stream != self.stream_handle:
            self._order(cu.CUstream(stream), self.stream.handle)

    def make_wait(self, stream: int) -> None:
        """Make `stream` (a handle) wait for the work queued on the stream so far."""
        if stream != self.stream_handle:
            self._order(self.stream.handle, cu.CUstream(stream))

    def _order(self, first: Any, then: Any) -> None:
        # A wait takes the event as last recorded when it is queued, so one event serves
        # every ordering: recording it again later does not move an earlier wait.
        if self._marker is None:
            self._marker = _event()
        check("cuEventRecord", cu.cuEventRecord(self._marker, first))
        check("cuStreamWaitEvent", cu.cuStreamWaitEvent(then, self._marker, 0))

    def hold(self, objects: tuple[Any, ...]) -> None:
        """Keep `objects` alive until the work queued on the stream so far is done.

        A GPU array of another library that a queued run reads must outlive the run: freed
        earlier, its allocator could hand its memory to work on another stream.
        """
        self._release_done()
        event = self._spare.pop() if self._spare else _event()
        check("cuEventRecord", cu.cuEventRecord(event, self.stream.handle))
        self._held.append((event, objects))

    def _release_done(self) -> None:
        """Let go of the objects `hold` kept for work that is done (in queue order)."""
        while self._held:
            event = self._held[0][0]
            result = cu.cuEventQuery(event)
            status = result[0] if isinstance(result, tuple) else result
            if status == cu.CUresult.CUDA_ERROR_NOT_READY:
                return
            check("cuEventQuery", status)
            self._spare.append(self._held.popleft()[0])

    def dlpack(self, address: int, shape: tuple[int, ...], dtype: np.dtype, versioned: bool) -> Any:
        """A DLPack capsule of the device memory at `address` (the caller orders the streams).

        The memory stays knopt's: the capsule neither owns nor frees it. Its description
        (a cuda.core view) is made once per place, as a decoding loop hands over the same
        output at every step.

        Args:
            address: Where the (contiguous) data starts.
            shape: Its shape.
            dtype: Its numpy dtype.
            versioned: A DLPack 1.x capsule ("dltensor_versioned"), else a 0.x one.

        Raises:
            CudaError: If cuda.core cannot describe the memory.
        """
        key = (address, shape, dtype)
        try:
            view = self._views.get(key)
            if view is None:
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                buffer = core.Buffer.from_handle(address, nbytes)
                view = StridedMemoryView.from_buffer(buffer, shape, dtype=dtype)
                if len(self._views) >= VIEWS_KEPT:
                    self._views.clear()
                self._views[key] = view
            return view.__dlpack__(max_version=(1, 0) if versioned else None)
        except Exception as err:  # cuda.core raises its own types; keep the message
            raise CudaError("StridedMemoryView.__dlpack__", None, str(err)) from err

    def begin_capture(self) -> None:
        """Start recording the stream's work into a CUDA graph."""
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check("cuStreamBeginCapture", cu.cuStreamBeginCapture(self.stream.handle, mode))

    def end_capture(self) -> Any:
        """Stop recording; returns the instantiated, uploaded graph."""
        graph = check("cuStreamEndCapture", cu.cuStreamEndCapture(self.stream.handle))
        executable = check("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
        check("cuGraphUpload", cu.cuGraphUpload(executable, self.stream.handle))
        check("cuGraphDestroy", cu.cuGraphDestroy(graph))
        return executable

    def abort_capture(self) -> None:
        """End a capture that failed part-way, discarding what it recorded."""
        status, graph = cu.cuStreamEndCapture(self.stream.handle)
        if int(status) == 0 and graph is not None:
            cu.cuGraphDestroy(graph)

    def replay(self, executable: Any) -> None:
        """Launch a captured graph on the stream."""
        check("cuGraphLaunch", cu.cuGraphLaunch(executable, self.stream.handle))

    def release_graph(self, executable: Any) -> None:
        """Free a captured graph."""
        check("cuGraphExecDestroy", cu.cuGraphExecDestroy(executable))

    def event(self) -> Any:
        """A timing event recorded on the stream now."""
        event = check("cuEventCreate", cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT))
        check("cuEventRecord", cu.cuEventRecord(event, self.stream.handle))
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded events (waits for the second)."""
        check("cuEventSynchronize", cu.cuEventSynchronize(end))
        milliseconds = check("cuEventElapsedTime", cu.cuEventElapsedTime(start, end))
        check("cuEventDestroy", cu.cuEventDestroy(start))
        check("cuEventDestroy", cu.cuEventDestroy(end))
        return float(milliseconds)


class _Staging:
    """Pinned host memory that small uploads pass through, in turn (a ring of two halves).

    An upload is copied in, then queued from there; the next upload takes the memory after
    it. Before the ring enters a half again, the host waits for the copies queued from that
    half last time: they were queued a whole half of uploads ago, so they are long done.

    Raises:
        CudaError: If the memory cannot be pinned.
    """

    def __init__(self) -> None:
        memory = np.empty(STAGING_BYTES + PAGE, np.uint8)
        start = -memory.ctypes.data % PAGE
        self.host = memory[start : start + STAGING_BYTES]
        self.address = int(self.host.ctypes.data)
        check("cuMemHostRegister", cu.cuMemHostRegister(self.address, STAGING_BYTES, 0))
        # Unpin before numpy frees the memory, which would otherwise stay registered.
        weakref.finalize(self, cu.cuMemHostUnregister, self.address)
        self.offset = 0
        self._left: list[Any] = [None, None]  # per half: an event recorded as the ring left it

    def place(self, array: np.ndarray, stream: Any) -> int:
        """Copy contiguous `array` in; returns its pinned address (to copy from on `stream`)."""
        half = STAGING_BYTES // 2
        size = -(-array.nbytes // 256) * 256
        current = self.offset // half
        if self.offset + size > (current + 1) * half:
            other = 1 - current
            if self._left[current] is None:
                self._left[current] = _event()
            check("cuEventRecord", cu.cuEventRecord(self._left[current], stream))
            if self._left[other] is not None:
                check("cuEventSynchronize", cu.cuEventSynchronize(self._left[other]))
            self.offset = other * half
        start = self.offset
        self.host[start : start + array.nbytes] = array.reshape(-1).view(np.uint8)
        self.offset = start + size
        return self.address + start


def _event() -> Any:
    """A driver event for ordering (no timing, which makes recording it cheaper)."""
    flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return check("cuEventCreate", cu.cuEventCreate(flags))
