"""Importers of the ONNX signal ops: DFT, STFT, windows (Hann, Hamming, Blackman), mel filters.

A DFT of static length is a product with constant cosine and sine matrices (computed in float64),
so it becomes two matmuls per output part. Windows and mel matrices depend only on sizes, so
they are computed here as constants, with the ONNX reference's formulas.
"""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.shape import numel
from knopt.onnx.context import ImportContext, Known, OnnxValue, importer
from knopt.onnx.ops.common import axis_of, static_dim


def _matrix_product(ctx: ImportContext, x: Value, matrix: np.ndarray) -> Value:
    """`x [..., L]` times a constant `[L, K]`, giving `[..., K]`."""
    b = ctx.builder
    rows = numel(x.shape[:-1])
    flat = b.view(x, (rows, x.shape[-1]))
    product = b.matmul(flat, b.constant(matrix.astype(x.dtype.numpy)))
    return b.view(product, (*x.shape[:-1], matrix.shape[1]))


def _fit(ctx: ImportContext, x: Value, length: int) -> Value:
    """`x` cut or zero-padded along its last axis to `length`."""
    b = ctx.builder
    size = x.shape[-1]
    if not isinstance(size, int):
        raise ctx.fail("a DFT needs a static signal length")
    if size > length:
        return b.slice(x, axis=x.rank - 1, start=0, stop=length)
    return b.pad(x, pads=(*((0, 0),) * (x.rank - 1), (0, length - size)))


def dft(
    ctx: ImportContext, x: Value, axis: int, length: int, inverse: bool, onesided: bool
) -> Value:
    """ONNX DFT of `x [..., 1 or 2]` (real or complex) along `axis`, as the reference computes.

    Returns `[..., K, 2]`, or `[..., L, 1]` for the inverse of a one-sided spectrum.
    """
    b = ctx.builder
    last = x.rank - 1
    parts = x.shape[-1]
    order = [i for i in range(last) if i != axis] + [axis]
    back = [order.index(i) for i in range(last)]

    def part(index: int) -> Value:
        piece = b.view(b.slice(x, axis=last, start=index, stop=index + 1), x.shape[:-1])
        return b.permute(piece, order)

    real = part(0)
    imag = part(1) if parts == 2 else None
    if inverse and onesided:  # irfft: Hermitian spectrum in, real signal out
        half = length // 2 + 1
        j = np.arange(length)[None, :]
        k = np.arange(half)[:, None]
        weight = np.where((k == 0) | ((length % 2 == 0) & (k == length // 2)), 1.0, 2.0) / length
        angle = 2 * np.pi * k * j / length
        out = _matrix_product(ctx, _fit(ctx, real, half), weight * np.cos(angle))
        if imag is not None:
            out = b.sub(out, _matrix_product(ctx, _fit(ctx, imag, half), weight * np.sin(angle)))
        outs = [out]
    else:
        count = length // 2 + 1 if onesided else length
        j = np.arange(length)[:, None]
        k = np.arange(count)[None, :]
        angle = 2 * np.pi * j * k / length
        scale = 1.0 / length if inverse else 1.0
        cos, sin = scale * np.cos(angle), scale * np.sin(angle) * (1 if inverse else -1)
        re = _fit(ctx, real, length)
        out_re, out_im = _matrix_product(ctx, re, cos), _matrix_product(ctx, re, sin)
        if imag is not None:  # (re + i im)(cos + i sin) for the signed sine
            im = _fit(ctx, imag, length)
            out_re = b.sub(out_re, _matrix_product(ctx, im, sin))
            out_im = b.add(out_im, _matrix_product(ctx, im, cos))
        outs = [out_re, out_im]
    stacked = [b.permute(o, back) for o in outs]
    stacked = [b.view(o, (*o.shape, 1)) for o in stacked]
    return b.concat(stacked, axis=last)


@importer("DFT", since=17)
def _dft(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x = ctx.value(node.input[0])
    attrs = ctx.attributes(node)
    inverse, onesided = bool(attrs.int("inverse", 0)), bool(attrs.int("onesided", 0))
    if ctx.opset >= 20:
        known_axis = ctx.optional_int(node, 2, "axis")
        axis = -2 if known_axis is None else known_axis
    else:
        axis = attrs.int("axis", 1)
    axis = axis_of(ctx, axis, x.rank)
    if axis == x.rank - 1:
        raise ctx.fail("the DFT axis cannot be the last (real/imaginary) axis")
    known_length = ctx.optional_int(node, 1, "dft_length")
    size = x.shape[axis]
    if known_length is not None:
        length = known_length
    elif not isinstance(size, int):
        raise ctx.fail_symbolic("a DFT over a symbolic length needs dft_length")
    else:
        length = 2 * (size - 1) if inverse and onesided else size
    return [dft(ctx, x, axis, length, inverse, onesided)]


@importer("STFT", since=17)
def _stft(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, _, window, _ = ctx.inputs(node, count=(2, 4))
    onesided = bool(ctx.attributes(node).int("onesided", 1))
    hop = ctx.known_int(node, 1, "frame_step")
    known_length = ctx.optional_int(node, 3, "frame_length")
    if known_length is not None:
        frame = known_length
    elif window is not None:
        frame = static_dim(ctx, window.shape[0], "the STFT window")
    else:
        frame = static_dim(ctx, x.shape[-2], "the STFT signal")
    total = x.shape[1]
    if not isinstance(total, int):
        raise ctx.fail("STFT needs a static signal length")
    frames = 1 + (total - frame) // hop
    b = ctx.builder
    starts = np.arange(frames)[:, None] * hop + np.arange(frame)[None, :]
    framed = b.gather(x, b.constant(starts.astype(np.int64)), axis=1)  # [B, F, frame, c]
    if window is not None:
        framed = b.mul(framed, b.view(window, (frame, 1)))
    return [dft(ctx, framed, 2, frame, False, onesided)]


def _window_size(ctx: ImportContext, node: onnx.NodeProto) -> tuple[np.ndarray, float, DType]:
    """The sample positions, the period and the output dtype of a window op."""
    attrs = ctx.attributes(node)
    n = ctx.known_int(node, 0, "size")
    dtype = DType.from_onnx(attrs.int("output_datatype", 1), ctx.where)
    periodic = bool(attrs.int("periodic", 1))
    positions = np.arange(n, dtype=dtype.numpy if dtype.is_float else np.float32)
    return positions, float(n if periodic else n - 1), dtype


@importer("HannWindow", since=17)
def _hann_window(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    n, period, dtype = _window_size(ctx, node)
    values = np.sin(n * np.pi / period) ** 2
    return [Known(values.astype(dtype.numpy), dtype)]


@importer("HammingWindow", since=17)
def _hamming_window(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    n, period, dtype = _window_size(ctx, node)
    alpha = 25.0 / 46.0
    values = alpha - np.cos(n * np.pi * 2 / period) * (1 - alpha)
    return [Known(values.astype(dtype.numpy), dtype)]


@importer("BlackmanWindow", since=17)
def _blackman_window(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    n, period, dtype = _window_size(ctx, node)
    n = np.arange(n.size)
    values = np.cos((n * (np.pi * 2)) / period) * (-0.5)
    values += np.cos((n * (np.pi * 4)) / period) * 0.08
    values += 0.42
    return [Known(values.astype(dtype.numpy), dtype)]


def mel_weights(bins: int, dft_length: int, rate: int, low: float, high: float) -> np.ndarray:
    """The `[dft_length // 2 + 1, bins]` triangular mel filter bank of the ONNX reference."""
    edges = np.arange(0, bins + 2)
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    edges = edges * ((high_mel - low_mel) / (bins + 2)) + low_mel
    edges = 700 * np.expm1(edges / 2595 * np.log(10))
    edges = (((dft_length + 1) * edges) // rate).astype(int)
    out = np.zeros((dft_length // 2 + 1, bins))
    for i in range(bins):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return out


@importer("MelWeightMatrix", since=17)
def _mel_weight_matrix(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    dtype = DType.from_onnx(ctx.attributes(node).int("output_datatype", 1), ctx.where)
    bins, length, rate = (
        ctx.known_int(node, i, name)
        for i, name in enumerate(("num_mel_bins", "dft_length", "sample_rate"))
    )
    low = ctx.known_number(node, 3, "lower_edge_hertz")
    high = ctx.known_number(node, 4, "upper_edge_hertz")
    weights = mel_weights(bins, length, rate, low, high)
    return [Known(weights.astype(dtype.numpy), dtype)]
