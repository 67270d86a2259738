"""knopt on the GPU against PyTorch eager and torch.compile, in one process, timed with CUDA events.

Builds ResNet-50 (torchvision), BERT-base and GPT-2 small (transformers, sequence 128) with random
weights, exports each to ONNX, and times the median latency of many runs after a warm-up at each
batch size and precision. Also measures the device copy bandwidth and what a fused elementwise
knopt kernel reaches of it. Needs a CUDA GPU, torch, torchvision and transformers.

    python benchmarks/gpu.py --out results.json --plot gpu.png
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import knopt
from knopt.cuda.runner import CudaRunner
from knopt.opt.egraph import Limits

SEQ = 128


class _Hidden(torch.nn.Module):
    """A transformers model returning its last hidden state only (what is exported)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=False)[0]


def build(name: str, attention: str) -> torch.nn.Module:
    """A randomly initialized model in eval mode, on the CPU."""
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None).eval()
    import transformers

    if name == "bert":
        config = transformers.BertConfig(attn_implementation=attention)
        return _Hidden(transformers.BertModel(config, add_pooling_layer=False)).eval()
    config = transformers.GPT2Config(attn_implementation=attention)
    return _Hidden(transformers.GPT2Model(config)).eval()


def example(name: str, batch: int) -> torch.Tensor:
    """Inputs of the model at `batch` on the GPU."""
    generator = torch.Generator().manual_seed(1)
    if name == "resnet50":
        return torch.randn(batch, 3, 224, 224, generator=generator).cuda()
    return torch.randint(0, 30000, (batch, SEQ), generator=generator).cuda()


def export(model: torch.nn.Module, x: torch.Tensor, path: Path) -> None:
    """ONNX export with the TorchScript exporter (fixed shapes), else the dynamo one."""
    name = "input_ids" if x.dtype == torch.int64 else "input"
    try:
        torch.onnx.export(
            model,
            (x.cpu(),),
            str(path),
            input_names=[name],
            output_names=["output"],
            opset_version=17,
            dynamo=False,
        )
    except Exception as err:  # older or newer exporters differ; try the other one
        print(f"  torchscript export failed ({err}); trying dynamo", file=sys.stderr)
        torch.onnx.export(
            model,
            (x.cpu(),),
            str(path),
            input_names=[name],
            output_names=["output"],
            opset_version=18,
            dynamo=True,
        )


def time_cuda(
    run: Callable[[], Any], stream: torch.cuda.Stream, warmup: int = 10, repeat: int = 50
) -> float:
    """Median milliseconds of `run` between CUDA events on `stream` (after a warm-up)."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    times = []
    with torch.cuda.stream(stream):
        for _ in range(repeat):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            run()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def relative_error(mine: np.ndarray, theirs: np.ndarray) -> float:
    """‖mine - theirs‖ / ‖theirs‖ in float64."""
    a, b = mine.astype(np.float64), theirs.astype(np.float64)
    return float(np.linalg.norm(a - b)) / max(float(np.linalg.norm(b)), 1e-30)


def bench_model(
    name: str,
    batches: list[int],
    precisions: list[str],
    modes: list[str],
    folder: Path,
    optimize: bool,
    optimize_seconds: float,
) -> list[dict[str, Any]]:
    """Every (batch, precision) row for one model (with the optimized program if `optimize`)."""
    rows = []
    # One instance per precision: converting one module back and forth leaves transformers'
    # cached dtypes behind (a half model then fed float masks).
    eager_models = {
        p: build(name, "sdpa").cuda().half() if p == "fp16" else build(name, "sdpa").cuda()
        for p in precisions
    }
    export_model = build(name, "eager")
    for batch in batches:
        x = example(name, batch)
        path = folder / f"{name}_{batch}.onnx"
        began = time.perf_counter()
        export(export_model, x, path)
        export_seconds = time.perf_counter() - began
        program = None  # the optimized program, made once per batch size
        for precision in precisions:
            half = precision == "fp16"
            model = eager_models[precision]
            tx = x.half() if half and x.is_floating_point() else x
            row: dict[str, Any] = {
                "model": name,
                "batch": batch,
                "precision": precision,
                "export_s": round(export_seconds, 1),
            }
            default_stream = torch.cuda.current_stream()
            with torch.no_grad():
                reference = model(tx)
                reference = reference[0] if isinstance(reference, tuple) else reference
                row["eager_ms"] = time_cuda(functools.partial(model, tx), default_stream)
                for mode in modes:
                    began = time.perf_counter()
                    compiled = torch.compile(model, mode=None if mode == "default" else mode)
                    compiled(tx)
                    row[f"compile_{mode}_s"] = round(time.perf_counter() - began, 1)
                    row[f"compile_{mode}_ms"] = time_cuda(
                        functools.partial(compiled, tx), default_stream
                    )
            began = time.perf_counter()
            runner = CudaRunner("fp16" if half else "f32")
            graph = knopt.load(path)
            feeds = {graph.input_names[0]: x}
            executable = runner.executable(graph)
            (out,) = executable.run(feeds, device_outputs=True)
            row["knopt_prepare_s"] = round(time.perf_counter() - began, 1)
            stream = torch.cuda.ExternalStream(executable.gpu.stream_handle)
            row["knopt_ms"] = time_cuda(
                functools.partial(executable.run, feeds, device_outputs=True), stream
            )
            row["knopt_replay_ms"] = time_cuda(executable.replay, stream)
            row["knopt_arena_MiB"] = executable.plan.region_bytes["arena"] / 2**20
            row["knopt_arena_bound_MiB"] = executable.plan.arena_lower_bound / 2**20
            row["knopt_error_vs_torch"] = relative_error(
                out.numpy(), reference.float().cpu().numpy()
            )
            for mode in modes:
                row[f"ratio_compile_{mode}"] = row["knopt_ms"] / row[f"compile_{mode}_ms"]
            row["ratio_eager"] = row["knopt_ms"] / row["eager_ms"]
            if optimize:
                try:
                    program = _fused(
                        row, runner, graph, program, feeds, reference, modes, optimize_seconds
                    )
                except Exception as err:  # record and go on: the unfused numbers still count
                    row["fused_error"] = f"{type(err).__name__}: {str(err)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _fused(
    row: dict[str, Any],
    runner: CudaRunner,
    graph: Any,
    program: Any,
    feeds: dict[str, Any],
    reference: torch.Tensor,
    modes: list[str],
    optimize_seconds: float,
) -> Any:
    """Time knopt.optimize's fused program into `row`; returns the program for reuse."""
    if program is None:
        began = time.perf_counter()
        result = knopt.optimize(graph, profile="h200", limits=Limits(seconds=optimize_seconds))
        program = result.program
        row["optimize_s"] = round(time.perf_counter() - began, 1)
    fused = runner.executable(program)
    (fused_out,) = fused.run(feeds, device_outputs=True)
    fused_stream = torch.cuda.ExternalStream(fused.gpu.stream_handle)
    row["knopt_fused_ms"] = time_cuda(
        functools.partial(fused.run, feeds, device_outputs=True), fused_stream
    )
    row["knopt_fused_launches"] = len(program.launches())
    row["knopt_fused_error_vs_torch"] = relative_error(
        fused_out.numpy(), reference.float().cpu().numpy()
    )
    for mode in modes:
        row[f"ratio_fused_compile_{mode}"] = row["knopt_fused_ms"] / row[f"compile_{mode}_ms"]
    return program


def bandwidth() -> dict[str, float]:
    """Device copy bandwidth and a fused elementwise knopt kernel's share of it (GB/s)."""
    from knopt.cuda import prepare
    from knopt.ir import GraphBuilder
    from knopt.ir.dtype import DType
    from knopt.ir.op import Binary, Unary
    from knopt.ir.program import BinaryE, Kernel, Load, UnaryE, program_from_graph

    n = 1 << 26  # 256 MiB per f32 tensor: far beyond the 50 MB L2
    source = torch.randn(n, device="cuda")
    target = torch.empty_like(source)
    stream = torch.cuda.current_stream()
    copy_ms = time_cuda(lambda: target.copy_(source), stream, 3, 20)
    copy = 2 * 4 * n / copy_ms / 1e6
    g = GraphBuilder("bw")
    a, b, _ = (g.input(k, (n // 4096, 4096), DType.F32) for k in "abc")
    g.output(g.add(a, b), "y")
    base = program_from_graph(g.build())
    body = UnaryE(Unary.RELU, BinaryE(Binary.ADD, BinaryE(Binary.MUL, Load(0), Load(1)), Load(2)))
    base.kernels = [Kernel("elementwise", None, (0, 1, 2), base.kernels[0].output, body=body)]
    executable = prepare(base)
    feeds = {k: torch.randn(n // 4096, 4096, device="cuda") for k in "abc"}
    executable.run(feeds, device_outputs=True)
    ext = torch.cuda.ExternalStream(executable.gpu.stream_handle)
    fused_ms = time_cuda(executable.replay, ext, 3, 20)
    fused = 4 * 4 * n / fused_ms / 1e6
    return {"copy_GBps": copy, "fused_elementwise_GBps": fused, "fraction": fused / copy}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Latency bars per configuration (skipped when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    labels = [f"{r['model']}\nb{r['batch']} {r['precision']}" for r in rows]
    compiled = sorted(k for k in rows[0] if k.startswith("compile_") and k.endswith("_ms"))
    keys = ["eager_ms", *compiled, "knopt_ms"]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.2), 4.5))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ax.bar(
            [j + i * width for j in range(len(rows))],
            [r[key] for r in rows],
            width,
            label=key.removesuffix("_ms"),
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, fontsize=7)
    ax.set_ylabel("latency (ms, median)")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert,gpt2")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--precisions", default="f32,fp16")
    parser.add_argument(
        "--compile-modes",
        default="default",
        help="torch.compile modes, comma-separated (max-autotune is slow)",
    )
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, help="save a bar chart here")
    parser.add_argument("--no-bandwidth", action="store_true")
    parser.add_argument(
        "--optimize",
        default="",
        help="models to also run as knopt.optimize's fused program (a,b,...)",
    )
    parser.add_argument(
        "--optimize-seconds",
        type=float,
        default=15.0,
        help="saturation time limit of knopt.optimize",
    )
    args = parser.parse_args()
    # Strict f32 on both sides: no TF32 in torch's matmuls or convolutions either.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            rows += bench_model(
                name,
                [int(b) for b in args.batches.split(",")],
                args.precisions.split(","),
                args.compile_modes.split(","),
                Path(folder),
                name in args.optimize.split(","),
                args.optimize_seconds,
            )
            if args.out:
                args.out.write_text(json.dumps({"rows": rows}, indent=1))
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "rows": rows}
    if not args.no_bandwidth:
        result["bandwidth"] = bandwidth()
        print(json.dumps(result["bandwidth"]))
    nan = float("nan")
    print(
        f"{'model':9} {'batch':>5} {'prec':>5} {'eager':>8} {'compile':>8} {'knopt':>8} "
        f"{'fused':>8} {'k/comp':>7} {'f/comp':>7} {'err':>8}"
    )
    for r in rows:
        print(
            f"{r['model']:9} {r['batch']:5d} {r['precision']:>5} {r['eager_ms']:8.3f} "
            f"{r.get('compile_default_ms', nan):8.3f} {r['knopt_ms']:8.3f} "
            f"{r.get('knopt_fused_ms', nan):8.3f} {r.get('ratio_compile_default', nan):7.2f} "
            f"{r.get('ratio_fused_compile_default', nan):7.2f} "
            f"{r['knopt_error_vs_torch']:8.1e}"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    if args.plot and rows:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
