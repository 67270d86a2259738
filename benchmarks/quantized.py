"""Quantized matrix products on the GPU: knopt's int8 GEMM and W4A16 kernels against cuBLAS fp16.

    python benchmarks/quantized.py                 # table and a RESULTS.md entry on stdout
    python benchmarks/quantized.py --quick         # fewer sizes and rounds (a smoke run)
    python benchmarks/quantized.py --json out.json --record
    python benchmarks/quantized.py --w4a16-only    # W4A16 only: every kernel variant, M 1..1024

In one process, on one stream, interleaved round by round, timed with CUDA events:

* int8 GEMM, M = N = K from 1024 to 8192: knopt's cuBLASLt IMMA plan (int32 out), the same
  followed by knopt's requantizing epilogue (uint8 out), torch's `_int_mm`, and torch.matmul in
  fp16 (cuBLAS). TOPS count 2 M N K operations.
* W4A16, M = 1, 16, 128 and N = K = 4096 (blocks of 128, with zero points): knopt's kernels
  (as its rule picks them) against torch.nn.functional.linear in fp16 with the same weight
  dequantized. TFLOP/s count 2 M N K; GB/s count the bytes of the packed weight, scales and
  zero points. `--w4a16-only` times M from 1 to 1024, every GEMV (mma and stream) and GEMM
  configuration and the dequantize + cuBLASLt route beside the rule's choice, and M = 1 "cold"
  too, the rule's choice, the default stream GEMV and the stream candidates (each launch reads
  another copy of the weights, so that they come from HBM, not L2).

Each timing is the median over rounds of the CUDA-event time of a CUDA graph of `inner`
launches, divided by `inner` (graphs keep Python's launch overhead out of microsecond kernels).
knopt's launches keep programmatic dependent launch, as in its programs: the rule's stream GEMV
at M = 1 loads its weight while the launch ahead of it finishes (StreamConfig.early), so back to
back its loads overlap the one before; `KNOPT_PDL=0` times every launch after the last has
finished, and `--ms 1` with it narrows a run to that row.
Every product is checked against torch before it is timed. Targets (issue #14): int8 GEMM
>= 1.6x fp16 throughput at 4096^3 and above; W4A16 at M = 1 >= 2.5x faster than fp16.
Then a whole model (benchmarks/quantized_bert.py, skipped with --no-models): BERT-base at
batch 32 quantized by onnxruntime, through knopt, against knopt's and torch.compile's fp16 runs
of the float model (target: faster than knopt's fp16). Needs a CUDA GPU, torch, nvmath-python,
cuda-python, and for the model transformers and onnxruntime.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import platform
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.quantized_bert import bert_row, model_lines  # noqa: E402
from knopt.cuda import nvrtc  # noqa: E402
from knopt.cuda.blas import Blas  # noqa: E402
from knopt.cuda.driver import Gpu  # noqa: E402
from knopt.cuda.int8_epilogue import EpilogueArgs, Int8Epilogue  # noqa: E402
from knopt.cuda.intgemm import GemmOutput, IntGemmPlan, supported_outputs  # noqa: E402
from knopt.cuda.w4a16 import (  # noqa: E402
    DEFAULT_GEMM,
    DEFAULT_GEMV,
    DEFAULT_STREAM,
    GEMM_BMS,
    GEMV_MAX_M,
    STREAM_CANDIDATES,
    STREAM_MAX_M,
    W4A16,
    GemvConfig,
    KernelConfig,
    Route,
    StreamConfig,
    W4A16Operands,
    W4A16Plan,
)
from knopt.errors import KnoptError  # noqa: E402
from knopt.ir.dtype import DType  # noqa: E402

DATE = datetime.date.today().isoformat()
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Quantized matrix products"
TARGET_MS = 2.0  # each timed batch of launches lasts about this long
MAX_W4_ERROR = 1e-3  # relative to fp32 F.linear with the fp16 weight (rounding gives ~2e-4)
W4_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # --w4a16-only


@dataclass
class Row:
    """One configuration: times by method (ms a launch), and the work it does."""

    kind: str
    size: str
    ops: float  # 2 M N K
    times: dict[str, list[float]] = field(default_factory=dict)
    weight_bytes: int = 0  # packed int4 weight, scales and zero points
    fp16_bytes: int = 0  # the same weight in fp16
    error: dict[str, float] = field(default_factory=dict)
    chosen: str = ""  # W4A16: the kernel (or route) knopt's rule picks

    def median(self, method: str) -> float:
        """Median milliseconds a launch of `method`."""
        return statistics.median(self.times[method])


class Bench:
    """knopt's GPU, its stream shared with torch, and timing by CUDA events on it."""

    def __init__(self) -> None:
        self.gpu = Gpu()
        self.stream = torch.cuda.ExternalStream(self.gpu.stream_handle)
        self.sm_count = int(self.gpu.device.properties.multiprocessor_count)
        self.l2_bytes = int(self.gpu.device.properties.l2_cache_size)
        self.blas = Blas()
        self._graphs: list[Any] = []
        self._torch_graphs: list[torch.cuda.CUDAGraph] = []

    def batch_ms(self, run: Callable[[], Any], inner: int) -> float:
        """Milliseconds a launch over `inner` back-to-back launches."""
        with torch.cuda.stream(self.stream):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            for _ in range(inner):
                run()
            end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end) / inner

    def inner_for(self, run: Callable[[], Any]) -> int:
        """Launches a graph needs to last about TARGET_MS (after a warm-up)."""
        for _ in range(3):
            self.batch_ms(run, 1)
        once = max(self.batch_ms(run, 5), 1e-3)  # an upper bound: Python launches included
        return max(5, min(2000, int(TARGET_MS / once)))

    def capture(self, run: Callable[[], Any], inner: int, knopt: bool) -> Callable[[], Any]:
        """`inner` launches of `run` as one CUDA graph; returns what replays it.

        A graph keeps the host out of the measurement: a 3-microsecond kernel launched from
        Python would otherwise be timed at the launch rate of the interpreter.
        """
        if knopt:
            self.gpu.begin_capture()
            try:
                for _ in range(inner):
                    run()
            except BaseException:
                self.gpu.abort_capture()
                raise
            executable = self.gpu.end_capture()
            self._graphs.append(executable)
            return partial(self.gpu.replay, executable)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                run()
        self._torch_graphs.append(graph)
        return graph.replay

    def measure(self, row: Row, methods: Mapping[str, Callable[[], Any]], rounds: int) -> None:
        """Interleaved rounds: every method's graph once a round, times kept in `row`.

        Methods whose name starts with "knopt" launch on knopt's stream and are captured by it;
        the others by torch.
        """
        inner, replays = {}, {}
        for name, run in methods.items():
            with _blame(name, row):
                inner[name] = self.inner_for(run)
        torch.cuda.synchronize()
        for name, run in methods.items():
            with _blame(name, row):
                replays[name] = self.capture(run, inner[name], name.startswith("knopt"))
        for _ in range(rounds):
            for name, replay in replays.items():
                with _blame(name, row):  # each batch ends synchronized: a fault shows here
                    row.times.setdefault(name, []).append(self.batch_ms(replay, 1) / inner[name])
        torch.cuda.synchronize()
        for executable in self._graphs:
            self.gpu.release_graph(executable)
        self._graphs.clear()
        self._torch_graphs.clear()


@contextlib.contextmanager
def _blame(method: str, row: Row) -> Iterator[None]:
    """Name `method` when its work raises, then let the error go on.

    A device fault (an illegal address) leaves the CUDA context unusable, so nothing after it
    can run in this process: the rows measured so far are already printed.
    """
    try:
        yield
    except Exception:
        print(f"  FAILED: {method} at {row.kind} {row.size}", flush=True)
        raise


def _rel_error(mine: torch.Tensor, theirs: torch.Tensor) -> float:
    a, b = mine.double(), theirs.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def int8_rows(bench: Bench, sizes: list[int], rounds: int) -> list[Row]:
    """int8 GEMM (knopt cuBLASLt IMMA, + epilogue, torch._int_mm) against fp16 torch.matmul."""
    epilogue = Int8Epilogue(DType.U8)
    cubin = nvrtc.compile_cubin(epilogue.source(), bench.gpu.arch)
    kernel = bench.gpu.load(cubin, [epilogue.name])[epilogue.name]
    rows = []
    for s in sizes:
        gen = torch.Generator(device="cuda").manual_seed(s)
        a = torch.randint(-128, 128, (s, s), dtype=torch.int8, device="cuda", generator=gen)
        w = torch.randint(-128, 128, (s, s), dtype=torch.int8, device="cuda", generator=gen)
        a16, w16 = a.half() / 64, w.half() / 64
        plan = IntGemmPlan(bench.blas.handle, s, s, s, GemmOutput.I32)
        d = torch.empty((s, s), dtype=torch.int32, device="cuda")
        y = torch.empty((s, s), dtype=torch.uint8, device="cuda")
        workspace = torch.empty(max(plan.workspace, 1), dtype=torch.uint8, device="cuda")
        multiplier = torch.full((s,), 1e-3, dtype=torch.float32, device="cuda")
        args = EpilogueArgs(acc=d.data_ptr(), y=y.data_ptr(), col_scale=multiplier.data_ptr())
        torch.cuda.synchronize()  # made on torch's default stream, used on knopt's

        def knopt_gemm(plan=plan, a=a, w=w, d=d, workspace=workspace) -> None:
            plan.enqueue(
                a.data_ptr(),
                w.data_ptr(),
                d.data_ptr(),
                workspace.data_ptr(),
                bench.gpu.stream_handle,
            )

        def knopt_requant(args=args, gemm=knopt_gemm, s=s) -> None:
            gemm()
            epilogue.launch(bench.gpu, kernel, args, (s, s), bench.sm_count)

        row = Row("int8 GEMM", f"{s}^3", 2.0 * s**3)
        with torch.cuda.stream(bench.stream):
            knopt_gemm()
            exact = torch._int_mm(a, w.t())
            bench.stream.synchronize()
            row.error["knopt int8"] = float((d != exact).sum())
        methods: dict[str, Callable[[], Any]] = {
            "knopt int8": knopt_gemm,
            "knopt int8+requant": knopt_requant,
            "torch _int_mm": partial(torch._int_mm, a, w.t()),
            "torch fp16": partial(torch.matmul, a16, w16.t()),
        }
        bench.measure(row, methods, rounds)
        rows.append(row)
        plan.close()
        print("\n".join(row_lines(row)), flush=True)
    return rows


@dataclass
class W4Weight:
    """One random int4 weight on the device, and the same weight dequantized to fp16."""

    b: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    w16: torch.Tensor
    block: int

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight, scales and zero points."""
        return self.b.numel() + self.scales.numel() * 2 + self.zeros.numel()


def _w4_weight(n: int, k: int, block: int, seed: int) -> W4Weight:
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    b_np = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    s_np = rng.uniform(0.005, 0.05, (n, blocks)).astype(np.float16)
    z_np = rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8)
    b, scales, zeros = (torch.from_numpy(x).cuda() for x in (b_np, s_np, z_np))
    codes = torch.stack([b & 15, b >> 4], dim=-1).reshape(n, blocks, block).float()
    zero = torch.stack([zeros & 15, zeros >> 4], dim=-1).reshape(n, -1)[:, :blocks].float()
    w16 = ((codes - zero[:, :, None]) * scales.float()[:, :, None]).reshape(n, -1)[:, :k].half()
    return W4Weight(b, scales, zeros, w16, block)


def w4a16_variants(m: int) -> list[KernelConfig | Route]:
    """What is timed besides the rule's choice at M.

    Every GEMV (M <= 8; the stream GEMVs with the fewest columns that hold M, M <= 4), the GEMMs
    whose column tile suits M, dequantize + cuBLASLt from M = 64.
    """
    variants: list[KernelConfig | Route] = []
    if m <= STREAM_MAX_M:
        cols = min(c.cols for c in EXTRA_STREAM if c.cols >= m)
        variants += [c for c in EXTRA_STREAM if c.cols == cols]
    if m <= GEMV_MAX_M:
        variants += EXTRA_GEMV
        variants += [c for c in DEFAULT_GEMM if c.bm == 16 and c.split == 4]
    else:
        tile = next((b for b in GEMM_BMS if m <= b), GEMM_BMS[-1])
        variants += [c for c in DEFAULT_GEMM if c.bm == tile or (c.bm == 2 * tile and c.split == 4)]
    if m >= 64:
        variants.append(Route.DEQUANTIZE)
    return variants


EXTRA_GEMV = (
    *DEFAULT_GEMV,
    GemvConfig(depth=2),
    GemvConfig(warps=4),
    GemvConfig(warps=4, split=2),
)

# The stream GEMV's knobs around its defaults at 1, 2 and 4 columns (M = 1, 2, 3-4), and the
# candidates built for latency at M = 1 (K split over warps, activations loaded ahead).
EXTRA_STREAM = (
    *DEFAULT_STREAM,
    StreamConfig(1, rows=4),  # the rule's pick without early weight loads
    StreamConfig(1, rows=1),
    StreamConfig(1, rows=1, unroll=8),
    StreamConfig(1, unroll=2),
    StreamConfig(1, unroll=8),
    StreamConfig(1, warps=8),
    StreamConfig(1, rows=4, unroll=2),
    StreamConfig(1),
    StreamConfig(2, rows=1),
    StreamConfig(2, rows=4, unroll=2),
    StreamConfig(4, rows=1),
    StreamConfig(4, rows=4, unroll=1),
    *STREAM_CANDIDATES,
)


def _variant_name(variant: KernelConfig | Route) -> str:
    return f"knopt {variant.value if isinstance(variant, Route) else variant.suffix}"


def w4a16_rows(
    bench: Bench, ms: list[int], n: int, k: int, block: int, rounds: int, variants: bool
) -> list[Row]:
    """W4A16 against fp16 F.linear with the dequantized weight, M in increasing order.

    knopt runs as its rule picks, and with `variants` in every kernel configuration and route.
    With `variants`, M = 1 is also timed cold: each launch of a graph reads the next of enough
    copies of the weights to overflow the L2 cache (50 MB on an H200), as a model's layers do;
    otherwise back-to-back launches of one product find its weight in L2. Each row is printed
    as soon as it is measured.
    """
    w4 = W4A16(DType.F16, block, gemv=EXTRA_GEMV, gemm=DEFAULT_GEMM, stream=EXTRA_STREAM)
    cubin = nvrtc.compile_cubin(w4.source(), bench.gpu.arch)
    kernels = bench.gpu.load(cubin, w4.kernel_names)
    weight = _w4_weight(n, k, block, 0)
    rows = []
    for m in sorted(ms):
        row = Row(
            "W4A16",
            f"M={m} N={n} K={k}",
            2.0 * m * n * k,
            weight_bytes=weight.nbytes,
            fp16_bytes=2 * n * k,
        )
        a = torch.randn((m, k), dtype=torch.float16, device="cuda")
        methods = _w4a16_methods(bench, w4, kernels, row, a, weight, variants)
        bench.measure(row, methods, rounds)
        rows.append(row)
        print("\n".join(row_lines(row)), flush=True)
    return rows


def _w4a16_methods(
    bench: Bench,
    w4: W4A16,
    kernels: dict[str, Any],
    row: Row,
    a: torch.Tensor,
    weight: W4Weight,
    variants: bool,
) -> dict[str, Callable[[], Any]]:
    """What one row times: knopt's choices that plan and check out, and torch fp16.

    A choice that is refused (or gets no cuBLASLt algorithm) or computes a wrong result is
    reported and left out; the row goes on with the others.
    """
    m, k = a.shape
    n = weight.w16.shape[0]
    reference = torch.nn.functional.linear(a.float(), weight.w16.float())
    torch.cuda.synchronize()  # made on torch's default stream, used on knopt's
    methods: dict[str, Callable[[], Any]] = {}
    choices: list[tuple[str, KernelConfig | Route | None]] = [("knopt W4A16", None)]
    if variants:
        choices += [(_variant_name(v), v) for v in w4a16_variants(m)]
    for name, choice in choices:
        try:
            plan = w4.plan(m, n, k, bench.sm_count, blas=bench.blas, config=choice)
        except KnoptError as err:
            print(f"  FAILED: {name} at M={m}: {err}", flush=True)
            continue
        run = W4Launch(bench, kernels, plan, a, [weight])
        row.error[name] = _w4_error(bench, run, reference)
        if not row.error[name] < MAX_W4_ERROR:  # wrong (or NaN): reported, not timed
            print(f"  WRONG: {name} at M={m}: relative error {row.error[name]:.3g}", flush=True)
            continue
        methods[name] = run
        if choice is None:
            row.chosen = plan.kernel if plan.route is not Route.DEQUANTIZE else plan.route.value
    methods["torch fp16"] = partial(torch.nn.functional.linear, a, weight.w16)
    if variants and m == 1:
        copies = max(2, -(-bench.l2_bytes * 2 // weight.nbytes))  # twice L2 for the int4 copies
        cold = [weight] + [_w4_weight(n, k, weight.block, seed) for seed in range(1, copies)]
        plan = w4.plan(m, n, k, bench.sm_count, blas=bench.blas)
        methods["knopt W4A16 cold"] = W4Launch(bench, kernels, plan, a, cold)
        for config in (DEFAULT_STREAM[0], StreamConfig(1, rows=4), *STREAM_CANDIDATES):
            stream = _variant_name(config)
            if stream in methods:  # checked above
                plan = w4.plan(m, n, k, bench.sm_count, config=config)
                methods[f"{stream} cold"] = W4Launch(bench, kernels, plan, a, cold)
        fp16_copies = max(2, -(-bench.l2_bytes * 2 // (2 * n * k)))
        fp16 = itertools.cycle([c.w16 for c in cold[:fp16_copies]])
        methods["torch fp16 cold"] = partial(_linear_next, a, fp16)
    return methods


def _linear_next(a: torch.Tensor, weights: Iterator[torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.linear(a, next(weights))


class W4Launch:
    """One W4A16 plan, launched on the next of `weights` each call, and the memory it uses.

    It holds its activations, weights, output and workspace for as long as it lives: a CUDA
    graph captured from it keeps their raw addresses. (Holding only the workspace's address
    let torch free it at once: the dequantize route then wrote freed memory, harmless until
    torch.cuda.graph's empty_cache() returned its segment to the driver, after which replays
    fault with an illegal address, as they did at M = 512 on an H200.)
    """

    def __init__(
        self,
        bench: Bench,
        kernels: dict[str, Any],
        plan: W4A16Plan,
        a: torch.Tensor,
        weights: list[W4Weight],
    ) -> None:
        m, n, _ = plan.sizes
        self.bench, self.kernels, self.plan, self.a, self.weights = bench, kernels, plan, a, weights
        self.y = torch.empty((m, n), dtype=torch.float16, device="cuda")
        self.workspace = torch.empty(max(plan.workspace, 1), dtype=torch.uint8, device="cuda")
        self._operands = itertools.cycle(
            [
                W4A16Operands(
                    a=a.data_ptr(),
                    b=w.b.data_ptr(),
                    scales=w.scales.data_ptr(),
                    zeros=w.zeros.data_ptr(),
                    y=self.y.data_ptr(),
                    workspace=self.workspace.data_ptr() if plan.workspace else 0,
                )
                for w in weights
            ]
        )

    def __call__(self) -> torch.Tensor:
        """Queue one product on knopt's stream; returns the output it writes."""
        self.plan.enqueue(self.bench.gpu, self.kernels, next(self._operands))
        return self.y


def _w4_error(bench: Bench, run: Callable[[], Any], reference: Any) -> float:
    """Relative error of one launch against fp32 F.linear with the fp16 weight."""
    with torch.cuda.stream(bench.stream):
        y = run()
        bench.stream.synchronize()
    return _rel_error(y, reference)


TABLE_HEADER = [
    "| product | size | method | us | TOPS / TFLOP/s | GB/s (weights) | vs torch fp16 |",
    "| --- | --- | --- | ---: | ---: | ---: | ---: |",
]


def table(rows: list[Row]) -> list[str]:
    """Markdown: per configuration and method, time, throughput, and speed-up over fp16."""
    return [*TABLE_HEADER, *(line for row in rows for line in row_lines(row))]


def row_lines(row: Row) -> list[str]:
    """The table's lines of one configuration."""
    lines = []
    for method in row.times:
        ms = row.median(method)
        base = row.median("torch fp16 cold" if method.endswith(" cold") else "torch fp16")
        rate = row.ops / (ms * 1e-3) / 1e12
        moved = row.fp16_bytes if method.startswith("torch fp16") else row.weight_bytes
        gbs = f"{moved / (ms * 1e-3) / 1e9:.0f}" if row.weight_bytes else ""
        lines.append(
            f"| {row.kind} | {row.size} | {method} | {ms * 1e3:.1f} | {rate:.1f} | {gbs} | "
            f"{base / ms:.2f}x |"
        )
    return lines


def verdicts(rows: list[Row]) -> list[str]:
    """The issue's two targets, met or not."""
    lines = []
    for row in rows:
        if row.kind == "int8 GEMM" and int(row.size.split("^")[0]) >= 4096:
            ratio = row.median("torch fp16") / row.median("knopt int8")
            ok = "met" if ratio >= 1.6 else "NOT met"
            lines.append(f"int8 GEMM {row.size}: {ratio:.2f}x fp16 (target 1.6x: {ok})")
        if row.kind == "W4A16" and row.size.startswith("M=1 ") and "knopt W4A16" in row.times:
            ratio = row.median("torch fp16") / row.median("knopt W4A16")
            ok = "met" if ratio >= 2.5 else "NOT met"
            lines.append(f"W4A16 {row.size}: {ratio:.2f}x fp16 (target 2.5x: {ok})")
            if "knopt W4A16 cold" in row.times:
                cold = row.median("torch fp16 cold") / row.median("knopt W4A16 cold")
                lines.append(f"W4A16 {row.size}, weights not in L2: {cold:.2f}x fp16")
    return lines


def w4a16_choices(rows: list[Row]) -> list[str]:
    """Per W4A16 size: the rule's kernel against the fastest knopt variant (for the rule)."""
    lines = []
    for row in rows:
        knopt = [m for m in row.times if m.startswith("knopt") and not m.endswith(" cold")]
        if row.kind != "W4A16" or len(knopt) < 2 or "knopt W4A16" not in row.times:
            continue
        best = min(knopt[1:], key=row.median)
        rule = row.median("knopt W4A16")
        lines.append(
            f"W4A16 {row.size}: rule {row.chosen} {rule * 1e3:.1f} us; fastest {best} "
            f"{row.median(best) * 1e3:.1f} us ({rule / row.median(best):.2f}x the rule's time); "
            f"torch fp16 {row.median('torch fp16') * 1e3:.1f} us"
        )
    return lines


def entry(rows: list[Row], bench: Bench, outputs: list[str]) -> list[str]:
    """A RESULTS.md entry: date, machine, versions, the table and the verdicts."""
    errors = "; ".join(f"{r.size} {k}: {v:.2g}" for r in rows for k, v in r.error.items())
    return [
        "",
        f"{SECTION} ({DATE}, {bench.gpu.name})",
        "",
        f"`python benchmarks/quantized.py` (torch {torch.__version__}, CUDA "
        f"{torch.version.cuda}, NVRTC {'.'.join(map(str, nvrtc.version()))}, Python "
        f"{platform.python_version()}). Medians of interleaved rounds, CUDA events around "
        "CUDA graphs of back-to-back launches on one stream. cuBLASLt IMMA outputs offered "
        "at 1024^3: "
        f"{', '.join(outputs)}. Checks before timing (int8: wrong outputs; W4A16: relative "
        f"error against fp32 F.linear with the fp16 weight): {errors}.",
        "",
        *table(rows),
        "",
        *(f"- {line}" for line in verdicts(rows) + w4a16_choices(rows)),
    ]


def main() -> int:
    """Measure, print the table and verdicts, optionally record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the raw times here")
    parser.add_argument("--record", action="store_true", help="append the entry to RESULTS.md")
    parser.add_argument(
        "--w4a16-only",
        action="store_true",
        help="only W4A16, M from 1 to 1024, every kernel configuration and route, cold M = 1",
    )
    parser.add_argument(
        "--ms", help="with --w4a16-only: the values of M, comma-separated (default 1 to 1024)"
    )
    parser.add_argument(
        "--no-models", action="store_true", help="the products only, not the quantized BERT-base"
    )
    parser.add_argument(
        "--model-only", action="store_true", help="only the quantized BERT-base, not the products"
    )
    parser.add_argument(
        "--kernels", action="store_true", help="with the model: knopt's GPU kernels of a replay"
    )
    args = parser.parse_args()
    if args.model_only:
        print("\n".join(model_lines(bert_row(args.kernels))))
        return 0
    rounds = 5 if args.quick else args.rounds
    bench = Bench()
    outputs = [o.value for o in supported_outputs(bench.blas.handle, 1024, 1024, 1024)]
    print(f"{bench.gpu.name}: cuBLASLt IMMA outputs {outputs}", flush=True)
    print("\n".join(TABLE_HEADER), flush=True)
    if args.w4a16_only:
        ms = [1, 8, 16, 128, 1024] if args.quick else W4_MS
        if args.ms:
            ms = [int(m) for m in args.ms.split(",")]
        rows = w4a16_rows(bench, ms, 4096, 4096, 128, rounds, variants=True)
    else:
        sizes = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192]
        rows = int8_rows(bench, sizes, rounds)
        rows += w4a16_rows(bench, [1, 16, 128], 4096, 4096, 128, rounds, variants=False)
    lines = entry(rows, bench, outputs)
    if not (args.no_models or args.w4a16_only):
        lines += [
            "",
            "Whole models (benchmarks/quantized_bert.py):",
            "",
            *model_lines(bert_row(args.kernels)),
        ]
    print("\n".join(lines))
    if args.json:
        raw = [
            {"kind": r.kind, "size": r.size, "times_ms": r.times, "error": r.error} for r in rows
        ]
        args.json.write_text(json.dumps(raw, indent=2) + "\n")
    if args.record:
        text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
        RESULTS.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
