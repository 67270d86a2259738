"""The HTML report in a headless browser: how fast a large report loads, and the README's picture.

    python benchmarks/report_html.py                                  # measure
    python benchmarks/report_html.py --screenshot docs/report-bert.png

Measures BERT-like graphs built in code (those of benchmarks/optimize_time.py, every node named
as an exporter would) of about 1,000 and 2,700 original nodes: the page's size, the seconds from
opening it to the first drawn nodes and to both graphs drawn in full, and the longest task on
the page's main thread (what a user feels as a freeze; layout runs in a worker). Needs Chromium
(`apt-get install chromium`) and playwright; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from optimize_time import Config, _Bert  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

import knopt  # noqa: E402
from knopt.opt.explain import to_html  # noqa: E402
from knopt.opt.report_html import report_data  # noqa: E402

BERT = ROOT / "tests" / "fixtures" / "models" / "bert_ts14.onnx"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Collects the main thread's long tasks (over 50 ms) from the start.
LONG_TASKS = """window.longTasks = [];
new PerformanceObserver((list) => list.getEntries().forEach((e) => longTasks.push(e.duration)))
  .observe({type: "longtask", buffered: true});"""


def _graph(layers: int) -> knopt.Graph:
    graph = _Bert(Config(f"bert-{layers}-layers", layers=layers)).build()
    for i, node in enumerate(graph.nodes):
        node.name = node.name or f"/encoder/{node.op.name.lower()}_{i}"
    return graph


def _load(browser: Any, path: Path) -> dict[str, float]:
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.add_init_script(LONG_TASKS)
    start = time.perf_counter()
    page.goto(path.as_uri())
    page.wait_for_selector("#pane-original .n", timeout=120_000)
    first = time.perf_counter() - start
    page.wait_for_selector("body[data-ready='1']", timeout=120_000)
    ready = time.perf_counter() - start
    longest = max(page.evaluate("window.longTasks"), default=0.0)
    page.close()
    return {"first": first, "ready": ready, "longest_ms": longest}


def measure(browser: Any, layers: int, folder: Path) -> None:
    """Optimize a BERT-like graph, write its report and open it three times."""
    result = knopt.optimize(_graph(layers))
    data = report_data(result)
    path = folder / f"bert-{layers}.html"
    path.write_text(to_html(result))
    runs = [_load(browser, path) for _ in range(3)]
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(
        f"{len(data['original']['nodes'])} original nodes, {data['program']['kernels']} kernels, "
        f"{path.stat().st_size / 1e3:.0f} kB: first nodes drawn after {median['first']:.2f} s, "
        f"both graphs after {median['ready']:.2f} s, longest main-thread task "
        f"{median['longest_ms']:.0f} ms (median of 3)"
    )


def screenshot(browser: Any, png: Path, folder: Path) -> None:
    """The BERT fixture's report with its first LayerNorm kernel selected."""
    result = knopt.optimize(knopt.load(BERT))
    kernels = report_data(result)["program"]["nodes"]
    first = next(j for j, k in enumerate(kernels) if k["name"] == "LayerNorm")
    path = folder / "bert.html"
    path.write_text(to_html(result, title=BERT.name))
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    page.click(f'#pane-program .n[data-i="{first}"]')
    page.mouse.move(0, 0)
    page.screenshot(path=png, full_page=True, clip={"x": 0, "y": 0, "width": 1440, "height": 1180})
    print(f"wrote {png} ({png.stat().st_size / 1e3:.0f} kB)")


def main() -> int:
    """Measure, or take the README's screenshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshot", type=Path, help="write the BERT report's picture here")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("needs Chromium: apt-get install chromium", file=sys.stderr)
        return 1
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as folder:
        browser = playwright.chromium.launch(executable_path=chromium, args=ARGS)
        if args.screenshot:
            screenshot(browser, args.screenshot, Path(folder))
        else:
            for layers in (15, 40):
                measure(browser, layers, Path(folder))
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
