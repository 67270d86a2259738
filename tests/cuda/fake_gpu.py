"""A stand-in GPU that records what the executor asks of it, for dry runs without a GPU.

It allocates addresses, keeps uploads, and checks each launch against the kernel's C
signature (the number of arguments, and pointers against scalars of the declared types), so
the runner's and executor's Python paths run on any machine. It logs how its stream is
ordered against others (`stream_log`) and what it holds for queued work. Nothing is
computed: downloads return zeros, DLPack capsules hold zeros. Library plans (cuBLASLt,
cuDNN) are replaced by `FakeLibraryPlan`s.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

_SIGNATURE = re.compile(
    r'extern "C" __global__ void\s+(?:__cluster_dims__\([^)]*\)\s+)?'
    r"(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\("
)
_SCALARS = {
    "int": np.int32,
    "long long": np.int64,
    "float": np.float32,
    "double": np.float64,
}


def signatures(source: str) -> dict[str, list[str]]:
    """Each kernel's parameter declarations in a translation unit, by kernel name."""
    found = {}
    for match in _SIGNATURE.finditer(source):
        depth, start = 1, match.end()
        index = start
        while depth:
            depth += {"(": 1, ")": -1}.get(source[index], 0)
            index += 1
        text = source[start : index - 1]
        found[match.group(1)] = [p.strip() for p in text.split(",") if p.strip()]
    return found


@dataclass
class FakeGpu:
    """Records allocations, uploads, launches and captures."""

    arch: str = "sm_90"
    index: int = 0
    stream_handle: int = 7
    next_address: int = 1 << 20
    live: dict[int, int] = field(default_factory=dict)
    uploads: list[tuple[int, np.ndarray]] = field(default_factory=list)
    launches: list[tuple[str, tuple[int, int, int], list[Any]]] = field(default_factory=list)
    captures: int = 0
    replays: int = 0
    syncs: int = 0
    kernels: dict[str, list[str]] = field(default_factory=dict)
    stream_log: list[tuple[str, int]] = field(default_factory=list)  # (call, stream or address)
    held: list[tuple[Any, ...]] = field(default_factory=list)

    def allocate(self, nbytes: int) -> int:
        address = self.next_address
        self.next_address += -(-max(nbytes, 256) // 4096) * 4096 + 4096
        self.live[address] = nbytes
        return address

    def release(self, address: int) -> None:
        assert address in self.live, f"freeing {address:#x}, which is not allocated"
        del self.live[address]
        self.stream_log.append(("release", address))

    def upload(self, address: int, array: np.ndarray) -> None:
        self._check_inside(address, np.asarray(array).nbytes)
        self.uploads.append((address, np.array(array)))

    def download(self, address: int, array: np.ndarray) -> np.ndarray:
        self._check_inside(address, array.nbytes)
        array[...] = 0
        return array

    def copy(self, target: int, source: int, nbytes: int) -> None:
        self._check_inside(target, nbytes)

    def fill(self, address: int, byte: int, nbytes: int) -> None:
        self._check_inside(address, nbytes)

    def load(self, cubin: bytes, names: Sequence[str]) -> dict[str, Any]:
        return {name: name for name in names}

    def allow_shared(self, kernel: Any, nbytes: int) -> None:
        assert nbytes <= 227 * 1024

    def launch(
        self,
        kernel: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        args: Sequence[Any],
    ) -> None:
        params = self.kernels[kernel]
        assert len(params) == len(args), f"{kernel}: {len(args)} arguments for {params}"
        for param, arg in zip(params, args, strict=True):
            if "*" in param:
                assert isinstance(arg, int | np.uint64), f"{kernel}: {param} <- {arg!r}"
                assert int(arg) == 0 or self._inside(int(arg)), f"{kernel}: {param} <- {arg:#x}"
            else:
                kind = _SCALARS[param.removeprefix("const ").rsplit(" ", 1)[0]]
                assert isinstance(arg, kind), f"{kernel}: {param} <- {arg!r}"
        assert all(g >= 1 for g in grid), f"{kernel}: grid {grid}"
        self.launches.append((kernel, grid, list(args)))

    def sync(self) -> None:
        self.syncs += 1
        self.held.clear()
        self.stream_log.append(("sync", self.stream_handle))

    def wait_for(self, stream: int) -> None:
        if stream != self.stream_handle:
            self.stream_log.append(("wait_for", stream))

    def make_wait(self, stream: int) -> None:
        if stream != self.stream_handle:
            self.stream_log.append(("make_wait", stream))

    def hold(self, objects: tuple[Any, ...]) -> None:
        self.held.append(objects)

    def dlpack(self, address: int, shape: tuple[int, ...], dtype: np.dtype, versioned: bool) -> Any:
        self._check_inside(address, int(np.prod(shape)) * dtype.itemsize)
        return np.zeros(shape, dtype).__dlpack__(max_version=(1, 0) if versioned else None)

    def begin_capture(self) -> None:
        pass

    def end_capture(self) -> Any:
        self.captures += 1
        return object()

    def abort_capture(self) -> None:
        pass

    def replay(self, executable: Any) -> None:
        self.replays += 1
        self.stream_log.append(("replay", self.stream_handle))

    def release_graph(self, executable: Any) -> None:
        pass

    def device_array(self, array: np.ndarray) -> FakeDeviceArray:
        """`array` as another library's GPU array comes (DLPack, on device 0), in place."""
        self.live[array.ctypes.data] = max(array.nbytes, 1)
        return FakeDeviceArray(array)

    def _inside(self, address: int) -> bool:
        return any(start <= address < start + max(n, 1) for start, n in self.live.items())

    def _check_inside(self, address: int, nbytes: int) -> None:
        if nbytes:
            assert any(
                start <= address and address + nbytes <= start + max(n, 256)
                for start, n in self.live.items()
            ), f"{nbytes} bytes at {address:#x} are outside every allocation"


@dataclass(eq=False)
class FakeDeviceArray:
    """A host array that says it is on the GPU, as a torch CUDA tensor does through DLPack.

    Attributes:
        streams: The consumer streams it was asked for (its producer orders each after it).
    """

    array: np.ndarray
    streams: list[int | None] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        self.streams.append(stream)
        return self.array.__dlpack__(max_version=max_version)


@dataclass
class FakeLibraryPlan:
    """What Blas.plan and Dnn.plan return: always fused, no workspace."""

    step: Any
    fused: bool = True
    workspace: int = 0

    def enqueue(self, addresses: Any, workspace: int, stream: int) -> None:
        pass


class _FakeLibrary:
    def __init__(self, gpu: Any = None) -> None:
        self.plans: list[Any] = []

    def plan(self, step: Any) -> FakeLibraryPlan:
        self.plans.append(step)
        return FakeLibraryPlan(step)


@contextmanager
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    """Patch the CUDA backend to run on a FakeGpu (NVRTC output is read for signatures only)."""
    import knopt.cuda
    from knopt.cuda import executor, nvrtc, runner

    gpu = FakeGpu()

    def compile_cubin(source: str, arch: str, name: str = "knopt.cu") -> bytes:
        gpu.kernels.update(signatures(source))
        nvrtc.stats.compiles += 1
        return b"\x7fELF"

    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)
    monkeypatch.setattr(knopt.cuda, "is_available", lambda: True)
    monkeypatch.setattr(executor, "Gpu", lambda: gpu)
    monkeypatch.setattr(runner, "Gpu", lambda: gpu)
    for module, cls in (("knopt.cuda.blas", "Blas"), ("knopt.cuda.dnn", "Dnn")):
        fake = types.ModuleType(module)
        setattr(fake, cls, _FakeLibrary)
        monkeypatch.setitem(sys.modules, module, fake)
    yield gpu
