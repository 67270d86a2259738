"""Attention kernels on the GPU: knopt's against torch's scaled_dot_product_attention (flash).

    python benchmarks/attention.py            # every shape, 200 timed runs each
    python benchmarks/attention.py --quick    # 30 timed runs each

For each shape: a Program with one Attention op over fp16 q, k, v [b, h, s, d] (and, where
the model is causal, a -inf bias above the diagonal, read through stride-0 head and batch axes),
prepared by `knopt.cuda.prepare` and replayed as a CUDA graph. Beside it the same op through
knopt's exact kernel (f32 arithmetic, no tensor cores: the path fp16 took before), and torch's
SDPA with the flash backend (`is_causal` for causal). Median milliseconds of single runs between
CUDA events after a warm-up; TFLOP/s count the dense product, 4 b h s t d, for causal too. The
last column is the largest |knopt - torch| over the output. Needs a CUDA GPU; torch is optional.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from knopt.cuda import prepare  # noqa: E402
from knopt.cuda.gen import attention  # noqa: E402
from knopt.cuda.steps import Launch  # noqa: E402
from knopt.ir import op as ops  # noqa: E402
from knopt.ir.dtype import DType  # noqa: E402
from knopt.ir.program import Program  # noqa: E402
from tests.cuda.programs import ProgramBuilder  # noqa: E402

if TYPE_CHECKING:
    from knopt.cuda.executor import Executable


@dataclass(frozen=True)
class Shape:
    """One attention: batch, heads, query and key lengths, head size, causal mask or none."""

    name: str
    b: int
    h: int
    s: int
    t: int
    d: int
    causal: bool = False

    @property
    def flops(self) -> float:
        """The dense product's floating-point operations."""
        return 4.0 * self.b * self.h * self.s * self.t * self.d


SHAPES = [
    Shape("ViT-B/16 b1", 1, 12, 197, 197, 64),
    Shape("ViT-B/16 b32", 32, 12, 197, 197, 64),
    Shape("BERT-base b1", 1, 12, 128, 128, 64),
    Shape("BERT-base b32", 32, 12, 128, 128, 64),
    Shape("LLaMA s128 b1", 1, 32, 128, 128, 128, causal=True),
    Shape("LLaMA s128 b8", 8, 32, 128, 128, 128, causal=True),
    Shape("LLaMA s2048 b1", 1, 32, 2048, 2048, 128, causal=True),
    *(Shape(f"decode k{t} b1", 1, 32, 1, t, 128) for t in (128, 512, 1024, 2048, 4096)),
    Shape("decode k4096 b8", 8, 32, 1, 4096, 128),
]


def program(shape: Shape) -> Program:
    """One fp16 Attention op over dense [b, h, s, d] inputs."""
    p = ProgramBuilder()
    f16 = DType.F16
    q = p.input("q", (shape.b, shape.h, shape.s, shape.d), f16)
    k = p.input("k", (shape.b, shape.h, shape.t, shape.d), f16)
    v = p.input("v", (shape.b, shape.h, shape.t, shape.d), f16)
    if shape.causal:
        rows = np.arange(shape.s)[:, None] + (shape.t - shape.s)
        mask = np.where(np.arange(shape.t)[None, :] > rows, -np.inf, 0.0)
        mask = mask.reshape(1, 1, shape.s, shape.t)
    else:
        mask = np.zeros((1, 1, 1, 1))
    bias = p.view(
        ops.Broadcast((shape.b, shape.h, shape.s, shape.t)), p.constant(mask.astype(np.float16))
    )
    out = p.op(ops.Attention(1.0 / np.sqrt(shape.d)), (q, k, v, bias))
    return p.build([out])


def time_knopt(executable: Executable, warmup: int, repeat: int) -> float:
    """Median milliseconds of one graph replay, between CUDA events."""
    gpu = executable.gpu
    for _ in range(warmup):
        executable.replay()
    gpu.sync()
    times = []
    for _ in range(repeat):
        start = gpu.event()
        executable.replay()
        end = gpu.event()
        times.append(gpu.elapsed_ms(start, end))
    return statistics.median(times)


def time_torch(run: Callable[[], Any], warmup: int, repeat: int) -> float:
    """Median milliseconds of one call of `run`, between CUDA events."""
    import torch

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels(executable: Executable) -> str:
    """The launches of a plan, shortened: kind and grid."""
    names = []
    for step in executable.plan.steps:
        if isinstance(step, Launch):
            kind = step.name.rsplit("_", 1)[0].removeprefix("kn_attention").lstrip("_") or "exact"
            names.append(f"{kind}{list(step.grid[:2])}")
    return " + ".join(names)


def bench(shape: Shape, warmup: int, repeat: int) -> dict[str, Any]:
    """One table row."""
    rng = np.random.default_rng(0)
    prog = program(shape)
    feeds = {
        name: rng.uniform(-1, 1, prog.tensors[tid].type.shape).astype(np.float16)  # type: ignore[arg-type]
        for name, tid in zip(prog.input_names, prog.inputs, strict=True)
    }
    executable = prepare(prog)
    (out,) = executable.run(feeds)
    row: dict[str, Any] = {"shape": shape, "kernels": kernels(executable)}
    row["knopt"] = time_knopt(executable, warmup, repeat)
    with mock.patch.object(attention, "MMA_DTYPES", frozenset()):
        exact = prepare(prog)
    exact.run(feeds)
    row["exact"] = time_knopt(exact, warmup, repeat)
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return row
    q, k, v = (torch.from_numpy(feeds[n]).cuda() for n in ("q", "k", "v"))
    causal = shape.causal and shape.s > 1

    def run() -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        reference = run().float().cpu().numpy()
        row["torch"] = time_torch(run, warmup, repeat)
    row["error"] = float(np.nanmax(np.abs(out.astype(np.float32) - reference)))
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines."""
    lines = [
        "| shape | b h s t d | knopt ms | TFLOP/s | exact ms | torch flash ms | TFLOP/s "
        "| knopt / torch | knopt kernels | max abs diff |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in rows:
        shape = row["shape"]
        dims = f"{shape.b} {shape.h} {shape.s} {shape.t} {shape.d}" + (" causal" * shape.causal)
        torch_ms = row.get("torch")
        cells = [
            shape.name,
            dims,
            f"{row['knopt']:.4f}",
            f"{shape.flops / row['knopt'] / 1e9:.1f}",
            f"{row['exact']:.4f}",
            f"{torch_ms:.4f}" if torch_ms else "-",
            f"{shape.flops / torch_ms / 1e9:.1f}" if torch_ms else "-",
            f"{row['knopt'] / torch_ms:.2f}" if torch_ms else "-",
            row["kernels"],
            f"{row['error']:.2g}" if "error" in row else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 timed runs per shape, not 200")
    args = parser.parse_args()
    warmup, repeat = (5, 30) if args.quick else (20, 200)
    rows = []
    for shape in SHAPES:
        rows.append(bench(shape, warmup, repeat))
        print(table(rows)[-1], flush=True)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
