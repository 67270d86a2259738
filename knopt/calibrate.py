"""`calibrate`: measure a device profile for the cost model on this machine.

Each rate is measured through knopt's own executor for the device (numpy on "cpu", the
generated CUDA program on "cuda"), so the profile describes what knopt's kernels achieve here,
not a datasheet:

- bandwidth: an f32 Add over arrays far larger than the caches (bytes read plus written);
- peak f32 / f64 / f16: a square MatMul, 2*n^3 FLOPs;
- launch: the extra time per op of a chain of 65 tiny ops over a chain of 1.

The integer peak is not measured (no integer MatMul runs on every device); it is kept from the
built-in profile the calibration starts from, and the result says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.errors import KnoptError
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.op import Unary
from knopt.opt.cost import CPU, H200_GRAPH, DeviceProfile
from knopt.session import Session

_CHAIN = 65


@dataclass(frozen=True)
class _Sizes:
    """Problem sizes for one device: elements for bandwidth, n for each MatMul."""

    elements: int
    matmul: Mapping[str, int]
    trials: int


_SIZES = {
    ("cpu", False): _Sizes(1 << 23, {"f32": 1024, "f64": 1024, "f16": 256}, 5),
    ("cpu", True): _Sizes(1 << 21, {"f32": 512, "f64": 512, "f16": 128}, 3),
    ("cuda", False): _Sizes(1 << 26, {"f32": 4096, "f64": 4096, "f16": 8192}, 7),
    ("cuda", True): _Sizes(1 << 24, {"f32": 2048, "f64": 2048, "f16": 4096}, 3),
}
_NUMPY = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
_DTYPE = {"f32": DType.F32, "f64": DType.F64, "f16": DType.F16}


@dataclass(frozen=True)
class Calibration:
    """A measured profile, with what each figure came from.

    Attributes:
        profile: The profile to give `optimize` (or save with `profile.to_json()`).
        base: The built-in profile that unmeasured fields were kept from.
        notes: One line per figure: what was run and what it gave.
    """

    profile: DeviceProfile
    base: DeviceProfile
    notes: list[str]


def calibrate(
    device: str = "cpu",
    *,
    name: str | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Measure bandwidth, peak FLOP/s and launch cost on `device` ("cpu" or "cuda").

    Args:
        device: Where to measure: "cpu" (the numpy executor) or "cuda" (the GPU backend).
        name: The profile's name (default: "<device>-calibrated").
        quick: Smaller problems and fewer trials (a few seconds; rougher figures).
        progress: Called with a line as each figure is measured.

    Raises:
        KnoptError: If the device is unknown or not usable.
    """
    if device not in ("cpu", "cuda"):
        raise KnoptError(f"cannot calibrate device '{device}': use 'cpu' or 'cuda'")
    sizes = _SIZES[device, quick]
    base = CPU if device == "cpu" else H200_GRAPH
    timer = _Timer(device, sizes.trials)
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        if progress is not None:
            progress(line)

    n = sizes.elements
    feeds = {"a": _random((n,), np.float32, 1), "b": _random((n,), np.float32, 2)}
    seconds = timer.time(_add_graph(n), feeds)
    bandwidth = 3 * n * 4 / seconds
    note(f"bandwidth: Add of {n} f32 in {seconds * 1e3:.3f} ms -> {bandwidth / 1e9:.1f} GB/s")
    peak = {"int": base.peak["int"]}
    for kind, size in sizes.matmul.items():
        dtype = _NUMPY[kind]
        feeds = {"a": _random((size, size), dtype, 3), "b": _random((size, size), dtype, 4)}
        seconds = timer.time(_matmul_graph(size, _DTYPE[kind]), feeds)
        peak[kind] = 2 * size**3 / seconds
        note(
            f"peak {kind}: MatMul {size}x{size}x{size} in {seconds * 1e3:.3f} ms -> "
            f"{peak[kind] / 1e9:.1f} GFLOP/s"
        )
    note(f"peak int: not measured, kept from '{base.name}' ({base.peak['int'] / 1e9:.1f} GIOP/s)")
    x = {"x": _random((1,), np.float32, 5)}
    one = timer.time(_chain_graph(1), x)
    many = timer.time(_chain_graph(_CHAIN), x)
    launch = max((many - one) / (_CHAIN - 1), 1e-9)
    note(
        f"launch: {_CHAIN} tiny ops in {many * 1e6:.1f} us, 1 in {one * 1e6:.1f} us -> "
        f"{launch * 1e6:.2f} us per op"
    )
    profile = DeviceProfile(
        name or f"{device}-calibrated",
        bandwidth=bandwidth,
        peak=peak,
        launch=launch,
        symbol_size=base.symbol_size,
        per_op_launch=base.per_op_launch,
    )
    return Calibration(profile, base, notes)


class _Timer:
    """Times graphs on one device: the best over trials of the mean over a batch of runs."""

    def __init__(self, device: str, trials: int) -> None:
        self.device = device
        self.trials = trials
        self._gpu: Any = None
        if device == "cuda":
            import knopt.cuda

            if not knopt.cuda.is_available():
                raise KnoptError(
                    "cannot calibrate 'cuda': no usable NVIDIA GPU or the CUDA packages are "
                    "missing (pip install knopt[cuda])"
                )
            from knopt.cuda.driver import Gpu

            self._gpu = Gpu()

    def time(self, graph: Graph, feeds: dict[str, np.ndarray]) -> float:
        """Seconds per run of `graph` on `feeds` (inputs already on the device)."""
        session = Session(graph, self.device, optimize=False)
        inputs = feeds if self._gpu is None else {k: self._upload(v) for k, v in feeds.items()}

        def run() -> Any:
            return session.run(None, inputs, device_outputs=self._gpu is not None)

        finish = _finisher(run())  # the first run compiles (cuda) and warms caches
        runs = 1
        start = time.perf_counter()
        while time.perf_counter() - start < 0.05 and runs < 1000:
            finish(run())
            runs += 1
        batch = max(1, runs // 2)
        best = float("inf")
        for _ in range(self.trials):
            began = time.perf_counter()
            for _ in range(batch - 1):
                run()
            finish(run())
            best = min(best, (time.perf_counter() - began) / batch)
        return best

    def _upload(self, array: np.ndarray) -> Any:
        from knopt.cuda.executor import DeviceArray

        gpu = self._gpu
        address = gpu.allocate(array.nbytes)
        gpu.upload(address, array)
        gpu.sync()
        return DeviceArray(address, array.shape, array.dtype, gpu.stream_handle, gpu)


def _finisher(outputs: list[Any]) -> Callable[[list[Any]], None]:
    """How to wait for a run's work: GPU results wait on their stream; host ones are done."""
    gpu = getattr(outputs[0], "gpu", None)

    def finish(results: list[Any]) -> None:
        if gpu is not None:
            gpu.sync()

    return finish


def _random(shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.5, 1.5, shape).astype(dtype)


def _add_graph(n: int) -> Graph:
    g = GraphBuilder("calibrate-bandwidth")
    g.output(g.add(g.input("a", (n,), DType.F32), g.input("b", (n,), DType.F32)), "y")
    return g.build()


def _matmul_graph(n: int, dtype: DType) -> Graph:
    g = GraphBuilder("calibrate-matmul")
    g.output(g.matmul(g.input("a", (n, n), dtype), g.input("b", (n, n), dtype)), "y")
    return g.build()


def _chain_graph(length: int) -> Graph:
    g = GraphBuilder("calibrate-launch")
    value = g.input("x", (1,), DType.F32)
    for _ in range(length):
        value = g.unary(Unary.NEG, value)
    g.output(value, "y")
    return g.build()


__all__ = ["Calibration", "calibrate"]
