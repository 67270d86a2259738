"""The ONNX op importers, one module per family. Importing this package registers them all."""

from knopt.onnx.ops import elementwise, indexing, nn, reduce, symbolic, tensor

__all__ = ["elementwise", "indexing", "nn", "reduce", "symbolic", "tensor"]
