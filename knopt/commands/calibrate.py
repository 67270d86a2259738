"""`knopt calibrate`: measure a device profile for the cost model on this machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from knopt.calibrate import calibrate


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `calibrate` subcommand."""
    parser = subparsers.add_parser(
        "calibrate",
        help="measure bandwidth, FLOP/s and launch cost here, as a device profile",
        description="Measure a cost-model profile on this machine through knopt's own "
        "executor, and write it as JSON (to stdout without -o), with the measurements it was "
        "fitted to. Pass the file to `knopt optimize --device-profile FILE` or "
        "`knopt.optimize(profile=FILE)`.",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to measure (default: cpu)"
    )
    parser.add_argument("-o", "--output", type=Path, help="write the profile here")
    parser.add_argument("--name", help="the profile's name (default: DEVICE-calibrated)")
    parser.add_argument(
        "--quick", action="store_true", help="smaller problems, fewer trials (rougher figures)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Measure, print the figures to stderr and write the profile."""
    print(f"calibrating '{args.device}'{' (quick)' if args.quick else ''}...", file=sys.stderr)
    result = calibrate(
        args.device,
        name=args.name,
        quick=args.quick,
        progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
    )
    text = json.dumps(result.to_json(), indent=2) + "\n"
    base, measured = result.base, result.profile
    ratios = {
        "bandwidth": measured.bandwidth / base.bandwidth,
        "f32": measured.peak["f32"] / base.peak["f32"],
        "launch": measured.launch / base.launch,
    }
    shown = ", ".join(f"{key} {ratio:.2f}x" for key, ratio in ratios.items())
    print(f"against the built-in '{base.name}' estimates: {shown}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0
