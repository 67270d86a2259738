"""What a `knopt.Session` on device "cuda" uses: one GPU executable per bound graph."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from knopt.cuda import prepare
from knopt.cuda.executor import Executable
from knopt.cuda.precision import narrow_dtype
from knopt.ir.graph import Graph
from knopt.ir.program import Program, program_from_graph


class CudaRunner:
    """Runs graphs (or Programs) on the GPU, preparing each once.

    Raises:
        KnoptError: If `precision` is unknown.
    """

    def __init__(self, precision: str = "f32") -> None:
        narrow_dtype(precision)
        self.precision = precision
        self._executables: dict[Graph | Program, Executable] = {}

    def executable(self, source: Graph | Program) -> Executable:
        """The prepared executable of a graph with static sizes, or of a Program."""
        if source not in self._executables:
            program = source if isinstance(source, Program) else program_from_graph(source)
            self._executables[source] = prepare(program, self.precision)
        return self._executables[source]

    def run(
        self, source: Graph | Program, feeds: Mapping[str, Any], device_outputs: bool = False
    ) -> list[Any]:
        """The outputs of `source` on `feeds`, in order."""
        return self.executable(source).run(feeds, device_outputs=device_outputs)
