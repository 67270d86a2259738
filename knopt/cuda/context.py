"""The state code generation works on: plan tensors, their buffers, and the steps so far.

Every generator (knopt.cuda.gen) receives a `LoweringContext`, reads the layouts of its
kernel's tensors from it, asks it for temporaries and appends steps to it. The planner then
places the buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from knopt.cuda.layout import Layout
from knopt.cuda.steps import Step
from knopt.ir.dtype import DType

REGIONS = ("constant", "input", "output", "arena", "resident")


@dataclass
class PlanTensor:
    """A tensor of the plan: a program tensor or a temporary, as a layout over a buffer."""

    id: int
    dtype: DType
    layout: Layout
    buffer: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape."""
        return self.layout.shape


@dataclass
class Buffer:
    """Memory for one or more tensors (views share their source's buffer).

    Attributes:
        region: "constant" and "input" are filled before a run, "output" holds results until
            the next run, "arena" buffers share memory when their lifetimes do not overlap,
            and "resident" buffers (key/value caches) outlive runs at offsets fixed in advance.
        offset: Bytes from the start of the region (set by the planner).
        first: The first step that touches the buffer (arena buffers).
        last: The last step that touches it.
    """

    id: int
    nbytes: int
    region: str
    offset: int = -1
    first: int = -1
    last: int = -1


@dataclass
class LoweringContext:
    """Plan tensors, buffers and steps, grown by the generators of each kernel.

    Attributes:
        precision: "f32", "tf32", "fp16" or "bf16": how library calls compute.
        constants: Buffer id -> data, for buffers of the constant region.
        where: What is being lowered now (a kernel), for error messages.
        derived: Tensors made from others while lowering (a channels-last copy, a split GEMM
            operand), by (purpose, source...), so that readers of one source share one.
    """

    precision: str = "f32"
    tensors: list[PlanTensor] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    where: str = ""
    derived: dict[tuple[object, ...], int] = field(default_factory=dict)

    def tensor(self, tid: int) -> PlanTensor:
        """Plan tensor `tid`."""
        return self.tensors[tid]

    def layout(self, tid: int) -> Layout:
        """The layout of plan tensor `tid`."""
        return self.tensors[tid].layout

    def dtype(self, tid: int) -> DType:
        """The element type of plan tensor `tid`."""
        return self.tensors[tid].dtype

    def new_buffer(self, nbytes: int, region: str) -> int:
        """A new buffer of `nbytes` in `region`; returns its id."""
        assert region in REGIONS, region
        self.buffers.append(Buffer(len(self.buffers), nbytes, region))
        return len(self.buffers) - 1

    def add_tensor(self, dtype: DType, layout: Layout, buffer: int) -> int:
        """A plan tensor over an existing buffer; returns its id."""
        self.tensors.append(PlanTensor(len(self.tensors), dtype, layout, buffer))
        return len(self.tensors) - 1

    def new_tensor(self, shape: tuple[int, ...], dtype: DType, region: str = "arena") -> int:
        """A contiguous tensor with a buffer of its own; returns its id."""
        layout = Layout.contiguous(shape)
        buffer = self.new_buffer(max(layout.numel, 1) * dtype.itemsize, region)
        return self.add_tensor(dtype, layout, buffer)

    def constant_value(
        self,
        tid: int,
        shape: tuple[int, ...] | None = None,
        strides: tuple[int, ...] | None = None,
    ) -> np.ndarray | None:
        """The elements of `tid` if its buffer is a constant, else None.

        Args:
            tid: The plan tensor.
            shape: Read this shape instead of the tensor's own ...
            strides: ... with these strides (elements, from the tensor's first element).
        """
        data = self.constants.get(self.tensors[tid].buffer)
        if data is None:
            return None
        layout = self.tensors[tid].layout
        shape = layout.shape if shape is None else shape
        strides = layout.strides if strides is None else strides
        flat = np.ascontiguousarray(data).reshape(-1)
        view = np.lib.stride_tricks.as_strided(
            flat[layout.offset :],
            shape,
            [s * flat.itemsize for s in strides],
            writeable=False,
        )
        return np.array(view)

    def new_constant(self, data: np.ndarray, dtype: DType, layout: Layout) -> int:
        """A tensor over a new constant buffer holding `data` (its memory, in memory order)."""
        data = np.ascontiguousarray(data, dtype=dtype.numpy)
        buffer = self.new_buffer(max(data.nbytes, dtype.itemsize), "constant")
        self.constants[buffer] = data
        return self.add_tensor(dtype, layout, buffer)

    def emit(self, step: Step) -> None:
        """Append a step."""
        self.steps.append(step)
