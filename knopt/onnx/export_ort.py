"""Recognised patterns written as onnxruntime's com.microsoft fused ops (`--target onnxruntime`).

Only ops that onnxruntime documents (docs/ContribOperators.md) and runs on its CPU provider,
where they are faster than the standard spelling; each is checked against onnxruntime's own
kernel in tests/onnx/test_export_ort.py.
"""

from __future__ import annotations

from knopt.onnx.export_fused import Patterns

MS_DOMAIN = "com.microsoft"

ORT_PATTERNS: Patterns = {}
