"""The fusion caps of rules/fusion.egg, varied: what a longer or shorter fused body costs.

    python benchmarks/fusion_caps.py              # on a GPU: optimize, compile, run
    python benchmarks/fusion_caps.py --cpu-only   # anywhere: the optimizer's side only

fusion.egg caps an elementwise body at 12 scalar ops and a reduction's, softmax's or norm's
epilogue at 8. For each cap (the other held at its default) and each workload, this prints:
the kernels `knopt.optimize` chooses, the longest fused body among them, the e-graph's size
and the optimize time; with a GPU, also the NVRTC time to compile the program from a cold cache,
the most registers and local (spill) bytes per thread of any generated kernel, and the median
time of one replay of the program's CUDA graph.

Workloads (nothing is downloaded): a chain of 40 elementwise ops over 16M f32, built in code
(only the cap decides where it is cut), and the committed BERT, GPT-2 and ViT fixture models at
their test shapes (real bodies: residuals, GELU, LayerNorm tails). The caps are literals in
fusion.egg; this script runs optimize with copies of the shipped rule files whose cap literals
are replaced.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import knopt  # noqa: E402
import knopt.opt.egraph  # noqa: E402
from knopt.ir import Binary, DType, Graph, GraphBuilder, Unary  # noqa: E402
from knopt.opt.egraph import Limits  # noqa: E402
from knopt.opt.rules import RuleFile, shipped_rule_files  # noqa: E402
from tests.models import MODELS, fixtures  # noqa: E402

BODY, EPILOGUE = 12, 8  # the caps as shipped
BODY_CAPS = (4, 8, 12, 16, 24, 32)
EPILOGUE_CAPS = (2, 4, 8, 12, 16)
# A body's cap is a literal at the end of a guard on `body-size`: `(< (body-size bx) 12)`; an
# epilogue's is the reductions' and softmax's `(set (epilogue-cap y) 8)` (norms', which may
# quantize their result, and integer products', which carry their dequantization and
# requantization, have caps of their own). Lines of fusion.egg with each:
_GUARDS = {"body": 12, "epilogue": 2}


def fusion_rules(body: int, epilogue: int) -> list[RuleFile]:
    """The shipped rule files with fusion.egg's caps replaced.

    Raises:
        RuntimeError: If fusion.egg's guards no longer look as this script expects.
    """
    files = []
    for rule_file in shipped_rule_files():
        if rule_file.name == "fusion.egg":
            rule_file = dataclasses.replace(
                rule_file, text=_with_caps(rule_file.text, body, epilogue)
            )
        files.append(rule_file)
    return files


def _with_caps(text: str, body: int, epilogue: int) -> str:
    lines, found = [], {"body": 0, "epilogue": 0}
    for line in text.splitlines(keepends=True):
        if "(set (epilogue-cap y) 8)" in line:  # norms' and integer products' keep theirs
            line = line.replace("(epilogue-cap y) 8)", f"(epilogue-cap y) {epilogue})")
            found["epilogue"] += 1
        elif "(body-size b" in line and re.search(r" 12\)", line):
            line, found["body"] = re.sub(r" 12\)", f" {body})", line), found["body"] + 1
        lines.append(line)
    if found != _GUARDS:
        raise RuntimeError(
            f"fusion.egg has {found} cap guards, not {_GUARDS}: update benchmarks/fusion_caps.py"
        )
    return "".join(lines)


@contextmanager
def caps(body: int, epilogue: int) -> Iterator[None]:
    """Optimize with fusion caps other than the shipped ones."""
    files = fusion_rules(body, epilogue)
    with mock.patch.object(knopt.opt.egraph, "shipped_rule_files", lambda: list(files)):
        yield


def chain(length: int = 40, elements: int = 1 << 24) -> Graph:
    """`length` elementwise ops in a row over one f32 input (a mix that no rule shortens)."""
    g = GraphBuilder(f"chain-{length}")
    x = g.input("x", (elements,), DType.F32)
    value = x
    steps: list[Callable[[Any], Any]] = [
        lambda v: g.unary(Unary.SIN, v),
        lambda v: g.binary(Binary.MUL, v, g.constant(np.array(1.5, np.float32))),
        lambda v: g.unary(Unary.TANH, v),
        lambda v: g.binary(Binary.ADD, v, x),
    ]
    for step in range(length):
        value = steps[step % len(steps)](value)
    g.output(value, "y")
    return g.build()


def fixture(file: str) -> tuple[Graph, dict[str, np.ndarray]]:
    """A committed fixture model with its sizes fixed to its test shapes, and random inputs."""
    (found,) = [f for f in fixtures() if f.file == file]
    dims = {
        name: spec["shape"][int(axis)]
        for spec in found.inputs
        for axis, name in spec.get("dynamic_axes", {}).items()
    }
    return knopt.load(MODELS / file, dims=dims), found.feeds()


def _chain() -> tuple[Graph, dict[str, np.ndarray]]:
    graph = chain()
    rng = np.random.default_rng(0)
    return graph, {"x": rng.standard_normal(1 << 24).astype(np.float32)}


WORKLOADS: dict[str, Callable[[], tuple[Graph, dict[str, np.ndarray]]]] = {
    "chain-40": _chain,
    "bert": lambda: fixture("bert_ts14.onnx"),
    "gpt2": lambda: fixture("gpt2_ts14.onnx"),
    "vit": lambda: fixture("vit_ts14.onnx"),
}


def _ops(expr: Any) -> int:
    """Scalar ops in a fused body (loads, constants and the accumulator are free)."""
    if expr is None or not dataclasses.is_dataclass(expr):
        return 0
    children = [getattr(expr, f.name) for f in dataclasses.fields(expr)]
    inner = [c for c in children if dataclasses.is_dataclass(c)]
    return (1 + sum(_ops(c) for c in inner)) if inner else 0


def optimize_row(graph: Graph, body: int, epilogue: int) -> tuple[dict[str, Any], Any]:
    """The optimizer's side of one (workload, caps) point, and the program."""
    began = time.perf_counter()
    with caps(body, epilogue):
        result = knopt.optimize(graph, profile="h200", limits=Limits(seconds=300.0))
    kernels = result.program.launches()
    row = {
        "kernels": len(kernels),
        "longest body": max(_ops(k.body) for k in kernels),
        "longest epilogue": max(_ops(k.epilogue) for k in kernels),
        "e-nodes": result.report.egraph_nodes,
        "optimize s": round(time.perf_counter() - began, 2),
    }
    return row, result.program


def gpu_row(program: Any, feeds: dict[str, np.ndarray], repeat: int = 50) -> dict[str, Any]:
    """Cold NVRTC compile time, registers and spills, and the median replay time."""
    from knopt.cuda import prepare

    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ):
        os.environ["KNOPT_CACHE_DIR"] = cache  # a cold cache: every kernel compiles
        began = time.perf_counter()
        executable = prepare(program)
        compile_s = time.perf_counter() - began
        executable.run(feeds, device_outputs=True)  # eager; the first replay captures the graph
        gpu = executable.gpu
        times = []
        for _ in range(repeat):
            start = gpu.event()
            executable.replay()
            times.append(gpu.elapsed_ms(start, gpu.event()))
    attributes = [k.attributes for k in executable.kernels.values()]
    return {
        "compile s": round(compile_s, 2),
        "max regs": max((a.num_regs for a in attributes), default=0),
        "max spill B": max((a.local_size_bytes for a in attributes), default=0),
        "replay ms": round(statistics.median(times), 4),
    }


def _print_table(rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, "")).rjust(widths[c]) for c in columns), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-only", action="store_true", help="skip compiling and running")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    args = parser.parse_args()
    points = [(b, EPILOGUE) for b in BODY_CAPS]
    points += [(BODY, e) for e in EPILOGUE_CAPS if e != EPILOGUE]
    rows = []
    for name in args.workload or list(WORKLOADS):
        graph, feeds = WORKLOADS[name]()
        for body, epilogue in points:
            row: dict[str, Any] = {"workload": name, "body cap": body, "epilogue cap": epilogue}
            optimized, program = optimize_row(graph, body, epilogue)
            row.update(optimized)
            if not args.cpu_only:
                row.update(gpu_row(program, feeds))
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    _print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
