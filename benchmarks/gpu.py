"""knopt on the GPU against torch (eager, torch.compile in three modes) and tinygrad, one process.

Every side runs the same model with the same random weights on the same input: ResNet-50,
BERT-base, GPT-2 small, ViT-B/16 and a 1.1B LLaMA-class decoder (sequence 128), at batch 1 and
32, in strict f32 (TF32 off for torch; knopt too, unless KNOPT_SPLIT_F32 opts in to 3xTF32)
and fp16. Per-call latency is measured the same way for every side: synchronize the
device, call, synchronize, and the median of many calls after a warm-up is kept. Each row also
gives the floor, the time the model's matmul/conv/attention FLOPs take at the GPU's measured
peak for that precision plus the bytes it must move (weights, input, output) at the measured
copy bandwidth, knopt's time over that floor, and every side's relative error against a float64
run of the model on the GPU.

knopt runs the program `knopt.optimize` chose (its time and the first run's preparation are
recorded, as are the compile times of torch.compile and of tinygrad's JIT). tinygrad runs the
exported ONNX through its `OnnxRunner` under `TinyJit`, on its CUDA device.

The results file is appended to row by row and side by side, so an interrupted or budgeted run
resumes where it stopped when run again with the same file:

    python benchmarks/gpu.py --out gpu.json --budget 520            # all rows, ~8.7 min a call
    python benchmarks/gpu.py --out gpu.json --models bert --batches 1 --profile-kernels
    python benchmarks/gpu.py --out gpu.json --report                 # table and plot only

The plot (latency per model, sides side by side) is written next to the results file.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_models
import gpu_report
import torch

PEERS = ("eager", "compile-default", "reduce-overhead", "max-autotune", "tinygrad", "knopt")
COMPILE_MODES = {
    "compile-default": None,
    "reduce-overhead": "reduce-overhead",
    "max-autotune": "max-autotune",
}
PRECISIONS = ("f32", "fp16")


class Budget:
    """Wall-clock seconds this run may still start work in."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def spent(self) -> bool:
        """Whether the budget is used up."""
        return time.monotonic() > self.deadline


class Results:
    """The results file: machine facts and rows, rewritten atomically after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"rows": []}
        if path.exists():
            self.data = json.loads(path.read_text())

    def row(self, model: str, batch: int, precision: str) -> dict[str, Any]:
        """The row of a configuration (made empty if new)."""
        for row in self.data["rows"]:
            if (row["model"], row["batch"], row["precision"]) == (model, batch, precision):
                return row
        row = {"model": model, "batch": batch, "precision": precision, "peers": {}}
        self.data["rows"].append(row)
        return row

    def save(self) -> None:
        """Write the file (a temporary renamed over the old one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data, indent=1))
        os.replace(temporary, self.path)


# ---- timing ---------------------------------------------------------------------------------


def latency_ms(call: Callable[[], Any], sync: Callable[[], None], warmup: int, runs: int) -> float:
    """Median milliseconds of synchronize, call, synchronize, after `warmup` calls."""
    for _ in range(warmup):
        call()
    sync()
    times = []
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def relative_error(mine: torch.Tensor, exact: torch.Tensor) -> float:
    """‖mine - exact‖ / ‖exact‖ in float64."""
    mine, exact = mine.double().flatten(), exact.double().flatten()
    return float(torch.linalg.norm(mine - exact) / torch.linalg.norm(exact).clamp_min(1e-300))


def machine() -> dict[str, Any]:
    """The device's copy bandwidth and matmul peaks (torch), and the software versions."""
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": transformers.__version__,
    }
    for name in ("knopt", "tinygrad", "nvmath", "cudnn"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    return {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "versions": versions,
        "copy_GBps": _copy_bandwidth() / 1e9,
        "peak_TFLOPs": {p: _matmul_rate(d) / 1e12 for p, d in _DTYPES.items()},
    }


_DTYPES = {"f32": torch.float32, "fp16": torch.float16}


def _copy_bandwidth() -> float:
    """Bytes per second a device-to-device copy reads plus writes (256 MiB: beyond the L2)."""
    source = torch.randn(1 << 26, device="cuda")
    target = torch.empty_like(source)
    return 2 * source.nbytes / (_device_ms(lambda: target.copy_(source), 20) * 1e-3)


def _matmul_rate(dtype: torch.dtype) -> float:
    """FLOP/s of an 8192^3 matmul in `dtype` (TF32 off for f32)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    return 2 * 8192**3 / (_device_ms(lambda: a @ a, 10) * 1e-3)


def _device_ms(call: Callable[[], Any], repeats: int, stream: Any = None) -> float:
    """GPU milliseconds of `call`, between events on the stream it queues its work on.

    `stream` None is torch's current stream.
    """
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(repeats):
        call()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / repeats


def _free() -> None:
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


# ---- the sides ------------------------------------------------------------------------------


class Row:
    """One (model, batch, precision): its models, input, reference and results."""

    def __init__(
        self,
        args: argparse.Namespace,
        master: torch.nn.Module,
        spec: Any,
        batch: int,
        precision: str,
        onnx_path: Path,
        result: dict[str, Any],
    ) -> None:
        self.args = args
        self.master = master
        self.spec = spec
        self.batch = batch
        self.precision = precision
        self.onnx_path = onnx_path
        self.result = result
        self.x = gpu_models.example(spec, batch)
        self.dtype = torch.float16 if precision == "fp16" else torch.float32
        self._model: torch.nn.Module | None = None
        self.reference = self._reference()

    def _reference(self) -> torch.Tensor:
        model = copy.deepcopy(self.master).cuda().double()
        gpu_models.set_attention(model, "sdpa")
        x = self.x.double() if self.x.is_floating_point() else self.x
        with torch.no_grad():
            out = model(x).detach()
        if "floor_ms" not in self.result:
            self._floor(model, x, out)
        del model
        _free()
        return out

    def _floor(self, model: torch.nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
        item = 2 if self.precision == "fp16" else 4
        flops = gpu_models.count_flops(model, x)
        nbytes = gpu_models.count_bytes(model, x, out, item)
        facts = self.args.machine
        seconds = flops / (facts["peak_TFLOPs"][self.precision] * 1e12)
        seconds += nbytes / (facts["copy_GBps"] * 1e9)
        self.result.update(flops=flops, bytes=nbytes, floor_ms=seconds * 1e3)

    def model(self) -> torch.nn.Module:
        """The torch model at this precision, on the GPU, with SDPA attention."""
        if self._model is None:
            model = copy.deepcopy(self.master).to(device="cuda", dtype=self.dtype)
            gpu_models.set_attention(model, "sdpa")
            self._model = model
        return self._model

    def torch_input(self) -> torch.Tensor:
        """The input at this precision (token ids stay integers)."""
        return self.x.to(self.dtype) if self.x.is_floating_point() else self.x

    def measure(self, peer: str) -> dict[str, Any]:
        """Time one side; its latency, error and preparation times."""
        if peer == "knopt":
            return self._knopt()
        if peer == "tinygrad":
            return self._tinygrad()
        return self._torch(peer)

    def _timed(self, call: Callable[[], Any], sync: Callable[[], None]) -> float:
        return latency_ms(call, sync, self.args.warmup, self.args.runs)

    def _torch(self, peer: str) -> dict[str, Any]:
        model, x = self.model(), self.torch_input()
        entry: dict[str, Any] = {}
        call: Callable[[torch.Tensor], torch.Tensor] = model
        with torch.no_grad():
            if peer != "eager":
                _free()
                began = time.perf_counter()
                call = torch.compile(model, mode=COMPILE_MODES[peer])
                for _ in range(3):  # compiles (and for CUDA graphs, records) on the first calls
                    call(x)
                torch.cuda.synchronize()
                entry["compile_s"] = round(time.perf_counter() - began, 1)
            entry["ms"] = self._timed(lambda: call(x), torch.cuda.synchronize)
            entry["error"] = relative_error(call(x).detach().clone(), self.reference)
            if self.args.profile_kernels and peer != "eager":
                entry["profile"] = torch_profile(lambda: call(x))
        return entry

    def _knopt(self) -> dict[str, Any]:
        import knopt
        from knopt.cuda.runner import CudaRunner
        from knopt.opt.egraph import Limits

        entry: dict[str, Any] = {}
        began = time.perf_counter()
        dynamic = self.onnx_path.stem == self.spec.name  # exported with a symbolic batch
        graph = knopt.load(self.onnx_path, dims={"batch": self.batch} if dynamic else None)
        entry["load_s"] = round(time.perf_counter() - began, 1)
        began = time.perf_counter()
        result = knopt.optimize(
            graph, profile=self.args.knopt_profile, limits=Limits(seconds=self.args.optimize_s)
        )
        entry["optimize_s"] = round(time.perf_counter() - began, 1)
        began = time.perf_counter()
        executable = CudaRunner(self.precision).executable(result.program)
        feeds = {graph.input_names[0]: self.x}
        (out,) = executable.run(feeds, device_outputs=True)
        torch.cuda.synchronize()
        entry["prepare_s"] = round(time.perf_counter() - began, 1)
        entry["kernels"] = len(result.program.launches())
        entry["steps"] = len(executable.plan.steps)
        entry["ms"] = self._timed(
            lambda: executable.run(feeds, device_outputs=True), torch.cuda.synchronize
        )
        stream = torch.cuda.ExternalStream(executable.gpu.stream_handle)
        entry["replay_ms"] = _device_ms(executable.replay, 20, stream)
        (out,) = executable.run(feeds, device_outputs=True)
        entry["error"] = relative_error(torch.as_tensor(out, device="cuda"), self.reference)
        if self.args.profile_kernels:
            entry["profile"] = knopt_profile(executable, feeds)
        return entry

    def _tinygrad(self) -> dict[str, Any]:
        saved = os.environ.get("CC")
        try:
            return self._tinygrad_run()
        finally:  # torch.compile's own builds must not get the wrapper
            if saved is None:
                os.environ.pop("CC", None)
            else:
                os.environ["CC"] = saved

    def _tinygrad_run(self) -> dict[str, Any]:
        os.environ.setdefault("DEV", "CUDA")
        entry: dict[str, Any] = {"cpu_compiler": _tinygrad_cpu_compiler()}
        from tinygrad import Device, Tensor, TinyJit, dtypes
        from tinygrad.nn.onnx import OnnxRunner

        began = time.perf_counter()
        runner = OnnxRunner(self.onnx_path).to("CUDA")
        (name,) = runner.graph_inputs
        output = runner.graph_outputs[0]
        x = Tensor(self.x.cpu().numpy(), device="CUDA")
        if self.precision == "fp16":  # the weights, and a float input, in half precision
            runner.graph_values = {
                k: v.cast(dtypes.half) if isinstance(v, Tensor) and v.dtype == dtypes.float else v
                for k, v in runner.graph_values.items()
            }
            x = x.cast(dtypes.half) if x.dtype == dtypes.float else x
        weights = [v for v in runner.graph_values.values() if isinstance(v, Tensor)]
        Tensor.realize(x, *weights)  # on the GPU once, before the JIT captures
        jit = TinyJit(lambda t: runner({name: t})[output].realize())
        device = Device["CUDA"]
        for _ in range(3):  # the JIT captures on its second call
            jit(x)
        device.synchronize()
        entry["compile_s"] = round(time.perf_counter() - began, 1)
        entry["ms"] = self._timed(lambda: jit(x), device.synchronize)
        result = torch.from_numpy(jit(x).numpy().astype("float64"))
        entry["error"] = relative_error(result, self.reference.cpu())
        return entry


# tinygrad's CPU device (which it starts even when the model runs on CUDA) compiles small
# helper programs with `$CC --target=... - -o -` ($CC defaulting to clang). gcc takes neither
# --target nor an object file written to stdout, so a gcc (no clang, or $CC naming one) gets
# this wrapper in its place (COMPILER: the wrapped one).
_GCC_WRAPPER = """#!/bin/sh
cc='COMPILER'; out=$(mktemp); to_stdout=
for a in "$@"; do shift; case "$a" in --target=*) ;; *) set -- "$@" "$a";; esac; done
for a in "$@"; do shift
if [ "$prev" = "-o" ] && [ "$a" = "-" ]; then set -- "$@" "$out"; to_stdout=1
else set -- "$@" "$a"; fi; prev=$a; done
"$cc" "$@"; status=$?
if [ $status -eq 0 ] && [ -n "$to_stdout" ]; then cat "$out"; fi; rm -f "$out"; exit $status
"""


def _tinygrad_cpu_compiler() -> str:
    """Which C compiler tinygrad's CPU device gets (clang, or a gcc through a wrapper)."""
    chosen = os.environ.get("CC") or shutil.which("clang") or shutil.which("gcc")
    if chosen is None:
        return "none (tinygrad's CPU device will fail to start)"
    if "clang" in Path(chosen).name:
        os.environ["CC"] = chosen
        return chosen
    wrapper = Path(tempfile.mkdtemp(prefix="knopt-cc-")) / "clang"
    wrapper.write_text(_GCC_WRAPPER.replace("COMPILER", chosen))
    wrapper.chmod(0o755)
    os.environ["CC"] = str(wrapper)
    return f"{chosen} (through a wrapper taking clang's arguments)"


# ---- per-kernel profiles --------------------------------------------------------------------


def knopt_profile(executable: Any, feeds: dict[str, Any]) -> dict[str, Any]:
    """Each step of knopt's program run eagerly between CUDA events, grouped by kind."""
    from knopt.cuda.steps import Gemm, Launch, Sdpa

    bound, _held = executable._bind(feeds)  # the GPU feeds stay alive while the calls run
    calls = executable._enqueuers(bound)
    labels = []  # one per call, in the order the executor makes them
    for index, step in enumerate(executable.plan.steps):
        if isinstance(step, Launch):
            labels.append(step.name.split("_")[1])
            continue
        library = executable.library[index][0]  # (plan or None, its tensor ids)
        if isinstance(step, Sdpa):
            cudnn = library is not None
            labels.append("sdpa cudnn" if cudnn else "attention direct")
            labels += ["sdpa nan rows"] if cudnn and step.fixup is not None else []
            continue
        if isinstance(step, Gemm):
            labels.append(f"gemm {step.dtype.short} {step.precision}")
        elif library is None:
            labels.append("conv direct")
        else:
            labels.append(f"conv {step.dtype.short}{' nhwc' if step.channels_last else ''}")
        if step.fallback is not None and not (library is not None and library.fused):
            labels.append("epilogue")
    if len(labels) != len(calls):
        labels = [f"call {i}" for i in range(len(calls))]
    gpu = executable.gpu
    for _ in range(2):
        for call in calls:
            call()
    gpu.sync()
    events = []
    for call in calls:
        start = gpu.event()
        call()
        events.append((start, gpu.event()))
    times = [gpu.elapsed_ms(start, end) for start, end in events]
    return _grouped(labels, times)


def torch_profile(call: Callable[[], Any]) -> dict[str, Any]:
    """The CUDA kernels of a few calls (torch's profiler), grouped by kernel name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    labels, times = [], []
    for event in prof.key_averages():
        if event.device_type.name == "CUDA" or getattr(event, "self_device_time_total", 0):
            labels.append(event.key[:60])
            times.append(getattr(event, "self_device_time_total", 0.0) / 1e3 / 5)
    return _grouped(labels, times)


def _grouped(labels: list[str], times: list[float]) -> dict[str, Any]:
    groups: dict[str, list[float]] = {}
    for label, ms in zip(labels, times, strict=True):
        groups.setdefault(label, []).append(ms)
    total = sum(times)
    return {
        "total_ms": total,
        "groups": sorted(
            (
                {"kind": k, "count": len(v), "ms": sum(v), "share": sum(v) / total if total else 0}
                for k, v in groups.items()
            ),
            key=lambda g: -float(g["ms"]),
        )[:25],
    }


# ---- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace, results: Results) -> bool:
    """Measure every missing (row, side) within the budget; True if all were measured."""
    budget = Budget(args.budget)
    if "device" not in results.data:
        results.data.update(machine())
        results.save()
    args.machine = results.data
    folder = Path(args.onnx_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        spec = gpu_models.MODELS[name]
        master: torch.nn.Module | None = None
        for batch in args.batches:
            for precision in args.precisions:
                result = results.row(name, batch, precision)
                todo = [p for p in args.peers if p not in result["peers"] or args.redo]
                if not todo:
                    continue
                if budget.spent():
                    return False
                if master is None:
                    master = gpu_models.build(spec)
                path = gpu_models.export(master, spec, folder, batch)
                row = Row(args, master, spec, batch, precision, path, result)
                for peer in todo:
                    if budget.spent():
                        results.save()
                        return False
                    print(f"{name} b{batch} {precision} {peer}...", file=sys.stderr, flush=True)
                    # Marked first, so that a side the call's time limit kills is not retried.
                    result["peers"][peer] = {"failed": "interrupted: did not finish in the call"}
                    results.save()
                    try:
                        result["peers"][peer] = row.measure(peer)
                    except Exception as err:  # record it: the other sides still count
                        result["peers"][peer] = {"failed": f"{type(err).__name__}: {err}"[:500]}
                    print(f"  {json.dumps(result['peers'][peer])[:300]}", file=sys.stderr)
                    gpu_report.summarize(result)
                    results.save()
                del row
                _free()
        del master
        _free()
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu.json"), help="results (JSON)")
    parser.add_argument("--models", default=",".join(gpu_models.MODELS))
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--peers", default=",".join(PEERS), help=f"of {', '.join(PEERS)}")
    parser.add_argument("--budget", type=float, default=math.inf, help="seconds to start work in")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--knopt-profile", default="h200-graph", help="cost model: name or file")
    parser.add_argument("--optimize-s", type=float, default=30.0, help="saturation time limit")
    parser.add_argument(
        "--onnx-dir",
        default=str(Path(tempfile.gettempdir()) / "knopt-gpu-onnx"),
        help="where exported models are kept and reused",
    )
    parser.add_argument("--profile-kernels", action="store_true", help="per-kernel breakdowns")
    parser.add_argument("--redo", action="store_true", help="measure rows already in the file")
    parser.add_argument("--report", action="store_true", help="only print the table and plot")
    args = parser.parse_args()
    for key in ("models", "precisions", "peers"):
        setattr(args, key, [v for v in getattr(args, key).split(",") if v])
    args.batches = [int(b) for b in args.batches.split(",")]
    unknown = set(args.peers) - set(PEERS) | set(args.models) - set(gpu_models.MODELS)
    if unknown:
        parser.error(f"unknown models or peers: {sorted(unknown)}")
    results = Results(args.out)
    complete = True
    if not args.report:
        # Strict f32 for torch too: no TF32 in its matmuls or convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        complete = run(args, results)
    print(gpu_report.table(results.data))
    gpu_report.plot(results.data, args.out.with_suffix(".png"))
    if not complete:
        print("budget spent: run the same command again to resume", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
