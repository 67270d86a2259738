"""`knopt run`: run a model on inputs from an .npz file or random ones; save or show the outputs.

`--repeat N` times N runs after the first, as `onnxruntime_perf_test` does.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
from onnx import helper

import knopt
from knopt.commands.common import Status, check_writable, parse_ranges, positive_int
from knopt.errors import InputError, KnoptError, UsageError
from knopt.ir.memory import check_bytes, format_bytes
from knopt.session import PerSizeSession, Session


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `run` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="run a model on the CPU or a GPU with inputs from an .npz file",
        description="Run an ONNX model on knopt's CPU executor or its CUDA backend. The .npz "
        "files hold one array per model input (or output), named after it.",
    )
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument(
        "--inputs",
        metavar="IN.npz",
        help="the input arrays (default: random inputs of the model's shapes, symbolic sizes "
        "from --dims or 1; floats standard normal, integers 0 or 1)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random inputs (default: %(default)s)"
    )
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
    parser.add_argument(
        "--optimize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the optimized program (default: on cuda yes, on cpu no: the CPU executor "
        "runs the model as written, as the reference)",
    )
    parser.add_argument(
        "--repeat",
        type=positive_int,
        metavar="N",
        help="after a first run (which optimizes, binds and compiles), time N more runs and "
        "print the median and minimum latency",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress line and no notes on stderr (progress shows only on a terminal)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the model and write or print its outputs (and their timing)."""
    check_writable("--output", None if args.output is None else Path(args.output))
    try:
        session = knopt.compile(
            args.model,
            args.device,
            precision=args.precision,
            optimize=args.optimize,
            dims=parse_ranges(args.dims),
        )
    except InputError as err:  # before any run, only `dims` can be wrong
        raise UsageError(f"--dims: {str(err).removeprefix('dims: ')}") from err
    if args.device == "best" and not args.quiet:
        print(f"knopt run: device 'best': running on {session.device}", file=sys.stderr)
    if args.inputs is None:
        feeds = random_inputs(session, args.seed)
        shown = ", ".join(f"{n} {a.dtype} {list(a.shape)}" for n, a in feeds.items())
        if not args.quiet:
            print(f"knopt run: random inputs (seed {args.seed}): {shown}", file=sys.stderr)
    else:
        feeds = _read_inputs(Path(args.inputs))
    missing = [name for name in session.input_names if name not in feeds]
    if missing:
        raise InputError(
            f"{args.inputs}: no array for model input(s) {missing} (it holds {sorted(feeds)}); "
            "save one array per input, named after it"
        )
    began = time.perf_counter()
    with Status("run", quiet=args.quiet) as status:
        prepared = "optimizes and compiles" if session.device == "cuda" else "optimizes"
        status(f"first run ({prepared})" if session.optimize else "running")
        outputs = dict(zip(session.output_names, session.run(None, feeds), strict=True))
    first = time.perf_counter() - began
    if args.output is not None:
        _check_room(Path(args.output), outputs)
        try:
            np.savez(args.output, **outputs)
        except OSError as err:
            raise KnoptError(f"{args.output}: cannot write the outputs ({err.strerror})") from err
        print(f"wrote {len(outputs)} output(s) to {args.output}")
    else:
        for name, array in outputs.items():
            print(f"{name}: {_summary(array)}")
    if args.repeat:
        print(_timing(session, feeds, args.repeat, first))
    return 0


def random_inputs(session: Session, seed: int) -> dict[str, np.ndarray]:
    """Random arrays for every input of the session's model, of its shapes and dtypes.

    Symbolic sizes take the session's representative size (the `opt` of `dims`), else 1.
    Floats are standard normal; integers are 0 or 1 and booleans random, which are valid as
    masks, token ids and indices alike.

    Raises:
        UsageError: If an input's shape has a size expression instead of a name or a number.
    """
    sizes = session.dims.representative
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, dims, dtype in _input_types(session):
        shape = [_size(name, dim, sizes) for dim in dims]
        if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _input_types(session: Session) -> list[tuple[str, list[int | str], np.dtype]]:
    """Each model input's name, sizes (numbers, or the names of symbolic ones) and dtype."""
    if isinstance(session, PerSizeSession):
        initializers = {t.name for t in session.model.graph.initializer}
        types = []
        for info in session.model.graph.input:
            if info.name in initializers:
                continue
            tensor = info.type.tensor_type
            dims = [
                d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim
            ]
            types.append(
                (info.name, dims, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
            )
        return types
    return [
        (name, [d if isinstance(d, int) else str(d) for d in value.shape], value.dtype.numpy)
        for name, value in zip(session.input_names, session.graph.inputs, strict=True)
    ]


def _size(name: str, dim: int | str, sizes: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if dim and not dim.isidentifier():
        raise UsageError(
            f"input '{name}' has the size {dim}; random inputs need named sizes, give --inputs"
        )
    return sizes.get(dim, 1)


def _timing(session: Session, feeds: dict[str, np.ndarray], repeat: int, first: float) -> str:
    """Time `repeat` runs after the first; one line with the median and the minimum."""
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        session.run(None, feeds)
        seconds.append(time.perf_counter() - began)
    how = f"{session.device}, {session.precision}, {'' if session.optimize else 'not '}optimized"
    return (
        f"latency over {repeat} run(s): median {statistics.median(seconds) * 1e3:.3f} ms, "
        f"min {min(seconds) * 1e3:.3f} ms ({how}; first run {first * 1e3:.1f} ms)"
    )


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


def _check_room(path: Path, outputs: dict[str, np.ndarray]) -> None:
    """Refuse to write outputs larger than the memory budget or the free disk space."""
    size = sum(array.nbytes for array in outputs.values())
    check_bytes(size, f"{path}: the outputs")
    try:
        free = shutil.disk_usage(path.resolve().parent).free
    except OSError as err:
        raise KnoptError(f"{path}: cannot write the outputs ({err.strerror})") from err
    if size > free:
        raise KnoptError(
            f"{path}: the outputs need {format_bytes(size)} but the disk has "
            f"{format_bytes(free)} free"
        )


def _summary(array: np.ndarray) -> str:
    text = f"shape {list(array.shape)}, dtype {array.dtype}"
    if array.size == 0:
        return text + ", empty"
    # Reductions in place: a float64 copy of a broadcast output could be 8 times its size.
    low, high = float(array.min()), float(array.max())
    mean = float(np.mean(array, dtype=np.float64))
    return f"{text}, min {low:.6g}, max {high:.6g}, mean {mean:.6g}"
