"""Helpers of the quantized-kernel GPU tests (and benchmarks/quantized.py): random MatMulNBits
weights, numpy references, arrays moved to and from the device, and linear layers quantized
as benchmarks/quantized_bert.py quantizes BERT-base."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from knopt.ir.dtype import DType

NUMPY = {DType.F16: np.dtype(np.float16), DType.BF16: np.dtype(ml_dtypes.bfloat16)}


@dataclass(frozen=True)
class NBitsWeight:
    """A random int4 weight [N, K] in MatMulNBits' layout (zero points optional)."""

    b: np.ndarray  # uint8 [N, k_blocks, block / 2]
    scales: np.ndarray  # [N, k_blocks] of the activation type
    zeros: np.ndarray | None  # uint8 [N, ceil(k_blocks / 2)]
    k: int
    block: int

    @property
    def n(self) -> int:
        """Output features."""
        return int(self.b.shape[0])

    def dequantized(self, dtype: DType | None = None) -> np.ndarray:
        """W [N, K] as float64: exact, or rounded to `dtype` as the kernels round it."""
        n, blocks, _ = self.b.shape
        codes = np.stack([self.b & 15, self.b >> 4], axis=-1).reshape(n, blocks, self.block)
        if self.zeros is None:
            zero = np.full((n, blocks, 1), 8.0)
        else:
            nibbles = np.stack([self.zeros & 15, self.zeros >> 4], axis=-1).reshape(n, -1)
            zero = nibbles[:, :blocks, None].astype(np.float64)
        w = (codes - zero) * self.scales.astype(np.float64)[:, :, None]
        if dtype is not None:
            w = w.astype(NUMPY[dtype]).astype(np.float64)
        return w.reshape(n, blocks * self.block)[:, : self.k]


def random_nbits(
    rng: np.random.Generator, n: int, k: int, block: int, dtype: DType, zeros: bool
) -> NBitsWeight:
    """Random codes (every nibble value occurs), scales in [0.005, 0.05), zero points."""
    blocks = -(-k // block)
    return NBitsWeight(
        b=rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8),
        scales=rng.uniform(0.005, 0.05, (n, blocks)).astype(NUMPY[dtype]),
        zeros=rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8) if zeros else None,
        k=k,
        block=block,
    )


class Device:
    """Numpy arrays copied to and from one `knopt.cuda.driver.Gpu`."""

    def __init__(self, gpu: Any) -> None:
        self.gpu = gpu

    def put(self, array: np.ndarray | None) -> int:
        """A device copy of `array` (0 for None)."""
        if array is None:
            return 0
        array = np.ascontiguousarray(array)
        address = self.gpu.allocate(array.nbytes)
        self.gpu.upload(address, array)
        return int(address)

    def empty(self, nbytes: int) -> int:
        """Uninitialized device memory (0 for 0 bytes)."""
        return int(self.gpu.allocate(nbytes)) if nbytes else 0

    def get(self, address: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The device array at `address`, copied back."""
        self.gpu.sync()
        return self.gpu.download(address, np.empty(shape, dtype=dtype))

    @property
    def sm_count(self) -> int:
        """The GPU's multiprocessor count."""
        return int(self.gpu.device.properties.multiprocessor_count)


def _linear_matmuls(path: Path) -> list[str]:
    """MatMul nodes whose second operand is a weight (an initializer)."""
    model = onnx.load(path)
    weights = {t.name for t in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]


def quantize_linear_layers(float_path: Path, out: Path, feeds: Mapping[str, np.ndarray]) -> None:
    """The model's linear layers quantized to int8 QDQ by onnxruntime, calibrated on `feeds`.

    int8 activations (asymmetric) and symmetric per-channel int8 weights; the attention
    products stay float, as int8 deployments of BERT usually keep them.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class _OneBatch(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([dict(feeds)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(
        str(float_path),
        str(out),
        _OneBatch(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        nodes_to_quantize=_linear_matmuls(float_path),
        extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
    )
