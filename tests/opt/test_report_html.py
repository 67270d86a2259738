"""The HTML report: the data it embeds, the page, `knopt optimize --html`, and a real browser."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import knopt
from knopt.cli import main
from knopt.errors import KnoptError
from knopt.ir import Binary, DType, Graph, GraphBuilder, Reduction, Unary
from knopt.ir.kernel import KernelKind
from knopt.ir.op import TensorType
from knopt.opt.explain import to_html
from knopt.opt.optimize import OptimizeResult
from knopt.opt.report_html import KIND_COLOURS, html_page, report_data
from knopt.opt.rules import FACT_RULESETS
from knopt.testing.opaque import kept_node
from tests.models import fixtures

MLP = next(f for f in fixtures() if f.file == "mlp_ts14.onnx")
LAYER_NORM = ["ln/ReduceMean", "ln/Sub", "ln/Pow", "ln/ReduceMean_1", "ln/Add", "ln/Sqrt", "ln/Div"]
GELU = ["gelu/Div", "gelu/Erf", "gelu/Add", "gelu/Mul", "gelu/Mul_1"]


def _block(name: str = "block", names: bool = True) -> Graph:
    """LayerNorm, a linear layer and GELU, written out op by op as exporters do, each op named
    like its ONNX node (or not at all)."""
    rng = np.random.default_rng(0)
    g = GraphBuilder(name)

    def constant(value: Any) -> Any:
        return g.constant(np.asarray(value, np.float32))

    def at(node: str) -> None:
        g.current_name = node if names else ""

    x = g.input("x", (4, 16), DType.F32)
    at("ln/ReduceMean")
    mean = g.div(g.reduce(Reduction.SUM, x, axes=[1]), constant(16.0))
    at("ln/Sub")
    centred = g.sub(x, mean)
    at("ln/Pow")
    square = g.binary(Binary.POW, centred, constant(2.0))
    at("ln/ReduceMean_1")
    variance = g.div(g.reduce(Reduction.SUM, square, axes=[1]), constant(16.0))
    at("ln/Add")
    shifted = g.add(variance, constant(1e-5))
    at("ln/Sqrt")
    deviation = g.unary(Unary.SQRT, shifted)
    at("ln/Div")
    normal = g.div(centred, deviation)
    at("fc/MatMul")
    h = g.matmul(normal, constant(rng.standard_normal((16, 32))))
    at("fc/Add")
    h = g.add(h, constant(rng.standard_normal(32)))
    at("gelu/Div")
    t = g.div(h, constant(math.sqrt(2.0)))
    at("gelu/Erf")
    t = g.unary(Unary.ERF, t)
    at("gelu/Add")
    t = g.add(t, constant(1.0))
    at("gelu/Mul")
    t = g.mul(h, t)
    at("gelu/Mul_1")
    g.output(g.mul(t, constant(0.5)), "y")
    return g.build()


@pytest.fixture(scope="module")
def block() -> OptimizeResult:
    return knopt.optimize(_block())


def _names(data: dict[str, Any], indices: list[int]) -> list[str]:
    return [data["original"]["nodes"][i]["name"] for i in indices]


# ---- the data the page embeds -------------------------------------------------------------


def test_every_kernel_kind_has_a_colour() -> None:
    assert set(KIND_COLOURS) == {*KernelKind, "op", "opaque", "view", "removed"}


def test_an_opaque_op_is_a_kernel_of_its_own_kind_named_after_its_op() -> None:
    g = GraphBuilder("kept")
    x = g.input("x", (2, 3), DType.F32)
    (kept,) = kept_node(g, "Sin", [g.unary(Unary.RELU, x)], [TensorType((2, 3), DType.F32)])
    g.output(g.unary(Unary.NEG, kept), "y")
    program = report_data(knopt.optimize(g.build(), ilp=False))["program"]
    kinds = {n["name"]: n["kind"] for n in program["nodes"][: program["kernels"]]}
    assert kinds["Opaque[Sin]"] == "opaque"


def test_kernels_list_the_original_nodes_they_cover(block: OptimizeResult) -> None:
    data = report_data(block)
    program = data["program"]
    assert program["kernels"] == block.report.kernels == len(block.program.launches()) == 3
    kernels = program["nodes"][: program["kernels"]]
    assert [k["name"] for k in kernels] == ["LayerNorm", "MatMul", "elementwise"]
    assert _names(data, kernels[0]["covers"]) == LAYER_NORM
    assert _names(data, kernels[1]["covers"]) == ["fc/MatMul"]
    assert _names(data, kernels[2]["covers"]) == ["fc/Add", *GELU]
    assert kernels[2]["detail"] == ["body: GELU(ADD(in0, in1))"]
    for j, kernel in enumerate(kernels):
        for i in kernel["covers"]:
            assert j in data["original"]["nodes"][i]["kernels"]


def test_both_graphs_have_their_inputs_outputs_and_data_flow(block: OptimizeResult) -> None:
    data = report_data(block)
    nodes = data["original"]["nodes"]
    assert [n["name"] for n in nodes] == ["x", *LAYER_NORM, "fc/MatMul", "fc/Add", *GELU, "y"]
    assert (nodes[0]["kind"], nodes[-1]["kind"]) == ("input", "output")
    index = {n["name"]: i for i, n in enumerate(nodes)}
    edges = {tuple(e) for e in data["original"]["edges"]}
    assert (index["x"], index["ln/Sub"]) in edges
    assert (index["fc/Add"], index["gelu/Mul"]) in edges
    assert (index["gelu/Mul_1"], index["y"]) in edges
    program = data["program"]
    x, y = program["kernels"], program["kernels"] + 1
    assert [n["name"] for n in program["nodes"][x:]] == ["x", "y"]
    assert sorted(map(tuple, program["edges"])) == [(0, 1), (1, 2), (2, y), (x, 0)]


def test_costs_before_are_shared_out_to_the_kernels(block: OptimizeResult) -> None:
    data = report_data(block)
    kernels = data["program"]["nodes"][: data["program"]["kernels"]]
    # Every original node of this graph is covered: the kernels' shares add up to the total.
    assert sum(k["before"] for k in kernels) == pytest.approx(block.report.cost_before)
    assert [k["cost"] for k in kernels] == [k.cost for k in block.program.launches()]
    assert kernels[0]["before"] > 5 * kernels[0]["cost"]  # seven ops became one LayerNorm


def test_rules_are_those_that_fired(block: OptimizeResult) -> None:
    rules = report_data(block)["rules"]
    assert {r["name"]: r["count"] for r in rules} == block.report.rules_fired
    assert [r["count"] for r in rules] == sorted((r["count"] for r in rules), reverse=True)
    for rule in rules:
        assert rule["fact"] == (block.report.rulesets[rule["name"]] in FACT_RULESETS)
    assert any(r["name"] == "layer-norm" and not r["fact"] for r in rules)


def test_patterns_name_the_original_nodes_they_replaced(block: OptimizeResult) -> None:
    data = report_data(block)
    patterns = {p["op"]: _names(data, p["covers"]) for p in data["patterns"]}
    assert patterns == {"LayerNorm": LAYER_NORM, "GELU": GELU}


def test_constants_and_what_folds_from_them_are_left_out() -> None:
    g = GraphBuilder("shared")
    x = g.input("x", (2, 3), DType.F32)
    g.current_name = "scale"
    scale = g.broadcast(g.constant(np.float32(2.0)), (2, 3))  # computed from a constant alone
    g.current_name = "first"
    a = g.mul(x, scale)
    g.current_name = "second"
    g.output(g.mul(a, scale), "y")
    data = report_data(knopt.optimize(g.build()))
    assert [n["name"] for n in data["original"]["nodes"]] == ["x", "first", "second", "y"]
    assert data["original"]["edges"] == [[0, 1], [1, 2], [2, 3]]


def test_unnamed_nodes_stand_alone() -> None:
    data = report_data(knopt.optimize(_block(names=False)))
    ops = [n["ops"] for n in data["original"]["nodes"][1:-1]]  # between x and y
    assert ops == [
        *("REDUCE_SUM", "DIV", "Broadcast", "SUB", "POW", "REDUCE_SUM", "DIV", "ADD", "SQRT"),
        *("Broadcast", "DIV", "MatMul", "ADD", "DIV", "ERF", "ADD", "MUL", "MUL"),
    ]


def test_the_page_embeds_the_data_and_loads_nothing(block: OptimizeResult) -> None:
    page = to_html(block, title="a <block>")
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert data is not None
    assert json.loads(data[1]) == report_data(block, title="a <block>")
    assert "<h1>a &lt;block&gt;</h1>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(http" not in page


def test_a_name_cannot_end_the_script_early() -> None:
    g = GraphBuilder("names")
    x = g.input("x", (2,), DType.F32)
    g.current_name = "</script><!--<script>alert(1)</script>"
    g.output(g.unary(Unary.EXP, x), "y")
    page = to_html(knopt.optimize(g.build()))
    assert page.count("</script>") == 4  # the data, the layout library and the page's two
    assert "<!--" not in page


def test_the_report_needs_the_original_graph(block: OptimizeResult) -> None:
    copy = OptimizeResult(block.graph, block.program, block.report)
    with pytest.raises(KnoptError, match="no original graph"):
        to_html(copy)


# ---- the command line ---------------------------------------------------------------------


def test_optimize_writes_the_html_report(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert main(["optimize", str(MLP.path), "--html", str(page)]) == 0
    text = page.read_text()
    assert "<title>knopt report: mlp_ts14.onnx</title>" in text
    assert '"kernels":9' in text


def test_a_bad_html_path_fails_before_optimizing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["optimize", str(MLP.path), "--html", str(tmp_path / "no" / "r.html")]) == 2
    missing = tmp_path / "no"
    assert capsys.readouterr().err == (
        f"knopt optimize: error: --html {missing}/r.html: folder {missing} does not exist\n"
    )
    assert main(["optimize", str(MLP.path), "--html", str(tmp_path)]) == 2
    assert "is a folder; give a file name" in capsys.readouterr().err


def test_a_bad_html_path_still_saves_the_model(tmp_path: Path) -> None:
    model, page = tmp_path / "out.onnx", tmp_path / "no" / "r.html"
    args = ["optimize", str(MLP.path), "-o", str(model), "--html", str(page)]
    done = subprocess.run(
        [sys.executable, "-m", "knopt.cli", *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert model.exists() and not page.exists()
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"knopt optimize: warning: --html {page}: folder")  # at once
    assert lines[-1].endswith("does not exist; the report was not written")
    assert "Traceback" not in done.stderr


# ---- in a real browser --------------------------------------------------------------------

# Chromium from the system's packages (Debian: `apt-get install chromium`), driven by
# playwright; `.ci/run` installs both and sets KNOPT_REQUIRE_BROWSER so that CI never skips.
_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    has_playwright = importlib.util.find_spec("playwright") is not None
    if chromium is None or not has_playwright:
        missing = "chromium" if has_playwright else "playwright"
        if os.environ.get("KNOPT_REQUIRE_BROWSER"):
            pytest.fail(f"{missing} is missing and KNOPT_REQUIRE_BROWSER is set")
        pytest.skip(
            f"{missing} is not installed (apt-get install chromium; pip install playwright)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=_ARGS)
        yield launched
        launched.close()


class _Page:
    """A report opened in the browser, with what it logged and what it asked the network for."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.problems: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda err: self.problems.append(f"page error: {err}"))
        self.page.on("request", self._request)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='1']", timeout=15_000)

    def _console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            self.problems.append(f"console {message.type}: {message.text}")

    def _request(self, request: Any) -> None:
        if not request.url.startswith(("file:", "blob:", "data:")):
            self.problems.append(f"request: {request.url}")

    def count(self, selector: str) -> int:
        return int(self.page.locator(selector).count())


def test_the_report_loads_and_links_kernels_to_original_nodes(
    browser: Any, block: OptimizeResult, tmp_path: Path
) -> None:
    path = tmp_path / "block.html"
    path.write_text(to_html(block))
    shown = _Page(browser, path)
    assert shown.count("#pane-program .n:not(.io)") == 3
    assert shown.count("#pane-original .n:not(.io)") == 14
    assert shown.page.locator("#pane-program .count").inner_text() == "3 kernels"
    shown.page.hover('#pane-program .n[data-i="0"]')
    assert shown.count("#pane-original .n.hl") == len(LAYER_NORM)
    assert "LayerNorm" in shown.page.locator("#info").inner_text()
    shown.page.click('#pane-original [data-zoom="fit"]')  # the whole graph in view
    shown.page.hover('#pane-original .n[data-i="10"]')  # gelu/Div, fused into kernel #3
    assert shown.page.locator("#pane-program .n.hl").get_attribute("data-i") == "2"
    shown.page.click('.pattern[data-p="0"]')  # GELU, pinned
    shown.page.mouse.move(0, 0)
    assert shown.count("#pane-original .n.hl") == len(GELU)
    assert shown.count("#cost-chart .lab") == 3
    assert shown.problems == []


def _chain(nodes: int, kernels: int) -> dict[str, Any]:
    """Report data of a long chain with a skip edge every 7 nodes, as residual networks have."""
    per = nodes // kernels
    original = [
        {
            "name": f"/layer{i // 50}/op_{i}",
            "ops": "ADD",
            "kind": "elementwise",
            "cost": 1e-6,
            "kernels": [min(i // per, kernels - 1)],
        }
        for i in range(nodes)
    ]
    edges = [[i - 1, i] for i in range(1, nodes)] + [[i - 7, i] for i in range(7, nodes, 7)]
    program = [
        {
            "name": "elementwise",
            "kind": "elementwise",
            "cost": 1e-6,
            "before": per * 1e-6,
            "covers": list(range(j * per, (j + 1) * per)),
            "type": "f32[8]",
            "detail": [],
        }
        for j in range(kernels)
    ]
    summary = {
        "profile": "cpu",
        "nodes_before": nodes,
        "nodes_after": kernels,
        "seconds": 1.0,
        "cost_before": nodes * 1e-6,
        "cost_after": kernels * 1e-6,
        "stopped_by": None,
        "egraph_nodes": 0,
        "user_rules": [],
    }
    return {
        "title": "chain",
        "summary": summary,
        "colours": KIND_COLOURS,
        "original": {"nodes": original, "edges": edges},
        "program": {
            "nodes": program,
            "edges": [[j - 1, j] for j in range(1, kernels)],
            "kernels": kernels,
        },
        "rules": [],
        "patterns": [],
        "phases": [],
    }


def test_a_large_graph_is_drawn_in_full(browser: Any, tmp_path: Path) -> None:
    path = tmp_path / "chain.html"
    path.write_text(html_page(_chain(1200, 300)))
    shown = _Page(browser, path)
    assert shown.count("#pane-original .n") == 1200
    assert shown.count("#pane-original .e") == 1199 + 171  # every edge, across slices too
    assert shown.count("#pane-program .n") == 300
    assert shown.problems == []
