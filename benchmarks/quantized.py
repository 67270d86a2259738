"""Quantized matrix products on the GPU: knopt's int8 GEMM and W4A16 kernels against cuBLAS fp16.

    python benchmarks/quantized.py                 # table and a RESULTS.md entry on stdout
    python benchmarks/quantized.py --quick         # fewer sizes and rounds (a smoke run)
    python benchmarks/quantized.py --json out.json --record

In one process, on one stream, interleaved round by round, timed with CUDA events:

* int8 GEMM, M = N = K from 1024 to 8192: knopt's cuBLASLt IMMA plan (int32 out), the same
  followed by knopt's requantizing epilogue (uint8 out), torch's `_int_mm`, and torch.matmul in
  fp16 (cuBLAS). TOPS count 2 M N K operations.
* W4A16, M = 1, 16, 128 and N = K = 4096 (blocks of 128, with zero points): knopt's kernels
  against torch.nn.functional.linear in fp16 with the same weight dequantized. TFLOP/s count
  2 M N K; GB/s count the bytes of the packed weight, scales and zero points.

Each timing is the median over rounds of the CUDA-event time of a CUDA graph of `inner`
launches, divided by `inner` (graphs keep Python's launch overhead out of microsecond kernels).
Every product is checked against torch before it is timed. Targets (issue #14): int8 GEMM
>= 1.6x fp16 throughput at 4096^3 and above; W4A16 at M = 1 >= 2.5x faster than fp16.
Then a whole model (benchmarks/quantized_bert.py, skipped with --no-models): BERT-base at
batch 32 quantized by onnxruntime, through knopt, against knopt's and torch.compile's fp16 runs
of the float model (target: faster than knopt's fp16). Needs a CUDA GPU, torch, nvmath-python,
cuda-python, and for the model transformers and onnxruntime.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from collections.abc import Callable, Mapping
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
from knopt.cuda.w4a16 import W4A16, W4A16Operands  # noqa: E402
from knopt.ir.dtype import DType  # noqa: E402

DATE = datetime.date.today().isoformat()
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Quantized matrix products"
TARGET_MS = 2.0  # each timed batch of launches lasts about this long


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

    def median(self, method: str) -> float:
        """Median milliseconds a launch of `method`."""
        return statistics.median(self.times[method])


class Bench:
    """knopt's GPU, its stream shared with torch, and timing by CUDA events on it."""

    def __init__(self) -> None:
        self.gpu = Gpu()
        self.stream = torch.cuda.ExternalStream(self.gpu.stream_handle)
        self.sm_count = int(self.gpu.device.properties.multiprocessor_count)
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
        inner = {name: self.inner_for(run) for name, run in methods.items()}
        torch.cuda.synchronize()
        replays = {
            name: self.capture(run, inner[name], name.startswith("knopt"))
            for name, run in methods.items()
        }
        for _ in range(rounds):
            for name, replay in replays.items():
                row.times.setdefault(name, []).append(self.batch_ms(replay, 1) / inner[name])
        torch.cuda.synchronize()
        for executable in self._graphs:
            self.gpu.release_graph(executable)
        self._graphs.clear()
        self._torch_graphs.clear()


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
        print(f"  int8 {s}^3 done", flush=True)
    return rows


def w4a16_rows(bench: Bench, ms: list[int], n: int, k: int, block: int, rounds: int) -> list[Row]:
    """W4A16 (knopt) against fp16 F.linear with the dequantized weight."""
    w4 = W4A16(DType.F16, block)
    cubin = nvrtc.compile_cubin(w4.source(), bench.gpu.arch)
    kernels = bench.gpu.load(cubin, w4.kernel_names)
    rng = np.random.default_rng(0)
    blocks = -(-k // block)
    b_np = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    s_np = rng.uniform(0.005, 0.05, (n, blocks)).astype(np.float16)
    z_np = rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8)
    b, scales, zeros = (torch.from_numpy(x).cuda() for x in (b_np, s_np, z_np))
    codes = torch.stack([b & 15, b >> 4], dim=-1).reshape(n, blocks, block).float()
    zero = torch.stack([zeros & 15, zeros >> 4], dim=-1).reshape(n, -1)[:, :blocks].float()
    w16 = ((codes - zero[:, :, None]) * scales.float()[:, :, None]).reshape(n, -1)[:, :k].half()
    weight_bytes = b.numel() + scales.numel() * 2 + zeros.numel()
    rows = []
    for m in ms:
        a = torch.randn((m, k), dtype=torch.float16, device="cuda")
        y = torch.empty((m, n), dtype=torch.float16, device="cuda")
        workspace = torch.empty(
            max(w4.workspace_bytes(m, n, k, bench.sm_count), 4), dtype=torch.uint8, device="cuda"
        )
        operands = W4A16Operands(
            a=a.data_ptr(),
            b=b.data_ptr(),
            scales=scales.data_ptr(),
            zeros=zeros.data_ptr(),
            y=y.data_ptr(),
            workspace=workspace.data_ptr() if w4.workspace_bytes(m, n, k, bench.sm_count) else 0,
        )
        torch.cuda.synchronize()  # made on torch's default stream, used on knopt's

        def knopt_w4(operands=operands, m=m) -> None:
            w4.launch(bench.gpu, kernels, operands, (m, n, k), bench.sm_count)

        row = Row(
            "W4A16",
            f"M={m} N={n} K={k}",
            2.0 * m * n * k,
            weight_bytes=weight_bytes,
            fp16_bytes=2 * n * k,
        )
        with torch.cuda.stream(bench.stream):
            knopt_w4()
            reference = torch.nn.functional.linear(a.float(), w16.float())
            bench.stream.synchronize()
            row.error["knopt W4A16"] = _rel_error(y, reference)
        methods: dict[str, Callable[[], Any]] = {
            "knopt W4A16": knopt_w4,
            "torch fp16": partial(torch.nn.functional.linear, a, w16),
        }
        bench.measure(row, methods, rounds)
        rows.append(row)
        print(f"  W4A16 M={m} done", flush=True)
    return rows


def table(rows: list[Row]) -> list[str]:
    """Markdown: per configuration and method, time, throughput, and speed-up over fp16."""
    lines = [
        "| product | size | method | us | TOPS / TFLOP/s | GB/s (weights) | vs torch fp16 |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        base = row.median("torch fp16")
        for method in row.times:
            ms = row.median(method)
            rate = row.ops / (ms * 1e-3) / 1e12
            moved = row.fp16_bytes if method == "torch fp16" else row.weight_bytes
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
        if row.kind == "W4A16" and row.size.startswith("M=1 "):
            ratio = row.median("torch fp16") / row.median("knopt W4A16")
            ok = "met" if ratio >= 2.5 else "NOT met"
            lines.append(f"W4A16 {row.size}: {ratio:.2f}x fp16 (target 2.5x: {ok})")
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
        *(f"- {line}" for line in verdicts(rows)),
    ]


def main() -> int:
    """Measure, print the table and verdicts, optionally record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, help="write the raw times here")
    parser.add_argument("--record", action="store_true", help="append the entry to RESULTS.md")
    parser.add_argument(
        "--no-models", action="store_true", help="the products only, not the quantized BERT-base"
    )
    args = parser.parse_args()
    rounds = 5 if args.quick else args.rounds
    bench = Bench()
    outputs = [o.value for o in supported_outputs(bench.blas.handle, 1024, 1024, 1024)]
    print(f"{bench.gpu.name}: cuBLASLt IMMA outputs {outputs}", flush=True)
    sizes = [1024, 4096] if args.quick else [1024, 2048, 4096, 8192]
    rows = int8_rows(bench, sizes, rounds)
    rows += w4a16_rows(bench, [1, 16, 128], 4096, 4096, 128, rounds)
    lines = entry(rows, bench, outputs)
    if not args.no_models:
        lines += ["", "Whole models (benchmarks/quantized_bert.py):", "", *model_lines(bert_row())]
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
