"""Run a Plan: size-generic kernels, library plans, memory, one eager run, then a CUDA graph.

The plans of one program (one per set of sizes) share a `Runtime`: its compiled kernels
(size-generic, `knopt.cuda.generic`: a plan at a new size reuses them with other launch
arguments), the weights (uploaded once: the constant region is the same in every plan),
cuBLASLt and cuDNN plans (keyed by the call's shape, not its tensors), and memory pools for
the arena, the outputs and the library workspace, which grow to the largest plan. Each
`Executable` (one plan) has its input region of its own. Its first run with given input
addresses launches eagerly; the second captures the launch list into a CUDA graph and replays
it, and every later one replays it. A first run (a size seen once) so costs no capture.

cuDNN's attention compiles a kernel per shape. The runtime builds those its first plan needs;
a later plan's new shapes are built in a helper process (`knopt.cuda.sdpa_worker`) while its
attentions run knopt's own kernel, and a run that finds a plan built takes it (loads the bytes,
captures again). `Runtime.wait_for_plans` waits for the plans on their way.

Inputs come as numpy arrays (copied into the plan's input buffers) or as GPU arrays through
DLPack or the CUDA array interface, used in place: a graph is captured for each set of their
addresses run twice (a few captures are kept), and again when a pool has grown. Results are numpy
arrays, or `DeviceArray`s over the output buffers, valid until the next run.

A run that returns `DeviceArray`s does not wait for the GPU: it queues its work on the
stream and returns. The streams stay in order without the host: a GPU feed's producer
orders knopt's stream after its writes (DLPack's stream argument), a consumer of a result
through DLPack has its stream ordered after the run (`DeviceArray.__dlpack__`), and the next
run waits for what those consumers queued before overwriting the results (`ResultGuard`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from cuda.core.utils import StridedMemoryView

from knopt.cuda import nvrtc
from knopt.cuda.driver import DEFAULT_SHARED_LIMIT, Gpu
from knopt.cuda.generic import KernelLibrary, Template
from knopt.cuda.planner import Plan
from knopt.cuda.sdpa_worker import PlanBuilder, graph_spec, shared_builder, worker_enabled
from knopt.cuda.steps import Buf, Conv, Gemm, Launch, Sdpa, describe_step, kernel_launches
from knopt.errors import CudaError, InputError, ResultError
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
DLPACK_CUDA = 2  # DLPack's device type kDLCUDA
LEGACY_STREAM = 1  # CUDA's legacy default stream, as DLPack and the driver name it
_HOST = (np.ndarray, np.generic, list, tuple, float, int)  # feeds that are on the host


class ResultGuard:
    """Which run's results a runtime's output pool holds, and which streams are reading them.

    Every run of a runtime's plans writes the same output pool, so each run overwrites the
    results of the one before. A result handed over through DLPack orders the consumer's
    stream after the run that made it (`lend`); the next run first waits for the work those
    streams have queued by then (`begin_run`), so that it overwrites nothing being read.

    Attributes:
        run: Counts the runs; a result knows the run that made it.
    """

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.run = 0
        self._readers: set[int] = set()

    def settle(self) -> None:
        """Make the stream wait for the streams reading the results, before they are reused.

        Call it before queuing anything that overwrites or frees the output pool.
        """
        for stream in self._readers:
            self.gpu.wait_for(stream)
        self._readers.clear()

    def begin_run(self) -> None:
        """Start a run, after the work of the streams reading the results it overwrites."""
        self.settle()
        self.run += 1

    def forget(self) -> None:
        """Make every result handed out stale, once read: its memory is going away."""
        self.settle()
        self.run += 1

    def lend(self, run: int, stream: int) -> None:
        """Order `stream` (a handle) after run `run`, whose result it is about to read.

        Raises:
            ResultError: If a later run has overwritten the result.
        """
        self.check(run)
        if stream != self.gpu.stream_handle:
            self.gpu.make_wait(stream)
            self._readers.add(stream)

    def check(self, run: int) -> None:
        """Refuse a result of run `run` if a later run has overwritten it.

        Raises:
            ResultError: If so.
        """
        if run != self.run:
            raise ResultError(
                f"this result of run {run} was overwritten by run {self.run}: a result left on "
                "the GPU (device_outputs=True) is valid until the next run (copy it to keep it, "
                "such as torch.from_dlpack(result).clone())"
            )


@dataclass(frozen=True, eq=False)
class DeviceArray:
    """A result left on the GPU, valid until the next run of its session.

    Through DLPack (`torch.from_dlpack(a)`, `cupy.from_dlpack(a)`) it is handed over without a
    copy and without waiting on the host: the consumer's stream waits for the run that made
    it, and the session's next run waits for what that stream has queued by then.

    It also speaks the CUDA array interface (`torch.as_tensor(a)`, `cupy.asarray(a)`). That
    interface cannot order the consumer (torch ignores its stream), so it first waits on the
    host for the run. `numpy()` copies it to the host, which waits for the run too.

    Attributes:
        address: Where its (contiguous) data starts on the GPU.
        shape: Its shape.
        dtype: Its numpy dtype.
        guard: The guard of the output pool it lives in.
        run: The run that made it (a count of `guard`'s).
    """

    address: int
    shape: tuple[int, ...]
    dtype: np.dtype
    guard: ResultGuard
    run: int

    @property
    def gpu(self) -> Gpu:
        """The GPU it lives on."""
        return self.guard.gpu

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3), given once the run is done on the GPU.

        Raises:
            ResultError: If a later run has overwritten the result.
        """
        self.guard.check(self.run)
        self.gpu.sync()
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.address, False),
            "version": 3,
            "strides": None,
            "stream": None,  # the data is ready: the consumer need not synchronize
        }

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of the result, with `stream` ordered after the run that made it.

        Args:
            stream: The consumer's stream handle: None or 1 for CUDA's legacy default stream,
                2 for the per-thread default stream, -1 for none (the consumer orders itself).
            max_version: The newest DLPack version the consumer reads.
            dl_device: The device the consumer wants the data on: only its own is possible.
            copy: True is refused: knopt hands over its buffer, never a copy.

        Raises:
            ResultError: If a later run has overwritten the result, or for another device,
                a copy, the ambiguous stream 0 or a dtype cuda.core does not export (bfloat16).
        """
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise ResultError(f"a result on DLPack device {device} cannot go to {dl_device}")
        if copy:
            raise ResultError("knopt hands over its buffer, not a copy (copy=True)")
        if stream == 0:
            raise ResultError("DLPack stream 0 is ambiguous on CUDA (1 is the default stream)")
        if self.dtype.kind not in "biufc":
            raise ResultError(f"a {self.dtype} result has no DLPack export here: use numpy()")
        if stream == -1:
            self.guard.check(self.run)
        else:
            self.guard.lend(self.run, LEGACY_STREAM if stream is None else stream)
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return self.gpu.dlpack(self.address, self.shape, self.dtype, versioned)

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack's (device type, device id) of the result: (kDLCUDA, the GPU's index)."""
        return (DLPACK_CUDA, self.gpu.index)

    def numpy(self) -> np.ndarray:
        """A host copy (waits for the run).

        Raises:
            ResultError: If a later run has overwritten the result.
        """
        self.guard.check(self.run)
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
        self.guard = ResultGuard(self.gpu)
        self._shared: dict[str, int] = {}
        self.blas: Blas | None = None  # made when a plan first calls cuBLASLt
        self.dnn: Dnn | None = None  # made when a plan first calls cuDNN
        self._library_plans: dict[Gemm | Conv | Sdpa, Any] = {}
        self.executables = 0  # made so far: the first one's attention plans are built here
        # Attention plans being built in the helper process (`shared_builder`): its tickets.
        self._pending: dict[Sdpa, tuple[PlanBuilder, int]] = {}

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

    def library_plan(
        self, step: Gemm | Conv | Sdpa, *, later: bool = False
    ) -> tuple[Any, dict[int, int]]:
        """The cuBLASLt or cuDNN plan of a step's shape, and its tensors by the plan's ids.

        Plans are keyed by the call's shape and type, so equal calls of other tensors or other
        plans share one. The plan's tensor ids are 0, 1, ...; the map gives each the step's.
        With `later`, a cuDNN attention plan not built yet, for a plan after the first, is
        built in the helper process: None meanwhile (`pending` says it is on its way).

        Raises:
            CudaError: If the library fails (not when it merely declines to fuse).
        """
        canonical, ids = _canonical(step)
        if isinstance(canonical, Sdpa) and self._collect(canonical):
            return None, ids
        if canonical not in self._library_plans:
            if later and isinstance(canonical, Sdpa) and self._build_later(canonical):
                return None, ids
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

    def pending(self, step: Gemm | Conv | Sdpa) -> bool:
        """Whether the step's plan is being built in the helper process (not back yet)."""
        canonical, _ = _canonical(step)
        return isinstance(canonical, Sdpa) and self._collect(canonical)

    def wait_for_plans(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: as long as it takes) for the plans on their way.

        Plans that arrive are kept; each executable takes its own at its next run.

        Returns:
            Whether none is still on its way.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for canonical in list(self._pending):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._collect(canonical, left)
        return not self._pending

    def _build_later(self, step: Sdpa) -> bool:
        """Send an attention graph to the helper process; False: build it here instead."""
        if not self.executables or not worker_enabled():
            return False
        try:
            builder = shared_builder(self.gpu.index)
        except OSError:
            return False
        self._pending[step] = builder, builder.submit(graph_spec(step))
        return True

    def _collect(self, step: Sdpa, timeout: float | None = 0.0) -> bool:
        """Take the attention plan of `step` if the helper has sent it; whether still pending.

        A plan that cannot be loaded here, or that the helper declined, leaves the step on
        knopt's kernel; if the helper is gone, the plan is built here.
        """
        if step not in self._pending:
            return False
        builder, ticket = self._pending[step]
        found = builder.result(ticket, timeout)
        if found is None:
            return True
        del self._pending[step]
        self.stats.library_plans += 1
        if self.dnn is None:
            from knopt.cuda.dnn import Dnn

            self.dnn = Dnn(self.gpu)
        if isinstance(found, bytes):
            self._library_plans[step] = self.dnn.load_attention(step, found)
        elif found.lost:
            self._library_plans[step] = self.dnn.plan(step)
        else:
            self.dnn.declined[step] = f"{describe_step(step)}: {found.reason}"
            self._library_plans[step] = None
        return False

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
        for builder, ticket in self._pending.values():
            builder.discard(ticket)
        self._pending.clear()
        self.guard.forget()
        for address in (self.weights, self.resident, *(p.address for p in self.pools.values())):
            if address:
                self.gpu.release(address)
        self.weights = self.resident = 0
        self.pools = {name: Pool(self.gpu) for name in POOLS}

    def generations(self) -> tuple[int, ...]:
        """The pools' and resident region's generations (part of a captured graph's key)."""
        return (*(self.pools[name].generation for name in POOLS), self.resident_generation)


def _canonical(step: Gemm | Conv | Sdpa) -> tuple[Gemm | Conv | Sdpa, dict[int, int]]:
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
    if isinstance(step, Sdpa):
        ids = {0: step.q, 1: step.k, 2: step.v, 3: step.out}
        if step.bias is not None:
            ids[4] = step.bias
        bias = 4 if step.bias is not None else None
        sdpa = dataclasses.replace(
            step, q=0, k=1, v=2, out=3, bias=bias, direct=_FALLBACK, fixup=None
        )
        return sdpa, ids
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


@dataclass(frozen=True)
class _Feed:
    """One input of a plan, as `Executable._bind` fills it.

    Attributes:
        buffer: The plan's buffer of the input (bound to a GPU feed's address).
        address: That buffer's own memory, in the input region (numpy feeds are copied there).
        strides: The dense strides, in elements and in bytes (views give either).
    """

    name: str
    buffer: int
    address: int
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    strides: tuple[tuple[int, ...], ...]


class _Place(NamedTuple):
    """Where an output of a plan lies."""

    address: int
    shape: tuple[int, ...]
    dtype: np.dtype


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
            i: self.runtime.library_plan(s, later=True)
            for i, s in enumerate(plan.steps)
            if isinstance(s, Gemm | Conv | Sdpa)
        }
        # Attentions whose cuDNN plan the helper process builds: knopt's kernel meanwhile.
        self._pending = [
            i for i, s in enumerate(plan.steps) if isinstance(s, Sdpa) and self.runtime.pending(s)
        ]
        self._reserve_pools()
        self.runtime.upload_weights(plan)
        self.inputs = self.gpu.allocate(plan.region_bytes.get("input", 0))
        for buffer_id, data in plan.constants.items():
            if plan.buffers[buffer_id].region == "input":
                self.gpu.upload(self.inputs + plan.buffers[buffer_id].offset, data)
        self.feeds = [self._feed(name, tid) for name, tid in plan.inputs]
        self._accepted: dict[str, tuple[Any, ...]] = {}  # each GPU feed's last checked view
        self._places: tuple[tuple[int, ...], list[_Place]] | None = None  # by generations
        self._graphs: OrderedDict[tuple[Binding, tuple[int, ...]], Any] = OrderedDict()
        self._eager: OrderedDict[tuple[Binding, tuple[int, ...]], None] = OrderedDict()
        self._last: tuple[tuple[Binding, tuple[int, ...]], dict[int, int]] | None = None
        self.runtime.executables += 1

    def _reserve_pools(self) -> None:
        """Make the runtime's pools hold this plan's arena, outputs and library workspace."""
        library = [p for p, _ in self.library.values() if p is not None]
        self.workspace_bytes = max([getattr(p, "workspace", 0) for p in library] + [0])
        pools = self.runtime.pools
        generations = self.runtime.generations()
        self.runtime.guard.settle()  # a pool that grows frees the memory results are read from
        pools["workspace"].reserve(self.workspace_bytes)
        pools["arena"].reserve(self.plan.region_bytes.get("arena", 0))
        pools["output"].reserve(self.plan.region_bytes.get("output", 0))
        if self.runtime.generations() != generations:
            self.runtime.guard.forget()  # the results handed out lived in the old pools

    def _take_built_plans(self) -> None:
        """Take the attention plans the helper process has built since the last run.

        A plan taken changes the launch list: the CUDA graphs captured without it are dropped,
        and the next runs run eagerly once and capture again.
        """
        taken = False
        for index in list(self._pending):
            step = self.plan.steps[index]
            assert isinstance(step, Sdpa)
            if self.runtime.pending(step):
                continue
            self._pending.remove(index)
            self.library[index] = self.runtime.library_plan(step)
            taken = taken or self.library[index][0] is not None
        if taken:
            self._reserve_pools()
            for graph in self._graphs.values():
                self.gpu.release_graph(graph)
            self._graphs.clear()
            self._eager.clear()

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
            if isinstance(step, Sdpa):  # cuDNN's zeros where knopt's kernel gives NaN
                after = [step.fixup] if step.fixup is not None and library is not None else []
            else:
                fallback = step.fallback
                fused = library is not None and library.fused
                after = [fallback] if fallback is not None and not fused else []
            if library is None:
                assert isinstance(step, Conv | Sdpa) and step.direct is not None
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
        CUDA graph (then replays it), and later ones replay it. With `device_outputs`, the run
        is queued on the GPU and not waited for (see the module's docstring): the
        `DeviceArray`s returned order their consumers after it.

        Raises:
            InputError: If a feed is missing or of the wrong shape or dtype.
            CudaError: If a CUDA call fails.
        """
        if self._pending:
            self._take_built_plans()
        bound, external = self._bind(feeds)
        self.runtime.guard.begin_run()
        generations = self.runtime.generations()
        key = (tuple(bound.items()), generations)  # in the plan's input order: canonical
        self._last = key, bound
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
            self.gpu.replay(graph)
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
        if external:
            self.gpu.hold(external)
        return self._results(device_outputs, generations)

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

    def _feed(self, name: str, tid: int) -> _Feed:
        tensor = self.plan.tensors[tid]
        dtype = tensor.dtype.numpy
        return _Feed(
            name,
            tensor.buffer,
            self._buffer_address(tensor.buffer),
            tensor.shape,
            dtype,
            tensor.layout.numel * dtype.itemsize,
            (_dense(tensor.shape, 1), _dense(tensor.shape, dtype.itemsize)),
        )

    def _bind(self, feeds: Mapping[str, Any]) -> tuple[dict[int, int], tuple[Any, ...]]:
        """Fill the plan's inputs: (buffers bound to GPU feeds' addresses, the GPU feeds)."""
        bound: dict[int, int] = {}
        external: list[Any] = []
        stream = self.gpu.stream_handle
        for feed in self.feeds:
            if feed.name not in feeds:
                raise InputError(
                    f"input '{feed.name}' is missing (expected "
                    f"{feed.dtype}{format_shape(feed.shape)})"
                )
            value = feeds[feed.name]
            view = _gpu_view(value, feed.name, stream)
            if view is None:
                array = np.asarray(value)
                if array.shape != feed.shape or array.dtype != feed.dtype:
                    raise InputError(
                        f"input '{feed.name}' is {array.dtype}{list(array.shape)}, expected "
                        f"{feed.dtype}{format_shape(feed.shape)}"
                    )
                self.gpu.upload(feed.address, array)
                continue
            address = self._checked(feed, view)
            external.append(value)
            if address % ALIGNMENT == 0:
                bound[feed.buffer] = address
            else:
                self.gpu.copy(feed.address, address, feed.nbytes)
        return bound, tuple(external)

    def _checked(self, feed: _Feed, view: StridedMemoryView) -> int:
        """The address of a GPU feed, once its shape, dtype and strides are found right.

        A decoding loop feeds arrays alike every step: each input's last view found right
        is remembered, and a view like it is not checked again.

        Raises:
            InputError: If the view is of another shape or dtype, or strided.
        """
        seen = (view.shape, view.strides, view.dtype)
        if self._accepted.get(feed.name) != seen:
            shape, strides, dtype = seen
            if tuple(shape) != feed.shape or np.dtype(dtype) != feed.dtype:
                raise InputError(
                    f"input '{feed.name}' is {dtype}{list(shape)}, expected "
                    f"{feed.dtype}{format_shape(feed.shape)}"
                )
            if strides is not None and tuple(strides) not in feed.strides:
                raise InputError(
                    f"input '{feed.name}' is strided {tuple(strides)}; pass a contiguous array"
                )
            self._accepted[feed.name] = seen
        return int(view.ptr)

    def _results(self, device_outputs: bool, generations: tuple[int, ...]) -> list[Any]:
        if self._places is None or self._places[0] != generations:
            places = [
                _Place(
                    self._address(tid, {}),
                    self.plan.tensors[tid].shape,
                    self.plan.tensors[tid].dtype.numpy,
                )
                for _, tid in self.plan.outputs
            ]
            self._places = (generations, places)
        if device_outputs:
            guard = self.runtime.guard
            return [DeviceArray(*place, guard, guard.run) for place in self._places[1]]
        return [self.gpu.download(p.address, np.empty(p.shape, p.dtype)) for p in self._places[1]]

    def describe(self) -> str:
        """The steps, one per line, with what the libraries decided."""
        lines = []
        for index, step in enumerate(self.plan.steps):
            line = describe_step(step)
            if isinstance(step, Gemm | Conv | Sdpa):
                library = self.library[index][0]
                line += (
                    " [fused]"
                    if library is not None and library.fused
                    else (" [direct]" if library is None else " [plain + epilogue kernel]")
                )
                if index in self._pending:
                    line += " (cuDNN's plan on its way)"
            lines.append(line)
        return "\n".join(lines)


def _library_call(
    library: Any, addresses: dict[int, int], workspace: int, stream: int
) -> Callable[[], None]:
    def call() -> None:
        library.enqueue(addresses, workspace, stream)

    return call


def _gpu_view(value: Any, name: str, stream: int) -> StridedMemoryView | None:
    """A view of a GPU array feed, with `stream` ordered after its producer's work; else None.

    Raises:
        InputError: If the producer refuses to be viewed.
    """
    if isinstance(value, _HOST):
        return None
    if not (hasattr(value, "__dlpack__") or hasattr(value, "__cuda_array_interface__")):
        return None
    try:
        view = StridedMemoryView.from_any_interface(value, stream_ptr=stream)
    except Exception as err:  # BufferError, or the producer's own error
        raise InputError(f"input '{name}': cannot view it as a GPU array ({err})") from err
    return view if view.is_device_accessible else None


def _dense(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


__all__ = ["CudaError", "DeviceArray", "Executable", "ResultGuard", "Runtime"]
