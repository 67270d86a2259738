"""A decoding step's linear layers: knopt's GEMV (codegen/gemv.cu) against cuBLASLt, on the GPU.

    python benchmarks/gemv.py            # the ~1B decoder's layers at M = 1 and 8
    python benchmarks/gemv.py --ms 1     # one M
    python benchmarks/gemv.py --splits   # the GEMV at every cluster size too

The shapes of benchmarks/decode.py's 16-layer LLaMA (hidden 2048, SwiGLU 5632, no grouped
queries, vocabulary 32000; Q/K/V and gate/up merged as knopt merges them), fp16, W [K, N]
row-major as ONNX MatMul stores it. Per shape and M: knopt's GEMV with its weight loaded
before it waits for the kernel ahead (what knopt runs) and without, knopt's cuBLASLt plan of
the same Gemm step (what it ran before), and torch.matmul. Each launch reads another copy of
the weight (copies over twice the L2), as a decoding step does: its ~2 GB of weights never
stay in L2. Medians of interleaved rounds of CUDA graphs of back-to-back launches on one
stream (benchmarks/quantized.py's `Bench`); knopt's launches keep programmatic dependent
launch, as in its programs (set `KNOPT_PDL=0` to time each launch alone). GB/s count the
weight's bytes. Every method is checked against torch first. Needs a CUDA GPU and torch.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.quantized import Bench, Row  # noqa: E402
from knopt.cuda import nvrtc  # noqa: E402
from knopt.cuda.gen import gemv  # noqa: E402
from knopt.cuda.gen.indexing import named  # noqa: E402
from knopt.cuda.steps import Gemm, Operand  # noqa: E402
from knopt.ir.dtype import DType  # noqa: E402

SHAPES = [  # (layer, K, N)
    ("q/k/v", 2048, 6144),
    ("o", 2048, 2048),
    ("gate/up", 2048, 11264),
    ("down", 5632, 2048),
    ("lm head", 2048, 32000),
]


class Linear:
    """One method's launches over rotating weight copies: y = a @ w[i]."""

    def __init__(self, run: Callable[[int, int], None], weights: list[torch.Tensor]) -> None:
        self.run, self.weights = run, weights
        self.turn = itertools.cycle(range(len(weights)))

    def __call__(self) -> None:
        """Queue one launch on the next weight."""
        self.run(self.weights[next(self.turn)].data_ptr(), 0)


def methods(
    bench: Bench,
    m: int,
    k: int,
    n: int,
    a: torch.Tensor,
    weights: list[torch.Tensor],
    splits: bool,
) -> tuple[dict[str, Callable[[], Any]], dict[str, torch.Tensor]]:
    """The timed methods, and the output each writes (for the check).

    With `splits`, the GEMV at every cluster size besides the rule's (outputs not checked).
    """
    outputs = {name: torch.empty((m, n), dtype=torch.float16, device="cuda") for name in "ELT"}
    chosen = gemv.split_for(n, k)
    block = (gemv.THREADS, 1, 1)
    kernels = {}
    for split in gemv.SPLITS if splits else (chosen,):
        for early in (True, False) if split == chosen else (True,):
            config = (DType.F16, gemv.columns(m), split, early)
            name, source = named("gemv", gemv.kernel_source(*config))
            kernels[split, early] = bench.gpu.load(
                nvrtc.compile_cubin(source, bench.gpu.arch), [name]
            )[name]

    def knopt_gemv(w: int, _: int, early: bool, split: int = chosen) -> None:
        y = outputs["E" if early else "L"]
        ints = (np.int32(m), np.int32(n), np.int32(k), np.int32(k))
        args = (a.data_ptr(), w, 0, 0, y.data_ptr(), *ints, np.float32(1))
        grid = (-(-n // gemv.TILE), split, 1)
        bench.gpu.launch(kernels[split, early], grid, block, 0, args)

    step = Gemm(
        Operand(0, m, k, k, 1, 0),
        Operand(1, k, n, n, 1, 0),
        Operand(2, m, n, n, 1, 0),
        1,
        DType.F16,
        "fp16",
    )
    plan = bench.blas.plan(step)
    workspace = torch.empty(max(plan.workspace, 1), dtype=torch.uint8, device="cuda")

    def cublaslt(w: int, _: int) -> None:
        addresses = {0: a.data_ptr(), 1: w, 2: outputs["T"].data_ptr()}
        plan.enqueue(addresses, workspace.data_ptr(), bench.gpu.stream_handle)

    turn = itertools.cycle(weights)
    found: dict[str, Callable[[], Any]] = {
        "knopt GEMV": Linear(lambda w, i: knopt_gemv(w, i, True), weights),
        "knopt GEMV, not early": Linear(lambda w, i: knopt_gemv(w, i, False), weights),
    }
    for split, _early in kernels:
        if split != chosen:
            found[f"knopt GEMV, split {split}"] = Linear(
                functools.partial(knopt_gemv, early=True, split=split), weights
            )
    found["knopt cuBLASLt"] = Linear(cublaslt, weights)
    found["torch fp16"] = lambda: torch.matmul(a, next(turn))
    return found, {
        "knopt GEMV": outputs["E"],
        "knopt GEMV, not early": outputs["L"],
        "knopt cuBLASLt": outputs["T"],
    }


def main() -> int:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", default="1,8", help="values of M, comma-separated")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--splits", action="store_true", help="the GEMV at every cluster size")
    args = parser.parse_args()
    bench = Bench()
    print(f"{bench.gpu.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print("| layer | M | K x N | method | us | GB/s | vs cuBLASLt |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: |")
    for m in (int(x) for x in args.ms.split(",")):
        for layer, k, n in SHAPES:
            gen = torch.Generator(device="cuda").manual_seed(k + n)
            nbytes = 2 * k * n
            copies = max(2, -(-2 * bench.l2_bytes // nbytes))
            weights = [
                (torch.rand((k, n), generator=gen, device="cuda", dtype=torch.float16) - 0.5)
                for _ in range(copies)
            ]
            a = torch.rand((m, k), generator=gen, device="cuda", dtype=torch.float16) - 0.5
            timed, outputs = methods(bench, m, k, n, a, weights, args.splits)
            torch.cuda.synchronize()
            expected = (a.double() @ weights[0].double()).float()
            for name, out in outputs.items():
                with torch.cuda.stream(bench.stream):
                    timed[name].turn = itertools.cycle(range(len(weights)))  # type: ignore[attr-defined]
                    timed[name]()
                    bench.stream.synchronize()
                error = float((out.float() - expected).norm() / expected.norm())
                if not error < 2e-3:
                    raise SystemExit(f"{name} at {layer} M={m}: relative error {error:.3g}")
            row = Row("linear", f"{layer} M={m}", 2.0 * m * k * n)
            bench.measure(row, timed, args.rounds)
            base = statistics.median(row.times["knopt cuBLASLt"])
            for name, times in row.times.items():
                ms = statistics.median(times)
                print(
                    f"| {layer} | {m} | {k} x {n} | {name} | {ms * 1e3:.1f} | "
                    f"{nbytes / (ms * 1e-3) / 1e9:.0f} | {base / ms:.2f}x |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
