"""`knopt compile`: optimize (and on cuda compile) a model ahead of time into a program cache."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import knopt
from knopt.errors import KnoptError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `compile` subcommand."""
    parser = subparsers.add_parser(
        "compile",
        help="optimize a model for some input sizes ahead of time, into a program cache",
        description="Optimize MODEL (and on cuda compile its kernels) for every combination "
        "of the sizes given with --dims, writing the programs into the cache folder that "
        "sessions and served replicas read (knopt.compile(..., cache=DIR), knopt serve "
        "--cache DIR). Programs already there are read, not made again.",
    )
    parser.add_argument("model", type=Path, help="the .onnx file")
    parser.add_argument("--cache", required=True, type=Path, metavar="DIR", help="the cache")
    parser.add_argument(
        "--dims",
        action="append",
        default=[],
        metavar="NAME=SIZE[,SIZE...]",
        help="sizes of a named input size, such as batch=1,2,4,8 (repeatable; every named "
        "size needs one)",
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu (default) or cuda"
    )
    parser.add_argument(
        "--precision",
        choices=["f32", "tf32", "fp16", "bf16"],
        default="f32",
        help="on cuda: strict f32 (default), tf32, fp16 or bf16",
    )
    parser.add_argument(
        "--device-profile",
        metavar="NAME|FILE",
        help="the optimizer's cost model (default: the device's)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Compile every combination of sizes and say what was made and what was found."""
    from knopt.serve.spec import ModelSpec

    sizes = parse_size_lists(args.dims)
    session = knopt.compile(
        args.model,
        args.device,
        precision=args.precision,
        optimize=True,
        profile=args.device_profile,
        cache=args.cache,
    )
    assert session.cache is not None, "a cache was given"
    spec = ModelSpec.of(session)
    missing = [name for name in spec.sizes() if name not in sizes]
    if missing:
        raise KnoptError(f"give sizes for {missing} with --dims NAME=SIZE[,SIZE...]")
    unknown = sorted(set(sizes) - set(spec.sizes()))
    if unknown:
        raise KnoptError(f"--dims {unknown}: the model's named sizes are {spec.sizes()}")
    names = spec.sizes()
    for combination in itertools.product(*(sizes[name] for name in names)):
        bound = dict(zip(names, combination, strict=True))
        feeds = {s.name: np.zeros(_shape(s.name, s.shape, bound), s.dtype) for s in spec.inputs}
        writes = session.cache.stats.writes
        began = time.perf_counter()
        session.run(None, feeds)
        made = "optimized and written" if session.cache.stats.writes > writes else "in the cache"
        label = " ".join(f"{k}={v}" for k, v in bound.items()) or "static sizes"
        print(f"{label}: {made} ({time.perf_counter() - began:.2f} s)")
    stats = session.cache.stats
    print(f"{args.cache}: {stats.writes} program(s) written, {stats.hits} found")
    return 0


def parse_size_lists(items: Sequence[str]) -> dict[str, list[int]]:
    """`["batch=1,2", "seq=128"]` as `{"batch": [1, 2], "seq": [128]}`.

    Raises:
        KnoptError: If an item is not NAME=SIZE[,SIZE...] with positive integer sizes.
    """
    sizes: dict[str, list[int]] = {}
    for item in items:
        name, _, values = item.partition("=")
        parts = values.split(",")
        if not name or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise KnoptError(f"--dims {item!r}: expected NAME=SIZE[,SIZE...] with positive sizes")
        sizes[name] = [int(p) for p in parts]
    return sizes


def _shape(name: str, dims: Sequence[int | str | None], sizes: dict[str, int]) -> list[int]:
    shape = []
    for dim in dims:
        if dim is None:
            raise KnoptError(
                f"input '{name}' has a size computed from others; compile it by serving or "
                "running it once with a cache"
            )
        shape.append(sizes[dim] if isinstance(dim, str) else dim)
    return shape
