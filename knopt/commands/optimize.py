"""`knopt optimize`: optimize an ONNX model and save the result as standard ONNX."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import onnx

import knopt
from knopt.commands.common import (
    Status,
    check_writable,
    positive_float,
    positive_int,
    size_profile,
    unwritable,
)
from knopt.errors import KnoptError, UsageError
from knopt.onnx.export import MIN_OPSET
from knopt.onnx.load import default_opset, input_symbols, load_model
from knopt.opt.cost import PROFILES
from knopt.opt.egraph import Limits
from knopt.opt.explain import format_report, to_html
from knopt.opt.report import OptimizeReport


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
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress line and no summary (progress shows only on a terminal anyway)",
    )
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
        type=positive_float,
        default=Limits.seconds,
        help="seconds of saturation before stopping (default: %(default)s)",
    )
    parser.add_argument(
        "--node-limit",
        type=positive_int,
        default=Limits.nodes,
        help="e-nodes before stopping saturation (default: %(default)s)",
    )
    parser.add_argument("--no-ilp", action="store_true", help="skip the exact ILP extraction")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse a model with ops knopt lacks (by default such a node is kept as it is: "
        "the optimizer works around it and the saved model holds it unchanged)",
    )
    parser.add_argument(
        "--target",
        choices=["onnx", "onnxruntime"],
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
        help=f"ONNX opset of the output, {MIN_OPSET} to {onnx.defs.onnx_opset_version()} "
        f"(default: the model's, at least {MIN_OPSET})",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Optimize, report and save."""
    bad_reports = _check_request(args)
    with Status("optimize", quiet=args.quiet) as status:
        status("loading the model")
        model = load_model(args.model)
        opset = _output_opset(args.opset, default_opset(model))
        ranges = size_profile(args.dims, input_symbols(model))
        status("importing the model")
        graph = knopt.onnx.import_model(model, ranges.fixed, strict=args.strict)
        if args.output is None and not (
            args.quiet or args.explain or args.report_json or args.html
        ):
            print(
                "knopt optimize: note: no -o PATH given, so the optimized model will not be saved",
                file=sys.stderr,
            )
        result = knopt.optimize(
            graph,
            sizes=ranges.representative,
            rules=args.rules,
            profile=args.device_profile,
            limits=Limits(seconds=args.time_limit, nodes=args.node_limit),
            ilp=not args.no_ilp,
            progress=status,
        )
        if args.output:
            status(f"saving {args.output}")
            saved = knopt.save(
                result, args.output, kernels=args.kernels, opset=opset, target=args.target or "onnx"
            )
    report = result.report
    report.onnx_nodes_before = len(model.graph.node)
    if args.output:
        report.onnx_nodes_after = len(saved.graph.node)
    if args.explain:
        print(format_report(report))
    if not args.quiet:
        print(_summary(args, report), file=sys.stderr)
    if args.report_json and "--report-json" not in bad_reports:
        _write_report(args.report_json, "--report-json", json.dumps(report.to_json(), indent=2))
    if args.html and "--html" not in bad_reports:
        _write_report(args.html, "--html", to_html(result, title=args.model.name))
    if bad_reports:
        whys = bad_reports.values()
        raise UsageError("; ".join(f"{why}; the report was not written" for why in whys))
    return 0


def _check_request(args: argparse.Namespace) -> dict[str, str]:
    """Refuse a bad command line before any work; returns the reports to skip, flag: why.

    A report path that cannot be written is a warning when the model is saved (the user may
    want the model more than the report; the command still exits 2 at the end), and an error
    when there is nothing else to write.

    Raises:
        UsageError: If `-o` cannot be written, an option needs `-o`, or (without `-o`) a
            report path cannot be written.
    """
    check_writable("-o", args.output)
    if args.output is None:
        given = [flag for flag, value in _SAVE_OPTIONS.items() if getattr(args, value)]
        if given:
            raise UsageError(f"{', '.join(given)}: only for the saved model; add -o PATH")
    if args.opset is not None:
        _output_opset(args.opset, None)
    skipped: dict[str, str] = {}
    for flag, path in (("--report-json", args.report_json), ("--html", args.html)):
        problem = unwritable(path) if path is not None else None
        if problem and args.output is None:
            raise UsageError(f"{flag} {path}: {problem}")
        if problem:
            why = f"{flag} {path}: {problem}"
            print(
                f"knopt optimize: warning: {why}; the model will be saved but not this report",
                file=sys.stderr,
            )
            skipped[flag] = why
    return skipped


# Options of the saved model, by flag: they mean nothing without -o.
_SAVE_OPTIONS = {"--opset": "opset", "--kernels": "kernels", "--target": "target"}


def _output_opset(requested: int | None, model_opset: int | None) -> int:
    """The opset to save at: the one requested, else the model's (at least MIN_OPSET).

    Raises:
        UsageError: If the requested opset is one knopt cannot write.
    """
    newest = onnx.defs.onnx_opset_version()
    if requested is None:
        return min(max(MIN_OPSET, model_opset or MIN_OPSET), newest)
    if not MIN_OPSET <= requested <= newest:
        why = f" (the model's is {model_opset})" if model_opset is not None else ""
        raise UsageError(
            f"--opset {requested}: knopt writes opsets {MIN_OPSET} to {newest}{why}; choose "
            "one in that range"
        )
    return requested


def _summary(args: argparse.Namespace, report: OptimizeReport) -> str:
    """One line: node counts, kernels, estimated cost and time, and what was saved."""
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
    return summary + (f"; wrote {args.output}" if args.output else "; nothing saved (no -o)")


def _write_report(path: Path, flag: str, text: str) -> None:
    """Write a report file.

    Raises:
        KnoptError: If the file cannot be written after all (the disk filled up, say).
    """
    try:
        path.write_text(text + ("" if text.endswith("\n") else "\n"), encoding="utf-8")
    except OSError as err:
        raise KnoptError(f"{flag} {path}: {err.strerror or err}") from err
