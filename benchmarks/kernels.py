"""Kernel counts: knopt's fused programs against onnxruntime's fully optimized graphs.

    python benchmarks/kernels.py              # table, and a new entry in benchmarks/RESULTS.md
    python benchmarks/kernels.py --no-record --profile cpu
    python benchmarks/kernels.py --quantized  # the quantized fixtures (tests/fixtures/quantized)

For each committed fixture model: its ONNX node count, the node count onnxruntime reaches with
ORT_ENABLE_ALL (CPU provider, saved with `optimized_model_filepath`: each node is a kernel it
launches), and the number of kernels in the Program `knopt.optimize` chooses (views that need
no launch are not counted). Fewer is better: each kernel is a launch and a round trip of its
output through memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATE = datetime.date.today().isoformat()  # the day the numbers are measured
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Kernel counts vs onnxruntime"
QUANTIZED = ROOT / "tests" / "fixtures" / "quantized"


def _onnxruntime_nodes(path: Path, folder: Path) -> int:
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(folder / f"{path.stem}.ort.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return len(onnx.load(options.optimized_model_filepath).graph.node)


def _paths(quantized: bool) -> list[Path]:
    """The fixture models: the float ones, or the quantized ones."""
    if quantized:
        manifest = json.loads((QUANTIZED / "manifest.json").read_text())
        return [QUANTIZED / entry["file"] for entry in manifest["files"]]
    from tests.models import fixtures

    return [fixture.path for fixture in fixtures()]


def measure(profile: str, quantized: bool = False) -> list[tuple[str, int, int, int, float]]:
    """Per fixture: (file, ONNX nodes, onnxruntime nodes, knopt kernels, optimize seconds)."""
    import onnx

    import knopt

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for path in _paths(quantized):
            onnx_nodes = len(onnx.load(path).graph.node)
            ort_nodes = _onnxruntime_nodes(path, Path(folder))
            began = time.perf_counter()
            result = knopt.optimize(knopt.load(path), profile=profile)
            seconds = time.perf_counter() - began
            kernels = result.report.kernels
            rows.append((path.name, onnx_nodes, ort_nodes, kernels, seconds))
            print(
                f"{path.name:34s} onnx {onnx_nodes:4d}  onnxruntime {ort_nodes:4d}  "
                f"knopt {kernels:4d}  ({seconds:.1f} s)",
                flush=True,
            )
    return rows


def _table(rows: list[tuple[str, int, int, int, float]]) -> list[str]:
    lines = [
        "| model | ONNX nodes | onnxruntime nodes | knopt kernels | knopt / onnxruntime |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for file, onnx_nodes, ort_nodes, kernels, _ in rows:
        lines.append(
            f"| {file} | {onnx_nodes} | {ort_nodes} | {kernels} | {kernels / ort_nodes:.2f} |"
        )
    return lines


def _summary(rows: list[tuple[str, int, int, int, float]]) -> str:
    fewer = sum(kernels < ort_nodes for _, _, ort_nodes, kernels, _ in rows)
    geomean = math.exp(sum(math.log(k / o) for _, _, o, k, _ in rows) / len(rows))
    return (
        f"Fewer kernels than onnxruntime nodes on {fewer} of {len(rows)} models; geometric mean "
        f"of knopt / onnxruntime {geomean:.2f}."
    )


def _record(profile: str, rows: list[tuple[str, int, int, int, float]], quantized: bool) -> None:
    import onnxruntime

    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    which = ", quantized models" if quantized else ""
    flag = " --quantized" if quantized else ""
    entry = [
        "",
        f"{SECTION}{which} ({DATE}, profile {profile})",
        "",
        f"`python benchmarks/kernels.py{flag} --profile {profile}` ({machine}, onnxruntime "
        f"{onnxruntime.__version__}). onnxruntime: ORT_ENABLE_ALL on the CPU provider, nodes of "
        "the saved optimized model; knopt: kernels of the Program `knopt.optimize` chose under "
        f"the '{profile}' cost model.",
        "",
        *_table(rows),
        "",
        _summary(rows),
    ]
    RESULTS.write_text(text.rstrip("\n") + "\n" + "\n".join(entry) + "\n")


def main() -> int:
    """Count, print, and append an entry to RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200", help="knopt's cost model (default: h200)")
    parser.add_argument("--no-record", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument(
        "--quantized", action="store_true", help="the quantized fixtures (tests/fixtures/quantized)"
    )
    args = parser.parse_args()
    rows = measure(args.profile, args.quantized)
    print(_summary(rows))
    if not args.no_record:
        _record(args.profile, rows, args.quantized)
        print(f"recorded in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
