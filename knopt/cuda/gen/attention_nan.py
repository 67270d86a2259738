"""NaN rows after cuDNN's fused attention (codegen/attention_nan_rows.cu).

A query row whose additive bias is -inf at every key has a softmax over no keys: NaN in the
CPU oracle (numpy's softmax of all -inf) and in knopt's attention kernels, 0 in cuDNN's. The
launch that follows a cuDNN attention with a bias tensor restores the NaN. It reads each
distinct row of the bias once (a BERT mask of shape [batch, 1, 1, keys] is `batch` rows) and
writes only where a row hides every key, so a mask that hides none costs one small launch.
"""

from __future__ import annotations

from knopt.cuda.cexpr import storage_type
from knopt.cuda.gen.indexing import PLACEHOLDER, blocks, named
from knopt.cuda.steps import AttentionView, Buf, Launch
from knopt.cuda.templates import render
from knopt.ir.dtype import DType

THREADS = 256
WARP = 32


def nan_rows_launch(
    dtype: DType, bias: int, bias_view: AttentionView, out: int, out_view: AttentionView
) -> Launch:
    """The launch writing NaN over the output rows whose bias row is all -inf.

    Args:
        dtype: The bias's and the output's element type (cuDNN's attention takes one).
        bias: The bias's plan tensor.
        bias_view: How the bias is read: [batch, heads, rows, keys], size 1 where broadcast.
        out: The attention's output tensor.
        out_view: How the output is written: [batch, heads, rows, columns].
    """
    bb, bh, bs, keys = bias_view.dims
    sb, sh, ss, st = bias_view.strides
    batch, heads, rows, cols = out_view.dims
    ob, oh, os_, oe = out_view.strides
    bias_rows = bb * bh * bs
    source = render(
        "attention_nan_rows.cu",
        NAME=PLACEHOLDER,
        THREADS=THREADS,
        T=storage_type(dtype),
        BIAS_ROWS=bias_rows,
        BIAS_BATCH=bb,
        BIAS_HEADS=bh,
        BIAS_QROWS=bs,
        BIAS_SB=sb,
        BIAS_SH=sh,
        BIAS_SS=ss,
        BIAS_ST=st,
        KEYS=keys,
        BATCH=batch,
        HEADS=heads,
        QROWS=rows,
        COLS=cols,
        OUT_SB=ob,
        OUT_SH=oh,
        OUT_SS=os_,
        OUT_SE=oe,
    )
    name, source = named("attention_nan", source)
    grid = (blocks(bias_rows * WARP, THREADS), 1, 1)
    return Launch(name, source, grid, (THREADS, 1, 1), (Buf(bias), Buf(out)))
