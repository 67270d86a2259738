"""`GraphBuilder`: the one way to make graphs. Attributes are keyword-only and typed.

The builder types every node as it is added (`Op.infer`) and hash-conses: adding an op to
inputs that already carry that op returns the existing value, which gives common-subexpression
elimination for free. It does no algebra; that is the optimizer's job.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from knopt.errors import InvalidGraphError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Node, Value
from knopt.ir.memory import check_shape, check_value
from knopt.ir.op import Binary, ConstData, Op, PadMode, PoolKind, Reduction, TensorType, Unary
from knopt.ir.shape import Dim, Shape, broadcast_shapes

Pads = tuple[tuple[int, int], ...]


class GraphBuilder:
    """Builds a `Graph` node by node."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._nodes: list[Node] = []
        self._memo: dict[tuple[Op, tuple[Value, ...], object], Value] = {}
        self._inputs: list[Value] = []
        self._input_names: set[str] = set()
        self._outputs: list[tuple[str, Value]] = []
        self.current_name = ""  # names the nodes added next (the ONNX node being imported)
        # Nodes added while `scope` is set are shared only within that scope, and recorded in
        # `scopes` (the optimizer builds each fused kernel's nodes in a scope of its own).
        self.scope: object = None
        self.scopes: dict[Node, object] = {}

    # ---- core ------------------------------------------------------------------------

    def apply(self, op: Op, inputs: Sequence[Value] = (), name: str | None = None) -> Value:
        """Add `op` applied to `inputs` and return its value (an existing one if identical).

        Raises:
            InvalidGraphError: If the inputs do not fit the op.
            MemoryLimitError: If its value would be larger than the memory budget.
        """
        inputs = tuple(inputs)
        key = (op, inputs, self.scope)
        if (found := self._memo.get(key)) is not None:
            return found
        node = Node(op, inputs, name if name is not None else self.current_name)
        if op.arity is not None and len(inputs) != op.arity:
            raise InvalidGraphError(
                f"{node.describe()}: takes {op.arity} inputs, got {len(inputs)}"
            )
        node.output = Value(op.infer([v.type for v in inputs], node.describe()), node)
        check_value(node.output, node.describe())
        self._nodes.append(node)
        self._memo[key] = node.output
        if self.scope is not None:
            self.scopes[node] = self.scope
        return node.output

    def input(self, name: str, shape: Shape, dtype: DType) -> Value:
        """A new graph input.

        Raises:
            InvalidGraphError: If an input of that name exists already.
        """
        if name in self._input_names:
            raise InvalidGraphError(f"graph input '{name}' is declared twice")
        self._input_names.add(name)
        value = self.apply(ops.Input(name, TensorType(tuple(shape), dtype)), name=name)
        self._inputs.append(value)
        return value

    def output(self, value: Value, name: str) -> None:
        """Mark `value` as a graph output called `name`."""
        if any(existing == name for existing, _ in self._outputs):
            raise InvalidGraphError(f"graph output '{name}' is declared twice")
        self._outputs.append((name, value))

    def build(self) -> Graph:
        """The graph of the marked outputs; nodes no output needs are left out.

        Raises:
            InvalidGraphError: If no output was marked.
        """
        if not self._outputs:
            raise InvalidGraphError(f"graph '{self.name}' has no outputs")
        needed: set[Node] = {v.producer for v in self._inputs}
        stack = [v for _, v in self._outputs]
        while stack:
            node = stack.pop().producer
            if node not in needed:
                needed.add(node)
                stack.extend(node.inputs)
        nodes = [n for n in self._nodes if n in needed]
        names = [name for name, _ in self._outputs]
        return Graph(nodes, self._inputs, [v for _, v in self._outputs], names, self.name)

    # ---- leaves ----------------------------------------------------------------------

    def constant(
        self, array: np.ndarray | np.generic | float | int | bool, dtype: DType | None = None
    ) -> Value:
        """A constant tensor (copied)."""
        data = np.array(array, dtype=dtype.numpy if dtype is not None else None)
        return self.apply(ops.Constant(ConstData(data)))

    def scalar(self, value: float | int | bool, dtype: DType, shape: Shape = ()) -> Value:
        """A constant of `shape` whose elements all equal `value` (broadcast if symbolic)."""
        if all(isinstance(d, int) for d in shape):
            check_shape(shape, dtype.numpy.itemsize, f"a constant made for {self.current_name}")  # type: ignore[arg-type]
            return self.constant(np.full(shape, value, dtype.numpy))  # type: ignore[arg-type]
        one = self.constant(np.full((1,) * len(shape), value, dtype.numpy))
        return self.broadcast(one, shape)

    def iota(self, length: Dim, dtype: DType = DType.I64) -> Value:
        """The integers 0 .. length - 1."""
        return self.apply(ops.Iota(length, dtype))

    # ---- data movement ---------------------------------------------------------------

    def view(self, x: Value, shape: Shape) -> Value:
        """`x` reshaped (a no-op if the shape is unchanged)."""
        shape = tuple(shape)
        return x if shape == x.shape else self.apply(ops.View(shape), [x])

    def broadcast(self, x: Value, shape: Shape) -> Value:
        """`x` broadcast numpy-style to `shape` (leading axes added by a view)."""
        shape = tuple(shape)
        if x.rank < len(shape):
            x = self.view(x, (1,) * (len(shape) - x.rank) + x.shape)
        return x if x.shape == shape else self.apply(ops.Broadcast(shape), [x])

    def permute(self, x: Value, perm: Sequence[int]) -> Value:
        """`x` with its axes reordered (a no-op for the identity)."""
        perm = tuple(perm)
        return x if perm == tuple(range(x.rank)) else self.apply(ops.Permute(perm), [x])

    def slice(self, x: Value, *, axis: int, start: Dim, stop: Dim, step: int = 1) -> Value:
        """Elements `start:stop:step` of `axis` (a no-op for the whole axis)."""
        if start == 0 and stop == x.shape[axis] and step == 1:
            return x
        return self.apply(ops.Slice(axis, start, stop, step), [x])

    def flip(self, x: Value, *, axis: int) -> Value:
        """`x` reversed along `axis`."""
        return self.apply(ops.Flip(axis), [x])

    def pad(
        self, x: Value, *, pads: Pads, mode: PadMode = PadMode.CONSTANT, value: float = 0.0
    ) -> Value:
        """`x` grown by `pads` per axis."""
        if all(b == 0 and a == 0 for b, a in pads):
            return x
        return self.apply(ops.Pad(tuple(pads), mode, float(value)), [x])

    def concat(self, xs: Sequence[Value], *, axis: int) -> Value:
        """The inputs joined along `axis`."""
        return xs[0] if len(xs) == 1 else self.apply(ops.Concat(axis), xs)

    def gather(self, x: Value, indices: Value, *, axis: int) -> Value:
        """`x.take(indices, axis)`."""
        return self.apply(ops.Gather(axis), [x, indices])

    def scatter(
        self,
        data: Value,
        indices: Value,
        updates: Value,
        *,
        axis: int,
        reduction: ops.ScatterReduction = ops.ScatterReduction.NONE,
    ) -> Value:
        """A copy of `data` with `updates` written at `indices` along `axis`."""
        return self.apply(ops.Scatter(axis, reduction), [data, indices, updates])

    def cast(self, x: Value, dtype: DType) -> Value:
        """`x` converted to `dtype` (a no-op if it has that type)."""
        return x if x.dtype is dtype else self.apply(ops.Cast(dtype), [x])

    # ---- elementwise -----------------------------------------------------------------

    def unary(self, kind: Unary, x: Value) -> Value:
        """An elementwise function of `x`."""
        return self.apply(ops.UnaryOp(kind), [x])

    def binary(self, kind: Binary, a: Value, b: Value) -> Value:
        """An elementwise function of `a` and `b`, broadcast numpy-style first."""
        where = f"node '{self.current_name}' ({kind.name})" if self.current_name else kind.name
        shape = broadcast_shapes(a.shape, b.shape, where)
        return self.apply(ops.BinaryOp(kind), [self.broadcast(a, shape), self.broadcast(b, shape)])

    def clamp(self, x: Value, *, lo: float = -np.inf, hi: float = np.inf) -> Value:
        """`x` limited to `[lo, hi]`."""
        return self.apply(ops.Clamp(float(lo), float(hi)), [x])

    def where(self, condition: Value, x: Value, y: Value) -> Value:
        """`x` where `condition`, else `y`, broadcast numpy-style first."""
        where = f"node '{self.current_name}' (where)" if self.current_name else "where"
        shape = broadcast_shapes(broadcast_shapes(condition.shape, x.shape, where), y.shape, where)
        return self.apply(
            ops.Where(),
            [self.broadcast(condition, shape), self.broadcast(x, shape), self.broadcast(y, shape)],
        )

    def add(self, a: Value, b: Value) -> Value:
        """`a + b`, broadcast."""
        return self.binary(Binary.ADD, a, b)

    def sub(self, a: Value, b: Value) -> Value:
        """`a - b`, broadcast."""
        return self.binary(Binary.SUB, a, b)

    def mul(self, a: Value, b: Value) -> Value:
        """`a * b`, broadcast."""
        return self.binary(Binary.MUL, a, b)

    def div(self, a: Value, b: Value) -> Value:
        """`a / b`, broadcast."""
        return self.binary(Binary.DIV, a, b)

    # ---- reductions and friends ------------------------------------------------------

    def reduce(self, kind: Reduction, x: Value, *, axes: Sequence[int]) -> Value:
        """Combine over `axes`, which stay as size 1 (a no-op for no axes)."""
        axes = tuple(sorted(set(axes)))
        return x if not axes else self.apply(ops.Reduce(kind, axes), [x])

    def arg_reduce(self, x: Value, *, axis: int, largest: bool = True, last: bool = False) -> Value:
        """Index of the extreme element along `axis` (kept as size 1)."""
        return self.apply(ops.ArgReduce(axis, largest, last), [x])

    def arg_sort(self, x: Value, *, axis: int, descending: bool = False) -> Value:
        """Indices that stably sort `axis`."""
        return self.apply(ops.ArgSort(axis, descending), [x])

    def cumsum(
        self, x: Value, *, axis: int, exclusive: bool = False, reverse: bool = False
    ) -> Value:
        """Running sums along `axis`."""
        return self.apply(ops.CumSum(axis, exclusive, reverse), [x])

    def softmax(self, x: Value, *, axis: int) -> Value:
        """Softmax along `axis`."""
        return self.apply(ops.Softmax(axis), [x])

    def layer_norm(self, x: Value, *, axis: int, eps: float) -> Value:
        """LayerNorm without scale and bias over the axes from `axis` on."""
        return self.apply(ops.LayerNorm(axis, float(eps)), [x])

    def rms_norm(self, x: Value, *, axis: int, eps: float) -> Value:
        """RMSNorm without scale over the axes from `axis` on."""
        return self.apply(ops.RmsNorm(axis, float(eps)), [x])

    def rope(self, x: Value, cos: Value, sin: Value) -> Value:
        """`x * cos + rotate_half(x) * sin` over the last axis (cos and sin broadcast to x)."""
        return self.apply(
            ops.Rope(), [x, self.broadcast(cos, x.shape), self.broadcast(sin, x.shape)]
        )

    # ---- contractions ----------------------------------------------------------------

    def matmul(self, a: Value, b: Value) -> Value:
        """Batched matmul of operands with equal batch dimensions."""
        return self.apply(ops.MatMul(), [a, b])

    def conv(
        self,
        x: Value,
        w: Value,
        *,
        strides: Sequence[int],
        pads: Pads,
        dilations: Sequence[int],
        groups: int = 1,
    ) -> Value:
        """N-d convolution (cross-correlation) without bias."""
        return self.apply(ops.Conv(tuple(strides), tuple(pads), tuple(dilations), groups), [x, w])

    def int_matmul(self, a: Value, b: Value, a_zero: Value, b_zero: Value) -> Value:
        """`(a - a_zero) @ (b - b_zero)` in int32 for 8-bit a and b (zero points broadcast)."""
        a_zero, b_zero = self.broadcast(a_zero, a.shape), self.broadcast(b_zero, b.shape)
        return self.apply(ops.IntMatMul(), [a, b, a_zero, b_zero])

    def int_conv(
        self,
        x: Value,
        w: Value,
        x_zero: Value,
        w_zero: Value,
        *,
        strides: Sequence[int],
        pads: Pads,
        dilations: Sequence[int],
        groups: int = 1,
    ) -> Value:
        """Conv of `x - x_zero` with `w - w_zero` in int32 (zero points broadcast)."""
        op = ops.IntConv(tuple(strides), tuple(pads), tuple(dilations), groups)
        x_zero, w_zero = self.broadcast(x_zero, x.shape), self.broadcast(w_zero, w.shape)
        return self.apply(op, [x, w, x_zero, w_zero])

    def int4_matmul(
        self, a: Value, packed: Value, scales: Value, zeros: Value, *, block: int
    ) -> Value:
        """`a @ W^T` for a 4-bit weight W in MatMulNBits' packed layout (see `ops.Int4MatMul`)."""
        return self.apply(ops.Int4MatMul(block), [a, packed, scales, zeros])

    def pool(
        self,
        kind: PoolKind,
        x: Value,
        *,
        kernel: Sequence[int],
        strides: Sequence[int],
        pads: Pads,
        dilations: Sequence[int],
        ceil_mode: bool = False,
        count_include_pad: bool = False,
    ) -> Value:
        """Max or average pooling over the spatial axes."""
        op = ops.Pool(
            kind,
            tuple(kernel),
            tuple(strides),
            tuple(pads),
            tuple(dilations),
            ceil_mode,
            count_include_pad,
        )
        return self.apply(op, [x])
