"""knopt as an `onnx.backend` backend, so that ONNX's backend test suite can run against it.

`prepare` imports the model with knopt's importer and `run` executes it on the CPU executor.
Nothing falls back to onnxruntime or to onnx's reference evaluator: a model knopt cannot import
raises `UnsupportedModelError`.

knopt needs some values when it imports a graph: the target shape of a Reshape, the axes of a
reduction, the sizes of a Resize, the condition of an If. Models compute them from constants,
but test models (and some exported ones) take them as graph inputs. Such inputs are fixed at
run time instead: the model is imported again for each new value of them, and the result is
kept, as a JIT compiler specializes on shape-determining inputs. Every other input stays a
graph input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from knopt.errors import InputError, KnoptError
from knopt.onnx.context import KnownValueRequired
from knopt.onnx.load import import_model
from knopt.session import Session


class KnoptBackendRep(BackendRep):
    """A model prepared by `KnoptBackend`: knopt sessions, one per value of the fixed inputs."""

    def __init__(
        self, model: onnx.ModelProto, fixed: frozenset[str], session: Session | None
    ) -> None:
        self.model = model
        self.input_names = _runtime_input_names(model)
        self._fixed = fixed  # graph inputs whose values are needed when importing
        self._sessions: dict[tuple[object, ...], Session] = {}
        if session is not None:
            self._sessions[()] = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the model on `inputs`: one array per graph input, in order, or a name mapping.

        Raises:
            InputError: If the inputs do not match the model's inputs.
            UnsupportedModelError: If the model cannot be imported for these input values.
        """
        feeds = self._feeds(inputs)
        session = self._session_for(feeds)
        own = {name: feeds[name] for name in session.input_names}
        return tuple(session.run(None, own))

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        names = self.input_names
        if isinstance(inputs, Mapping):
            return {name: np.asarray(value) for name, value in inputs.items()}
        arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        if len(arrays) != len(names):
            raise InputError(f"got {len(arrays)} inputs, the model takes {len(names)}: {names}")
        return {name: np.asarray(a) for name, a in zip(names, arrays, strict=True)}

    def _session_for(self, feeds: Mapping[str, np.ndarray]) -> Session:
        while True:
            missing = sorted(self._fixed - set(feeds))
            if missing:
                raise InputError(f"input(s) {missing} are missing")
            key = tuple(_fingerprint(feeds[name]) for name in sorted(self._fixed))
            if key in self._sessions:
                return self._sessions[key]
            known = {name: feeds[name] for name in self._fixed}
            try:
                graph = import_model(self.model, known_inputs=known)
            except KnownValueRequired as err:
                self._fixed = _widen(self.model, self._fixed, err)
                continue
            self._sessions[key] = Session(graph, "cpu")
            return self._sessions[key]


class KnoptBackend(Backend):
    """The ONNX backend interface over knopt's importer and CPU executor. Device "CPU" only."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KnoptBackendRep:
        """Import `model` and prepare it to run on `device`.

        Raises:
            UnsupportedModelError: If the model uses an op, attribute or type knopt lacks.
            InvalidGraphError: If the model's graph is malformed.
            KnoptError: If the device is not "CPU".
        """
        if not cls.supports_device(device):
            raise KnoptError(f"device '{device}' is not available to knopt's backend (use 'CPU')")
        try:
            session = Session(import_model(model), "cpu")
        except KnownValueRequired as err:
            return KnoptBackendRep(model, _widen(model, frozenset(), err), None)
        return KnoptBackendRep(model, frozenset(), session)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        """Prepare `model` and run it once on `inputs`."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for "CPU", the only device this backend runs on."""
        try:
            return Device(device).type == DeviceType.CPU
        except AttributeError:
            return False


def _runtime_input_names(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def _fingerprint(array: np.ndarray) -> tuple[object, ...]:
    return (array.dtype.str, array.shape, np.ascontiguousarray(array).tobytes())


def _widen(
    model: onnx.ModelProto, fixed: frozenset[str], err: KnownValueRequired
) -> frozenset[str]:
    """`fixed` plus the graph inputs that the value `err` asks for depends on.

    Raises:
        KnownValueRequired: If fixing inputs cannot make that value known (it is computed from
            nothing that is a graph input, or its inputs are fixed already).
    """
    inputs = set(_runtime_input_names(model))
    wanted = {name for name in _ancestors(model.graph, err.value_name) if name in inputs}
    if not wanted:  # a name local to a function or subgraph: fix every input
        wanted = inputs
    if wanted <= fixed:
        raise err
    return fixed | wanted


def _ancestors(graph: onnx.GraphProto, name: str) -> Iterator[str]:
    """The names of every value that `name` is computed from, itself included."""
    producers = {out: node for node in graph.node for out in node.output if out}
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen or not current:
            continue
        seen.add(current)
        yield current
        node = producers.get(current)
        if node is not None:
            stack.extend(node.input)
            stack.extend(_outer_names(node))


def _outer_names(node: onnx.NodeProto) -> Iterator[str]:
    """Names that the subgraphs of `node` read from the enclosing graph (an iterative walk)."""
    # Each pending node carries the names its enclosing subgraphs define before it.
    stack: list[tuple[onnx.NodeProto, frozenset[str]]] = [(node, frozenset())]
    while stack:
        current, outer_local = stack.pop()
        for attr in current.attribute:
            for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                local = set(outer_local)
                local.update(i.name for i in graph.input)
                local.update(t.name for t in graph.initializer)
                for inner in graph.node:
                    local.update(inner.output)
                    yield from (n for n in inner.input if n and n not in local)
                    if any(a.HasField("g") or a.graphs for a in inner.attribute):
                        stack.append((inner, frozenset(local)))
