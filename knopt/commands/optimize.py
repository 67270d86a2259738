"""`knopt optimize`: optimize an ONNX model and save the result as standard ONNX."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import knopt
from knopt.commands.common import parse_ranges
from knopt.errors import KnoptError
from knopt.ir.dims import SizeProfile
from knopt.onnx.load import default_opset, input_symbols, load_model
from knopt.opt.cost import PROFILES
from knopt.opt.egraph import Limits
from knopt.opt.explain import format_report, to_html


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `optimize` subcommand."""
    parser = subparsers.add_parser(
        "optimize",
        help="optimize a model by equality saturation and save it as ONNX",
        description="Optimize MODEL with the rules in rules/ (and --rules files), choose the "
        "cheapest equivalent program under a device's cost model, and save it as ONNX.",
    )
    parser.add_argument("model", type=Path, help="the ONNX model to optimize")
    parser.add_argument("-o", "--output", type=Path, help="where to write the optimized model")
    parser.add_argument(
        "--rules",
        type=Path,
        action="append",
        default=[],
        metavar="FILE.egg",
        help="an extra rule file (repeatable); its rules join the `algebra` ruleset",
    )
    parser.add_argument("--explain", action="store_true", help="print what the optimizer did")
    parser.add_argument("--report-json", type=Path, help="write the report as JSON here")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="PATH",
        help="write the report as one self-contained HTML page here: the original graph beside "
        "the kernels, the rules that fired, estimated costs and phase timings",
    )
    parser.add_argument(
        "--device-profile",
        default="cpu",
        metavar="NAME|FILE",
        help=f"the cost model that guides extraction: {', '.join(sorted(PROFILES))} or a file "
        "from `knopt calibrate` (default: cpu)",
    )
    parser.add_argument(
        "--dims",
        action="append",
        default=[],
        metavar="NAME=SIZE|NAME=MIN:OPT:MAX",
        help="fix a symbolic input size (batch=2), or keep it symbolic and cost kernels at "
        "OPT (seq=1:128:512); repeatable",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=Limits.seconds,
        help="seconds of saturation before stopping (default: %(default)s)",
    )
    parser.add_argument(
        "--node-limit",
        type=int,
        default=Limits.nodes,
        help="e-nodes before stopping saturation (default: %(default)s)",
    )
    parser.add_argument("--no-ilp", action="store_true", help="skip the exact ILP extraction")
    parser.add_argument(
        "--target",
        choices=["onnx", "onnxruntime"],
        default="onnx",
        help="the runtime the output is for: standard ops only (onnx, the default), or also "
        "onnxruntime's com.microsoft fused ops",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="save each fused kernel as a `knopt`-domain function instead, to inspect the "
        "fusion in Netron",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=None,
        help="ONNX opset of the output (default: the model's, at least 18)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Optimize, report and save."""
    html_problem = _unwritable(args.html) if args.html else None
    if html_problem and not args.output:
        raise KnoptError(f"--html {args.html}: {html_problem}")
    if html_problem:
        # Say so at once, and still save the model: the user may want it more than the report.
        print(
            f"knopt optimize: warning: --html {args.html}: {html_problem}; the model will be "
            "saved but not the report",
            file=sys.stderr,
        )
    model = load_model(args.model)
    ranges = SizeProfile.parse(parse_ranges(args.dims), input_symbols(model))
    graph = knopt.onnx.import_model(model, ranges.fixed)
    result = knopt.optimize(
        graph,
        sizes=ranges.representative,
        rules=args.rules,
        profile=args.device_profile,
        limits=Limits(seconds=args.time_limit, nodes=args.node_limit),
        ilp=not args.no_ilp,
    )
    report = result.report
    report.onnx_nodes_before = len(model.graph.node)
    if args.output:
        opset = args.opset or max(18, default_opset(model))
        saved = knopt.save(
            result, args.output, kernels=args.kernels, opset=opset, target=args.target
        )
        report.onnx_nodes_after = len(saved.graph.node)
    if args.explain:
        print(format_report(report))
    if args.report_json:
        args.report_json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    onnx_nodes = f"{report.onnx_nodes_before} ONNX nodes"
    if report.onnx_nodes_after is not None:
        onnx_nodes = f"{report.onnx_nodes_before} -> {report.onnx_nodes_after} ONNX nodes"
    summary = (
        f"{args.model.name}: {onnx_nodes} ({report.nodes_before} -> "
        f"{report.nodes_after} IR nodes, {report.kernels} kernels), estimated "
        f"{report.cost_before * 1e6:.1f} -> {report.cost_after * 1e6:.1f} us "
        f"({report.profile}) in {report.seconds:.2f} s"
    )
    if report.stopped_by:
        summary += f"; saturation stopped by the {report.stopped_by}"
    print(summary + (f"; wrote {args.output}" if args.output else ""), file=sys.stderr)
    if html_problem:
        raise KnoptError(f"--html {args.html}: {html_problem}; the report was not written")
    if args.html:
        _write_html(args.html, to_html(result, title=args.model.name))
    return 0


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written (a folder, a missing or read-only folder), or None."""
    folder = path.parent
    if path.is_dir():
        return "is a folder; give a file name"
    if not folder.is_dir():
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "not writable; choose another path"
    return None


def _write_html(path: Path, page: str) -> None:
    """Write the HTML report.

    Raises:
        KnoptError: If the file cannot be written.
    """
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as err:
        raise KnoptError(f"--html {path}: {err.strerror or err}") from err
