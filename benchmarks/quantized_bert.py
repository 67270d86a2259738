"""A quantized BERT-base on the GPU: knopt's int8 program against fp16 knopt and torch.compile.

BERT-base (transformers, random weights, batch 32, sequence 128) is exported to ONNX and
quantized with onnxruntime's `quantize_static` (QDQ, int8 activations, symmetric per-channel
int8 weights, calibrated on one random batch) where its linear layers multiply by weights;
the attention products stay fp16, as int8 deployments of BERT usually keep them. Timed, all
in fp16 elsewhere and median of CUDA-event times of CUDA-graph replays:

* knopt, the quantized model (linear layers on cuBLASLt's int8 GEMM, rules/quantize.egg);
* knopt, the float model in fp16;
* torch.compile (default mode) of the float model in fp16.

The quantized output is checked against onnxruntime's CPU run of the quantized model, and
against the float model in fp16 (the quantization's own error). Target (issue #14): the
quantized BERT-base faster than knopt's own fp16 run of the float model.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import knopt
from benchmarks import gpu_models
from knopt.cuda.runner import CudaRunner
from tests.cuda.quant import quantize_linear_layers

BATCH = 32


@dataclass
class ModelRow:
    """Milliseconds by method, and what the run checked."""

    times: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # preparation
    errors: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)  # by method


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


def relative_error(mine: np.ndarray, exact: np.ndarray) -> float:
    """‖mine - exact‖ / ‖exact‖ in float64."""
    mine, exact = mine.astype(np.float64).ravel(), exact.astype(np.float64).ravel()
    return float(np.linalg.norm(mine - exact) / max(float(np.linalg.norm(exact)), 1e-300))


def _knopt(
    path: Path,
    feeds: dict[str, Any],
    row: ModelRow,
    name: str,
    dims: dict[str, int] | None,
    kernels: bool,
) -> np.ndarray:
    """Optimize, prepare in fp16 and time one model (and profile it); returns its output."""
    began = time.perf_counter()
    result = knopt.optimize(knopt.load(path, dims=dims), profile="h200", ilp=False)
    row.seconds[f"{name} optimize"] = time.perf_counter() - began
    row.kernels[name] = result.report.kernels
    began = time.perf_counter()
    executable = CudaRunner("fp16").executable(result.program)
    (out,) = executable.run(feeds, device_outputs=True)
    row.seconds[f"{name} prepare"] = time.perf_counter() - began
    stream = torch.cuda.ExternalStream(executable.gpu.stream_handle)
    row.times[name] = time_cuda(executable.replay, stream)
    if kernels:
        from benchmarks.gpu import torch_profile

        row.profiles[name] = torch_profile(executable.replay)
    return out.numpy()


def _onnxruntime(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input_ids": x})[0])


def bert_row(kernels: bool = False) -> ModelRow:
    """Build, quantize and time BERT-base at batch 32 (and profile knopt's kernels)."""
    row = ModelRow()
    spec = gpu_models.MODELS["bert"]
    x = gpu_models.example(spec, BATCH)
    feeds = {"input_ids": x}
    with tempfile.TemporaryDirectory() as folder:
        int8_path = Path(folder) / "bert_int8.onnx"
        began = time.perf_counter()
        float_path = gpu_models.export(gpu_models.build(spec), spec, Path(folder), BATCH)
        quantize_linear_layers(float_path, int8_path, {"input_ids": x.cpu().numpy()})
        row.seconds["export and quantize"] = time.perf_counter() - began
        dims = {"batch": BATCH} if float_path.stem == spec.name else None  # a symbolic batch
        int8_out = _knopt(int8_path, feeds, row, "knopt int8", dims, kernels)
        float_out = _knopt(float_path, feeds, row, "knopt fp16", dims, kernels)
        row.errors["int8 vs onnxruntime int8"] = relative_error(
            int8_out, _onnxruntime(int8_path, x.cpu().numpy())
        )
    model = gpu_models.build(spec)
    gpu_models.set_attention(model, "sdpa")
    model = model.cuda().half()
    with torch.no_grad():
        reference = model(x).float().cpu().numpy()
        began = time.perf_counter()
        compiled = torch.compile(model)
        compiled(x)
        row.seconds["torch.compile"] = time.perf_counter() - began
        row.times["torch.compile fp16"] = time_cuda(
            functools.partial(compiled, x), torch.cuda.current_stream()
        )
    row.errors["knopt fp16 vs torch fp16"] = relative_error(float_out, reference)
    row.errors["int8 vs torch fp16 (quantization)"] = relative_error(int8_out, reference)
    return row


def model_lines(row: ModelRow) -> list[str]:
    """Markdown table, checks and the target's verdict."""
    base = row.times["knopt fp16"]
    lines = [
        f"| model | method | ms (batch {BATCH}) | vs knopt fp16 | kernels |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for method, ms in row.times.items():
        kernels = row.kernels.get(method, "")
        lines.append(f"| BERT-base | {method} | {ms:.2f} | {base / ms:.2f}x | {kernels} |")
    ratio = base / row.times["knopt int8"]
    verdict = "met" if ratio > 1.0 else "NOT met"
    checks = "; ".join(f"{k}: {v:.2g}" for k, v in row.errors.items())
    prep = "; ".join(f"{k} {v:.0f} s" for k, v in row.seconds.items())
    lines += [
        "",
        f"- quantized BERT-base: {ratio:.2f}x knopt's fp16 run of the float model "
        f"(target: faster, {verdict})",
        f"- relative errors: {checks}",
        f"- preparation: {prep}",
    ]
    for method, profile in row.profiles.items():
        lines += [
            "",
            f"{method}: GPU kernels of one replay, {profile['total_ms']:.3f} ms",
            "",
            "| kernel | launches | ms | share |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| `{g['kind']}` | {g['count']} | {g['ms']:.3f} | {g['share']:.1%} |"
                for g in profile["groups"]
            ),
        ]
    return lines
