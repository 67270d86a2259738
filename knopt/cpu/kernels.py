"""One small numpy function per IR op: the CPU executor's table, and the oracle of knopt.

Each function takes the op (its attributes) and the input arrays and returns the result array.
They favour obvious correctness; speed comes from numpy and BLAS doing the inner loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from knopt.cpu.conv import conv, pool
from knopt.cpu.elementwise import NUMPY_BINARY, NUMPY_UNARY
from knopt.cpu.opaque import run_opaque
from knopt.errors import RunError
from knopt.ir import op as ops
from knopt.ir.dtype import COMPUTE_TYPE, DType
from knopt.ir.op import PadMode, Reduction, ScatterReduction

Array = np.ndarray
Kernel = Callable[..., Array]


def _view(op: ops.View, x: Array) -> Array:
    return x.reshape(op.shape)  # type: ignore[arg-type]


def _broadcast(op: ops.Broadcast, x: Array) -> Array:
    return np.broadcast_to(x, op.shape)  # type: ignore[arg-type]


def _permute(op: ops.Permute, x: Array) -> Array:
    return np.transpose(x, op.perm)


def _slice(op: ops.Slice, x: Array) -> Array:
    index = [slice(None)] * x.ndim
    index[op.axis] = slice(op.start, op.stop, op.step)
    return x[tuple(index)]


def _flip(op: ops.Flip, x: Array) -> Array:
    return np.flip(x, op.axis)


_PAD_MODES = {
    PadMode.CONSTANT: "constant",
    PadMode.REFLECT: "reflect",
    PadMode.EDGE: "edge",
    PadMode.WRAP: "wrap",
}


def _pad(op: ops.Pad, x: Array) -> Array:
    if op.mode is PadMode.CONSTANT:
        value = np.array(op.value).astype(x.dtype)
        return np.pad(x, op.pads, mode="constant", constant_values=value)
    return np.pad(x, op.pads, mode=_PAD_MODES[op.mode])  # type: ignore[call-overload]


def _concat(op: ops.Concat, *xs: Array) -> Array:
    return np.concatenate(xs, axis=op.axis)


def _wrap(indices: Array, size: int) -> Array:
    """Indices with negatives counted from the end, each checked to lie in [-size, size).

    Raises:
        RunError: If an index is out of range (onnxruntime refuses it too).
    """
    if indices.size and (indices.min() < -size or indices.max() >= size):
        bad = indices[(indices < -size) | (indices >= size)].flat[0]
        raise RunError(
            f"index {bad} is out of range for an axis of size {size} (valid: {-size} to {size - 1})"
        )
    return np.where(indices < 0, indices + size, indices).astype(np.intp)


def _gather(op: ops.Gather, x: Array, indices: Array) -> Array:
    return np.take(x, _wrap(indices, x.shape[op.axis]), axis=op.axis)


_SCATTER_UFUNCS: dict[ScatterReduction, Any] = {
    ScatterReduction.ADD: np.add,
    ScatterReduction.MUL: np.multiply,
    ScatterReduction.MAX: np.maximum,
    ScatterReduction.MIN: np.minimum,
}


def _scatter(op: ops.Scatter, data: Array, indices: Array, updates: Array) -> Array:
    out = data.copy()
    size = data.shape[op.axis]
    index: list[Array] = list(np.indices(indices.shape, sparse=True))
    index[op.axis] = _wrap(indices, size)
    if op.reduction is ScatterReduction.NONE:
        out[tuple(index)] = updates
    else:
        _SCATTER_UFUNCS[op.reduction].at(out, tuple(index), updates)
    return out


def _cast(op: ops.Cast, x: Array) -> Array:
    target = op.dtype.numpy
    if np.issubdtype(target, np.integer) and np.issubdtype(x.dtype, np.floating):
        x = np.trunc(x)  # float to int truncates toward zero
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(target)


def _unary(op: ops.UnaryOp, x: Array) -> Array:
    # Floating-point warnings (log of 0, overflow) are silenced once per run by the executor:
    # an errstate here would cost three times the arithmetic of a small tensor.
    return np.asarray(NUMPY_UNARY[op.kind](x))


def _binary(op: ops.BinaryOp, a: Array, b: Array) -> Array:
    return np.asarray(NUMPY_BINARY[op.kind](a, b))


def _clamp(op: ops.Clamp, x: Array) -> Array:
    if np.issubdtype(x.dtype, np.integer):
        info = ml_dtypes.iinfo(x.dtype)
        lo = min(max(op.lo, info.min), info.max)  # an infinite bound on either side
        hi = min(max(op.hi, info.min), info.max)  # stays within the integer range
        return np.clip(x, int(np.ceil(lo)), int(np.floor(hi))).astype(x.dtype)
    return np.minimum(np.maximum(x, x.dtype.type(op.lo)), x.dtype.type(op.hi))


def _where(op: ops.Where, condition: Array, x: Array, y: Array) -> Array:
    return np.where(condition, x, y)


_REDUCERS: dict[Reduction, Any] = {
    Reduction.SUM: np.sum,
    Reduction.PROD: np.prod,
    Reduction.MAX: np.max,
    Reduction.MIN: np.min,
}


def _reduce(op: ops.Reduce, x: Array) -> Array:
    if x.size == 0 and op.kind in (Reduction.MAX, Reduction.MIN):
        shape = tuple(1 if i in op.axes else d for i, d in enumerate(x.shape))
        fill = _extreme(x.dtype, lowest=op.kind is Reduction.MAX)
        return np.full(shape, fill, x.dtype)
    return np.asarray(_REDUCERS[op.kind](x, axis=op.axes, keepdims=True)).astype(x.dtype)


def _extreme(dtype: np.dtype, *, lowest: bool) -> Any:
    if np.issubdtype(dtype, np.floating):
        return -np.inf if lowest else np.inf
    if dtype == np.bool_:
        return not lowest
    info = ml_dtypes.iinfo(dtype)
    return info.min if lowest else info.max


def _arg_reduce(op: ops.ArgReduce, x: Array) -> Array:
    """The index of the first (or last) largest or smallest element along the axis.

    Raises:
        RunError: If the axis is empty but the result is not (onnxruntime refuses it too).
    """
    if x.shape[op.axis] == 0:
        shape = tuple(1 if i == op.axis else d for i, d in enumerate(x.shape))
        if math.prod(shape):
            which = "largest" if op.largest else "smallest"
            raise RunError(f"no {which} element along axis {op.axis}, which is empty")
        return np.zeros(shape, np.int64)
    if op.last:
        flipped = np.flip(x, op.axis)
        found = _arg_reduce(ops.ArgReduce(op.axis, op.largest, False), flipped)
        return (x.shape[op.axis] - 1 - found).astype(np.int64)
    pick = np.argmax if op.largest else np.argmin
    return np.expand_dims(pick(x, axis=op.axis), op.axis).astype(np.int64)


def _arg_sort(op: ops.ArgSort, x: Array) -> Array:
    if not op.descending:
        return np.argsort(x, axis=op.axis, kind="stable").astype(np.int64)
    # Descending with ties in index order: sort the reversed array ascending, stably, and
    # map the indices back. Negation would overflow the smallest integer.
    n = x.shape[op.axis]
    reversed_order = np.argsort(np.flip(x, op.axis), axis=op.axis, kind="stable")
    return np.flip(n - 1 - reversed_order, op.axis).astype(np.int64)


def _cumsum(op: ops.CumSum, x: Array) -> Array:
    if op.reverse:
        x = np.flip(x, op.axis)
    out = np.cumsum(x, axis=op.axis, dtype=x.dtype)
    if op.exclusive:
        out = out - x
    return np.flip(out, op.axis) if op.reverse else out


def _matmul(op: ops.MatMul, a: Array, b: Array) -> Array:
    return np.matmul(a, b)


def _softmax(op: ops.Softmax, x: Array) -> Array:
    if x.size == 0:  # nothing to normalize, and numpy's max of an empty axis raises
        return x.copy()
    with np.errstate(invalid="ignore"):  # a row of only -inf is NaN, as exp(-inf - -inf)
        shifted = x - np.max(x, axis=op.axis, keepdims=True)
        e = np.exp(shifted)
        return (e / np.sum(e, axis=op.axis, keepdims=True)).astype(x.dtype)


def _layer_norm(op: ops.LayerNorm, x: Array) -> Array:
    axes = tuple(range(op.axis, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return (centered / np.sqrt(var + np.asarray(op.eps, x.dtype))).astype(x.dtype)


def _rms_norm(op: ops.RmsNorm, x: Array) -> Array:
    axes = tuple(range(op.axis, x.ndim))
    ms = np.mean(x * x, axis=axes, keepdims=True)
    return (x / np.sqrt(ms + np.asarray(op.eps, x.dtype))).astype(x.dtype)


def _attention(op: ops.Attention, q: Array, k: Array, v: Array, bias: Array) -> Array:
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * q.dtype.type(op.scale) + bias
    probabilities = _softmax(ops.Softmax(scores.ndim - 1), scores)
    return np.matmul(probabilities, v)


def rotate_half(x: Array) -> Array:
    """`concat(-x[..., h:], x[..., :h])` along the last axis, `h` half its size."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rope(op: ops.Rope, x: Array, cos: Array, sin: Array) -> Array:
    # Op by op, as the template it replaces: each product rounds to x's type, then the sum
    # (narrow types computed wider, as the executor computes their binary ops).
    narrow = x.dtype
    wide = COMPUTE_TYPE.get(DType.from_numpy(narrow), narrow)

    def product(a: Array, b: Array) -> Array:
        return (a.astype(wide) * b.astype(wide)).astype(narrow)

    total = product(x, cos).astype(wide) + product(rotate_half(x), sin).astype(wide)
    return total.astype(narrow)


def _centered(x: Array, zero: Array) -> Array:
    # float64 holds every sum of products of 9-bit integers below 2^53 exactly, and BLAS
    # multiplies it far faster than numpy multiplies integers.
    return x.astype(np.float64) - zero.astype(np.float64)


def _to_int32(exact: Array) -> Array:
    return exact.astype(np.int64).astype(np.int32)  # wraps as int32 accumulation would


def _int_matmul(op: ops.IntMatMul, a: Array, b: Array, a_zero: Array, b_zero: Array) -> Array:
    return _to_int32(np.matmul(_centered(a, a_zero), _centered(b, b_zero)))


def _int_conv(op: ops.IntConv, x: Array, w: Array, x_zero: Array, w_zero: Array) -> Array:
    as_float = ops.Conv(op.strides, op.pads, op.dilations, op.groups)
    return _to_int32(conv(as_float, _centered(x, x_zero), _centered(w, w_zero)))


def unpack_int4(packed: Array) -> Array:
    """uint8 bytes `[..., c]` as their 4-bit codes `[..., 2c]`, low nibble first."""
    codes = np.stack([packed & 15, packed >> 4], axis=-1)
    return codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def int4_weight(op: ops.Int4MatMul, packed: Array, scales: Array, zeros: Array, k: int) -> Array:
    """The weight `[n, k]` of an Int4MatMul in the scales' type."""
    n, blocks, _ = packed.shape
    t = scales.dtype.type
    codes = unpack_int4(packed).reshape(n, blocks, op.block).astype(t)
    zero = unpack_int4(zeros)[:, :blocks, None].astype(t)
    return ((codes - zero) * scales[:, :, None]).reshape(n, blocks * op.block)[:, :k]


def _int4_matmul(op: ops.Int4MatMul, a: Array, packed: Array, scales: Array, zeros: Array) -> Array:
    return np.matmul(a, int4_weight(op, packed, scales, zeros, a.shape[-1]).T)


def _iota(op: ops.Iota) -> Array:
    assert isinstance(op.length, int), "bind symbolic sizes before running"
    return np.arange(op.length, dtype=op.dtype.numpy)


def _sizes(op: ops.Sizes) -> Array:
    return np.array(op.dims, dtype=op.dtype.numpy)


def _constant(op: ops.Constant) -> Array:
    return op.data.array


KERNELS: dict[type[ops.Op], Kernel] = {
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
    ops.Conv: conv,
    ops.Pool: pool,
    ops.Softmax: _softmax,
    ops.LayerNorm: _layer_norm,
    ops.RmsNorm: _rms_norm,
    ops.Attention: _attention,
    ops.Rope: _rope,
    ops.IntMatMul: _int_matmul,
    ops.IntConv: _int_conv,
    ops.Int4MatMul: _int4_matmul,
    ops.Opaque: run_opaque,
}
