"""The ONNX files `knopt optimize` writes, run in onnxruntime against the models they came from.

    python benchmarks/onnx_output.py               # table, and a new entry in RESULTS.md
    python benchmarks/onnx_output.py --no-record --runs 100 bert gpt2

For every committed fixture model (tests/fixtures/models), knopt's demo, models derived from
fixtures with onnxruntime's own tools (float16 weights and activations, QDQ static and dynamic
int8 quantization, made in a temporary folder at the start) and the committed quantized
fixtures with 8-bit activations (tests/fixtures/quantized: QDQ and dynamic): the onnxruntime CPU
latency (ORT_ENABLE_ALL, one intra-op thread and onnxruntime's default, the median of many runs)
of the original and of knopt's output for `--target onnx` and `--target onnxruntime`, all
sessions of one model in one process, run interleaved; and the node counts of the original,
of onnxruntime's own saved optimized model, of onnxsim's and onnxslim's outputs (when they are
installed: `pip install onnxsim onnxslim`) and of knopt's two outputs. A second session of the
original, run interleaved like the others, measures the noise: its ratio to the first would be
1.00 on a quiet machine. Every output is checked against the original's on random inputs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATE = datetime.date.today().isoformat()  # the day the numbers are measured
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## ONNX output in onnxruntime"
TRANSFORMERS = ("bert", "gpt2", "llama", "vit")  # the transformer architectures (float32)
SESSIONS = ("original", "again", "onnx", "onnxruntime")  # "again": the original, for noise


@dataclass
class Row:
    """One model's measurements."""

    file: str
    nodes: dict[str, int | None] = field(default_factory=dict)
    latency: dict[int, dict[str, float]] = field(default_factory=dict)  # threads -> us
    error: float = (
        0.0  # largest |knopt - original| over outputs, relative to the largest |original|
    )


def _session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads  # 0: onnxruntime's default
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def _onnxruntime_nodes(model: Any, folder: Path) -> int:
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(folder / "ort.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return len(onnx.load(options.optimized_model_filepath).graph.node)


def _simplifier_nodes(model: Any) -> dict[str, int | None]:
    """Node counts after onnxsim and onnxslim, None where one is not installed or fails."""
    counts: dict[str, int | None] = {}
    for name in ("onnxsim", "onnxslim"):
        try:
            module = __import__(name)
        except ImportError:
            counts[name] = None
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                if name == "onnxsim":
                    simplified, ok = module.simplify(model)
                    counts[name] = len(simplified.graph.node) if ok else None
                else:
                    counts[name] = len(module.slim(model).graph.node)
            except Exception:  # a third-party tool's failure is a row entry, not an abort
                counts[name] = None
    return counts


def _latency(
    models: dict[str, Any], feeds: dict[str, np.ndarray], threads: int, runs: int
) -> dict[str, float]:
    """Median microseconds per run of each model, sessions interleaved run by run."""
    sessions = {name: _session(model, threads) for name, model in models.items()}
    for session in sessions.values():
        for _ in range(max(10, runs // 10)):
            session.run(None, feeds)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, session in sessions.items():
            began = time.perf_counter()
            session.run(None, feeds)
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def _error(original: Any, written: Any, feeds: dict[str, np.ndarray]) -> float:
    expected = _session(original, 1).run(None, feeds)
    got = _session(written, 1).run(None, feeds)
    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        if e.size:
            scale = max(float(np.max(np.abs(e.astype(np.float64)))), 1e-6)
            worst = max(worst, float(np.max(np.abs(e.astype(np.float64) - g))) / scale)
    return worst


def _models(folder: Path) -> list[tuple[str, Path, dict[str, np.ndarray]]]:
    from tests.models import fixtures

    models = [(f.file, f.path, f.feeds()) for f in fixtures()]
    demo = ROOT / "knopt" / "data" / "demo.onnx"
    models.append(("demo.onnx", demo, _random_feeds(demo)))
    return models + _derived(folder) + _quantized()


def _quantized() -> list[tuple[str, Path, dict[str, np.ndarray]]]:
    """The committed quantized fixtures whose activations are 8-bit too (QDQ and dynamic)."""
    import json

    from tests.models import Fixture

    folder = ROOT / "tests" / "fixtures" / "quantized"
    made = []
    for entry in json.loads((folder / "manifest.json").read_text())["files"]:
        if entry["variant"].startswith("qdq") or entry["variant"] == "dynamic":
            fixture = Fixture(entry["file"], entry["model"], entry["variant"], entry["inputs"])
            made.append((f"quantized/{entry['file']}", folder / entry["file"], fixture.feeds()))
    return made


def _derived(folder: Path) -> list[tuple[str, Path, dict[str, np.ndarray]]]:
    """Float16, QDQ and dynamically quantized variants of fixtures, made by onnxruntime's tools."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    from tests.models import fixtures

    by_file = {f.file: f for f in fixtures()}

    class Calibration(CalibrationDataReader):
        def __init__(self, file: str) -> None:
            self.feeds = iter([by_file[file].feeds(seed=seed) for seed in range(8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    made = []
    for model in ("bert", "convnext"):
        base = by_file[f"{model}_dynamo18.onnx"]
        half = OnnxModel(convert_float_to_float16(onnx.load(base.path), keep_io_types=True))
        half.topological_sort()  # the converter leaves its input casts after their readers
        path = folder / f"{model}_fp16.onnx"
        onnx.save(half.model, path)
        made.append((path.name, path, base.feeds()))
    base = by_file["resnet_dynamo18.onnx"]
    path = folder / "resnet_qdq.onnx"
    with contextlib.redirect_stderr(io.StringIO()):
        quantize_static(base.path, path, Calibration(base.file), quant_format=QuantFormat.QDQ)
    made.append((path.name, path, base.feeds()))
    base = by_file["bert_dynamo18.onnx"]
    path = folder / "bert_dynamic_int8.onnx"
    quantize_dynamic(base.path, path, weight_type=QuantType.QInt8)
    made.append((path.name, path, base.feeds()))
    return made


def _random_feeds(path: Path) -> dict[str, np.ndarray]:
    import onnx

    rng = np.random.default_rng(0)
    feeds = {}
    for info in onnx.load(path).graph.input:
        dims = [d.dim_value or 2 for d in info.type.tensor_type.shape.dim]
        feeds[info.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def measure(names: list[str], runs: int) -> list[Row]:
    """Optimize, write, count and time every model whose file name contains one of `names`."""
    import onnx

    import knopt
    from knopt.onnx.load import default_opset

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for file, path, feeds in _models(Path(folder)):
            if names and not any(name in file for name in names):
                continue
            original = onnx.load(path)
            result = knopt.optimize(knopt.load(path))
            opset = max(18, default_opset(original))
            written = {
                target: knopt.save(result, None, opset=opset, target=target)
                for target in ("onnx", "onnxruntime")
            }
            row = Row(file)
            row.nodes = {
                "original": len(original.graph.node),
                "onnxruntime": _onnxruntime_nodes(original, Path(folder)),
                **_simplifier_nodes(original),
                **{f"knopt {t}": len(m.graph.node) for t, m in written.items()},
            }
            row.error = max(_error(original, m, feeds) for m in written.values())
            models = {"original": original, "again": original, **written}
            for threads in (1, 0):
                row.latency[threads] = _latency(models, feeds, threads, runs)
            rows.append(row)
            _print(row)
    return rows


def _ratio(row: Row, threads: int, session: str) -> float:
    times = row.latency[threads]
    return times[session] / times["original"]


def _print(row: Row) -> None:
    one = row.latency[1]
    print(
        f"{row.file:30s} nodes {row.nodes}  1 thread: original {one['original']:.1f} us, "
        f"onnx x{_ratio(row, 1, 'onnx'):.2f}, onnxruntime x{_ratio(row, 1, 'onnxruntime'):.2f}, "
        f"noise x{_ratio(row, 1, 'again'):.2f}; default threads: onnx "
        f"x{_ratio(row, 0, 'onnx'):.2f}, onnxruntime x{_ratio(row, 0, 'onnxruntime'):.2f}, "
        f"noise x{_ratio(row, 0, 'again'):.2f}; error {row.error:.1e}",
        flush=True,
    )


def _count(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "| model | nodes: original | onnxruntime | onnxsim | onnxslim | knopt onnx | knopt ort "
        "| 1 thread: original us | knopt onnx | knopt ort | noise "
        "| default threads: original us | knopt onnx | knopt ort | noise |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    for row in rows:
        n = row.nodes
        cells = [row.file, *(_count(n[k]) for k in ("original", "onnxruntime", "onnxsim"))]
        cells += [_count(n[k]) for k in ("onnxslim", "knopt onnx", "knopt onnxruntime")]
        for threads in (1, 0):
            cells.append(f"{row.latency[threads]['original']:.1f}")
            cells += [f"{_ratio(row, threads, s):.2f}" for s in ("onnx", "onnxruntime", "again")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _summary(rows: list[Row]) -> list[str]:
    lines = []
    for threads, label in ((1, "one thread"), (0, "default threads")):
        for target in ("onnx", "onnxruntime"):
            ratios = [_ratio(r, threads, target) for r in rows]
            worst = max(rows, key=lambda r: _ratio(r, threads, target))
            transformers = [_ratio(r, threads, target) for r in rows if _is_transformer(r)]
            quantized = [_ratio(r, threads, target) for r in rows if _kind(r) == "quantized"]
            noise = [abs(math.log(_ratio(r, threads, "again"))) for r in rows]
            lines.append(
                f"- {label}, `--target {target}`: knopt / original latency geometric mean "
                f"{_geomean(ratios):.2f} (transformers {_geomean(transformers):.2f}, quantized "
                f"{_geomean(quantized):.2f}), worst "
                f"{_ratio(worst, threads, target):.2f} ({worst.file}), at most 1.05 on "
                f"{sum(x <= 1.05 for x in ratios)} of {len(rows)}; noise (original against "
                f"itself) median {math.exp(statistics.median(noise)):.3f}, worst "
                f"{math.exp(max(noise)):.3f}."
            )
    slim = [r for r in rows if r.nodes.get("onnxslim") is not None]
    for target in ("onnx", "onnxruntime"):
        fewer = sum(r.nodes[f"knopt {target}"] <= r.nodes["onnxslim"] for r in slim)  # type: ignore[operator]
        lines.append(
            f"- `--target {target}` nodes at most onnxslim's on {fewer} of {len(slim)} models."
        )
    for label, members in (
        ("float32", [r for r in rows if _kind(r) == "float32"]),
        ("float16", [r for r in rows if _kind(r) == "float16"]),
        ("quantized", [r for r in rows if _kind(r) == "quantized"]),
    ):
        if members:
            worst = max(members, key=lambda r: r.error)
            lines.append(
                f"- Largest output difference of the {label} models, relative to the largest "
                f"output: {worst.error:.1e} ({worst.file})."
            )
    return lines


def _kind(row: Row) -> str:
    """float32, float16 or quantized: what the model computes in."""
    if "_fp16" in row.file:
        return "float16"
    quantized = ("_qdq" in row.file, "int8" in row.file, "_dynamic" in row.file)
    return "quantized" if any(quantized) else "float32"


def _is_transformer(row: Row) -> bool:
    return row.file.startswith(TRANSFORMERS) and _kind(row) == "float32"


def _record(rows: list[Row], runs: int) -> None:
    import onnxruntime

    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, onnxruntime {onnxruntime.__version__}"
    )
    entry = [
        "",
        f"{SECTION} ({DATE})",
        "",
        f"`nice python benchmarks/onnx_output.py --runs {runs}` ({machine}). Latency: median "
        f"of {runs} runs per session, sessions interleaved; ratios are knopt's output over the "
        "original; 'noise' is a second session of the original over the first. Default threads: "
        "onnxruntime's intra-op default.",
        "",
        *_table(rows),
        "",
        *_summary(rows),
    ]
    RESULTS.write_text(text.rstrip("\n") + "\n" + "\n".join(entry) + "\n")


def main() -> int:
    """Measure, print, and append an entry to RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only models whose file name contains one")
    parser.add_argument("--runs", type=int, default=500, help="timed runs per session")
    parser.add_argument("--no-record", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args()
    rows = measure(args.names, args.runs)
    print("\n".join(_summary(rows)))
    if not args.no_record:
        _record(rows, args.runs)
        print(f"recorded in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
