"""Argument helpers shared by the subcommands."""

from __future__ import annotations

from collections.abc import Sequence

from knopt.errors import KnoptError
from knopt.ir.dims import SizeRange, parse_range_text


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """`["batch=2", "seq=128"]` as `{"batch": 2, "seq": 128}`.

    Raises:
        KnoptError: If an item is not NAME=SIZE with a positive integer size.
    """
    dims: dict[str, int] = {}
    for item in items:
        name, _, size = item.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise KnoptError(f"--dims {item!r}: expected NAME=SIZE with a positive size")
        dims[name] = int(size)
    return dims


def parse_ranges(items: Sequence[str]) -> dict[str, SizeRange]:
    """`["batch=2", "seq=1:128:512"]` as sizes fixed (min = max) or ranged (min, opt, max).

    Raises:
        InputError: If an item is neither NAME=SIZE nor NAME=MIN:OPT:MAX.
    """
    return dict(parse_range_text(item) for item in items)
