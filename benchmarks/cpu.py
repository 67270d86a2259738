"""knopt's CPU executor against onnxruntime's CPU provider on the committed fixture models.

    python benchmarks/cpu.py                  # table, and a new entry in benchmarks/RESULTS.md
    python benchmarks/cpu.py --no-record --models gpt2
    python benchmarks/cpu.py --profile        # where the executor's time goes, by IR op

Both run in the same process, on the same random inputs: a few warm-up runs, then the median of
N runs. Each thread setting runs in its own child process, because BLAS reads its thread count
when numpy is first imported: "1 thread" sets OPENBLAS_NUM_THREADS=1 (and onnxruntime's
intra_op_num_threads=1), "default" leaves both libraries to choose.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATE = datetime.date.today().isoformat()  # the day the numbers are measured
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## CPU executor vs onnxruntime"
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _median_ms(run: Callable[[], object], warmup: int, runs: int) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


@dataclass(frozen=True)
class Row:
    """One model's median latencies; `knopt_ms` is None where knopt cannot load the model."""

    model: str
    ort_ms: float
    knopt_ms: float | None

    @property
    def ratio(self) -> float | None:
        """The ratio of knopt's latency to onnxruntime's."""
        return None if self.knopt_ms is None else self.knopt_ms / self.ort_ms


def measure(threads: str, warmup: int, runs: int, models: list[str]) -> list[Row]:
    """Latencies of every selected fixture on knopt and onnxruntime, in this process."""
    import onnxruntime as ort

    import knopt
    from tests.models import fixtures

    rows: list[Row] = []
    for fixture in fixtures():
        if models and not any(m in fixture.file for m in models):
            continue
        feeds = fixture.feeds()
        options = ort.SessionOptions()
        if threads == "1":
            options.intra_op_num_threads = 1
        reference = ort.InferenceSession(
            str(fixture.path), options, providers=["CPUExecutionProvider"]
        )
        ort_ms = _median_ms(partial(reference.run, None, feeds), warmup, runs)
        try:
            session = knopt.compile(fixture.path)
        except knopt.KnoptError:
            rows.append(Row(fixture.file, ort_ms, None))
            continue
        knopt_ms = _median_ms(partial(session.run, None, feeds), warmup, runs)
        rows.append(Row(fixture.file, ort_ms, knopt_ms))
    return rows


def _child(threads: str, args: argparse.Namespace) -> list[Row]:
    env = dict(os.environ)
    for name in _THREAD_VARIABLES:
        env.pop(name, None)
        if threads == "1":
            env[name] = "1"
    command = [
        sys.executable,
        __file__,
        "--child",
        threads,
        "--warmup",
        str(args.warmup),
        "--runs",
        str(args.runs),
        *(["--models", *args.models] if args.models else []),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return [Row(**row) for row in json.loads(done.stdout)]


def _table(single: list[Row], default: list[Row]) -> list[str]:
    lines = [
        "| model | knopt 1T ms | ort 1T ms | ratio 1T | knopt ms | ort ms | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratios: tuple[list[float], list[float]] = ([], [])
    for one, many in zip(single, default, strict=True):
        cells = [one.model]
        for row, kept in ((one, ratios[0]), (many, ratios[1])):
            if row.knopt_ms is None or row.ratio is None:
                cells += ["not supported", f"{row.ort_ms:.3f}", "-"]
                continue
            kept.append(row.ratio)
            cells += [f"{row.knopt_ms:.3f}", f"{row.ort_ms:.3f}", f"{row.ratio:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    means = [statistics.geometric_mean(r) if r else float("nan") for r in ratios]
    lines.append(f"| geometric mean | | | {means[0]:.1f}x | | | {means[1]:.1f}x |")
    return lines


def _machine() -> str:
    import numpy as np
    import onnxruntime as ort

    return (
        f"{platform.platform()}, {platform.processor() or platform.machine()}, "
        f"os.cpu_count() = {os.cpu_count()}; Python {platform.python_version()}, "
        f"numpy {np.__version__}, onnxruntime {ort.__version__}"
    )


def _record(label: str, args: argparse.Namespace, table: list[str]) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\nMade by `python benchmarks/cpu.py`.\n"
    entry = [
        "",
        f"### {DATE}: {label}",
        "",
        f"Machine: {_machine()}. Warm-up {args.warmup} runs, then the median of {args.runs}; "
        "1T is one thread for both (OPENBLAS_NUM_THREADS=1, intra_op_num_threads=1), the "
        "others use each library's default threads. Ratio is knopt / onnxruntime.",
        "",
        *table,
    ]
    start = text.index(SECTION)
    following = text.find("\n## ", start + len(SECTION))
    end = len(text) if following < 0 else following
    text = text[:end].rstrip("\n") + "\n" + "\n".join(entry) + "\n" + text[end:]
    RESULTS.write_text(text)


def profile(models: list[str], runs: int) -> None:
    """Print the executor's time per IR op, summed over the selected fixtures."""
    import knopt
    from knopt.cpu.executor import run_graph
    from knopt.ir.bind import bind_symbols, infer_sizes
    from tests.models import fixtures

    seconds: dict[str, float] = {}
    calls: collections.Counter[str] = collections.Counter()
    for fixture in fixtures():
        if models and not any(m in fixture.file for m in models):
            continue
        try:
            graph = knopt.load(fixture.path)
        except knopt.KnoptError:
            continue
        feeds = fixture.feeds()
        graph = bind_symbols(graph, infer_sizes(graph, {k: v.shape for k, v in feeds.items()}))
        run_graph(graph, feeds)  # warm up
        for _ in range(runs):
            run_graph(graph, feeds, seconds)
        calls.update(node.op.name for node in graph.nodes)
    total = sum(seconds.values())
    print(f"{'op':18s} {'ms per run':>10s} {'share':>6s} {'nodes':>7s} {'us per node':>12s}")
    for name, spent in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(
            f"{name:18s} {spent * 1e3 / runs:10.3f} {spent / total:6.1%} "
            f"{calls[name]:7d} {spent / runs / calls[name] * 1e6:12.1f}"
        )
    print(f"{'total':18s} {total * 1e3 / runs:10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per model")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--models", nargs="*", default=[], help="only files containing these")
    parser.add_argument("--label", default="knopt CPU executor", help="names the RESULTS entry")
    parser.add_argument("--no-record", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument("--profile", action="store_true", help="time the executor by IR op")
    parser.add_argument("--child", choices=["1", "default"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        rows = measure(args.child, args.warmup, args.runs, args.models)
        print(json.dumps([asdict(row) for row in rows]))
        return
    if args.profile:
        profile(args.models, args.runs)
        return
    table = _table(_child("1", args), _child("default", args))
    print("\n".join(table))
    if not args.no_record:
        _record(args.label, args, table)
        print(f"\nrecorded in {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
