"""Tables and the plot of benchmarks/gpu.py's results (no GPU needed).

python benchmarks/gpu_report.py gpu.json      # the Markdown tables, and gpu.png beside it
"""

from __future__ import annotations

import html
import math
import sys
from pathlib import Path
from typing import Any

SIDES = ("eager", "compile-default", "reduce-overhead", "max-autotune", "tinygrad", "knopt")
BEST_COMPILE = ("reduce-overhead", "max-autotune")  # the modes a latency-minded user picks
NAMES = {
    "resnet50": "ResNet-50",
    "bert": "BERT-base",
    "gpt2": "GPT-2 small",
    "vit": "ViT-B/16",
    "llama": "LLaMA 1.1B",
}
COLORS = ("#9e9e9e", "#90caf9", "#42a5f5", "#1565c0", "#ffb74d", "#2e7d32")


def _ms(row: dict[str, Any], side: str) -> float | None:
    entry = row["peers"].get(side, {})
    value = entry.get("ms")
    return float(value) if isinstance(value, int | float) else None


def summarize(row: dict[str, Any]) -> None:
    """Add knopt's ratios to the best torch.compile mode and to the floor, where measured."""
    knopt = _ms(row, "knopt")
    compiled = [t for t in (_ms(row, s) for s in BEST_COMPILE) if t is not None]
    row.pop("knopt_over_best_compile", None)
    row.pop("knopt_over_floor", None)
    if knopt is not None and compiled:
        row["knopt_over_best_compile"] = knopt / min(compiled)
    if knopt is not None and row.get("floor_ms"):
        row["knopt_over_floor"] = knopt / row["floor_ms"]


def _cell(row: dict[str, Any], side: str) -> str:
    entry = row["peers"].get(side)
    if entry is None:
        return "—"
    if "failed" in entry:
        return "failed"
    return f"{entry['ms']:.3f}"


def _error(row: dict[str, Any], side: str) -> str:
    error = row["peers"].get(side, {}).get("error")
    return f"{error:.1e}" if isinstance(error, float) else "—"


def _ratio(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else "—"


def table(data: dict[str, Any]) -> str:
    """The results as Markdown: latencies, ratios, errors; then preparation times and failures."""
    lines = []
    if "device" in data:
        versions = ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items())
        peaks = ", ".join(f"{k} {v:.0f}" for k, v in data.get("peak_TFLOPs", {}).items())
        lines += [
            f"{data['device']}, {data.get('date', '')}: {versions}. Copy bandwidth "
            f"{data.get('copy_GBps', 0):.0f} GB/s; matmul peak (torch, 8192^3) {peaks} TFLOP/s.",
            "",
        ]
    header = ["model", "batch", "prec", "floor ms", *SIDES, "knopt / best compile"]
    header += ["knopt / floor", "knopt err", "best compile err"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * 3 + " ---: |" * (len(header) - 3)]
    ratios = []
    for row in data.get("rows", []):
        summarize(row)
        best = min(BEST_COMPILE, key=lambda s: _ms(row, s) or math.inf)
        cells = [
            NAMES.get(row["model"], row["model"]),
            str(row["batch"]),
            row["precision"],
            f"{row['floor_ms']:.3f}" if "floor_ms" in row else "—",
            *(_cell(row, side) for side in SIDES),
            _ratio(row.get("knopt_over_best_compile")),
            _ratio(row.get("knopt_over_floor")),
            _error(row, "knopt"),
            _error(row, best),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if "knopt_over_best_compile" in row:
            ratios.append(row["knopt_over_best_compile"])
    if ratios:
        mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        under = sum(r <= 0.9 for r in ratios)
        lines += [
            "",
            f"knopt / best torch.compile mode: geometric mean {mean:.2f} over {len(ratios)} rows; "
            f"{under} rows at or under 0.9.",
        ]
    lines += ["", *_preparation(data)]
    return "\n".join(lines)


def _preparation(data: dict[str, Any]) -> list[str]:
    sides = ("compile-default", "reduce-overhead", "max-autotune", "tinygrad")
    header = ["model", "batch", "prec", *(f"{s} s" for s in sides), "knopt optimize + prepare s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * 3 + " ---: |" * (len(header) - 3)]
    failures = []
    for row in data.get("rows", []):
        peers = row["peers"]
        knopt = peers.get("knopt", {})
        cells = [NAMES.get(row["model"], row["model"]), str(row["batch"]), row["precision"]]
        cells += [str(peers.get(s, {}).get("compile_s", "—")) for s in sides]
        cells.append(
            f"{knopt['optimize_s']} + {knopt['prepare_s']}" if "prepare_s" in knopt else "—"
        )
        lines.append("| " + " | ".join(cells) + " |")
        failures += [
            f"- {row['model']} b{row['batch']} {row['precision']} {side}: {entry['failed']}"
            for side, entry in peers.items()
            if "failed" in entry
        ]
    return lines + (["", "Failures:", *failures] if failures else [])


def plot(data: dict[str, Any], path: Path) -> Path:
    """Latency per model, the sides side by side, one panel per batch and precision.

    matplotlib draws a PNG at `path`; without it, a plain SVG is written beside it instead.
    Returns the file written.
    """
    panels = _panels(data)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg(panels, path.with_suffix(".svg"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)), squeeze=False)
    for ax, (title, models, values) in zip(axes[:, 0], panels, strict=True):
        width = 0.8 / len(SIDES)
        for i, side in enumerate(SIDES):
            xs = [j + i * width for j in range(len(models))]
            heights = [values[m].get(side) or 0.0 for m in models]
            ax.bar(xs, heights, width, label=side, color=COLORS[i])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(models))], models)
        ax.set_yscale("log")
        ax.set_ylabel("ms per call (median)")
        ax.set_title(title)
    axes[0, 0].legend(ncols=len(SIDES), fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


Panel = tuple[str, list[str], dict[str, dict[str, float | None]]]


def _panels(data: dict[str, Any]) -> list[Panel]:
    panels: dict[tuple[int, str], dict[str, dict[str, float | None]]] = {}
    for row in data.get("rows", []):
        values = panels.setdefault((row["batch"], row["precision"]), {})
        values[NAMES.get(row["model"], row["model"])] = {s: _ms(row, s) for s in SIDES}
    return [
        (f"batch {batch}, {precision}", list(values), values)
        for (batch, precision), values in sorted(panels.items())
    ]


def _svg(panels: list[Panel], path: Path) -> Path:
    """A bar chart in plain SVG: one panel per batch and precision, log-scaled latency."""
    width, height, left, top = 900, 220, 60, 30
    times = [t for _, _, v in panels for m in v.values() for t in m.values() if t]
    low = math.log10(min(times, default=0.01)) - 0.2
    high = math.log10(max(times, default=100.0)) + 0.2
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{(height + top) * len(panels) + 40}" font-family="sans-serif" font-size="11">'
    ]
    for p, (title, models, values) in enumerate(panels):
        y0 = p * (height + top) + top
        parts.append(f'<text x="{left}" y="{y0 - 8}" font-size="13">{html.escape(title)}</text>')
        slot = (width - left - 20) / max(len(models), 1)
        bar = slot * 0.8 / len(SIDES)
        for j, model in enumerate(models):
            x0 = left + j * slot
            parts.append(
                f'<text x="{x0 + slot * 0.4:.0f}" y="{y0 + height + 14}" '
                f'text-anchor="middle">{html.escape(model)}</text>'
            )
            for i, side in enumerate(SIDES):
                t = values[model].get(side)
                if not t:
                    continue
                h = (math.log10(t) - low) / (high - low) * height
                parts.append(
                    f'<rect x="{x0 + i * bar:.1f}" y="{y0 + height - h:.1f}" width="{bar:.1f}" '
                    f'height="{h:.1f}" fill="{COLORS[i]}"><title>{side}: {t:.3f} ms</title></rect>'
                )
    legend_y = (height + top) * len(panels) + 25
    for i, side in enumerate(SIDES):
        parts.append(
            f'<rect x="{left + i * 130}" y="{legend_y - 10}" width="10" height="10" '
            f'fill="{COLORS[i]}"/><text x="{left + i * 130 + 14}" y="{legend_y}">{side}</text>'
        )
    parts.append("</svg>")
    path.write_text("\n".join(parts))
    return path


def main() -> int:
    import json

    path = Path(sys.argv[1])
    data = json.loads(path.read_text())
    print(table(data))
    print(f"plot: {plot(data, path.with_suffix('.png'))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
