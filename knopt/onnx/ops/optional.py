"""Importers of the ONNX optional ops applied to plain tensors.

knopt has no optional type: a present tensor is simply the tensor and an absent input is absent.
OptionalHasElement and OptionalGetElement on such values are therefore known when loading.
"""

from __future__ import annotations

import numpy as np
import onnx

from knopt.ir.dtype import DType
from knopt.onnx.context import ImportContext, Known, OnnxValue, importer


@importer("OptionalHasElement", since=18)
def _optional_has_element(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.attributes(node)
    present = bool(node.input) and bool(node.input[0])
    if present:
        ctx.lookup(node.input[0])  # a present input must be defined
    return [Known(np.array(present), DType.BOOL)]


@importer("OptionalGetElement", since=18)
def _optional_get_element(ctx: ImportContext, node: onnx.NodeProto) -> list[OnnxValue]:
    ctx.attributes(node)
    if not node.input or not node.input[0]:
        raise ctx.fail("OptionalGetElement of an absent value has no element")
    return [ctx.lookup(node.input[0])]
