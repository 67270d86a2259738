"""ONNX conformance of knopt: run onnx's backend test suite and report, by op, what fails.

    python benchmarks/conformance.py            # report, and refresh README's "Supported ONNX"
    python benchmarks/conformance.py --no-readme

Every CPU case of the installed onnx runs (the excluded ones too, so that the rate over all node
cases is measured, not assumed). The exclusions and expected failures are those of
tests/onnx/test_backend.py, the one place that lists them.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
import sys
import tempfile
import textwrap
import time
import unittest
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")  # onnx generates its node cases with noisy numpy on import

import onnx  # noqa: E402
import onnx.backend.test  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

import knopt.onnx  # noqa: E402
from knopt.onnx_backend import KnoptBackend  # noqa: E402
from tests.onnx.test_backend import XFAIL, excluded_names, model_opsets  # noqa: E402

DATE = datetime.date.today().isoformat()  # the day the numbers are measured
START, END = "<!-- onnx-support:start -->", "<!-- onnx-support:end -->"


@dataclass(frozen=True)
class Outcome:
    """How one case went."""

    kind: str  # Node, Real, Simple, PyTorchConverted, PyTorchOperator
    passed: bool
    seconds: float
    error: str


def run_suite() -> dict[str, Outcome]:
    """Run every CPU case of the backend test suite; outcomes by case name (no `_cpu`)."""
    suite = onnx.backend.test.BackendTest(KnoptBackend, __name__)
    suite.include(r"_cpu$")
    outcomes: dict[str, Outcome] = {}
    for class_name, cls in suite.test_cases.items():
        kind = class_name.removeprefix("OnnxBackend").removesuffix("ModelTest")
        for test in unittest.defaultTestLoader.loadTestsFromTestCase(cls):
            assert isinstance(test, unittest.TestCase)
            name = test.id().rsplit(".", 1)[1]
            if not name.endswith("_cpu"):
                continue
            result = unittest.TestResult()
            start = time.perf_counter()
            test.run(result)
            problems = result.failures + result.errors
            error = _headline(problems[0][1]) if problems else ""
            outcomes[name.removesuffix("_cpu")] = Outcome(
                kind, not problems, time.perf_counter() - start, error
            )
    return outcomes


def _headline(trace: str) -> str:
    """The line of a traceback that says what went wrong."""
    lines = trace.strip().splitlines()
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception): ", line) or line.startswith("Mismatched"):
            return line.strip()
    return lines[-1].strip()


def node_ops() -> dict[str, str]:
    """The op a node case tests (the first op of its graph that is not a Constant)."""
    ops = {}
    for case in load_model_tests(kind="node"):
        assert case.model is not None
        types = [n.op_type for n in case.model.graph.node if n.op_type != "Constant"]
        ops[case.name] = types[0] if types else "Constant"
    return ops


def report(outcomes: dict[str, Outcome]) -> dict[str, float]:
    """Print the numbers and failures by op; return the headline numbers."""
    opsets = model_opsets()
    excluded = excluded_names(outcomes, opsets)
    node = {n: o for n, o in outcomes.items() if o.kind == "Node"}
    passed = [n for n, o in node.items() if o.passed]
    kept = [n for n in node if n not in excluded]
    kept_passed = [n for n in kept if node[n].passed]
    numbers = {
        "node_total": len(node),
        "node_passed": len(passed),
        "node_rate": len(passed) / len(node),
        "excluded": sum(1 for n in node if n in excluded),
        "kept": len(kept),
        "kept_rate": len(kept_passed) / len(kept),
        "xfail": sum(1 for n in kept if n in XFAIL),
        "real_total": sum(1 for o in outcomes.values() if o.kind == "Real"),
        "real_passed": sum(1 for o in outcomes.values() if o.kind == "Real" and o.passed),
    }
    print(
        f"node cases: {numbers['node_passed']} of {numbers['node_total']} pass "
        f"({100 * numbers['node_rate']:.1f}% of all)"
    )
    print(
        f"excluding {numbers['excluded']} (see tests/onnx/test_backend.py): "
        f"{len(kept_passed)} of {len(kept)} pass ({100 * numbers['kept_rate']:.1f}%), "
        f"{numbers['xfail']} expected failures"
    )
    print("\nexclusions by reason:")
    for reason, count in collections.Counter(excluded[n] for n in node if n in excluded).items():
        print(f"  {count:4d}  {reason}")
    print("\nreal models:")
    for name, o in sorted(outcomes.items()):
        if o.kind == "Real":
            print(f"  {'pass' if o.passed else 'FAIL'}  {name:28s} {o.seconds:6.2f} s  {o.error}")
    others = {n: o for n, o in outcomes.items() if o.kind not in ("Node", "Real")}
    other_kept = [n for n in others if n not in excluded]
    print(
        f"\nother model cases (simple, pytorch): {sum(others[n].passed for n in other_kept)} "
        f"of {len(other_kept)} not excluded pass"
    )
    ops = node_ops()
    failures: dict[str, list[str]] = collections.defaultdict(list)
    for name in kept:
        if not node[name].passed:
            failures[ops.get(name, "?")].append(name)
    for name in other_kept:
        if not others[name].passed:
            failures["(model cases)"].append(name)
    print("\nfailures by op (excluded cases not shown):")
    for op, names in sorted(failures.items(), key=lambda item: -len(item[1])):
        print(f"  {op} ({len(names)}): {', '.join(sorted(names))}")
        example = node[names[0]].error if names[0] in node else others[names[0]].error
        print(f"      {example[:160]}")
    return numbers


def readme_section(numbers: dict[str, float]) -> str:
    """The README's "Supported ONNX" text between the markers."""
    ops = knopt.onnx.supported_op_types()
    summary = (
        f"Measured on {DATE} with onnx {onnx.__version__}'s backend test suite "
        "(`python benchmarks/conformance.py`): knopt passes "
        f"{int(numbers['node_passed'])} of {int(numbers['node_total'])} node cases "
        f"({100 * numbers['node_rate']:.1f}%), and {100 * numbers['kept_rate']:.1f}% of the "
        f"{int(numbers['kept'])} left after excluding what an inference compiler with numeric "
        "tensors cannot run (strings, sequences, random and training ops, data-dependent "
        "output shapes, opsets before 7; the list is in `tests/onnx/test_backend.py`). "
        f"{int(numbers['real_passed'])} of {int(numbers['real_total'])} real-model cases "
        "pass. Models read opset 7 and newer, in float32, float16, "
        "bfloat16, float64, float8, float4, integer (2 to 64 bits) and bool types; "
        "inputs that fix shapes (a Reshape target, reduction axes, Resize sizes, an If "
        "condition) are fixed when the model runs, one import per value."
    )
    listing = f"Supported ONNX op types ({len(ops)}): " + ", ".join(f"`{op}`" for op in ops) + "."
    wrap = textwrap.TextWrapper(width=100, break_long_words=False, break_on_hyphens=False)
    return "\n".join([START, wrap.fill(summary), "", wrap.fill(listing), END])


def update_readme(section: str) -> None:
    """Replace the text between the markers of README.md, and nothing else."""
    path = ROOT / "README.md"
    text = path.read_text()
    head, found, rest = text.partition(START)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise SystemExit(f"{path}: the markers {START} ... {END} are missing")
    path.write_text(head + section + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-readme", action="store_true", help="do not rewrite README.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="knopt-onnx-home-") as home:
        os.environ["ONNX_HOME"] = home  # the light real models unpack here
        start = time.perf_counter()
        outcomes = run_suite()
        elapsed = time.perf_counter() - start
    numbers = report(outcomes)
    print(f"\nran {len(outcomes)} cases in {elapsed:.0f} s")
    if not args.no_readme:
        update_readme(readme_section(numbers))
        print("README.md: Supported ONNX section updated")


if __name__ == "__main__":
    main()
