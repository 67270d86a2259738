"""Which kernels next to a GEMM could still join it, at batch 1: what is left to fuse.

    python benchmarks/gemm_epilogues.py              # table, and an entry in benchmarks/RESULTS.md
    python benchmarks/gemm_epilogues.py --no-record

For each transformer fixture (BERT, GPT-2, LLaMA, ViT; both export styles) optimized under the
'h200' cost model at batch 1, every kernel of the Program that is not a GEMM but touches one is
sorted by what keeps it a launch of its own:

- *epilogue, not in cuBLASLt*: an elementwise kernel that is the only reader of a GEMM's result
  and reads it once, whose body uses an op cuBLASLt's epilogues lack (they take a scale, a bias,
  a residual, RELU and the tanh GELU). A GEMM with a generated epilogue would absorb it.
- *epilogue, two slices*: an elementwise kernel that reads two slices of one GEMM's result
  (SwiGLU's gate and up halves, rotary embeddings' two halves): an epilogue would need both
  columns in one thread, which a generated GEMM can arrange by interleaving the weights.
- *norm prologue*: a LayerNorm or RMSNorm kernel whose result only GEMMs read: fusing it needs
  a GEMM that computes row statistics over its whole K extent first.
- *norm epilogue*: a norm kernel that is the only reader of a GEMM's result: the GEMM's tile
  would need whole rows (the hidden size) to normalize them.

The table says how many launches each would save; nothing is fused by this script.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import knopt  # noqa: E402
from knopt.ir import Graph, bind_symbols  # noqa: E402
from knopt.ir.op import Binary, Unary  # noqa: E402
from knopt.ir.program import (  # noqa: E402
    Acc,
    BinaryE,
    CastE,
    ClampE,
    Const,
    Expr,
    Kernel,
    Load,
    Program,
    UnaryE,
    WhereE,
)
from tests.models import Fixture, fixtures  # noqa: E402

DATE = datetime.date.today().isoformat()  # the day the numbers are measured
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## What is left next to the GEMMs"
MODELS = ("bert", "gpt2", "llama", "vit")
GEMMS = frozenset({"matmul", "MatMul"})
NORMS = frozenset({"layer_norm", "rms_norm", "LayerNorm", "RmsNorm"})
# What cuBLASLt's epilogues compute besides the product: scale, bias and residual adds, RELU
# (a clamp at 0) and the tanh GELU.
LIBRARY_UNARY = frozenset({Unary.RELU, Unary.GELU_TANH})
LIBRARY_BINARY = frozenset({Binary.ADD, Binary.MUL})
REASONS = ("epilogue, not in cuBLASLt", "epilogue, two slices", "norm prologue", "norm epilogue")


@dataclass
class Row:
    """One fixture: its kernels, GEMMs, and the kernels next to a GEMM by what keeps them."""

    file: str
    kernels: int
    gemms: int
    left: Counter[str]
    ops: Counter[str]  # the ops cuBLASLt lacks, over the "not in cuBLASLt" kernels


def _ops(expr: Expr) -> list[str]:
    """The ops of a body that a cuBLASLt epilogue cannot compute."""
    if isinstance(expr, Load | Acc | Const):
        return []
    if isinstance(expr, UnaryE):
        own = [] if expr.kind in LIBRARY_UNARY else [expr.kind.name]
        return own + _ops(expr.x)
    if isinstance(expr, BinaryE):
        own = [] if expr.kind in LIBRARY_BINARY else [expr.kind.name]
        return own + _ops(expr.a) + _ops(expr.b)
    if isinstance(expr, ClampE):
        own = [] if expr.lo == 0.0 and expr.hi == float("inf") else ["CLAMP"]
        return own + _ops(expr.x)
    if isinstance(expr, CastE):
        return ["CAST", *_ops(expr.x)]
    assert isinstance(expr, WhereE)
    return ["WHERE", *_ops(expr.condition), *_ops(expr.a), *_ops(expr.b)]


def _loads(expr: Expr) -> Counter[int]:
    """How often a body reads each of its inputs."""
    if isinstance(expr, Load):
        return Counter({expr.index: 1})
    found: Counter[int] = Counter()
    for child in vars(expr).values():
        if isinstance(child, Load | Acc | Const | UnaryE | BinaryE | ClampE | CastE | WhereE):
            found += _loads(child)
    return found


class _Flow:
    """Who writes and who reads each tensor of a program, seen through views."""

    def __init__(self, program: Program) -> None:
        self.writer: dict[int, Kernel] = {k.output: k for k in program.kernels}
        self.readers: dict[int, list[Kernel]] = {}
        for kernel in program.launches():
            for tid in kernel.inputs:
                self.readers.setdefault(self.source(tid), []).append(kernel)
        self.outputs = {self.source(t) for t in program.outputs}

    def source(self, tid: int) -> int:
        """The tensor a view (of a view...) reads, or `tid` itself."""
        kernel = self.writer.get(tid)
        while kernel is not None and kernel.is_view:
            tid = kernel.inputs[0]
            kernel = self.writer.get(tid)
        return tid

    def gemm_of(self, tid: int) -> Kernel | None:
        kernel = self.writer.get(self.source(tid))
        return kernel if kernel is not None and kernel.kind in GEMMS else None

    def only_reader(self, tid: int) -> bool:
        return len(self.readers.get(tid, [])) == 1 and tid not in self.outputs


def _reason(flow: _Flow, kernel: Kernel) -> str | None:
    """What keeps a kernel next to a GEMM from joining it, or None if it touches no GEMM."""
    if kernel.kind in NORMS:
        gemms = [flow.gemm_of(t) for t in kernel.inputs]
        if any(g is not None and flow.only_reader(g.output) for g in gemms):
            return REASONS[3]
        readers = flow.readers.get(kernel.output, [])
        if readers and all(r.kind in GEMMS for r in readers):
            return REASONS[2]
        return None
    if kernel.kind != "elementwise" or kernel.body is None:
        return None
    reads = _loads(kernel.body)
    gemms = [flow.gemm_of(t) for t in kernel.inputs]
    sources = Counter(g.output for g in gemms if g is not None)
    if any(count > 1 for count in sources.values()):
        return REASONS[1]  # two slices (or views) of one GEMM's result
    for index, gemm in enumerate(gemms):
        if gemm is not None and reads[index] == 1 and flow.only_reader(gemm.output):
            return REASONS[0]
    return None


def measure(fixture: Fixture) -> Row:
    """Optimize one fixture at batch 1 and sort its kernels."""
    graph: Graph = knopt.load(fixture.path)
    sizes = {  # the manifest's test sizes, with a batch of 1
        name: 1 if name == "batch" else spec["shape"][int(axis)]
        for spec in fixture.inputs
        for axis, name in spec.get("dynamic_axes", {}).items()
    }
    if sizes:
        graph = bind_symbols(graph, sizes)
    program = knopt.optimize(graph, profile="h200").program
    flow = _Flow(program)
    left: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    for kernel in program.launches():
        reason = _reason(flow, kernel)
        if reason is None:
            continue
        left[reason] += 1
        if reason == REASONS[0] and kernel.body is not None:
            ops.update(set(_ops(kernel.body)))
    launches = program.launches()
    gemms = sum(k.kind in GEMMS for k in launches)
    return Row(fixture.file, len(launches), gemms, left, ops)


def _table(rows: list[Row]) -> list[str]:
    lines = [
        "| model | kernels | GEMMs | " + " | ".join(REASONS) + " | ops cuBLASLt lacks |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in REASONS) + " | --- |",
    ]
    for row in rows:
        counts = " | ".join(str(row.left[r]) for r in REASONS)
        ops = ", ".join(f"{op} ({n})" for op, n in sorted(row.ops.items())) or "-"
        lines.append(f"| {row.file} | {row.kernels} | {row.gemms} | {counts} | {ops} |")
    return lines


def _record(rows: list[Row]) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    machine = f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    entry = [
        "",
        f"{SECTION} ({DATE})",
        "",
        f"`python benchmarks/gemm_epilogues.py` ({machine}): the transformer fixtures at batch 1 "
        "under the 'h200' cost model; each column counts the kernels that stay launches of "
        "their own next to a GEMM, by what keeps them (the script's docstring says how they "
        "are told apart).",
        "",
        *_table(rows),
    ]
    RESULTS.write_text(text.rstrip("\n") + "\n" + "\n".join(entry) + "\n")


def main() -> int:
    """Sort, print, and append an entry to RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args()
    rows = []
    for fixture in fixtures():
        if fixture.model in MODELS and not fixture.file.endswith("nofold.onnx"):
            rows.append(measure(fixture))
            print(f"{rows[-1].file}: {dict(rows[-1].left)} {dict(rows[-1].ops)}", flush=True)
    print("\n".join(_table(rows)))
    if not args.no_record:
        _record(rows)
        print(f"recorded in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
