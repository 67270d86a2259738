"""ONNX import (ONNX ops decomposed into IR ops) and export (IR graphs back to standard ONNX)."""

from knopt.onnx.context import supported_op_types
from knopt.onnx.export import save_onnx
from knopt.onnx.load import import_model, load_model

__all__ = ["import_model", "load_model", "save_onnx", "supported_op_types"]
