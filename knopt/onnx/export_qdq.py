"""Quantized products written as the QDQ node groups onnxruntime turns into integer kernels.

onnxruntime runs a quantized model fast by matching node groups (its QDQ selectors): an op it
has an integer kernel for, with DequantizeLinear on each input (weights dequantized from an
8-bit initializer) and QuantizeLinear on its output, becomes QLinearConv, QGemm, QLinearMatMul,
QLinearAdd, ... The optimizer keeps what a quantized model computes but not that form: it folds
the weights' DequantizeLinear into float weights, and writes some products as exact integer
products (ConvInteger, MatMulInteger) rescaled in float. onnxruntime runs those as written:
float convolutions, ConvInteger's reference kernel, a Cast and a Mul pass.

This pass works on the written ONNX nodes, as onnxruntime's selectors do, and restores the
groups. Each rewrite needs a QuantizeLinear after the product and a DequantizeLinear before it,
so float models are never touched:

- `ConvInteger | MatMulInteger -> Cast -> Mul(c) [-> Add(bias)] -> QuantizeLinear`: the
  operands dequantized (the second by c) before a float Conv or MatMul (and its bias);
- a product split along its output channels (the optimizer merges the products of one input,
  such as the Q, K and V projections), a part of it quantized: one product per part;
- a float Conv, Gemm or MatMul between DequantizeLinear and QuantizeLinear whose weights are
  whole multiples of a scale (per tensor or per output channel, as a quantizer made them and
  the optimizer scaled them): those 8-bit codes, dequantized; the same for a constant added to
  or multiplying a dequantized value (onnxruntime's QLinearAdd and QLinearMul);
- codes dequantized and quantized again with the same parameters: the codes;
- an int8 quantization whose codes are read by more than one op, or through MaxPool or a
  layout op: uint8 codes, the zero point 128 higher (exact). onnxruntime's x86 integer kernels
  take uint8 activations; it converts a lone int8 Quantize-Dequantize pair (one op reading the
  DequantizeLinear) itself, and no other.

Within a group onnxruntime's integer kernel computes the result, rounding in its own way; as
written, each rewrite computes what the nodes it replaces computed, up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from knopt.onnx.export_codes import Codes, quantized_weights

# Ops that only move or select codes: onnxruntime moves a DequantizeLinear across them.
_CARRIERS = frozenset({"Flatten", "MaxPool", "Reshape", "Squeeze", "Transpose", "Unsqueeze"})
# ---- the written graph -------------------------------------------------------------------


class _Graph:
    """The written nodes with their producers, readers and initializers."""

    def __init__(
        self,
        nodes: Sequence[onnx.NodeProto],
        initializers: Sequence[onnx.TensorProto],
        outputs: Iterable[str],
    ) -> None:
        self.nodes = list(nodes)
        self.initializers = list(initializers)
        self.outputs = set(outputs)
        self._tensors = {t.name: t for t in self.initializers}
        self._names = {n for node in self.nodes for n in (node.name, *node.input, *node.output)}
        self._names |= set(self._tensors) | self.outputs
        self.producer: dict[str, onnx.NodeProto] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        self._index()

    def holds(self, node: onnx.NodeProto) -> bool:
        """True if `node` (this very message) is one of the graph's nodes."""
        return id(node) in self._held

    def _index(self) -> None:
        self._held = {id(node) for node in self.nodes}
        self.producer.clear()
        self.readers.clear()
        for node in self.nodes:
            self.producer.update((name, node) for name in node.output)
            for name in dict.fromkeys(node.input):
                self.readers.setdefault(name, []).append(node)

    def array(self, name: str) -> np.ndarray | None:
        """The contents of an initializer, or None for a computed value."""
        tensor = self._tensors.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def only_reader(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The one node that reads `name`, if it is an `op_type` and `name` no graph output."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or readers[0].op_type != op_type or name in self.outputs:
            return None
        return readers[0]

    def quantized(self, name: str) -> bool:
        """True if `name` is read by QuantizeLinear only, and is no graph output."""
        readers = self.readers.get(name, [])
        if not readers or name in self.outputs:
            return False
        return all(r.op_type == "QuantizeLinear" and r.input[0] == name for r in readers)

    def dequantized(self, name: str) -> bool:
        """True if `name` is a DequantizeLinear's output, perhaps moved by layout ops."""
        node = self.producer.get(name)
        while node is not None and node.op_type in _CARRIERS:
            node = self.producer.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    def fresh(self, base: str) -> str:
        """A value or node name not used yet."""
        name, count = base, 0
        while name in self._names:
            count += 1
            name = f"{base}_{count}"
        self._names.add(name)
        return name

    def constant(self, array: np.ndarray, base: str) -> str:
        """A new initializer holding `array`."""
        tensor = numpy_helper.from_array(np.asarray(array), self.fresh(base))
        self.initializers.append(tensor)
        self._tensors[tensor.name] = tensor
        return tensor.name

    def node(
        self, op_type: str, inputs: Sequence[str], base: str, output: str = "", **attrs: Any
    ) -> onnx.NodeProto:
        """A new node (not in the graph yet) with one output: `output`, or a fresh name."""
        kept = {key: value for key, value in attrs.items() if value is not None}
        output = output or self.fresh(f"{base}_output")
        return helper.make_node(op_type, list(inputs), [output], name=self.fresh(base), **kept)

    def dequantized_codes(self, codes: Codes, base: str) -> onnx.NodeProto:
        """A DequantizeLinear of new initializers holding `codes`."""
        inputs = [
            self.constant(codes.codes, f"{base}_quantized"),
            self.constant(codes.scale, f"{base}_scale"),
            self.constant(codes.zero, f"{base}_zero_point"),
        ]
        return self.node("DequantizeLinear", inputs, f"{base}_DequantizeLinear", axis=codes.axis)

    def replace(self, old: Sequence[onnx.NodeProto], new: Sequence[onnx.NodeProto]) -> None:
        """Put `new` where the last of `old` was, and drop `old`.

        `old` reads values made before its first node, and only its last node's outputs are
        read after it, so `new` (reading the former, making the latter) keeps the order.
        """
        dropped = {id(node) for node in old}
        last = max(i for i, node in enumerate(self.nodes) if id(node) in dropped)
        kept = [node for node in self.nodes[:last] if id(node) not in dropped]
        self.nodes = kept + list(new) + self.nodes[last + 1 :]
        self._index()


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


Rewrite = Callable[[_Graph, onnx.NodeProto], None]


def qdq_groups(
    nodes: Sequence[onnx.NodeProto],
    initializers: Sequence[onnx.TensorProto],
    outputs: Iterable[str],
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The written nodes with quantized products in the groups onnxruntime fuses.

    Args:
        nodes: The written nodes, in topological order, each needed by an output.
        initializers: Their initializers.
        outputs: The graph output names.

    Returns:
        The nodes and the initializers; those no node reads any more are left for the caller.
    """
    graph = _Graph(nodes, initializers, outputs)
    for rewrite in _REWRITES:
        for node in list(graph.nodes):
            if graph.holds(node):  # not replaced by an earlier rewrite of this round
                rewrite(graph, node)
    return graph.nodes, graph.initializers


# ---- integer products ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rescale:
    """The float rescale after an integer product: Cast, Mul by `scale`, perhaps Add `bias`."""

    nodes: list[onnx.NodeProto]
    scale: np.ndarray
    bias: np.ndarray | None


def _rescale(graph: _Graph, product: onnx.NodeProto) -> _Rescale | None:
    """`Cast(float) -> Mul(c) [-> Add(bias)]` after `product`, quantized at the end; or None."""
    cast = graph.only_reader(product.output[0], "Cast")
    if cast is None or _attributes(cast)["to"] != onnx.TensorProto.FLOAT:
        return None
    mul = graph.only_reader(cast.output[0], "Mul")
    if mul is None:
        return None
    scale = graph.array(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
    nodes, bias = [cast, mul], None
    add = graph.only_reader(mul.output[0], "Add")
    if add is not None:
        bias = graph.array(add.input[1] if add.input[0] == mul.output[0] else add.input[0])
        nodes += [add] if bias is not None else []
    if scale is None or not graph.quantized(nodes[-1].output[0]):
        return None
    return _Rescale(nodes, scale, bias)


def _channel_vector(array: np.ndarray, channels: int, axis: int, rank: int) -> np.ndarray | None:
    """`array` (broadcast to a result of `rank` axes) as one value per channel on `axis`."""
    if array.ndim > rank or array.size not in (1, channels):
        return None
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    if any(size != 1 for a, size in enumerate(padded.shape) if a != axis % rank):
        return None
    return np.broadcast_to(padded.reshape(-1), (channels,)).astype(np.float32)


def _integer_conv(graph: _Graph, node: onnx.NodeProto) -> None:
    """`ConvInteger -> Cast -> Mul(c) [-> Add(bias)] -> QuantizeLinear`: QDQ Conv."""
    if node.op_type != "ConvInteger" or len(node.input) != 4:
        return
    weights, rescale = graph.array(node.input[1]), _rescale(graph, node)
    if weights is None or rescale is None:
        return
    channels, rank = weights.shape[0], weights.ndim
    scale = _channel_vector(rescale.scale, channels, 1, rank)
    bias = None if rescale.bias is None else _channel_vector(rescale.bias, channels, 1, rank)
    if scale is None or (rescale.bias is not None and bias is None):
        return
    operands = _dequantized_operands(graph, node, scale, weight_axis=0)
    if operands is None:
        return
    inputs = [operands[0].output[0], operands[1].output[0]]
    if bias is not None:
        inputs.append(graph.constant(bias, f"{node.name}_bias"))
    conv = graph.node(
        "Conv", inputs, f"{node.name}_conv", rescale.nodes[-1].output[0], **_attributes(node)
    )
    graph.replace([node, *rescale.nodes], [*operands, conv])


def _integer_matmul(graph: _Graph, node: onnx.NodeProto) -> None:
    """`MatMulInteger -> Cast -> Mul(c) [-> Add(bias)] -> QuantizeLinear`: QDQ MatMul (+ Add).

    c may vary along the columns of constant 2-D weights; for computed ones it is one number.
    """
    if node.op_type != "MatMulInteger" or len(node.input) != 4:
        return
    weights, rescale = graph.array(node.input[1]), _rescale(graph, node)
    if rescale is None:
        return
    if weights is not None and weights.ndim == 2:
        scale = _channel_vector(rescale.scale, weights.shape[1], -1, 2)
    else:
        scale = rescale.scale.reshape(1) if rescale.scale.size == 1 else None
    operands = None if scale is None else _dequantized_operands(graph, node, scale, weight_axis=1)
    if operands is None:
        return
    inputs = [operands[0].output[0], operands[1].output[0]]
    last = rescale.nodes[-1].output[0]
    if rescale.bias is None:
        product = [graph.node("MatMul", inputs, f"{node.name}_matmul", last)]
    else:
        matmul = graph.node("MatMul", inputs, f"{node.name}_matmul")
        bias = graph.constant(rescale.bias, f"{node.name}_bias")
        product = [matmul, graph.node("Add", [matmul.output[0], bias], f"{node.name}_add", last)]
    graph.replace([node, *rescale.nodes], [*operands, *product])


def _dequantized_operands(
    graph: _Graph, node: onnx.NodeProto, scale: np.ndarray, weight_axis: int
) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    """DequantizeLinear of an integer product's input (scale 1) and weights (`scale`)."""
    x, weights, x_zero, w_zero = node.input
    zero = graph.array(w_zero)
    if zero is None or graph.array(x_zero) is None or not np.all(scale > 0):
        return None
    one = graph.constant(np.array(1.0, np.float32), f"{node.name}_input_scale")
    x_dq = graph.node("DequantizeLinear", [x, one, x_zero], f"{node.name}_input_DequantizeLinear")
    if np.all(scale == scale[0]) and zero.size == 1:
        scale, zero, axis = scale[:1].reshape(()), zero.reshape(()), None
    else:
        zero, axis = np.broadcast_to(zero.reshape(-1), scale.shape), weight_axis
    w_inputs = [
        weights,
        graph.constant(scale, f"{node.name}_weight_scale"),
        graph.constant(np.array(zero), f"{node.name}_weight_zero_point"),
    ]
    w_dq = graph.node(
        "DequantizeLinear", w_inputs, f"{node.name}_weight_DequantizeLinear", axis=axis
    )
    return x_dq, w_dq


# ---- float products between a dequantization and a quantization ---------------------------


def _weight_axis(node: onnx.NodeProto) -> int | None:
    """The output-channel axis of a product's weights (its input 1), or None."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "MatMul":
        return 1
    if node.op_type == "Gemm":
        attrs = _attributes(node)
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
            return None
        return 0 if attrs.get("transB", 0) else 1
    return None


def _split_product(graph: _Graph, node: onnx.NodeProto) -> None:
    """A product split along its output channels, a part quantized: one product per part.

    The optimizer merges products of one input (the Q, K and V projections) into one; in a
    quantized model each part has its own quantization, and onnxruntime fuses a product with
    the QuantizeLinear right after it only.
    """
    source = graph.producer.get(node.input[0]) if node.op_type == "Split" else None
    if source is None or source.op_type not in ("Conv", "MatMul") or len(node.input) != 2:
        return
    weights, sizes = graph.array(source.input[1]), graph.array(node.input[1])
    if weights is None or sizes is None or graph.only_reader(source.output[0], "Split") is None:
        return
    axis = 0 if source.op_type == "Conv" else weights.ndim - 1
    rank = weights.ndim if source.op_type == "Conv" else None
    split_axis = _attributes(node).get("axis", 0)
    if (rank is None and split_axis != -1) or (
        rank is not None and split_axis not in (1, 1 - rank)
    ):
        return
    if not graph.dequantized(source.input[0]) or not any(map(graph.quantized, node.output)):
        return
    bias = graph.array(source.input[2]) if len(source.input) > 2 else None
    parts, start = [], 0
    for size, output in zip(sizes.tolist(), node.output, strict=True):
        piece = np.take(weights, range(start, start + size), axis=axis)
        inputs = [source.input[0], graph.constant(piece, f"{source.name}_weight")]
        if bias is not None:
            inputs.append(graph.constant(bias[start : start + size], f"{source.name}_bias"))
        part = graph.node(source.op_type, inputs, source.name, output, **_attributes(source))
        parts.append(part)
        start += size
    graph.replace([source, node], parts)


def _float_weights(graph: _Graph, node: onnx.NodeProto) -> None:
    """Float weights of a product between DequantizeLinear and QuantizeLinear: 8-bit codes."""
    axis = _weight_axis(node)
    weights = graph.array(node.input[1]) if axis is not None and len(node.input) > 1 else None
    if weights is None or weights.ndim < 2 or axis is None:
        return
    if not graph.dequantized(node.input[0]) or not graph.quantized(node.output[0]):
        return
    codes = quantized_weights(weights, axis)
    if codes is None:
        return
    dequantized = graph.dequantized_codes(codes, f"{node.name}_weight")
    rewritten = onnx.NodeProto()
    rewritten.CopyFrom(node)
    rewritten.input[1] = dequantized.output[0]
    graph.replace([node], [dequantized, rewritten])


def _float_operand(graph: _Graph, node: onnx.NodeProto) -> None:
    """A float constant added to (or multiplying) a dequantized value, then quantized: codes.

    onnxruntime's QLinearAdd and QLinearMul take both operands quantized, per tensor.
    """
    if node.op_type not in ("Add", "Mul") or not graph.quantized(node.output[0]):
        return
    for index in (0, 1):
        operand, other = node.input[index], node.input[1 - index]
        array = graph.array(operand)
        if array is None or array.ndim == 0 or not graph.dequantized(other):
            continue
        codes = quantized_weights(array, axis=None)
        if codes is None:
            continue
        dequantized = graph.dequantized_codes(codes, f"{node.name}_operand")
        rewritten = onnx.NodeProto()
        rewritten.CopyFrom(node)
        rewritten.input[index] = dequantized.output[0]
        graph.replace([node], [dequantized, rewritten])
        return


# ---- activations ---------------------------------------------------------------------------


def _code_readers(graph: _Graph, name: str) -> list[onnx.NodeProto] | None:
    """The DequantizeLinear nodes reading the codes `name`, through carriers; None if others do."""
    found: list[onnx.NodeProto] = []
    for reader in graph.readers.get(name, []):
        if name in graph.outputs or reader.input[0] != name:
            return None
        if reader.op_type == "DequantizeLinear":
            found.append(reader)
        elif reader.op_type in _CARRIERS and len(reader.output) == 1:
            further = _code_readers(graph, reader.output[0])
            if further is None:
                return None
            found += further
        else:
            return None
    return found


def _lone_pair(graph: _Graph, node: onnx.NodeProto) -> bool:
    """True if one DequantizeLinear reads the quantization, and at most one op reads that."""
    direct = graph.readers.get(node.output[0], [])
    if len(direct) != 1 or direct[0].op_type != "DequantizeLinear":
        return False
    return len(graph.readers.get(direct[0].output[0], [])) <= 1


def _unsigned_activations(graph: _Graph, node: onnx.NodeProto) -> None:
    """An int8 quantization read by several ops, or through carriers: uint8 codes."""
    if node.op_type != "QuantizeLinear" or len(node.input) != 3:
        return
    zero = graph.array(node.input[2])
    if zero is None or zero.dtype != np.int8 or zero.size != 1:
        return
    readers = _code_readers(graph, node.output[0])
    if not readers or _lone_pair(graph, node):
        return
    for reader in readers:
        reader_zero = graph.array(reader.input[2]) if len(reader.input) == 3 else None
        if reader_zero is None or not np.array_equal(reader_zero, zero):
            return
    unsigned = graph.constant((zero.astype(np.int16) + 128).astype(np.uint8), f"{node.name}_zero")
    for reader in (node, *readers):
        reader.input[2] = unsigned


def _requantized(graph: _Graph, node: onnx.NodeProto) -> None:
    """Codes dequantized and quantized again with the same scale and zero point: the codes.

    Exact: `(q - zero) * scale / scale` is within float rounding of the whole `q - zero`.
    """
    if node.op_type != "QuantizeLinear" or len(node.input) != 3 or node.output[0] in graph.outputs:
        return
    source = graph.producer.get(node.input[0])
    if source is None or source.op_type != "DequantizeLinear" or len(source.input) != 3:
        return
    if _attributes(source).get("axis", 1) != _attributes(node).get("axis", 1):
        return
    for a, b in zip(source.input[1:], node.input[1:], strict=True):
        first, second = graph.array(a), graph.array(b)
        if first is None or second is None or first.dtype != second.dtype:
            return
        if not np.array_equal(first, second):
            return
    for reader in graph.readers.get(node.output[0], []):
        for i, name in enumerate(reader.input):
            if name == node.output[0]:
                reader.input[i] = source.input[0]
    graph.replace([node], [])


_REWRITES: list[Rewrite] = [
    _requantized,
    _integer_conv,
    _integer_matmul,
    _split_product,
    _float_weights,
    _float_operand,
    _unsigned_activations,
]
