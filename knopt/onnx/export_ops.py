"""ONNX export of the IR ops: one small function per op class, in `EXPORTERS`.

Each function takes the emitter, the op, the IR node and the ONNX names of the node's inputs,
adds ONNX nodes and returns the name of the value that holds the node's result. Sizes that may
be symbolic (View, Broadcast, Slice, Iota, Sizes, ...) go through `Emitter.sizes`, so that they
are computed from the graph inputs' shapes at run time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from knopt.errors import UnsupportedModelError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Node
from knopt.ir.op import PadMode, PoolKind, Reduction
from knopt.ir.shape import Dim
from knopt.onnx.emitter import Emitter
from knopt.onnx.export_elementwise import BINARY_EXPORTERS, UNARY_EXPORTERS

OpExporter = Callable[[Emitter, Any, Node, list[str]], str]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_WRAP_PAD_OPSET = 19  # Pad mode "wrap" arrived in opset 19
_DILATED_AVERAGE_POOL_OPSET = 19  # and AveragePool dilations too
_RMS_NORM_OPSET = 23  # RMSNormalization arrived in opset 23
_RANGE_DTYPES = frozenset({DType.F32, DType.F64, DType.I16, DType.I32, DType.I64})


def _input(em: Emitter, op: ops.Input, node: Node, args: list[str]) -> str:
    return op.input_name


def _constant(em: Emitter, op: ops.Constant, node: Node, args: list[str]) -> str:
    return em.constant(op.data.array)


def _iota(em: Emitter, op: ops.Iota, node: Node, args: list[str]) -> str:
    dtype = op.dtype if op.dtype in _RANGE_DTYPES else DType.I64
    length = em.scalar_size(op.length)
    if dtype is not DType.I64:
        length = em.op("Cast", [length], to=int(dtype))
    out = em.op("Range", [em.scalar(0, dtype), length, em.scalar(1, dtype)])
    return out if dtype is op.dtype else em.op("Cast", [out], to=int(op.dtype))


def _sizes(em: Emitter, op: ops.Sizes, node: Node, args: list[str]) -> str:
    out = em.sizes(op.dims)
    return out if op.dtype is DType.I64 else em.op("Cast", [out], to=int(op.dtype))


def _view(em: Emitter, op: ops.View, node: Node, args: list[str]) -> str:
    # allowzero: a 0 in the shape is a size of zero, not "copy this axis" (ONNX's default).
    return em.op("Reshape", [args[0], em.sizes(op.shape)], allowzero=1)


def _broadcast(em: Emitter, op: ops.Broadcast, node: Node, args: list[str]) -> str:
    return em.op("Expand", [args[0], em.sizes(op.shape)])


def _permute(em: Emitter, op: ops.Permute, node: Node, args: list[str]) -> str:
    return em.op("Transpose", args, perm=list(op.perm))


def _slice(em: Emitter, op: ops.Slice, node: Node, args: list[str]) -> str:
    starts, stops = em.sizes([op.start]), em.sizes([op.stop])
    return em.op("Slice", [args[0], starts, stops, em.ints([op.axis]), em.ints([op.step])])


def _flip(em: Emitter, op: ops.Flip, node: Node, args: list[str]) -> str:
    bounds = [em.ints([-1]), em.ints([INT64_MIN])]
    return em.op("Slice", [args[0], *bounds, em.ints([op.axis]), em.ints([-1])])


_PAD_MODES = {PadMode.CONSTANT: "constant", PadMode.REFLECT: "reflect", PadMode.EDGE: "edge"}


def _pad(em: Emitter, op: ops.Pad, node: Node, args: list[str]) -> str:
    if op.mode is PadMode.WRAP and em.opset < _WRAP_PAD_OPSET:
        return _wrap_pad(em, op, node, args[0])
    mode = "wrap" if op.mode is PadMode.WRAP else _PAD_MODES[op.mode]
    pads = em.ints([b for b, _ in op.pads] + [a for _, a in op.pads])
    inputs = [args[0], pads]
    if op.mode is PadMode.CONSTANT:
        inputs.append(em.constant(np.array(op.value).astype(node.output.dtype.numpy)))
    return em.op("Pad", inputs, mode=mode)


def _wrap_pad(em: Emitter, op: ops.Pad, node: Node, x: str) -> str:
    """Wrap padding as slices of the periodic extension, joined by Concat, axis by axis."""
    shape = list(node.inputs[0].shape)
    for axis, (before, after) in enumerate(op.pads):
        if before == 0 and after == 0:
            continue
        size = shape[axis]
        source = x
        if not isinstance(size, int) or max(before, after) > size:
            if not isinstance(size, int):
                raise UnsupportedModelError(
                    f"{node.describe()}: wrap padding of a symbolic axis needs opset "
                    f"{_WRAP_PAD_OPSET} or newer; export with opset={_WRAP_PAD_OPSET}"
                )
            # A repeated axis has the same periodic extension, and is long enough to slice.
            repeats = [1] * len(shape)
            repeats[axis] = -(-max(before, after) // size)
            source = em.op("Tile", [x, em.ints(repeats)])
        pieces = []
        if before:
            pieces.append(
                em.op("Slice", [source, em.ints([-before]), em.ints([INT64_MAX]), em.ints([axis])])
            )
        pieces.append(x)
        if after:
            pieces.append(em.op("Slice", [source, em.ints([0]), em.ints([after]), em.ints([axis])]))
        x = em.op("Concat", pieces, axis=axis)
        shape[axis] = size + before + after
    return x


def _concat(em: Emitter, op: ops.Concat, node: Node, args: list[str]) -> str:
    return em.op("Concat", args, axis=op.axis)


def _gather(em: Emitter, op: ops.Gather, node: Node, args: list[str]) -> str:
    return em.op("Gather", args, axis=op.axis)


def _scatter(em: Emitter, op: ops.Scatter, node: Node, args: list[str]) -> str:
    reduction = op.reduction.name.lower()
    return em.op("ScatterElements", args, axis=op.axis, reduction=reduction)


def _cast(em: Emitter, op: ops.Cast, node: Node, args: list[str]) -> str:
    return em.op("Cast", args, to=int(op.dtype))


def _unary(em: Emitter, op: ops.UnaryOp, node: Node, args: list[str]) -> str:
    return UNARY_EXPORTERS[op.kind](em, args[0], node.inputs[0].dtype)


def _binary(em: Emitter, op: ops.BinaryOp, node: Node, args: list[str]) -> str:
    return BINARY_EXPORTERS[op.kind](em, args[0], args[1], node.inputs[0].dtype)


def _clamp(em: Emitter, op: ops.Clamp, node: Node, args: list[str]) -> str:
    dtype = node.output.dtype
    lo, hi = op.lo, op.hi
    if dtype.is_int:
        # Compare as Python ints: float(iinfo(int64).max) rounds up to 2**63, which wraps.
        info = ml_dtypes.iinfo(dtype.numpy)
        low = int(info.min) if lo < info.min else max(int(np.ceil(lo)), int(info.min))
        high = int(info.max) if hi > info.max else min(int(np.floor(hi)), int(info.max))
        bounds = [em.scalar(low, dtype), em.scalar(high, dtype)]
    else:
        bounds = [
            em.scalar(lo, dtype) if np.isfinite(lo) else "",
            em.scalar(hi, dtype) if np.isfinite(hi) else "",
        ]
    return em.op("Clip", [args[0], *bounds])


# onnxruntime implements Where for few integer types (not bool, int16, uint16 or uint64): select
# those through a type that holds every value exactly and cast back. uint64 goes through int64,
# whose casts both ways keep the bits.
_WHERE_CARRIERS = {
    DType.BOOL: DType.U8,
    DType.I16: DType.I32,
    DType.U16: DType.I32,
    DType.U64: DType.I64,
}


def _where(em: Emitter, op: ops.Where, node: Node, args: list[str]) -> str:
    dtype = node.output.dtype
    carrier = _WHERE_CARRIERS.get(dtype)
    if carrier is None:
        return em.op("Where", args)
    condition, x, y = args
    wide = [em.op("Cast", [v], to=int(carrier)) for v in (x, y)]
    return em.op("Cast", [em.op("Where", [condition, *wide])], to=int(dtype))


_REDUCE_OPS = {
    Reduction.SUM: "ReduceSum",
    Reduction.PROD: "ReduceProd",
    Reduction.MAX: "ReduceMax",
    Reduction.MIN: "ReduceMin",
}


def _reduce(em: Emitter, op: ops.Reduce, node: Node, args: list[str]) -> str:
    return em.op(_REDUCE_OPS[op.kind], [args[0], em.ints(list(op.axes))], keepdims=1)


def _arg_reduce(em: Emitter, op: ops.ArgReduce, node: Node, args: list[str]) -> str:
    op_type = "ArgMax" if op.largest else "ArgMin"
    return em.op(op_type, args, axis=op.axis, keepdims=1, select_last_index=int(op.last))


def _arg_sort(em: Emitter, op: ops.ArgSort, node: Node, args: list[str]) -> str:
    # TopK of the whole axis; ONNX breaks ties by the lower index, as ArgSort does.
    k = em.sizes([node.inputs[0].shape[op.axis]])
    _, indices = em.op_outputs(
        "TopK", [args[0], k], outputs=2, axis=op.axis, largest=int(op.descending), sorted=1
    )
    return indices


def _cumsum(em: Emitter, op: ops.CumSum, node: Node, args: list[str]) -> str:
    axis = em.scalar(op.axis, DType.I64)
    return em.op("CumSum", [args[0], axis], exclusive=int(op.exclusive), reverse=int(op.reverse))


def _matmul(em: Emitter, op: ops.MatMul, node: Node, args: list[str]) -> str:
    return em.op("MatMul", args)


def _onnx_pads(pads: tuple[tuple[int, int], ...]) -> list[int]:
    return [b for b, _ in pads] + [a for _, a in pads]


def conv_attributes(op: ops.Conv) -> dict[str, Any]:
    """The attributes of the ONNX Conv (and FusedConv) that computes `op`."""
    return {
        "strides": list(op.strides),
        "pads": _onnx_pads(op.pads),
        "dilations": list(op.dilations),
        "group": op.groups,
    }


def _conv(em: Emitter, op: ops.Conv, node: Node, args: list[str]) -> str:
    if not node.output.dtype.is_float:
        return _integer_conv(em, op, node, args)
    return em.op("Conv", args, **conv_attributes(op))


# ONNX Conv is for floats only, and ConvInteger for 8-bit operands; the int32 convolutions of
# imported QLinearConv/ConvInteger nodes (centered operands, 9 bits) are exported as im2col:
# one strided Slice of the padded input per kernel offset, then one integer MatMul per group.
_INTEGER_MATMUL_DTYPES = frozenset({DType.I32, DType.I64, DType.U32, DType.U64})


def _static(dims: Sequence[Dim]) -> list[int] | None:
    ints = [d for d in dims if isinstance(d, int)]
    return ints if len(ints) == len(dims) else None


def _integer_conv(em: Emitter, op: ops.Conv, node: Node, args: list[str]) -> str:
    out = node.output.shape
    sizes, kernel = _static(out[2:]), _static(node.inputs[1].shape)
    if node.output.dtype not in _INTEGER_MATMUL_DTYPES or sizes is None or kernel is None:
        raise UnsupportedModelError(
            f"{node.describe()}: an integer convolution exports only for int32/int64 with "
            "static kernel and output sizes; fix the sizes when loading (dims=...)"
        )
    x = args[0]
    if any(b or a for b, a in op.pads):
        zero = em.scalar(0, node.output.dtype)
        befores, afters = [b for b, _ in op.pads], [a for _, a in op.pads]
        x = em.op("Pad", [x, em.ints([0, 0, *befores, 0, 0, *afters]), zero])
    axes = em.ints(list(range(2, 2 + len(sizes))))
    steps = em.ints(list(op.strides))
    patches = []
    for offset in itertools.product(*(range(k) for k in kernel[2:])):
        starts = [k * d for k, d in zip(offset, op.dilations, strict=True)]
        ends = [s + (n - 1) * t + 1 for s, n, t in zip(starts, sizes, op.strides, strict=True)]
        piece = em.op("Slice", [x, em.ints(starts), em.ints(ends), axes, steps])
        patches.append(em.op("Unsqueeze", [piece, em.ints([2])]))
    stacked = em.op("Concat", patches, axis=2) if len(patches) > 1 else patches[0]
    depth = kernel[1] * len(patches)  # input channels per group times kernel offsets
    columns = em.op("Reshape", [stacked, em.sizes([out[0], op.groups, depth, math.prod(sizes)])])
    weights = em.op("Reshape", [args[1], em.ints([op.groups, kernel[0] // op.groups, depth])])
    return em.op("Reshape", [em.op("MatMul", [weights, columns]), em.sizes(out)])


def _pool(em: Emitter, op: ops.Pool, node: Node, args: list[str]) -> str:
    window: dict[str, Any] = {
        "kernel_shape": list(op.kernel),
        "strides": list(op.strides),
        "pads": _onnx_pads(op.pads),
        "ceil_mode": int(op.ceil_mode),
    }
    if op.kind is PoolKind.MAX:
        return em.op("MaxPool", args, dilations=list(op.dilations), **window)
    if any(d != 1 for d in op.dilations):
        if em.opset < _DILATED_AVERAGE_POOL_OPSET:
            raise UnsupportedModelError(
                f"{node.describe()}: average pooling with dilations needs opset "
                f"{_DILATED_AVERAGE_POOL_OPSET} or newer; export with "
                f"opset={_DILATED_AVERAGE_POOL_OPSET}"
            )
        window["dilations"] = list(op.dilations)
    return em.op("AveragePool", args, count_include_pad=int(op.count_include_pad), **window)


def _softmax(em: Emitter, op: ops.Softmax, node: Node, args: list[str]) -> str:
    return em.op("Softmax", args, axis=op.axis)


def ones(em: Emitter, node: Node, axis: int) -> str:
    """A scale of ones over the normalized axes `axis...` of the node's input."""
    dims = node.inputs[0].shape[axis:]
    dtype = node.output.dtype
    if all(isinstance(d, int) for d in dims):
        return em.constant(np.ones(dims, dtype.numpy))  # type: ignore[arg-type]
    one = em.constant(np.ones((1,) * len(dims), dtype.numpy))
    return em.op("Expand", [one, em.sizes(dims)])


def _layer_norm(em: Emitter, op: ops.LayerNorm, node: Node, args: list[str]) -> str:
    scale = ones(em, node, op.axis)
    return em.op("LayerNormalization", [args[0], scale], axis=op.axis, epsilon=op.eps)


def _rms_norm(em: Emitter, op: ops.RmsNorm, node: Node, args: list[str]) -> str:
    return rms_norm(em, op, node, args[0], ones(em, node, op.axis))


def rms_norm(em: Emitter, op: ops.RmsNorm, node: Node, x: str, scale: str) -> str:
    """`op` on `x`, times `scale` (of the normalized axes' shape).

    RMSNormalization from opset 23; before it, the spelling that onnxruntime fuses into its
    SimplifiedLayerNormalization.
    """
    if em.opset >= _RMS_NORM_OPSET:
        return em.op("RMSNormalization", [x, scale], axis=op.axis, epsilon=op.eps)
    dtype = node.output.dtype
    axes = em.ints(list(range(op.axis, node.output.rank)))
    square = em.op("Pow", [x, em.scalar(2.0, dtype)])
    mean_square = em.op("ReduceMean", [square, axes], keepdims=1)
    root = em.op("Sqrt", [em.op("Add", [mean_square, em.scalar(op.eps, dtype)])])
    return em.op("Mul", [em.op("Div", [x, root]), scale])


def _attention(em: Emitter, op: ops.Attention, node: Node, args: list[str]) -> str:
    q, k, v, bias = args
    rank = node.output.rank
    perm = [*range(rank - 2), rank - 1, rank - 2]
    scores = em.op("MatMul", [q, em.op("Transpose", [k], perm=perm)])
    scaled = em.op("Mul", [scores, em.scalar(op.scale, node.output.dtype)])
    weights = em.op("Softmax", [em.op("Add", [scaled, bias])], axis=rank - 1)
    return em.op("MatMul", [weights, v])


def _rope(em: Emitter, op: ops.Rope, node: Node, args: list[str]) -> str:
    # Written out as the exporters write it (ONNX's RotaryEmbedding takes half-width tables).
    x, cos, sin = args
    size = node.output.shape[-1]
    assert isinstance(size, int)
    last, half = em.ints([-1]), size // 2
    upper = em.op("Slice", [x, em.ints([half]), em.ints([size]), last])
    lower = em.op("Slice", [x, em.ints([0]), em.ints([half]), last])
    rotated = em.op("Concat", [em.op("Neg", [upper]), lower], axis=-1)
    return em.op("Add", [em.op("Mul", [x, cos]), em.op("Mul", [rotated, sin])])


def _centered(em: Emitter, value: str, zero: str) -> str:
    """`value - zero` of 8-bit tensors, in int32."""
    int32 = int(DType.I32)
    return em.op("Sub", [em.op("Cast", [value], to=int32), em.op("Cast", [zero], to=int32)])


# The products of IntMatMul and IntConv run in int32 over centered operands, which is what
# they mean whatever the shape of their zero points (with per-tensor ones they are
# MatMulInteger and ConvInteger instead: knopt/onnx/export_integer.py).
def _int_matmul(em: Emitter, op: ops.IntMatMul, node: Node, args: list[str]) -> str:
    a, b, a_zero, b_zero = args
    return em.op("MatMul", [_centered(em, a, a_zero), _centered(em, b, b_zero)])


def _int_conv(em: Emitter, op: ops.IntConv, node: Node, args: list[str]) -> str:
    x, w, x_zero, w_zero = args
    as_conv = ops.Conv(op.strides, op.pads, op.dilations, op.groups)
    centered = [_centered(em, x, x_zero), _centered(em, w, w_zero)]
    return _integer_conv(em, as_conv, node, centered)


def _unpacked_int4(em: Emitter, packed: str, rows: int, count: int, dtype: DType) -> str:
    """The 4-bit codes of uint8 `packed` (rows of bytes), `[rows, count]` in `dtype`."""
    wide = em.op("Cast", [packed], to=int(DType.I32))
    sixteen = em.scalar(16, DType.I32)
    low = em.op("Unsqueeze", [em.op("Mod", [wide, sixteen]), em.ints([-1])])
    high = em.op("Unsqueeze", [em.op("Div", [wide, sixteen]), em.ints([-1])])
    codes = em.op("Reshape", [em.op("Concat", [low, high], axis=-1), em.ints([rows, -1])])
    codes = em.op("Slice", [codes, em.ints([0]), em.ints([count]), em.ints([1]), em.ints([1])])
    return em.op("Cast", [codes], to=int(dtype))


def _int4_matmul(em: Emitter, op: ops.Int4MatMul, node: Node, args: list[str]) -> str:
    a, packed, scales, zeros = args
    n, blocks, _ = node.inputs[1].shape
    k = node.inputs[0].shape[-1]
    assert isinstance(n, int) and isinstance(blocks, int) and isinstance(k, int)
    dtype = node.output.dtype
    codes = em.op(
        "Reshape",
        [_unpacked_int4(em, packed, n, blocks * op.block, dtype), em.ints([n, blocks, op.block])],
    )
    zero = em.op("Reshape", [_unpacked_int4(em, zeros, n, blocks, dtype), em.ints([n, blocks, 1])])
    scale = em.op("Reshape", [scales, em.ints([n, blocks, 1])])
    weight = em.op(
        "Reshape", [em.op("Mul", [em.op("Sub", [codes, zero]), scale]), em.ints([n, -1])]
    )
    weight = em.op("Slice", [weight, em.ints([0]), em.ints([k]), em.ints([1]), em.ints([1])])
    return em.op("MatMul", [a, em.op("Transpose", [weight], perm=[1, 0])])


def _opaque(em: Emitter, op: ops.Opaque, node: Node, args: list[str]) -> str:
    name = em.opaque(op.call, args)[op.output]
    em.declared[name] = op.tensor_type
    return name


EXPORTERS: dict[type[ops.Op], OpExporter] = {
    ops.Input: _input,
    ops.Constant: _constant,
    ops.Iota: _iota,
    ops.Sizes: _sizes,
    ops.View: _view,
    ops.Broadcast: _broadcast,
    ops.Permute: _permute,
    ops.Slice: _slice,
    ops.Flip: _flip,
    ops.Pad: _pad,
    ops.Concat: _concat,
    ops.Gather: _gather,
    ops.Scatter: _scatter,
    ops.Cast: _cast,
    ops.UnaryOp: _unary,
    ops.BinaryOp: _binary,
    ops.Clamp: _clamp,
    ops.Where: _where,
    ops.Reduce: _reduce,
    ops.ArgReduce: _arg_reduce,
    ops.ArgSort: _arg_sort,
    ops.CumSum: _cumsum,
    ops.MatMul: _matmul,
    ops.Conv: _conv,
    ops.Pool: _pool,
    ops.Softmax: _softmax,
    ops.LayerNorm: _layer_norm,
    ops.RmsNorm: _rms_norm,
    ops.Attention: _attention,
    ops.Rope: _rope,
    ops.IntMatMul: _int_matmul,
    ops.IntConv: _int_conv,
    ops.Int4MatMul: _int4_matmul,
    ops.Opaque: _opaque,
}
