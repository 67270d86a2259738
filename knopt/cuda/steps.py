"""What a plan runs, step by step: kernel launches and library calls over plan tensors.

Steps are plain data (no CUDA objects), so planning and code generation run and are tested
without a GPU. Tensor arguments are plan tensor ids; the executor turns them into addresses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from knopt.ir.dtype import DType


@dataclass(frozen=True)
class Buf:
    """A kernel argument: the address of plan tensor `tensor` (its element at index 0)."""

    tensor: int


Arg = Buf | np.generic


@dataclass(frozen=True)
class Launch:
    """One NVRTC kernel launch. `source` defines `extern "C"` kernel `name` (and nothing else).

    Attributes:
        shared: Dynamic shared memory bytes.
    """

    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Arg, ...]
    shared: int = 0


@dataclass(frozen=True)
class Operand:
    """A GEMM operand in row-major terms: `rows x cols` matrices, `batch` of them.

    Exactly one of `row_stride` and `col_stride` is 1 (or the matrix has one row or column).
    """

    tensor: int
    rows: int
    cols: int
    row_stride: int
    col_stride: int
    batch_stride: int

    def with_tensor(self, tensor: int) -> Operand:
        """The same operand of another plan tensor (cheaper than `dataclasses.replace`)."""
        return Operand(
            tensor, self.rows, self.cols, self.row_stride, self.col_stride, self.batch_stride
        )


@dataclass(frozen=True)
class Gemm:
    """`d = act(alpha * a @ b + beta * c + bias)` for each of `batch` matrix triples (cuBLASLt).

    Attributes:
        bias: A contiguous vector of `d.cols` elements added to every row, or None.
        residual: `c`, of d's shape, added with beta 1; None for beta 0.
        activation: "", "relu" or "gelu_tanh" (cuBLASLt epilogues).
        precision: "f32" (strict), "tf32", or the half types' name.
        fallback: The in-place kernel that applies the fused epilogue to `d` when cuBLASLt
            cannot fuse it; the GEMM then runs plain.
        alignment: Bytes that a, b, the residual and d are each aligned to (powers of two up
            to 256), which limits the algorithms cuBLASLt may pick.
    """

    a: Operand
    b: Operand
    d: Operand
    batch: int
    dtype: DType
    precision: str
    alpha: float = 1.0
    bias: int | None = None
    residual: Operand | None = None
    activation: str = ""
    fallback: Launch | None = None
    alignment: tuple[int, int, int, int] = (256, 256, 256, 256)


@dataclass(frozen=True)
class Conv:
    """A cuDNN convolution `y = act(conv(x, w) + bias + residual)` on dense tensors.

    Shapes are always N, C, spatial... (K, C, window... for `w`); the elements are stored in that
    order, or channels last (N, spatial..., C) for x, w, y and the residual alike.

    Attributes:
        bias: A contiguous `[K]` vector, or None.
        residual: A contiguous tensor of y's shape, or None.
        fallback: The in-place kernel that applies the fused epilogue to `y` when cuDNN cannot
            fuse it; the convolution then runs plain.
        direct: A kernel computing the plain convolution, for when cuDNN has no engine.
        channels_last: Whether x, w, y and the residual are stored channels last.
    """

    x: int
    w: int
    y: int
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    dilations: tuple[int, ...]
    groups: int
    dtype: DType
    precision: str
    bias: int | None = None
    residual: int | None = None
    relu: bool = False
    fallback: Launch | None = None
    direct: Launch | None = None
    channels_last: bool = False


@dataclass(frozen=True)
class AttentionView:
    """One operand of `Sdpa` as cuDNN takes it: dims [batch, heads, rows, cols] and strides.

    Strides are in elements; an axis of size 1 has the stride a dense tensor would give it.
    """

    dims: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]


@dataclass(frozen=True)
class Sdpa:
    """cuDNN's fused attention `out = softmax(scale * q @ k^T + bias) @ v`, inference only.

    k and v may have fewer heads than q (grouped queries: query head h reads key head
    h // (q heads / k heads)). A bias view has size 1 on the axes it is broadcast over.

    Attributes:
        bias: The additive bias tensor, or None (none, or the causal mask below).
        causal: Keys after `row + t - s` are hidden (t >= s; aligned to the last key).
        direct: knopt's attention kernel, run when cuDNN declines the graph.
        fixup: Run after cuDNN's call (not after `direct`): NaN over the output rows whose
            bias hides every key, where cuDNN writes 0 (`knopt.cuda.gen.attention_nan`).
    """

    q: int
    k: int
    v: int
    out: int
    bias: int | None
    q_view: AttentionView
    k_view: AttentionView
    v_view: AttentionView
    out_view: AttentionView
    bias_view: AttentionView | None
    scale: float
    causal: bool
    dtype: DType
    direct: Launch
    fixup: Launch | None = None


Step = Launch | Gemm | Conv | Sdpa


def step_tensors(step: Step) -> list[int]:
    """The plan tensors a step reads or writes."""
    if isinstance(step, Launch):
        return [arg.tensor for arg in step.args if isinstance(arg, Buf)]
    if isinstance(step, Sdpa):
        found = [step.q, step.k, step.v, step.out]
        found += [step.bias] if step.bias is not None else []
        found += step_tensors(step.fixup) if step.fixup is not None else []
        return found + step_tensors(step.direct)
    if isinstance(step, Gemm):
        found = [step.a.tensor, step.b.tensor, step.d.tensor]
        if step.residual is not None:
            found.append(step.residual.tensor)
        if step.bias is not None:
            found.append(step.bias)
    else:
        found = [step.x, step.w, step.y]
        found += [t for t in (step.bias, step.residual) if t is not None]
    if step.fallback is not None:
        found += step_tensors(step.fallback)
    if isinstance(step, Conv) and step.direct is not None:
        found += step_tensors(step.direct)
    return found


def map_step_tensors(step: Step, new: Mapping[int, int]) -> Step:
    """`step` with every plan tensor `t` it reads or writes replaced by `new[t]`.

    The same tensors as `step_tensors` lists, in every field that holds one.

    Raises:
        KeyError: If `new` lacks a tensor of the step.
    """
    if isinstance(step, Launch):
        return _map_launch(step, new)
    if isinstance(step, Sdpa):
        return dataclasses.replace(
            step,
            q=new[step.q],
            k=new[step.k],
            v=new[step.v],
            out=new[step.out],
            bias=new[step.bias] if step.bias is not None else None,
            direct=_map_launch(step.direct, new),
            fixup=_map_launch(step.fixup, new) if step.fixup is not None else None,
        )
    fallback = _map_launch(step.fallback, new) if step.fallback is not None else None
    bias = new[step.bias] if step.bias is not None else None
    if isinstance(step, Gemm):
        return dataclasses.replace(
            step,
            a=step.a.with_tensor(new[step.a.tensor]),
            b=step.b.with_tensor(new[step.b.tensor]),
            d=step.d.with_tensor(new[step.d.tensor]),
            bias=bias,
            residual=(
                step.residual.with_tensor(new[step.residual.tensor])
                if step.residual is not None
                else None
            ),
            fallback=fallback,
        )
    direct = _map_launch(step.direct, new) if step.direct is not None else None
    return dataclasses.replace(
        step,
        x=new[step.x],
        w=new[step.w],
        y=new[step.y],
        bias=bias,
        residual=new[step.residual] if step.residual is not None else None,
        fallback=fallback,
        direct=direct,
    )


def _map_launch(launch: Launch, new: Mapping[int, int]) -> Launch:
    args = tuple(Buf(new[arg.tensor]) if isinstance(arg, Buf) else arg for arg in launch.args)
    return Launch(launch.name, launch.source, launch.grid, launch.block, args, launch.shared)


def kernel_launches(step: Step) -> list[Launch]:
    """The NVRTC launches a step may make (a library call's fallback and direct kernels)."""
    if isinstance(step, Launch):
        return [step]
    if isinstance(step, Sdpa):
        return [step.direct] + ([step.fixup] if step.fixup is not None else [])
    found = [step.fallback] if step.fallback is not None else []
    if isinstance(step, Conv) and step.direct is not None:
        found.append(step.direct)
    return found


def describe_step(step: Step) -> str:
    """One line naming a step, for plan dumps and error messages."""
    if isinstance(step, Launch):
        return f"launch {step.name} grid {step.grid} block {step.block}"
    if isinstance(step, Sdpa):
        mask = " +bias" if step.bias is not None else (" +causal" if step.causal else "")
        return (
            f"sdpa q{list(step.q_view.dims)} k{list(step.k_view.dims)} "
            f"v{list(step.v_view.dims)} {step.dtype.short}{mask}"
        )
    if isinstance(step, Gemm):
        extras = [
            x
            for x in (
                "bias" if step.bias is not None else "",
                "residual" if step.residual is not None else "",
                step.activation,
            )
            if x
        ]
        return (
            f"gemm {step.batch}x[{step.a.rows}x{step.a.cols}]@[{step.b.rows}x{step.b.cols}] "
            f"{step.dtype.short}" + (f" +{'+'.join(extras)}" if extras else "")
        )
    extras = [
        x
        for x in (
            "bias" if step.bias is not None else "",
            "residual" if step.residual is not None else "",
            "relu" if step.relu else "",
        )
        if x
    ]
    layout = " nhwc" if step.channels_last else ""
    return f"conv x{list(step.x_shape)} w{list(step.w_shape)} {step.dtype.short}{layout}" + (
        f" +{'+'.join(extras)}" if extras else ""
    )
