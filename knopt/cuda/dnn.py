"""cuDNN convolutions through the cuDNN frontend's graph API, one built graph per convolution.

A graph is the conv, then the bias, residual and RELU the step fuses.

Strict f32 leaves out the engines that compute with TF32 tensor cores. One-dimensional
convolutions run as two-dimensional ones of height 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cudnn

from knopt.cuda.steps import Conv
from knopt.errors import CudaError
from knopt.ir.dtype import DType

_TYPES = {
    DType.F32: cudnn.data_type.FLOAT,
    DType.F16: cudnn.data_type.HALF,
    DType.BF16: cudnn.data_type.BFLOAT16,
}


def _strides(dims: list[int]) -> list[int]:
    # cuDNN wants real strides for size-1 axes too, not knopt's canonical 0.
    strides, step = [], 1
    for size in reversed(dims):
        strides.append(step)
        step *= max(size, 1)
    return list(reversed(strides))


def _lift(
    step: Conv,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int], list[int], list[int]]:
    x, w, y = list(step.x_shape), list(step.w_shape), list(step.y_shape)
    pre = [p[0] for p in step.pads]
    post = [p[1] for p in step.pads]
    strides, dilations = list(step.strides), list(step.dilations)
    if len(x) == 3:
        x, w, y = [*x[:2], 1, *x[2:]], [*w[:2], 1, *w[2:]], [*y[:2], 1, *y[2:]]
        pre, post, strides, dilations = [0, *pre], [0, *post], [1, *strides], [1, *dilations]
    return x, w, y, pre, post, strides, dilations, [1, y[1]] + [1] * (len(y) - 2)


class ConvPlan:
    """A built cuDNN graph for one Conv step.

    Attributes:
        fused: Whether bias, residual and RELU run inside (else the caller applies the step's
            fallback kernel after a plain convolution).
        workspace: Bytes of workspace the plan needs.
    """

    def __init__(self, handle: Any, step: Conv, fused: bool) -> None:
        self.handle = handle
        self.step = step
        self.fused = fused
        io = _TYPES[step.dtype]
        x_dims, w_dims, y_dims, pre, post, strides, dilations, bias_dims = _lift(step)
        graph = cudnn.pygraph(
            io_data_type=io,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        self.x = graph.tensor(name="X", dim=x_dims, stride=_strides(x_dims), data_type=io)
        self.w = graph.tensor(name="W", dim=w_dims, stride=_strides(w_dims), data_type=io)
        y = graph.conv_fprop(
            image=self.x,
            weight=self.w,
            pre_padding=pre,
            post_padding=post,
            stride=strides,
            dilation=dilations,
            compute_data_type=cudnn.data_type.FLOAT,
        )
        self.bias = self.residual = None
        if fused and step.bias is not None:
            self.bias = graph.tensor(
                name="B", dim=bias_dims, stride=_strides(bias_dims), data_type=io
            )
            y = graph.bias(input=y, bias=self.bias)
        if fused and step.residual is not None:
            self.residual = graph.tensor(
                name="Z", dim=y_dims, stride=_strides(y_dims), data_type=io
            )
            y = graph.add(a=y, b=self.residual)
        if fused and step.relu:
            y = graph.relu(input=y)
        y.set_output(True).set_data_type(io).set_dim(y_dims).set_stride(_strides(y_dims))
        self.y = y
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        if step.dtype is DType.F32 and step.precision == "f32":
            graph.deselect_numeric_notes(
                [cudnn.numerical_note.TENSOR_CORE, cudnn.numerical_note.DOWN_CONVERT_INPUTS]
            )
        graph.check_support()
        graph.build_plans(cudnn.build_plan_policy.HEURISTICS_CHOICE)
        self.graph = graph
        self.workspace = int(graph.get_workspace_size())

    def enqueue(self, addresses: Mapping[int, int], workspace: int, stream: int) -> None:
        """Queue the convolution on `stream` (addresses by plan tensor id)."""
        step = self.step
        pack = {self.x: addresses[step.x], self.w: addresses[step.w], self.y: addresses[step.y]}
        if self.bias is not None:
            pack[self.bias] = addresses[step.bias]  # type: ignore[index]
        if self.residual is not None:
            pack[self.residual] = addresses[step.residual]  # type: ignore[index]
        try:
            cudnn.set_stream(self.handle, stream)
            self.graph.execute(pack, workspace, handle=self.handle)
        except Exception as err:  # the frontend raises RuntimeError and its own types
            raise CudaError("cudnn.execute", None, f"{_describe(step)}: {err}") from err


def _describe(step: Conv) -> str:
    return (
        f"conv x{list(step.x_shape)} w{list(step.w_shape)} {step.dtype.short} "
        f"strides {list(step.strides)} pads {list(step.pads)} groups {step.groups}"
    )


class Dnn:
    """A cuDNN handle and the plans built with it."""

    def __init__(self) -> None:
        try:
            self.handle = cudnn.create_handle()
        except Exception as err:
            raise CudaError("cudnn.create_handle", None, str(err)) from err
        self._plans: dict[Conv, ConvPlan | None] = {}
        self.declined: dict[Conv, str] = {}

    def plan(self, step: Conv) -> ConvPlan | None:
        """The plan of `step`: fused if cuDNN takes the epilogue, else plain.

        Returns:
            None if cuDNN has no engine for the convolution at all (the caller then runs the
            step's direct kernel).
        """
        if step not in self._plans:
            fusing = step.bias is not None or step.residual is not None or step.relu
            attempts = [True, False] if fusing and step.fallback is not None else [fusing]
            self._plans[step] = None
            for fused in attempts:
                try:
                    self._plans[step] = ConvPlan(self.handle, step, fused)
                    break
                except Exception as err:  # cuDNN reports unsupported graphs by exceptions
                    self.declined[step] = f"{_describe(step)} (fused={fused}): {err}"
        return self._plans[step]
