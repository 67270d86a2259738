"""Known values that hold symbolic sizes, turned into graph values computed at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from knopt.ir import op as ops
from knopt.ir.graph import Value
from knopt.ir.shape import Dim, Sym

if TYPE_CHECKING:
    from knopt.onnx.context import ImportContext, Known


def materialize_symbolic(ctx: ImportContext, known: Known) -> Value:
    """A graph value equal to `known`, an integer tensor with symbolic entries.

    Raises:
        UnsupportedModelError: If the known value is not an integer tensor.
    """
    if not known.dtype.is_int:
        raise ctx.fail(
            f"a {known.dtype.short} value computed from symbolic sizes is not supported; "
            "fix the sizes when loading (dims=...)"
        )
    flat: tuple[Dim, ...] = tuple(
        v if isinstance(v, Sym) else int(v) for v in known.array.reshape(-1)
    )
    sizes = ctx.builder.apply(ops.Sizes(flat, known.dtype))
    return ctx.builder.view(sizes, known.array.shape)
