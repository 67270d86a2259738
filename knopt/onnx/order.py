"""Nodes in topological order, and why a node reads a name that nothing defined before it.

ONNX requires nodes in topological order, but some writers break it (onnxruntime's float16
converter, hand-edited graphs): `in_topological_order` sorts such nodes, as onnxruntime and
onnxsim accept them. What cannot be sorted is a dangling input or a cycle, and the error says
which, since the fixes differ: declare the missing value, or export the model again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import networkx as nx
import onnx

from knopt.errors import InvalidGraphError


def in_topological_order(
    nodes: Sequence[onnx.NodeProto], defined: Collection[str]
) -> Sequence[onnx.NodeProto]:
    """The nodes, sorted so that each reads only names defined before it.

    Nodes already in order come back as they are (the usual case costs one pass); otherwise
    the sort keeps the model's order wherever the dependencies allow. Nodes with a dangling
    input or in a cycle are left in place, for the importer to report (`undefined_input_error`).

    Args:
        nodes: The nodes of one graph (or subgraph).
        defined: The names defined before the nodes run (inputs, initializers, outer scopes).
    """
    known = set(defined)
    for node in nodes:
        if any(name and name not in known for name in node.input):
            break
        known.update(node.output)
    else:
        return nodes
    dependencies = _dependencies(nodes, defined)
    try:
        order = list(nx.lexicographical_topological_sort(dependencies))
    except nx.NetworkXUnfeasible:  # a cycle
        return nodes
    return [nodes[index] for index in order]


def _dependencies(nodes: Sequence[onnx.NodeProto], defined: Collection[str]) -> nx.DiGraph:
    """Node indices, with an edge from each node to every node that reads one of its outputs."""
    producers = {out: index for index, node in enumerate(nodes) for out in node.output if out}
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(nodes)))
    for index, node in enumerate(nodes):
        for name in node.input:
            if name and name not in defined and name in producers:
                graph.add_edge(producers[name], index)
    return graph


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
    cycle = _cycle(nodes, defined)
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


def _cycle(nodes: Sequence[onnx.NodeProto], defined: Collection[str]) -> list[onnx.NodeProto]:
    """Some cycle among the nodes (its nodes in order, the first repeated last), or []."""
    try:
        edges = nx.find_cycle(_dependencies(nodes, defined))
    except nx.NetworkXNoCycle:
        return []
    return [nodes[source] for source, _ in edges] + [nodes[edges[0][0]]]


def _label(node: onnx.NodeProto, nodes: Sequence[onnx.NodeProto]) -> str:
    if node.name:
        return node.name
    return f"#{next(i for i, n in enumerate(nodes) if n is node)}"
