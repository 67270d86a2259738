"""The cost model: a roofline estimate per kernel, with device profiles.

    cost = launch + max(bytes_moved / bandwidth, flops / peak)

Views (View, Broadcast, Permute, Slice, Flip) are free, since kernels read through strides,
and so are inputs, constants and classes folded while compiling. Costs are in seconds.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knopt.errors import KnoptError, OptimizeError
from knopt.ir import op as ops
from knopt.ir.dtype import DType
from knopt.ir.kernel import KernelKind
from knopt.opt.serialized import EGraphData, ENode, SRef
from knopt.opt.terms import LEAF_TERMS


@dataclass(frozen=True)
class DeviceProfile:
    """What a device can do, for the roofline.

    Attributes:
        bandwidth: Bytes per second read plus written.
        peak: FLOP/s by element kind ("f32", "f16", "f64", "int"), and optionally "i8": the
            rate of 8-bit integer matrix products (tensor cores; "int" where absent), and
            "i8-varying": the rate of those whose second operand (the weight) varies, where
            the device multiplies such products otherwise ("i8" where absent).
        launch: Fixed seconds per kernel.
    """

    name: str
    bandwidth: float
    peak: Mapping[str, float]
    launch: float
    symbol_size: int = 8  # the size of a named symbolic size no `sizes=` gives (see CostModel)
    per_op_launch: bool = False  # a fused body still costs one launch per op (numpy)

    def flops_per_second(self, dtype: DType) -> float:
        """Peak arithmetic rate for elements of `dtype`."""
        if dtype in (DType.F16, DType.BF16):
            return self.peak["f16"]
        if dtype is DType.F64:
            return self.peak["f64"]
        if dtype.is_float:
            return self.peak["f32"]
        return self.peak["int"]

    def int8_product_rate(self, *, varying_weight: bool = False) -> float:
        """Peak rate of 8-bit integer matrix products with int32 accumulation.

        Args:
            varying_weight: Whether the second operand is computed from the inputs (attention
                scores of quantized queries and keys) rather than a constant weight.
        """
        rate = self.peak.get("i8", self.peak["int"])
        return self.peak.get("i8-varying", rate) if varying_weight else rate

    def to_json(self) -> dict[str, Any]:
        """The profile as a JSON object (what `knopt calibrate` writes)."""
        return {
            "name": self.name,
            "bandwidth": self.bandwidth,
            "peak": dict(self.peak),
            "launch": self.launch,
            "symbol_size": self.symbol_size,
            "per_op_launch": self.per_op_launch,
        }


_PEAK_KINDS = ("f32", "f16", "f64", "int")
_OPTIONAL_PEAK_KINDS = ("i8", "i8-varying")


def load_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    """Read a profile file written by `knopt calibrate`.

    Raises:
        KnoptError: If the file is missing, not JSON, or lacks a field or has a bad value.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        raise KnoptError(f"device profile {path}: cannot read it ({err.strerror})") from err
    except json.JSONDecodeError as err:
        raise KnoptError(f"device profile {path}: not JSON ({err})") from err
    where = f"device profile {path}"
    if not isinstance(data, dict):
        raise KnoptError(f"{where}: expected a JSON object; write one with `knopt calibrate`")
    peak = data.get("peak")
    if not isinstance(peak, dict) or not set(_PEAK_KINDS) <= set(peak) <= set(
        _PEAK_KINDS + _OPTIONAL_PEAK_KINDS
    ):
        raise KnoptError(
            f"{where}: 'peak' must give FLOP/s for each of {', '.join(_PEAK_KINDS)} "
            f"(and may for {', '.join(_OPTIONAL_PEAK_KINDS)})"
        )
    rates = {"bandwidth": data.get("bandwidth"), "launch": data.get("launch")}
    rates.update({f"peak.{k}": v for k, v in peak.items()})
    for key, value in rates.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise KnoptError(f"{where}: '{key}' must be a positive number, not {value!r}")
        if not math.isfinite(value):
            raise KnoptError(f"{where}: '{key}' must be finite, not {value!r}")
    name = data.get("name", path.stem)
    symbol_size = data.get("symbol_size", 8)
    if not isinstance(name, str) or not name:
        raise KnoptError(f"{where}: 'name' must be a non-empty string")
    if not isinstance(symbol_size, int) or isinstance(symbol_size, bool) or symbol_size < 1:
        raise KnoptError(f"{where}: 'symbol_size' must be a positive integer")
    return DeviceProfile(
        name,
        bandwidth=float(data["bandwidth"]),
        peak={k: float(v) for k, v in peak.items()},
        launch=float(data["launch"]),
        symbol_size=symbol_size,
        per_op_launch=bool(data.get("per_op_launch", False)),
    )


def find_profile(profile: str | os.PathLike[str] | DeviceProfile) -> DeviceProfile:
    """A profile by name ("cpu", "h200", "h200-graph"), from a calibrated file, or as given.

    Raises:
        KnoptError: If the name is unknown and no such file exists, or the file is bad.
    """
    if isinstance(profile, DeviceProfile):
        return profile
    if isinstance(profile, str) and profile in PROFILES:
        return PROFILES[profile]
    if not isinstance(profile, str) or profile.endswith(".json") or Path(profile).exists():
        return load_profile(profile)
    raise KnoptError(
        f"unknown device profile '{profile}': use one of {', '.join(PROFILES)} or a file "
        "written by `knopt calibrate`"
    )


# Estimates for a 2-core development machine running numpy with OpenBLAS: each numpy op costs
# a few microseconds of Python before any data moves.
CPU = DeviceProfile(
    "cpu",
    bandwidth=8e9,
    # 8-bit products run as float64 BLAS (exact): knopt/cpu/kernels.py.
    peak={"f32": 60e9, "f16": 5e9, "f64": 30e9, "int": 20e9, "i8": 30e9},
    launch=6e-6,
    per_op_launch=True,
)
# H200: HBM3e copy bandwidth 4.2 TB/s, f32 (no TF32) 51 TFLOP/s, f16 tensor cores 760 TFLOP/s,
# int8 tensor cores twice that (1,979 dense TOPS on paper, as f16's 989 is 760 measured), a
# kernel launch about 4 us from Python (under 1 us inside a CUDA graph). Only products by a
# constant weight reach the int8 tensor cores (cuBLASLt takes the weight transposed and
# centered while planning: knopt/cuda/gen/imma.py); a product of two computed operands runs a
# direct int32 kernel: BERT-base's 8-bit Q @ K^T at batch 32, 0.81 GOP, took 122 us (6.6 TOP/s).
H200 = DeviceProfile(
    "h200",
    bandwidth=4.2e12,
    peak={
        "f32": 51e12,
        "f16": 760e12,
        "f64": 60e12,
        "int": 30e12,
        "i8": 1520e12,
        "i8-varying": 6.6e12,
    },
    launch=4e-6,
)
H200_GRAPH = DeviceProfile("h200-graph", H200.bandwidth, H200.peak, launch=0.8e-6)
PROFILES = {p.name: p for p in (CPU, H200, H200_GRAPH)}

FREE_OPS = LEAF_TERMS | {cls.__name__ for cls in ops.VIEW_OPS}
_TRACE = 1e-12
# Rough arithmetic per element of the result, relative to an add (1, for kinds not listed).
_KIND_FLOPS = {
    "EXP": 8,
    "LOG": 8,
    "TANH": 10,
    "ERF": 12,
    "SIGMOID": 10,
    "GELU": 16,
    "GELU_TANH": 16,
    "SILU": 12,
    "SOFTPLUS": 12,
    "SIN": 10,
    "COS": 10,
    "TAN": 12,
    "SQRT": 4,
    "RSQRT": 4,
    "RECIPROCAL": 4,
    "POW": 12,
    "DIV": 4,
    "MOD": 4,
    "FMOD": 4,
}


@dataclass
class CostModel:
    """Costs of e-nodes of one e-graph on one device.

    Kernels are costed at one representative size: each symbolic dimension (a polynomial of
    named sizes, such as `batch*seq`) is evaluated with the named sizes that `symbols` gives
    it, so that a view does not change a tensor's estimated element count. A program stays
    symbolic and serves every size; this size decides only which program extraction picks.

    Attributes:
        symbols: The estimated value of each symbolic dimension, by its (negative) i64 code in
            the e-graph's shapes; a code missing here counts `profile.symbol_size`.
    """

    data: EGraphData
    profile: DeviceProfile
    folding: bool = True  # folded classes are free; off to price the graph as given
    symbols: Mapping[int, int] = field(default_factory=dict)
    _bytes: dict[int, float] = field(default_factory=dict)
    _body_cache: dict[int, tuple[int, float]] = field(default_factory=dict)

    def shape(self, cls: int) -> tuple[int, ...]:
        """The estimated sizes of a class (symbolic sizes at their representative values)."""
        return tuple(
            d if d >= 0 else self.symbols.get(d, self.profile.symbol_size)
            for d in self.data.shapes[cls]
        )

    def numel(self, cls: int) -> int:
        """Estimated element count of a class."""
        return math.prod(self.shape(cls))

    def dtype(self, cls: int) -> DType:
        """The dtype of a class."""
        return DType[self.data.dtypes[cls]]

    def bytes(self, cls: int) -> float:
        """Bytes a kernel reads when it loads this class (a broadcast reads its source only)."""
        stack = [(cls, False)]
        while stack:  # iterative: a chain of broadcasts may be long
            current, ready = stack.pop()
            if ready:
                self._bytes[current] = min(
                    [self._bytes[current]]
                    + [self._bytes[n.args[0].id] for n in self._broadcasts(current)]
                )
            elif current not in self._bytes:
                self._bytes[current] = self.numel(current) * self.dtype(current).itemsize
                if any(n.op == "Splat" for n in self.data.classes.get(current, [])):
                    self._bytes[current] = 0.0
                stack.append((current, True))  # a class seen again (a cycle) keeps its numel
                stack.extend((n.args[0].id, False) for n in self._broadcasts(current))
        return self._bytes[cls]

    def _broadcasts(self, cls: int) -> list[ENode]:
        return [n for n in self.data.classes.get(cls, []) if n.op == "Broadcast"]

    def node_cost(self, cls: int, node: ENode) -> float:
        """Seconds to compute `node` as its own kernel (0 for views, leaves and folds)."""
        if node.op in FREE_OPS:
            # Views cost nothing to run; a trace of cost prefers one view over a chain of them.
            return 0.0 if node.op in LEAF_TERMS else _TRACE
        children = self.data.children(node)
        out = self.numel(cls)
        if self.folding and cls in self.data.folds and all(c in self.data.folds for c in children):
            # Computed while compiling, but kept in memory: a tiny charge per byte makes
            # extraction prefer small folded constants (a broadcast of a product over a product
            # of broadcasts).
            return out * self.dtype(cls).itemsize / self.profile.bandwidth * 1e-3
        moved = out * self.dtype(cls).itemsize + sum(self.bytes(c) for c in set(children))
        ops, body_flops = self._bodies(node)
        flops = self.flops(cls, node, out) + body_flops * self._body_elements(cls, node, out)
        if node.op in _INT8_PRODUCTS:
            varying = node.args[1].id in self.data.relations.get("varies", ())
            rate = self.profile.int8_product_rate(varying_weight=varying)
        else:
            rate = self.profile.flops_per_second(self.dtype(children[0]) if children else DType.F32)
        launches = 1 + ops if self.profile.per_op_launch else 1
        roofline = max(moved / self.profile.bandwidth, flops / rate)
        # A thousandth of the arithmetic breaks ties between equally bandwidth-bound forms:
        # a multiply over a divide, x * x over pow(x, 2).
        return self.profile.launch * launches + roofline + 1e-3 * flops / rate

    def _bodies(self, node: ENode) -> tuple[int, float]:
        """Scalar ops in a kernel node's bodies, and their arithmetic per element."""
        ops, flops = 0, 0.0
        for arg in node.args:
            if isinstance(arg, SRef):
                n, f = self._body(arg.id)
                ops, flops = ops + n, flops + f
        if node.op == "KElem":
            ops -= 1  # the kernel itself is the first op
        return max(ops, 0), flops

    def _body(self, sid: int) -> tuple[int, float]:
        if sid not in self._body_cache:
            count, flops, seen, stack = 0, 0.0, set(), [sid]
            while stack:
                current = stack.pop()
                if current in seen:
                    continue
                seen.add(current)
                node = self.data.body(current)
                if node.op not in ("SLoad", "SConst", "SAcc"):
                    count += 1
                    kind = node.args[0] if isinstance(node.args[0], str) else ""
                    flops += _KIND_FLOPS.get(kind, 1)
                stack.extend(a.id for a in node.args if isinstance(a, SRef))
            self._body_cache[sid] = (count, flops)
        return self._body_cache[sid]

    def _body_elements(self, cls: int, node: ENode, out: int) -> int:
        """Elements a prologue runs over: a reduction's input, else the output."""
        if node.op == "KReduce":
            loads = self.data.loads(node.args[1].id)
            return max([self.numel(c) for c in loads], default=out)
        return out

    def flops(self, cls: int, node: ENode, out: int) -> float:
        """Estimated arithmetic of a node.

        Raises:
            OptimizeError: If the cost model does not know the node's constructor.
        """
        count = FLOPS.get(node.op)
        if count is None:
            raise OptimizeError(
                f"the cost model has no arithmetic estimate for {node.op}; add one to FLOPS "
                "in knopt/opt/cost.py"
            )
        return count(self, node, out)


FlopCount = Callable[[CostModel, ENode, int], float]


def _per_element(model: CostModel, node: ENode, out: int) -> float:
    return float(out)


def _of_kind(model: CostModel, node: ENode, out: int) -> float:
    return float(out * _KIND_FLOPS.get(node.args[0], 1))


def _reads_operand(index: int) -> FlopCount:
    """One operation per element of argument `index` (reductions and scans)."""

    def count(model: CostModel, node: ENode, out: int) -> float:
        return float(model.numel(node.args[index].id))

    return count


def _matmul(model: CostModel, node: ENode, out: int) -> float:
    a = model.shape(node.args[0].id)
    return 2.0 * out * a[-1]


def _conv(model: CostModel, node: ENode, out: int) -> float:
    w = model.shape(node.args[1].id)
    return 2.0 * out * math.prod(w[1:])


def _pool(model: CostModel, node: ENode, out: int) -> float:
    return float(out * math.prod(node.args[2]))


def _rowwise(model: CostModel, node: ENode, out: int) -> float:
    return 8.0 * out


def _arg_sort(model: CostModel, node: ENode, out: int) -> float:
    return out * max(1.0, math.log2(max(out, 2))) * 4


def _attention(model: CostModel, node: ENode, out: int) -> float:
    q, v = model.shape(node.args[0].id), model.shape(node.args[2].id)
    keys = model.shape(node.args[1].id)[-2]
    rows = math.prod(q[:-1])
    return 2.0 * rows * keys * (q[-1] + v[-1]) + 8.0 * rows * keys


def _rope(model: CostModel, node: ENode, out: int) -> float:
    return 3.0 * out  # two products and their sum; the negation is a sign


def _int4_matmul(model: CostModel, node: ENode, out: int) -> float:
    # The product, and the dequantization of every weight element (subtract, multiply).
    k = model.shape(node.args[0].id)[-1]
    n = model.shape(node.args[1].id)[0]
    return 2.0 * out * k + 2.0 * n * k


def _elementwise_kernel(model: CostModel, node: ENode, out: int) -> float:
    return 0.0  # all of it is in the body, which `node_cost` counts


def _reduce_kernel(model: CostModel, node: ENode, out: int) -> float:
    loads = model.data.loads(node.args[1].id)
    return float(max([model.numel(c) for c in loads], default=out))


_OP_FLOPS: dict[type[ops.Op], FlopCount] = {
    ops.Pad: _per_element,
    ops.Concat: _per_element,
    ops.Gather: _per_element,
    ops.Scatter: _per_element,
    ops.Cast: _per_element,
    ops.UnaryOp: _of_kind,
    ops.BinaryOp: _of_kind,
    ops.Clamp: _per_element,
    ops.Where: _per_element,
    ops.Reduce: _reads_operand(1),
    ops.ArgReduce: _reads_operand(0),
    ops.ArgSort: _arg_sort,
    ops.CumSum: _reads_operand(0),
    ops.MatMul: _matmul,
    ops.Conv: _conv,
    ops.Pool: _pool,
    ops.Softmax: _rowwise,
    ops.LayerNorm: _rowwise,
    ops.RmsNorm: _rowwise,
    ops.Attention: _attention,
    ops.Rope: _rope,
    ops.IntMatMul: _matmul,
    ops.IntConv: _conv,
    ops.Int4MatMul: _int4_matmul,
    # Unknown arithmetic: an op per element of the result, beside the launch and the bytes of
    # its inputs and result that every kernel pays. A symbolic size no input gives counts the
    # profile's `symbol_size`. It is a constant of every program: it bears on no choice.
    ops.Opaque: _per_element,
}


def _kernel_flops(kind: KernelKind) -> FlopCount:
    """A kernel's own arithmetic: its main op's, whose arguments a kernel term keeps in place.

    A reduction's prologue runs over the reduction's input, which the kernel term does not
    hold as a tensor: its size is the largest tensor the prologue loads.
    """
    if kind is KernelKind.ELEMENTWISE:
        return _elementwise_kernel
    if kind is KernelKind.REDUCE:
        return _reduce_kernel
    assert kind.main_op is not None
    return _OP_FLOPS[kind.main_op]


# Every constructor that is not free (leaves, views), by schema.egg name.
FLOPS: dict[str, FlopCount] = {
    **{cls.__name__: count for cls, count in _OP_FLOPS.items()},
    **{kind.constructor: _kernel_flops(kind) for kind in KernelKind},
}
# Products of 8-bit integers priced at the device's integer matrix rate: the GEMM, which the
# GPU runs on its int8 tensor cores. IntConv has the plain integer rate: the GPU runs it as a
# direct kernel (knopt/cuda/gen/quantized.py), so a large one stays a float convolution.
_INT8_PRODUCTS = frozenset({"IntMatMul", KernelKind.INT_MATMUL.constructor})
