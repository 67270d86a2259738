"""The memory budget: the largest tensor knopt allocates, derived from the machine's memory.

Models declare sizes that nobody checked (an integer `ConstantOfShape` asking for 7 TiB, an input
of size 2^32 x 2^32): every place that makes a tensor whose size comes from a model or from its
inputs asks `check_shape` first, and gets a `MemoryLimitError` naming the node instead of a
`MemoryError`, a swapping machine or a killed process.

The budget is, by priority: `set_memory_limit(...)`, the environment variable
`KNOPT_MEMORY_LIMIT` (bytes, or with a suffix: `512M`, `8G`, `1T`), or half the memory available
when first asked (half, so that a tensor and the result computed from it fit together).

Tensors have at most `MAX_RANK` (32) axes; `check_shape` refuses more with an
`UnsupportedModelError`, as it refuses sizes beyond what an array can index.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from knopt.errors import MemoryLimitError, UnsupportedModelError

if TYPE_CHECKING:
    from knopt.ir.graph import Value

ENVIRONMENT_VARIABLE = "KNOPT_MEMORY_LIMIT"
AVAILABLE_FRACTION = 0.5
_MINIMUM = 64 * 2**20  # a budget derived from a nearly full machine stays usable
_FALLBACK_AVAILABLE = 8 * 2**30  # where the platform says nothing about its memory
_NUMPY_SPAN = 2**62  # numpy refuses shapes whose non-zero dims multiply to 2^63 bytes or more
# The most axes a tensor may have: numpy arrays have up to 64, but its iterators (`flat`,
# `broadcast_shapes`, which import-time folding uses) take 32, and the CPU executor views the
# windows of a rank-r convolution or pooling input with 2r - 2 axes (knopt/cpu/conv.py).
MAX_RANK = 32
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE)

_setting: int | None = None


def parse_size(text: str) -> int:
    """`"512M"` as 536870912: bytes, with an optional K, M, G or T suffix (powers of 1024).

    Raises:
        ValueError: If the text is not a size.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a size (write bytes, or a number with K, M, G or T)")
    return int(float(match[1]) * _UNITS[match[2].upper()])


def set_memory_limit(limit: int | str | None) -> None:
    """Set the largest tensor knopt allocates, in bytes (or `"8G"`); None restores the default.

    Raises:
        ValueError: If the limit is not a positive size.
    """
    global _setting
    value = parse_size(limit) if isinstance(limit, str) else limit
    if value is not None and value < 1:
        raise ValueError(f"memory limit {limit!r} is not positive")
    _setting = value


def memory_limit() -> int:
    """The largest tensor, in bytes, that knopt allocates now.

    Raises:
        MemoryLimitError: If `KNOPT_MEMORY_LIMIT` is set but is not a size.
    """
    if _setting is not None:
        return _setting
    text = os.environ.get(ENVIRONMENT_VARIABLE)
    if text:
        try:
            return max(parse_size(text), 1)
        except ValueError as err:
            raise MemoryLimitError(f"{ENVIRONMENT_VARIABLE}: {err}") from err
    return max(int(_available_memory() * AVAILABLE_FRACTION), _MINIMUM)


def check_bytes(size: int, what: str) -> None:
    """Refuse `size` bytes if they exceed the budget; `what` names the tensor or file.

    Raises:
        MemoryLimitError: If `size` is larger than `memory_limit()`.
    """
    limit = memory_limit()
    if size > limit:
        raise MemoryLimitError(
            f"{what}: needs {format_bytes(size)}, more than the memory limit of "
            f"{format_bytes(limit)} ({_limit_origin()}); fix the model's sizes or raise the "
            f"limit with {ENVIRONMENT_VARIABLE}"
        )


def check_shape(shape: Sequence[int], itemsize: int, what: str) -> None:
    """Refuse a tensor of static `shape` that exceeds the budget or that numpy cannot represent.

    Args:
        shape: The dims (Python integers, so products never overflow).
        itemsize: Bytes per element as allocated.
        what: Names the tensor, for the message ("node 'expand' (Broadcast)").

    Raises:
        MemoryLimitError: If the tensor is larger than `memory_limit()`, or its non-zero dims
            multiply beyond what an array can index (an empty [2^32, 2^32, 0] is such a shape).
        UnsupportedModelError: If it has more than `MAX_RANK` axes.
    """
    check_rank(len(shape), what)
    span = math.prod(d for d in shape if d) * itemsize
    if span >= _NUMPY_SPAN:
        raise MemoryLimitError(
            f"{what}: shape {list(shape)} has dims that multiply to {format_bytes(span)}, more "
            "than any array can index; fix the model's sizes"
        )
    check_bytes(math.prod(shape) * itemsize, f"{what} of shape {list(shape)}")


def check_rank(rank: int, what: str) -> None:
    """Refuse a tensor of more than `MAX_RANK` axes; `what` names it.

    Raises:
        UnsupportedModelError: If `rank` is larger than `MAX_RANK`.
    """
    if rank > MAX_RANK:
        raise UnsupportedModelError(
            f"{what}: {rank} axes, more than the {MAX_RANK} that knopt supports"
        )


def check_value(value: Value, what: str) -> None:
    """Refuse a graph value larger than the budget, counting each symbolic size as 1.

    A symbolic size is at least 1, so the static dims alone bound the value from below.

    Raises:
        MemoryLimitError: As `check_shape`.
        UnsupportedModelError: As `check_shape`.
    """
    static = [d if isinstance(d, int) else 1 for d in value.shape]
    check_shape(static, value.dtype.numpy.itemsize, what)


def format_bytes(size: int) -> str:
    """A byte count for people: `1.5 GiB`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def _limit_origin() -> str:
    if _setting is not None:
        return "set by knopt.set_memory_limit"
    if os.environ.get(ENVIRONMENT_VARIABLE):
        return f"set by {ENVIRONMENT_VARIABLE}"
    return f"{AVAILABLE_FRACTION:.0%} of the available memory"


@functools.cache
def _available_memory() -> int:
    """Bytes of memory available to this process when first asked (cgroup limits included)."""
    available = _FALLBACK_AVAILABLE
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(available, _cgroup_room())


def _cgroup_room() -> int:
    """What a cgroup (v2) memory limit leaves, or a huge number where there is none."""
    folder = Path("/sys/fs/cgroup")
    try:
        limit = (folder / "memory.max").read_text().strip()
        used = int((folder / "memory.current").read_text().strip())
        return 2**63 if limit == "max" else max(int(limit) - used, 0)
    except (OSError, ValueError):
        return 2**63
