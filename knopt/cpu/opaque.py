"""Opaque ops on the CPU: each node runs alone through onnx's reference evaluator.

An opaque op is an ONNX node knopt keeps without knowing it (`knopt.ir.op.Opaque`). Where onnx
has the op (a standard op knopt lacks, such as BitCast), its reference evaluator runs the node
on its input arrays; where it does not (a custom domain, onnxruntime's com.microsoft ops), the
CPU cannot run the model, and `cpu_support` says so before anything runs.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from knopt.errors import RunError, UnsupportedOpError
from knopt.ir import op as ops
from knopt.ir.graph import Graph
from knopt.ir.shape import format_shape, symbols_of


def run_opaque(op: ops.Opaque, *args: np.ndarray) -> np.ndarray:
    """Output `op.output` of the op's ONNX node, run on `args`.

    Raises:
        UnsupportedOpError: If onnx's reference evaluator does not have the op.
        RunError: If the node fails on these inputs, or its result is not the type the model
            declares for it.
    """
    evaluator = _evaluator(op.call)
    feeds = {f"in{i}": np.asarray(a) for i, a in enumerate(args)}
    try:
        (found,) = evaluator.run([f"out{op.output}"], feeds)
    except Exception as err:  # onnx's kernels raise what numpy raises: any error is a failure
        raise RunError(f"{_where(op.call)}: onnx's reference evaluator failed: {err}") from err
    result = np.asarray(found)
    expected = op.tensor_type
    if result.shape != expected.shape or result.dtype != expected.dtype.numpy:
        raise RunError(
            f"{_where(op.call)} computed {result.dtype}{list(result.shape)}, but the model "
            f"declares {expected.dtype.numpy}{format_shape(expected.shape)} for its output "
            f"{op.output}"
        )
    return result


def cpu_support(call: ops.OpaqueCall) -> UnsupportedOpError | None:
    """Why the CPU cannot run `call`, or None if it can."""
    try:
        _evaluator(call)
    except UnsupportedOpError as err:
        return err
    return None


def cpu_refusal(graph: Graph) -> UnsupportedOpError | None:
    """Why the CPU cannot run `graph`'s opaque ops, or None if it can (or there are none).

    It cannot where onnx's reference evaluator lacks the op, or where the model declares no
    size for an output axis (a run binds the sizes the inputs give, before anything runs).
    """
    given = frozenset().union(*(symbols_of(v.shape) for v in graph.inputs))
    for node in graph.nodes:
        op = node.op
        if not isinstance(op, ops.Opaque):
            continue
        problem = cpu_support(op.call)
        if problem is not None:
            return problem
        unknown = sorted(symbols_of(op.tensor_type.shape) - given)
        if unknown:
            call = op.call
            return UnsupportedOpError(
                f"{_where(call)}: the size(s) {', '.join(unknown)} of its output {op.output} "
                f"({op.tensor_type}) are no input's, so knopt cannot run the model; declare the "
                "output's shape in the model's value_info",
                call.op_type,
                call.domain,
                call.node_name,
            )
    return None


def _where(call: ops.OpaqueCall) -> str:
    return f"node '{call.node_name}' ({call})" if call.node_name else f"a {call} node"


@functools.lru_cache(maxsize=256)
def _evaluator(call: ops.OpaqueCall) -> ReferenceEvaluator:
    """The reference evaluator of a model holding only `call`'s node (made once per call).

    Raises:
        UnsupportedOpError: If onnx does not have the op.
    """
    node = onnx.NodeProto()
    node.ParseFromString(call.node)
    inputs = [f"in{i}" for i in range(call.inputs)]
    names = iter(inputs)
    node.input[:] = [next(names) if name else "" for name in node.input]
    node.output[:] = [f"out{i}" if name else "" for i, name in enumerate(node.output)]
    untyped = onnx.TypeProto()
    graph = onnx.helper.make_graph(
        [node],
        "opaque",
        [onnx.helper.make_value_info(name, untyped) for name in inputs],
        [onnx.helper.make_value_info(name, untyped) for name in node.output if name],
    )
    default = call.version if not call.domain else onnx.defs.onnx_opset_version()
    opsets = [onnx.helper.make_opsetid("", default)]
    if call.domain:
        opsets.append(onnx.helper.make_opsetid(call.domain, call.version))
    try:
        return ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opsets))
    except Exception as err:  # onnx refuses an op it lacks (or a node it cannot read) variously
        raise UnsupportedOpError(
            f"{_where(call)}: knopt keeps this op as it is but cannot run it on the CPU (onnx's "
            "reference evaluator cannot run it); `knopt optimize --target onnx` writes it "
            "back unchanged for a runtime that has it (onnxruntime)",
            call.op_type,
            call.domain,
            call.node_name,
        ) from err
