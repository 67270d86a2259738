"""Why a node reads a name that nothing defined before it: a dangling input, or a bad order.

ONNX requires nodes in topological order. When a node reads a name that is not defined yet,
the error says which case it is, since the fixes differ: declare the missing value, sort the
nodes, or break the cycle.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import onnx

from knopt.errors import InvalidGraphError


def undefined_input_error(
    where: str, name: str, nodes: Sequence[onnx.NodeProto], defined: Collection[str]
) -> InvalidGraphError:
    """The error for the node at `where` reading `name`, which no earlier node defines.

    Args:
        where: The reading node, as error messages name it.
        name: The value it reads.
        nodes: All nodes of the graph being imported.
        defined: The names defined before the nodes run (inputs and initializers).
    """
    producers = {out: node for node in nodes for out in node.output if out}
    if name not in producers:
        return InvalidGraphError(
            f"{where}: reads '{name}', which no node, graph input or initializer defines "
            "(a dangling input); declare it as a graph input or an initializer"
        )
    cycle = _cycle(nodes, producers, set(defined))
    if cycle:
        path = " -> ".join(f"'{_label(n, nodes)}'" for n in cycle)
        return InvalidGraphError(
            f"{where}: reads '{name}' in a cycle of nodes {path}; ONNX graphs must be acyclic, "
            "so the model is broken: export it again"
        )
    producer = _label(producers[name], nodes)
    return InvalidGraphError(
        f"{where}: reads '{name}', which node '{producer}' computes later; ONNX needs nodes "
        "in topological order: sort them (or export the model again)"
    )


def _cycle(
    nodes: Sequence[onnx.NodeProto],
    producers: dict[str, onnx.NodeProto],
    defined: set[str],
) -> list[onnx.NodeProto]:
    """Some cycle among the nodes (its nodes in order, the first repeated last), or []."""
    # Depth-first search with an explicit stack: models have thousands of nodes in a row.
    finished: set[int] = set()
    for root in nodes:
        if id(root) in finished:
            continue
        path = [root]
        on_path = {id(root)}
        pending = [iter(_producers_of(root, producers, defined))]
        while pending:
            producer = next(pending[-1], None)
            if producer is None:
                pending.pop()
                finished.add(id(path[-1]))
                on_path.discard(id(path.pop()))
            elif id(producer) in on_path:
                start = next(i for i, n in enumerate(path) if n is producer)
                return [*path[start:], producer]
            elif id(producer) not in finished:
                path.append(producer)
                on_path.add(id(producer))
                pending.append(iter(_producers_of(producer, producers, defined)))
    return []


def _producers_of(
    node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], defined: set[str]
) -> list[onnx.NodeProto]:
    return [producers[n] for n in node.input if n and n not in defined and n in producers]


def _label(node: onnx.NodeProto, nodes: Sequence[onnx.NodeProto]) -> str:
    if node.name:
        return node.name
    return f"#{next(i for i, n in enumerate(nodes) if n is node)}"
