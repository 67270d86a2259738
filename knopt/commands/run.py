"""`knopt run`: run a model on inputs from an .npz file; save or summarize the outputs."""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

import numpy as np

import knopt
from knopt.commands.common import parse_ranges
from knopt.errors import InputError, KnoptError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `run` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run a model on the CPU or a GPU with inputs from an .npz file",
        description="Run an ONNX model on knopt's CPU executor or its CUDA backend. The .npz "
        "files hold one array per model input (or output), named after it.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("--inputs", required=True, metavar="IN.npz", help="the input arrays")
    parser.add_argument(
        "--output", metavar="OUT.npz", help="write the outputs here instead of summarizing them"
    )
    parser.add_argument(
        "--dims",
        action="append",
        default=[],
        metavar="NAME=SIZE|NAME=MIN:OPT:MAX",
        help="fix a symbolic input size, such as batch=2, or bound it, such as seq=1:128:512 "
        "(min, the size kernels are costed at, max); repeatable",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda", "best"],
        default="cpu",
        help="where to run (best: cuda when a GPU is usable; default: cpu)",
    )
    parser.add_argument(
        "--precision",
        choices=["f32", "tf32", "fp16", "bf16"],
        default="f32",
        help="on cuda: strict f32 (default), tf32, fp16 or bf16",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the model and write or print its outputs."""
    session = knopt.compile(
        args.model, args.device, precision=args.precision, dims=parse_ranges(args.dims)
    )
    feeds = _read_inputs(Path(args.inputs))
    missing = [name for name in session.input_names if name not in feeds]
    if missing:
        raise InputError(
            f"{args.inputs}: no array for model input(s) {missing} (it holds {sorted(feeds)}); "
            "save one array per input, named after it"
        )
    outputs = dict(zip(session.output_names, session.run(None, feeds), strict=True))
    if args.output is not None:
        try:
            np.savez(args.output, **outputs)
        except OSError as err:
            raise KnoptError(f"{args.output}: cannot write the outputs ({err.strerror})") from err
        print(f"wrote {len(outputs)} output(s) to {args.output}")
        return 0
    for name, array in outputs.items():
        print(f"{name}: {_summary(array)}")
    return 0


def _read_inputs(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise InputError(f"{path}: no such file (give the inputs as an .npz file)")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise InputError(f"{path}: not a readable .npz file ({err})") from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InputError(f"{path}: holds one array, not named ones; save inputs with np.savez")
    with archive:
        try:
            return {name: archive[name] for name in archive.files}
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise InputError(f"{path}: not a readable .npz file ({err})") from err


def _summary(array: np.ndarray) -> str:
    text = f"shape {list(array.shape)}, dtype {array.dtype}"
    if array.size == 0:
        return text + ", empty"
    values = array.astype(np.float64)
    return f"{text}, min {values.min():.6g}, max {values.max():.6g}, mean {values.mean():.6g}"
