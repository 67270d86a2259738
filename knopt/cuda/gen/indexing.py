"""Small pieces of C that every generator needs: index splitting, offsets, names, parameters."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from knopt.cuda.cexpr import storage_type
from knopt.cuda.context import LoweringContext
from knopt.cuda.layout import Layout
from knopt.cuda.steps import Buf
from knopt.errors import CodegenError

PLACEHOLDER = "__KN_KERNEL__"
INT32_LIMIT = 2**31 - 1


def index_type(*counts: int) -> str:
    """`int` when every count (elements, offsets) fits in 31 bits, else `long long`."""
    return "int" if max(counts, default=0) < INT32_LIMIT else "long long"


def decompose(var: str, dims: Sequence[int], prefix: str, itype: str) -> list[str]:
    """C lines splitting row-major index `var` over `dims` into `prefix0` (outermost)..."""
    if not dims:
        return []
    if len(dims) == 1:
        return [f"const {itype} {prefix}0 = {var};"]
    lines = [f"{itype} {prefix}_rest = {var};"]
    for i in reversed(range(1, len(dims))):
        lines.append(f"const {itype} {prefix}{i} = {prefix}_rest % {dims[i]};")
        lines.append(f"{prefix}_rest /= {dims[i]};")
    lines.append(f"const {itype} {prefix}0 = {prefix}_rest;")
    return lines


def offset(prefix: str, strides: Sequence[int], base: str = "") -> str:
    """C for `base + sum(prefix_i * strides[i])`, leaving out zero strides."""
    terms = [base] if base else []
    for i, stride in enumerate(strides):
        if stride == 1:
            terms.append(f"{prefix}{i}")
        elif stride != 0:
            terms.append(f"{prefix}{i} * ({stride})")
    return " + ".join(terms) or "0"


def broadcast_to(layout: Layout, shape: Sequence[int], where: str) -> tuple[int, ...]:
    """The strides that read `layout` at each index of `shape` (numpy broadcasting).

    Raises:
        CodegenError: If the shapes do not broadcast.
    """
    shape = tuple(shape)
    if layout.shape == shape:
        return layout.strides
    lead = len(shape) - len(layout.shape)
    if lead < 0:
        raise CodegenError(f"{where}: cannot read {list(layout.shape)} at {list(shape)}")
    strides = [0] * lead
    for size, stride, target in zip(layout.shape, layout.strides, shape[lead:], strict=True):
        if size not in (1, target):
            raise CodegenError(f"{where}: cannot read {list(layout.shape)} at {list(shape)}")
        strides.append(0 if size == 1 else stride)
    return tuple(strides)


def named(kind: str, source: str) -> tuple[str, str]:
    """Give a kernel source its name, a hash of the source, so equal kernels share one."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    name = f"kn_{kind}_{digest}"
    return name, source.replace(PLACEHOLDER, name)


def params(entries: Sequence[tuple[str, str, bool]]) -> str:
    """A kernel parameter list from (C element type, name, writable) entries (all pointers)."""
    parts = []
    for ctype, name, writable in entries:
        qualifier = "" if writable else "const "
        parts.append(f"{qualifier}{ctype}* __restrict__ {name}")
    return ", ".join(parts)


def blocks(count: int, threads: int) -> int:
    """Blocks of `threads` covering `count` items."""
    return max(1, -(-count // threads))


def indent(lines: Sequence[str], depth: int = 1) -> str:
    """Lines joined, each indented by `depth` levels of two spaces."""
    pad = "  " * depth
    return "\n".join(pad + line for line in lines)


class Reads:
    """The kernel's input tensors as pointer parameters `in0, in1, ...`, each tensor once."""

    def __init__(self, ctx: LoweringContext) -> None:
        self.ctx = ctx
        self.tensors: list[int] = []

    def slot(self, tid: int, share: bool = True) -> str:
        """The parameter name of tensor `tid` (a new one each call unless `share`)."""
        if not share or tid not in self.tensors:
            self.tensors.append(tid)
            return f"in{len(self.tensors) - 1}"
        return f"in{self.tensors.index(tid)}"

    def params(self, out: int) -> str:
        """The parameter list: `out`, then the inputs."""
        entries = [(storage_type(self.ctx.dtype(out)), "out", True)]
        entries += [
            (storage_type(self.ctx.dtype(t)), f"in{i}", False) for i, t in enumerate(self.tensors)
        ]
        return params(entries)

    def args(self, out: int) -> tuple[Buf, ...]:
        """The launch arguments matching `params`."""
        return (Buf(out), *(Buf(t) for t in self.tensors))
