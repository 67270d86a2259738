"""The ONNX op importers, one module per family. Importing this package registers them all."""

from knopt.onnx.ops import attention, elementwise, indexing, loss, nn, reduce, resize, symbolic, tensor

__all__ = ["attention", "elementwise", "indexing", "loss", "nn", "reduce", "resize", "symbolic", "tensor"]
