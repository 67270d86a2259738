"""Importers of the ONNX losses NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick, for every sample and position, the input at the target class. The pick is a one-hot
select over the class axis (`where(class == target, x, 0)` summed over classes), which is exact,
never reads out of range for ignored targets, and works with symbolic sizes.
"""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.ir.graph import Value
from knopt.ir.op import Binary, Reduction, Unary
from knopt.onnx.context import ImportContext, OnnxValue, importer
from knopt.onnx.ops.common import scalar_like, static_dim

_REDUCTIONS = ("none", "sum", "mean")


def _pick(ctx: ImportContext, x: Value, target: Value) -> Value:
    """`x[n, target[n, ...], ...]`: the class axis (1) of `x` indexed by `target`."""
    b = ctx.builder
    classes = x.shape[1]
    positions = b.view(b.iota(classes), (1, classes, *(1,) * (x.rank - 2)))
    wanted = b.view(b.cast(target, DType.I64), (target.shape[0], 1, *target.shape[1:]))
    hot = b.binary(Binary.EQUAL, positions, wanted)
    chosen = b.where(hot, x, scalar_like(ctx, x, 0))
    total = b.reduce(Reduction.SUM, chosen, axes=[1])
    return b.view(total, target.shape)


def _nll(
    ctx: ImportContext,
    log_prob: Value,
    target: Value,
    weight: Value | None,
    ignore_index: int | None,
    reduction: str,
    weigh_ignored: bool,
) -> Value:
    """The loss `-weight[t] * log_prob[n, t, ...]` with its reduction applied.

    Args:
        ctx: The import context.
        log_prob: Log-probabilities `[N, C, ...]`.
        target: Class indices `[N, ...]`.
        weight: Per-class weights `[C]`, or None.
        ignore_index: A target value that contributes nothing, or None.
        reduction: "none", "sum" or "mean".
        weigh_ignored: Whether an unweighted mean counts only the positions that are not
            ignored (SoftmaxCrossEntropyLoss, and NegativeLogLikelihoodLoss unless its
            ignore_index is -1, as the ONNX reference does).
    """
    b = ctx.builder
    loss = b.unary(Unary.NEG, _pick(ctx, log_prob, target))
    ignored = None
    if ignore_index is not None:
        index = b.constant(np.array(ignore_index, target.dtype.numpy))
        ignored = b.binary(Binary.EQUAL, target, index)
        loss = b.where(ignored, scalar_like(ctx, loss, 0), loss)
    weights = None
    if weight is not None:
        last = weight.shape[0] - 1
        safe = b.clamp(
            b.cast(target, DType.I64), lo=0, hi=float(static_dim(ctx, last, "the class count"))
        )
        weights = b.gather(weight, safe, axis=0)
    elif ignored is not None and weigh_ignored:
        weights = b.scalar(1.0, loss.dtype, loss.shape)
    if weights is not None and ignored is not None:
        weights = b.where(ignored, scalar_like(ctx, weights, 0), weights)
    if weight is not None and weights is not None:
        loss = b.mul(loss, weights)
    axes = list(range(loss.rank))
    if reduction == "none":
        return loss
    total = b.view(b.reduce(Reduction.SUM, loss, axes=axes), ())
    if reduction == "sum":
        return total
    if weights is not None:
        return b.div(total, b.view(b.reduce(Reduction.SUM, weights, axes=axes), ()))
    count = int(np.prod([static_dim(ctx, d, "a mean loss") for d in loss.shape]))
    return b.div(total, scalar_like(ctx, total, count))


def _options(ctx: ImportContext, node: onnx.NodeProto) -> tuple[int | None, str]:
    """The node's ignore_index (or None) and reduction."""
    attrs = ctx.attributes(node)
    reduction = attrs.string("reduction", "mean")
    if reduction not in _REDUCTIONS:
        raise ctx.fail(f"reduction '{reduction}' is not one of {', '.join(_REDUCTIONS)}")
    return (attrs.int("ignore_index") if attrs.has("ignore_index") else None), reduction


@importer("NegativeLogLikelihoodLoss", since=12)
def _negative_log_likelihood_loss(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, target, weight = ctx.inputs(node, count=(2, 3))
    ignore_index, reduction = _options(ctx, node)
    return [_nll(ctx, x, target, weight, ignore_index, reduction, ignore_index != -1)]


@importer("SoftmaxCrossEntropyLoss", since=12)
def _softmax_cross_entropy_loss(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    x, target, weight = ctx.inputs(node, count=(2, 3))
    b = ctx.builder
    shifted = b.sub(x, b.reduce(Reduction.MAX, x, axes=[1]))
    total = b.reduce(Reduction.SUM, b.unary(Unary.EXP, shifted), axes=[1])
    log_prob = b.sub(shifted, b.unary(Unary.LOG, total))
    ignore_index, reduction = _options(ctx, node)
    loss = _nll(ctx, log_prob, target, weight, ignore_index, reduction, True)
    return [loss, log_prob]
