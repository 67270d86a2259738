"""Constants a lowering reads or makes while planning (quantized weights, repacked once).

The planner uploads every constant of the constant region before the first run; a lowering may
read the value of one (a view of a constant, through its layout) and add new ones.
"""

from __future__ import annotations

import numpy as np

from knopt.cuda.context import LoweringContext
from knopt.ir.dtype import DType


def constant_array(ctx: LoweringContext, tid: int) -> np.ndarray | None:
    """The value of a plan tensor that is (a view of) a constant, else None."""
    tensor = ctx.tensor(tid)
    if tensor.buffer < 0 or ctx.buffers[tensor.buffer].region != "constant":
        return None
    data = np.ascontiguousarray(ctx.constants[tensor.buffer]).reshape(-1)
    layout = tensor.layout
    item = data.itemsize
    return np.ndarray(
        layout.shape,
        data.dtype,
        buffer=data,
        offset=layout.offset * item,
        strides=tuple(s * item for s in layout.strides),
    )


def add_constant(ctx: LoweringContext, array: np.ndarray, dtype: DType) -> int:
    """A new constant plan tensor holding `array` (converted to `dtype`)."""
    tid = ctx.new_tensor(tuple(array.shape), dtype, region="constant")
    ctx.constants[ctx.tensor(tid).buffer] = np.ascontiguousarray(array, dtype=dtype.numpy)
    return tid
