"""An attention's operands as cuDNN's fused attention takes them: [batch, heads, rows, cols].

knopt's attention kernels see up to three leading axes with a stride per operand
(`knopt.cuda.gen.attention.Geometry`); cuDNN sees a batch axis and a head axis. Those leading
axes split into batch axes and head axes that q and out each walk as one axis; k and v too,
except that their innermost head axes may be broadcast (grouped queries: cuDNN's query head
h reads key head h // (q heads / k heads), which is what broadcasting the innermost axes
means). A bias is either broadcast over all of a group's axes (size 1 there) or walks them as
one; broadcast rows or columns have size 1 too.
"""

from __future__ import annotations

from knopt.cuda.steps import AttentionView

# q, k, v, out and the bias (None when it is not read).
AttentionViews = tuple[
    AttentionView, AttentionView, AttentionView, AttentionView, AttentionView | None
]


def attention_views(
    sizes: tuple[int, int, int, int],
    lead: tuple[int, ...],
    strides: tuple[tuple[int, ...], ...],
    read_bias: bool,
) -> AttentionViews | None:
    """q, k, v, out and bias as cuDNN views; None if no split of the leading axes serves.

    Args:
        sizes: Query rows, keys, and the head sizes of q/k and of v/out.
        lead: The three leading axes' sizes.
        strides: For q, k, v, bias and out: the leading axes', the rows' and the columns'.
        read_bias: Whether the bias is read (else its view is None).
    """
    for cut in (1, 2):
        views = _split_views(sizes, lead, strides, read_bias, cut)
        if views is not None:
            return views
    return None


def _split_views(
    sizes: tuple[int, int, int, int],
    lead: tuple[int, ...],
    all_strides: tuple[tuple[int, ...], ...],
    read_bias: bool,
    cut: int,
) -> AttentionViews | None:
    """`attention_views` with batch axes `lead[:cut]` and head axes the rest."""
    s, t, d, e = sizes
    q, k, v, b, out = all_strides
    groups = []
    for strides in (q, out):
        batch = _merged(lead[:cut], strides[:cut])
        heads = _merged(lead[cut:], strides[cut:3])
        if batch is None or heads is None:
            return None
        groups.append((batch, heads))
    kv_heads = len(lead) - _broadcast_axes(lead[cut:], k[cut:3], v[cut:3])
    kv = []
    for strides in (k, v):
        batch = _merged(lead[:cut], strides[:cut])
        heads = _merged(lead[cut:kv_heads], strides[cut:kv_heads])
        if batch is None or heads is None:
            return None
        kv.append((batch, heads))
    (qb, qh), (ob, oh) = groups
    (kb, kh), (vb, vh) = kv
    views = [
        _view((qb, qh, (s, q[3]), (d, q[4]))),
        _view((kb, kh, (t, k[3]), (d, k[4]))),
        _view((vb, vh, (t, v[3]), (e, v[4]))),
        _view((ob, oh, (s, out[3]), (e, out[4]))),
    ]
    if not read_bias:
        return views[0], views[1], views[2], views[3], None
    bias_batch = _broadcast_or_merged(lead[:cut], b[:cut], qb[0])
    bias_heads = _broadcast_or_merged(lead[cut:], b[cut:3], qh[0])
    if bias_batch is None or bias_heads is None:
        return None
    rows = (s, b[3]) if b[3] else (1, 0)
    cols = (t, b[4]) if b[4] else (1, 0)
    return views[0], views[1], views[2], views[3], _view((bias_batch, bias_heads, rows, cols))


def _merged(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(size, stride) of axes walked as one, innermost stride; None if they are not."""
    size, stride = 1, 0
    for n, st in zip(reversed(dims), reversed(strides), strict=True):
        if n == 1:
            continue
        if size > 1 and st != stride * size:
            return None
        if size == 1:
            stride = st
        size *= n
    if size > 1 and stride == 0:
        return None  # one element for every index: not a head or batch axis cuDNN reads
    return size, stride


def _broadcast_axes(dims: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    """How many innermost head axes k and v are broadcast over: the query heads of a key head."""
    axes = 0
    for n, ks, vs in zip(reversed(dims), reversed(k), reversed(v), strict=True):
        if n > 1 and not (ks == vs == 0):
            break
        axes += 1
    return axes


def _broadcast_or_merged(
    dims: tuple[int, ...], strides: tuple[int, ...], full: int
) -> tuple[int, int] | None:
    """A bias's batch or head axes: (1, 0) if broadcast over all, else all walked as one."""
    if not any(st for n, st in zip(dims, strides, strict=True) if n > 1):
        return 1, 0
    merged = _merged(dims, strides)
    return merged if merged is not None and merged[0] == full else None


def _view(axes: tuple[tuple[int, int], ...]) -> AttentionView:
    """The view of four (size, stride) axes; a size-1 axis gets a dense tensor's stride."""
    dims = [n for n, _ in axes]
    strides = [st for _, st in axes]
    for j in reversed(range(4)):
        if dims[j] == 1:
            strides[j] = 1 if j == 3 else dims[j + 1] * strides[j + 1]
    return AttentionView(
        (dims[0], dims[1], dims[2], dims[3]), (strides[0], strides[1], strides[2], strides[3])
    )
