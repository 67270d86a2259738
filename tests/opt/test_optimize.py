"""`knopt optimize` and `knopt.optimize` on the real-model fixtures, checked by onnxruntime."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

import knopt
from knopt.cli import main
from knopt.ir import Graph
from knopt.ir.shape import sym
from knopt.opt.cost import CPU
from knopt.opt.egraph import Limits
from knopt.opt.explain import format_report
from knopt.opt.optimize import OptimizeReport, symbol_values
from knopt.opt.terms import TermTables
from tests.models import Fixture, fixtures
from tests.oracle import assert_same, run_onnxruntime

FIXTURES = fixtures()
BY_FILE = {f.file: f for f in FIXTURES}

# Instances of each recognised op per model. The fixtures are two-layer models: BERT, GPT-2 and
# ViT have a LayerNorm before the layers and two per layer, LLaMA two RMSNorms per layer and a
# final one, ConvNeXt five LayerNorms over its two stages, the UNet 14 InstanceNorms (which the
# importer writes as LayerNorm) and 13 SiLUs, EfficientNet 7 SiLUs (its two squeeze-excitation
# gates multiply by the sigmoid of another tensor, which is no SiLU).
PATTERNS: dict[str, dict[str, int]] = {
    "bert": {"LayerNorm": 5, "GELU": 2, "Attention": 2},
    "gpt2": {"LayerNorm": 5, "GELU_TANH": 2, "Attention": 2},
    "llama": {"RmsNorm": 5, "SILU": 2, "Attention": 2},
    "vit": {"LayerNorm": 5, "GELU": 2, "Attention": 2},
    "convnext": {"LayerNorm": 5, "GELU": 2},
    "unet": {"LayerNorm": 14, "SILU": 13, "Attention": 1},
    "efficientnet": {"SILU": 7},
}
REPORT_KEYS = {
    "rules_fired",
    "nodes_before",
    "nodes_after",
    "cost_before",
    "cost_after",
    "seconds",
    "stopped_by",
    "patterns",
    "phases",
}
_PATTERN_LINE = re.compile(r"^  (\w+) \[[^]]*\] replaces ", re.MULTILINE)


@dataclass
class Run:
    """One fixture optimized by `knopt.optimize` and saved by `knopt.save`."""

    fixture: Fixture
    graph: Graph
    report: OptimizeReport
    output: Path

    def explained(self) -> Counter[str]:
        """How many recognised instances of each op the `--explain` text names."""
        return _explained(format_report(self.report))


def _explained(explain: str) -> Counter[str]:
    return Counter(_PATTERN_LINE.findall(explain))


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every fixture optimized and saved once, shared by this module's tests.

    Without the ILP: it runs into its 5 s limit on half of the fixtures, and the ILP has tests
    of its own below and in test_extract.py.
    """
    folder = tmp_path_factory.mktemp("optimized")
    runs = {}
    for fixture in FIXTURES:
        result = knopt.optimize(knopt.load(fixture.path), ilp=False)
        output = folder / fixture.file
        knopt.save(result.graph, output)
        runs[fixture.file] = Run(fixture, result.graph, result.report, output)
    return runs


def _cli(fixture: Fixture, folder: Path, *options: str) -> tuple[int, str, Path, dict]:
    """`knopt optimize MODEL -o out.onnx --report-json r.json [options]`: status, stdout."""
    out, report = folder / "out.onnx", folder / "report.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        status = main(
            ["optimize", str(fixture.path), "-o", str(out), "--report-json", str(report), *options]
        )
    return status, stdout.getvalue(), out, json.loads(report.read_text())


def _assert_same_on_onnxruntime(fixture: Fixture, output: Path) -> None:
    feeds = fixture.feeds(seed=1)
    ours = run_onnxruntime(onnx.load(output), feeds)
    assert_same(ours, run_onnxruntime(onnx.load(fixture.path), feeds))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.file for f in FIXTURES])
def test_saved_model_matches_the_original_on_onnxruntime(
    fixture: Fixture, optimized: dict[str, Run]
) -> None:
    _assert_same_on_onnxruntime(fixture, optimized[fixture.file].output)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.file for f in FIXTURES])
def test_report_has_the_documented_keys_and_never_costs_more(
    fixture: Fixture, optimized: dict[str, Run]
) -> None:
    report = optimized[fixture.file].report.to_json()
    assert set(report) >= REPORT_KEYS
    assert report["stopped_by"] is None
    assert report["cost_after"] <= report["cost_before"] * (1 + 1e-9)
    assert report["nodes_after"] <= report["nodes_before"]
    assert all(count > 0 for count in report["rules_fired"].values())
    assert report["phases"][-1]["name"].endswith("extraction")
    json.dumps(report)  # JSON-ready


@pytest.mark.parametrize("file", ["mlp_ts14.onnx", "gpt2_dynamo18.onnx"])
def test_extraction_with_the_ilp_matches_the_original(file: str, tmp_path: Path) -> None:
    fixture = BY_FILE[file]
    result = knopt.optimize(knopt.load(fixture.path), ilp=True)
    assert "Optimal" in result.report.ilp_status  # one solve per extraction phase
    knopt.save(result.graph, tmp_path / "out.onnx")
    _assert_same_on_onnxruntime(fixture, tmp_path / "out.onnx")


def test_cli_saves_explains_and_writes_the_json_report(tmp_path: Path) -> None:
    fixture = BY_FILE["bert_ts14.onnx"]
    status, explain, output, report = _cli(fixture, tmp_path, "--explain")
    assert status == 0
    assert _explained(explain) >= Counter(PATTERNS["bert"])
    assert "layer-norm" in explain and "gelu-erf-core" in explain
    assert set(report) >= REPORT_KEYS
    assert report["rules_fired"]["layer-norm"] == 5
    _assert_same_on_onnxruntime(fixture, output)


_INSTANCES = [
    (f"{model}_{style}.onnx", op, count)
    for model, ops in PATTERNS.items()
    for style in ("ts14", "ts14nofold", "dynamo18")
    for op, count in ops.items()
]
_INSTANCE_IDS = [f"{file}-{op}" for file, op, _ in _INSTANCES]


@pytest.mark.parametrize(("file", "op", "count"), _INSTANCES, ids=_INSTANCE_IDS)
def test_every_pattern_instance_is_in_the_optimized_model(
    file: str, op: str, count: int, optimized: dict[str, Run]
) -> None:
    assert optimized[file].graph.op_histogram().get(op, 0) == count


@pytest.mark.parametrize(("file", "op", "count"), _INSTANCES, ids=_INSTANCE_IDS)
def test_explain_names_every_instance_the_rules_recognised(
    file: str, op: str, count: int, optimized: dict[str, Run]
) -> None:
    imported = knopt.load(BY_FILE[file].path).op_histogram().get(op, 0)
    assert optimized[file].explained()[op] >= count - imported


_ARITHMETIC = ("MUL", "ADD", "SUB", "DIV", "SQRT")


@pytest.mark.parametrize("model", ["resnet", "mobilenetv2", "efficientnet"])
def test_every_batch_norm_folds_into_its_conv(model: str, optimized: dict[str, Run]) -> None:
    unfolded = optimized[f"{model}_ts14nofold.onnx"].graph
    folded = optimized[f"{model}_ts14.onnx"].graph
    for op in _ARITHMETIC:
        assert unfolded.op_histogram().get(op, 0) == folded.op_histogram().get(op, 0), op
    for node in unfolded.nodes:
        if node.op.name == "Conv":
            readers = [u.op.name for u in node.output.users()]
            assert "MUL" not in readers and readers.count("ADD") <= 1, readers


@pytest.mark.parametrize("model", ["resnet", "mobilenetv2", "efficientnet"])
def test_explain_data_names_every_folded_batch_norm(model: str, optimized: dict[str, Run]) -> None:
    fixture = BY_FILE[f"{model}_ts14nofold.onnx"]
    covered = {
        name
        for kernel in optimized[fixture.file].report.to_json()["program"]
        for name in kernel["names"]
    }
    batch_norms = {
        n.name for n in onnx.load(fixture.path).graph.node if n.op_type == "BatchNormalization"
    }
    assert batch_norms
    assert batch_norms <= covered


def test_tiny_time_limit_stops_saturation_and_still_gives_a_correct_model(
    tmp_path: Path,
) -> None:
    fixture = BY_FILE["bert_ts14.onnx"]
    # The limit is checked between slices; the first step (typing, about 30 ms) always runs.
    status, _, output, report = _cli(fixture, tmp_path, "--time-limit", "0.005", "--no-ilp")
    assert status == 0
    assert report["stopped_by"].startswith("time limit")
    _assert_same_on_onnxruntime(fixture, output)


def test_tiny_node_limit_stops_saturation_and_still_gives_a_correct_graph() -> None:
    fixture = BY_FILE["bert_ts14.onnx"]
    graph = knopt.load(fixture.path)
    result = knopt.optimize(graph, limits=Limits(nodes=1500), ilp=False)
    assert (result.report.stopped_by or "").startswith("node limit")
    feeds = fixture.feeds()
    assert_same(knopt.compile(result.graph).run(None, feeds), knopt.compile(graph).run(None, feeds))


@pytest.mark.parametrize("limits", [Limits(seconds=0.0), Limits(nodes=10)], ids=["time", "nodes"])
def test_limit_hit_before_any_step_gives_the_input_program(limits: Limits) -> None:
    fixture = BY_FILE["mlp_ts14.onnx"]
    graph = knopt.load(fixture.path)
    result = knopt.optimize(graph, limits=limits)
    assert result.report.stopped_by is not None
    feeds = fixture.feeds()
    assert_same(knopt.compile(result.graph).run(None, feeds), knopt.compile(graph).run(None, feeds))


def test_h200_profile_optimizes_to_an_equivalent_graph() -> None:
    fixture = BY_FILE["gpt2_dynamo18.onnx"]
    graph = knopt.load(fixture.path)
    result = knopt.optimize(graph, profile="h200", ilp=False)
    assert result.report.profile == "h200"
    assert result.graph.op_histogram()["Attention"] == 2
    feeds = fixture.feeds()
    assert_same(knopt.compile(result.graph).run(None, feeds), knopt.compile(graph).run(None, feeds))


def test_each_pattern_names_its_own_nodes_when_one_kernel_fuses_them() -> None:
    # The demo's LayerNorm feeds a GELU; on the GPU profile both share one kernel, and each
    # pattern once listed the whole kernel's nodes (the GELU "replaced" the ReduceMeans).
    demo = Path(knopt.__file__).parent / "data" / "demo.onnx"
    report = knopt.optimize(knopt.load(demo), profile="h200", ilp=False).report
    fused = [
        k["names"]
        for k in report.program
        if any("ReduceMean" in n for n in k["names"]) and any("Erf" in n for n in k["names"])
    ]
    assert fused, "the LayerNorm and the GELU after it share a kernel"
    names = {p.op: p.replaced for p in report.patterns}
    assert any("ReduceMean" in n for n in names["LayerNorm"])
    assert any("Erf" in n for n in names["GELU"])
    assert not set(names["LayerNorm"]) & set(names["GELU"])
    assert all(len(set(p.replaced)) == len(p.replaced) for p in report.patterns)


def test_symbolic_sizes_are_costed_at_representative_values() -> None:
    tables = TermTables()
    product = tables.dim(sym("batch") * sym("seq"))
    shifted = tables.dim(sym("seq") + 1)
    values = symbol_values(tables, {"seq": 128}, CPU)
    # Each name not given counts the profile's symbol_size (8); polynomials are evaluated.
    assert values == {product: CPU.symbol_size * 128, shifted: 129}
