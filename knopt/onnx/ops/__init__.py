"""The ONNX op importers, one module per family. Importing this package registers them all."""

from knopt.onnx.ops import (
    attention,
    control,
    einsum,
    elementwise,
    indexing,
    loss,
    nn,
    quantize,
    reduce,
    resize,
    rnn,
    sampling,
    symbolic,
    tensor,
    transformer,
)

__all__ = [
    "attention",
    "control",
    "einsum",
    "elementwise",
    "indexing",
    "loss",
    "nn",
    "quantize",
    "reduce",
    "resize",
    "rnn",
    "sampling",
    "symbolic",
    "tensor",
    "transformer",
]
