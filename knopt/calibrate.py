"""`calibrate`: measure a device profile for the cost model on this machine.

Each figure is measured through knopt's own executor for the device (numpy on "cpu", the
generated CUDA program on "cuda"), so the profile describes what knopt's kernels achieve here,
not a datasheet.

On "cpu": bandwidth from an f32 Add over arrays far larger than the caches (bytes read plus
written), peak f32 / f64 / f16 from a square MatMul each (2*n^3 FLOPs), and launch as the extra
time per op of a chain of 65 tiny ops over a chain of 1.

On "cuda" every time is device time between CUDA events around replays of the captured graph:
bandwidth from the Add, launch from the chains (so it is the cost of a kernel inside a CUDA
graph), and each peak fitted to library kernels at several shapes, the GEMMs of transformers
at batch 1 and 32 and large square ones (cuBLASLt; 3xTF32 in f32 where `KNOPT_SPLIT_F32` opts in)
and two chained ResNet convolutions (cuDNN, channels last in f16): the peak whose roofline
`launch + max(bytes / bandwidth, flops / peak)` best predicts those times (least squares of
the log ratio), so extraction's estimates track what the device does at the sizes models use.

The integer peak is not measured (no integer MatMul runs on every device); it is kept from the
built-in profile the calibration starts from, and the result says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from knopt.errors import KnoptError
from knopt.ir.builder import GraphBuilder
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph
from knopt.ir.op import Unary
from knopt.ir.program import program_from_graph
from knopt.opt.cost import CPU, H200_GRAPH, DeviceProfile
from knopt.session import Session

_CHAIN = 65
_NUMPY = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
_DTYPE = {"f32": DType.F32, "f64": DType.F64, "f16": DType.F16}


@dataclass(frozen=True)
class _Sizes:
    """Problem sizes for one device: elements for bandwidth, n for each MatMul."""

    elements: int
    matmul: Mapping[str, int]
    trials: int


_SIZES = {
    ("cpu", False): _Sizes(1 << 23, {"f32": 1024, "f64": 1024, "f16": 256}, 5),
    ("cpu", True): _Sizes(1 << 21, {"f32": 512, "f64": 512, "f16": 128}, 3),
    ("cuda", False): _Sizes(1 << 26, {"f64": 2048}, 5),
    ("cuda", True): _Sizes(1 << 24, {"f64": 1024}, 3),
}
# (m, n, k) of the GEMMs a peak is fitted to: BERT-base's and a 1B LLaMA's projections at
# sequence 128 for batch 1 and 32, and square ones; quick runs keep the first four.
GEMM_SHAPES = (
    (128, 768, 768),
    (128, 3072, 768),
    (4096, 768, 768),
    (2048, 2048, 2048),
    (4096, 3072, 768),
    (4096, 768, 3072),
    (128, 8192, 2048),
    (4096, 8192, 2048),
    (4096, 4096, 4096),
)
# (batch, channels, size) of two chained 3x3 convolutions: ResNet-50's first stage.
CONV_SHAPES = ((1, 64, 56), (32, 64, 56))


@dataclass(frozen=True)
class Sample:
    """One measured kernel (or program): what ran, its work and its time.

    Attributes:
        kind: The peak it informs ("f32", "f16", "f64"), or "" for bandwidth and launch.
        seconds: Device time of one run, launch included.
    """

    what: str
    kind: str
    flops: float
    bytes: float
    seconds: float


@dataclass(frozen=True)
class Calibration:
    """A measured profile, with what each figure came from.

    Attributes:
        profile: The profile to give `optimize` (or save with `profile.to_json()`).
        base: The built-in profile that unmeasured fields were kept from.
        notes: One line per figure: what was run and what it gave.
        samples: The measurements the figures come from.
    """

    profile: DeviceProfile
    base: DeviceProfile
    notes: list[str]
    samples: list[Sample]

    def to_json(self) -> dict[str, Any]:
        """The profile file: the profile, and the samples it was fitted to."""
        return {**self.profile.to_json(), "samples": [asdict(s) for s in self.samples]}


def fit_peak(samples: Sequence[Sample], bandwidth: float, launch: float) -> float:
    """The peak FLOP/s whose roofline best predicts the samples' times.

    Minimizes the sum of squared log ratios of predicted to measured time over a log grid
    from half the slowest sample's rate to four times the fastest's.
    """
    rates = [s.flops / s.seconds for s in samples]
    low, high = min(rates) / 2, max(rates) * 4
    best, best_error = high, math.inf
    for step in range(481):
        peak = low * (high / low) ** (step / 480)
        error = sum(
            math.log((launch + max(s.bytes / bandwidth, s.flops / peak)) / s.seconds) ** 2
            for s in samples
        )
        if error < best_error:
            best, best_error = peak, error
    return best


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
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        if progress is not None:
            progress(line)

    sizes = _SIZES[device, quick]
    if device == "cpu":
        base, (bandwidth, peak, launch, samples) = CPU, _measure_cpu(sizes, note)
    else:
        base, (bandwidth, peak, launch, samples) = H200_GRAPH, _measure_cuda(sizes, quick, note)
    # The integer rates are not measured: kept from the base profile, with its 8-bit product
    # rates ("i8", "i8-varying"), which would otherwise fall back to the plain integer rate.
    peak.update({kind: rate for kind, rate in base.peak.items() if kind not in peak})
    note(f"peak int: not measured, kept from '{base.name}' ({base.peak['int'] / 1e9:.1f} GIOP/s)")
    profile = DeviceProfile(
        name or f"{device}-calibrated",
        bandwidth=bandwidth,
        peak=peak,
        launch=launch,
        symbol_size=base.symbol_size,
        per_op_launch=base.per_op_launch,
    )
    return Calibration(profile, base, notes, samples)


Measured = tuple[float, dict[str, float], float, list[Sample]]


def _measure_cpu(sizes: _Sizes, note: Callable[[str], None]) -> Measured:
    timer = _HostTimer(sizes.trials)
    n = sizes.elements
    feeds = {"a": _random((n,), np.float32, 1), "b": _random((n,), np.float32, 2)}
    seconds = timer.time(_add_graph(n), feeds)
    bandwidth = 3 * n * 4 / seconds
    samples = [Sample(f"add {n} f32", "", n, 3 * n * 4, seconds)]
    note(f"bandwidth: Add of {n} f32 in {seconds * 1e3:.3f} ms -> {bandwidth / 1e9:.1f} GB/s")
    peak = {}
    for kind, size in sizes.matmul.items():
        dtype = _NUMPY[kind]
        feeds = {"a": _random((size, size), dtype, 3), "b": _random((size, size), dtype, 4)}
        seconds = timer.time(_matmul_graph(size, _DTYPE[kind]), feeds)
        peak[kind] = 2 * size**3 / seconds
        item = np.dtype(dtype).itemsize
        samples.append(Sample(f"matmul {size}^3", kind, 2 * size**3, 3 * size**2 * item, seconds))
        note(
            f"peak {kind}: MatMul {size}x{size}x{size} in {seconds * 1e3:.3f} ms -> "
            f"{peak[kind] / 1e9:.1f} GFLOP/s"
        )
    x = {"x": _random((1,), np.float32, 5)}
    one = timer.time(_chain_graph(1), x)
    many = timer.time(_chain_graph(_CHAIN), x)
    launch = max((many - one) / (_CHAIN - 1), 1e-9)
    note(
        f"launch: {_CHAIN} tiny ops in {many * 1e6:.1f} us, 1 in {one * 1e6:.1f} us -> "
        f"{launch * 1e6:.2f} us per op"
    )
    return bandwidth, peak, launch, samples


def _measure_cuda(sizes: _Sizes, quick: bool, note: Callable[[str], None]) -> Measured:
    timer = _GpuTimer(sizes.trials)
    x = {"x": _random((1,), np.float32, 5)}
    one = timer.time(_chain_graph(1), x)
    many = timer.time(_chain_graph(_CHAIN), x)
    launch = max((many - one) / (_CHAIN - 1), 1e-9)
    overhead = max(one - launch, 0.0)  # a graph replay's own cost, beyond its kernels
    note(
        f"launch: {_CHAIN} tiny kernels in {many * 1e6:.1f} us, 1 in {one * 1e6:.1f} us of "
        f"graph replay -> {launch * 1e6:.2f} us per kernel"
    )
    n = sizes.elements
    feeds = {"a": _random((n,), np.float32, 1), "b": _random((n,), np.float32, 2)}
    seconds = timer.time(_add_graph(n), feeds) - overhead
    bandwidth = 3 * n * 4 / seconds
    samples = [Sample(f"add {n} f32", "", n, 3 * n * 4, seconds)]
    note(f"bandwidth: Add of {n} f32 in {seconds * 1e3:.3f} ms -> {bandwidth / 1e9:.1f} GB/s")

    def measure(
        what: str, kind: str, flops: float, nbytes: float, graph: Graph, feeds: Any
    ) -> None:
        seconds = max(timer.time(graph, feeds) - overhead, launch)
        samples.append(Sample(what, kind, flops, nbytes, seconds))
        note(f"{what}: {seconds * 1e6:.1f} us -> {flops / seconds / 1e12:.1f} TFLOP/s")

    for kind in ("f32", "f16"):
        item = _DTYPE[kind].itemsize
        for m, n, k in GEMM_SHAPES[:4] if quick else GEMM_SHAPES:
            a = {"x": _random((m, k), _NUMPY[kind], 3)}
            graph = _gemm_graph(m, n, k, _DTYPE[kind])
            measure(
                f"gemm {kind} {m}x{n}x{k}",
                kind,
                2 * m * n * k,
                (m * k + k * n + m * n) * item,
                graph,
                a,
            )
        for batch, channels, size in CONV_SHAPES[:1] if quick else CONV_SHAPES:
            flops = 2 * 2 * batch * channels * channels * 9 * size * size
            nbytes = (3 * batch * channels * size * size + 2 * channels * channels * 9) * item
            a = {"x": _random((batch, channels, size, size), _NUMPY[kind], 4)}
            graph = _conv_graph(batch, channels, size, _DTYPE[kind])
            measure(
                f"2 convs {kind} {batch}x{channels}x{size}x{size} 3x3",
                kind,
                flops,
                nbytes,
                graph,
                a,
            )
    for kind, size in sizes.matmul.items():
        a = {"x": _random((size, size), _NUMPY[kind], 3)}
        item = _DTYPE[kind].itemsize
        graph = _gemm_graph(size, size, size, _DTYPE[kind])
        measure(f"gemm {kind} {size}^3", kind, 2 * size**3, 3 * size**2 * item, graph, a)
    peak = {}
    for kind in ("f32", "f16", "f64"):
        fitted = [s for s in samples if s.kind == kind]
        peak[kind] = fit_peak(fitted, bandwidth, launch)
        note(f"peak {kind}: fitted to {len(fitted)} kernels -> {peak[kind] / 1e12:.1f} TFLOP/s")
    return bandwidth, peak, launch, samples


class _HostTimer:
    """Times graphs on the CPU: the best over trials of the mean over a batch of runs."""

    def __init__(self, trials: int) -> None:
        self.trials = trials

    def time(self, graph: Graph, feeds: dict[str, np.ndarray]) -> float:
        """Seconds per run of `graph` on `feeds`."""
        session = Session(graph, "cpu", optimize=False)
        session.run(None, feeds)  # warms caches
        runs = 1
        start = time.perf_counter()
        while time.perf_counter() - start < 0.05 and runs < 1000:
            session.run(None, feeds)
            runs += 1
        batch = max(1, runs // 2)
        best = float("inf")
        for _ in range(self.trials):
            began = time.perf_counter()
            for _ in range(batch):
                session.run(None, feeds)
            best = min(best, (time.perf_counter() - began) / batch)
        return best


class _GpuTimer:
    """Times graphs on the GPU: device time of replays of the captured program, best of trials.

    Raises:
        KnoptError: If there is no usable GPU.
    """

    TRIAL_SECONDS = 2e-3

    def __init__(self, trials: int) -> None:
        import knopt.cuda

        if not knopt.cuda.is_available():
            raise KnoptError(
                "cannot calibrate 'cuda': no usable NVIDIA GPU or the CUDA packages are "
                "missing (pip install knopt[cuda])"
            )
        from knopt.cuda.driver import Gpu

        self.trials = trials
        self.gpu = Gpu()

    def time(self, graph: Graph, feeds: dict[str, np.ndarray]) -> float:
        """Seconds of device time per replay of `graph`'s program (not optimized)."""
        from knopt.cuda.executor import Executable
        from knopt.cuda.planner import build_plan

        executable = Executable(build_plan(program_from_graph(graph)), self.gpu)
        executable.run(feeds, device_outputs=True)  # eager; the first replay captures
        gpu = self.gpu

        def replays(count: int) -> float:
            start = gpu.event()
            for _ in range(count):
                executable.replay()
            return gpu.elapsed_ms(start, gpu.event()) / 1e3 / count

        replays(3)  # warm: uploads, clocks
        count = max(1, min(1000, math.ceil(self.TRIAL_SECONDS / replays(1))))
        return min(replays(count) for _ in range(self.trials))


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


def _gemm_graph(m: int, n: int, k: int, dtype: DType) -> Graph:
    """`x @ w` with `w` a constant, as a model's projection is (scaled to keep sums near 1)."""
    g = GraphBuilder("calibrate-gemm")
    w = _random((k, n), dtype.numpy, 6) / k
    g.output(g.matmul(g.input("x", (m, k), dtype), g.constant(w)), "y")
    return g.build()


def _conv_graph(batch: int, channels: int, size: int, dtype: DType) -> Graph:
    """Two 3x3 convolutions, one after the other, as in a ResNet stage."""
    g = GraphBuilder("calibrate-conv")
    y = g.input("x", (batch, channels, size, size), dtype)
    for seed in (7, 8):
        w = _random((channels, channels, 3, 3), dtype.numpy, seed) / (channels * 9)
        y = g.conv(y, g.constant(w), strides=(1, 1), pads=((1, 1), (1, 1)), dilations=(1, 1))
    g.output(y, "y")
    return g.build()


def _chain_graph(length: int) -> Graph:
    g = GraphBuilder("calibrate-launch")
    value = g.input("x", (1,), DType.F32)
    for _ in range(length):
        value = g.unary(Unary.NEG, value)
    g.output(value, "y")
    return g.build()


__all__ = ["GEMM_SHAPES", "Calibration", "Sample", "calibrate", "fit_peak"]
