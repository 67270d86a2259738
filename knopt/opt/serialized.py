"""The saturated e-graph as Python data, read from `serialize().to_json()`.

Only tensor classes (sort `T`) are kept as classes; attribute children are decoded into Python
values, so an `ENode` reads like the term it is: `ENode("Clamp", (Ref(3), 0.0, 6.0))`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to a tensor e-class by its id."""

    id: int


@dataclass(frozen=True, slots=True)
class SRef:
    """A reference to a scalar-body e-class (sort `S`) by its id."""

    id: int


@dataclass(frozen=True, slots=True)
class ENode:
    """One e-node of a tensor class: a constructor applied to decoded arguments."""

    op: str
    args: tuple[Any, ...]

    def children(self) -> list[int]:
        """The ids of the tensor classes this node reads, in argument order (with repeats)."""
        found: list[int] = []
        for arg in self.args:
            if isinstance(arg, Ref):
                found.append(arg.id)
            elif isinstance(arg, tuple):
                found.extend(a.id for a in arg if isinstance(a, Ref))
        return found


Children = Callable[[ENode], list[int]]  # the classes a node reads


@dataclass
class EGraphData:
    """Tensor classes with their nodes and analysis facts.

    Attributes:
        classes: Class id to its e-nodes (subsumed and unextractable ones left out).
        shapes: Class id to its shape, as i64 codes (negative codes are symbolic sizes).
        dtypes: Class id to its dtype's constructor name.
        folds: Classes whose value can be computed while compiling.
        handles: IR node index (from `(V i)`) to class id.
    """

    classes: dict[int, list[ENode]] = field(default_factory=dict)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[int, str] = field(default_factory=dict)
    folds: set[int] = field(default_factory=set)
    handles: dict[int, int] = field(default_factory=dict)
    relations: dict[str, set[int]] = field(default_factory=dict)
    scalars: dict[int, list[ENode]] = field(default_factory=dict)
    _loads: dict[int, frozenset[int]] = field(default_factory=dict)

    def node_count(self) -> int:
        """How many tensor e-nodes there are."""
        return sum(len(nodes) for nodes in self.classes.values())

    def body(self, sid: int) -> ENode:
        """The node that spells scalar class `sid`: a constant if it is one, else the first."""
        nodes = self.scalars[sid]
        for node in nodes:
            if node.op == "SConst":
                return node
        return nodes[0]

    def loads(self, sid: int) -> frozenset[int]:
        """The tensor classes a scalar body reads."""
        if sid not in self._loads:
            found: set[int] = set()
            stack = [sid]
            seen: set[int] = set()
            while stack:
                current = stack.pop()
                if current in seen:
                    continue
                seen.add(current)
                node = self.body(current)
                for arg in node.args:
                    if isinstance(arg, Ref):
                        found.add(arg.id)
                    elif isinstance(arg, SRef):
                        stack.append(arg.id)
            self._loads[sid] = frozenset(found)
        return self._loads[sid]

    def children(self, node: ENode) -> list[int]:
        """The tensor classes a node needs: its tensor arguments and what its bodies load."""
        found = node.children()
        for arg in node.args:
            if isinstance(arg, SRef):
                found.extend(sorted(self.loads(arg.id)))
        return found


_PRIMITIVES: dict[str, Callable[[str], Any]] = {
    "i64": int,
    "f64": float,
    "bool": lambda text: text == "true",
}


def parse_egraph(text: str, tensor_sort: str = "T", scalar_sort: str = "S") -> EGraphData:
    """Decode egglog's serialized JSON."""
    raw = json.loads(text)
    nodes: dict[str, dict[str, Any]] = raw["nodes"]
    sorts = {name: data["type"] for name, data in raw["class_data"].items()}
    # The node that spells each non-tensor class's value: a primitive, a vec-of, or an enum
    # constructor (analysis rows such as `(shape x)` live in those classes too).
    spelling: dict[str, str] = {}
    for node_id, node in nodes.items():
        if sorts[node["eclass"]] not in (tensor_sort, scalar_sort) and _spells_value(
            node_id, node, nodes, sorts
        ):
            spelling.setdefault(node["eclass"], node_id)
    cache: dict[str, Any] = {}

    def value_of(eclass: str) -> Any:
        if eclass in cache:
            return cache[eclass]
        sort = sorts[eclass]
        if sort == tensor_sort:
            value: Any = Ref(int(eclass.rsplit("-", 1)[1]))
        elif sort == scalar_sort:
            value = SRef(int(eclass.rsplit("-", 1)[1]))
        else:
            node = nodes[spelling[eclass]]
            if sort in _PRIMITIVES:
                value = _PRIMITIVES[sort](node["op"])
            elif sort == "String":
                value = _unquote(node["op"])
            elif node["op"] == "vec-of":
                value = tuple(value_of(nodes[c]["eclass"]) for c in node["children"])
            else:
                value = node["op"]
        cache[eclass] = value
        return value

    data = EGraphData()
    classes: dict[int, list[ENode]] = defaultdict(list)
    scalars: dict[int, list[ENode]] = defaultdict(list)
    relations: dict[str, set[int]] = defaultdict(set)
    for node in nodes.values():
        sort = sorts[node["eclass"]]
        op = node["op"]
        args = [value_of(nodes[c]["eclass"]) for c in node["children"]]
        if sort == tensor_sort:
            cid = value_of(node["eclass"]).id
            if op == "V":
                data.handles[args[0]] = cid
            elif not node.get("subsumed", False):
                classes[cid].append(ENode(op, tuple(args)))
        elif sort == scalar_sort:
            scalars[value_of(node["eclass"]).id].append(ENode(op, tuple(args)))
        elif len(args) == 1 and isinstance(args[0], Ref):
            if op == "shape":
                data.shapes[args[0].id] = value_of(node["eclass"])
            elif op == "dtype":
                data.dtypes[args[0].id] = value_of(node["eclass"])
            elif sort.startswith("@"):
                relations[op].add(args[0].id)
    data.classes = dict(classes)
    data.scalars = dict(scalars)
    data.relations = dict(relations)
    data.folds = data.relations.get("folds", set())
    return data


def _spells_value(
    node_id: str, node: dict[str, Any], nodes: dict[str, Any], sorts: dict[str, str]
) -> bool:
    if node_id.startswith("primitive-"):
        return True
    # An enum member: a constructor with no arguments.
    return not node["children"]


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body.replace('\\"', '"').replace("\\\\", "\\")


def _key(value: Any) -> Any:
    if isinstance(value, float):
        # NaN-safe and exact; egglog's f64 hash-conses -0.0 with 0.0, so the key does too.
        return ("f64", (value + 0.0).hex())
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    return value


def node_key(node: ENode) -> tuple[Any, ...]:
    """A hashable key equal for e-nodes that egglog would hash-cons together."""
    return (node.op, _key(node.args))


def locate_terms(terms: list[Any], data: EGraphData) -> list[tuple[int, ENode]]:
    """The class and e-node of each term (`knopt.opt.terms.Term`), found by structure.

    Terms inlined into their readers have no handle; egglog hash-consed them, so each is the
    e-node with the same constructor and arguments.
    """
    index = {node_key(n): cls for cls, nodes in data.classes.items() for n in nodes}
    located: dict[Any, int] = {}  # term (compared by identity) -> class

    def value(term: Any) -> Any:
        if not hasattr(term, "name"):  # a literal
            return term.value
        if term.name == "V":
            return Ref(data.handles[term.args[0].value])
        if term.name in ("vec-of", "vec-empty"):
            return tuple(value(a) for a in term.args)
        if not term.args:
            return term.name
        return Ref(locate(term))

    def locate(term: Any) -> int:
        if term not in located:
            located[term] = index[node_key(enode(term))]
        return located[term]

    def enode(term: Any) -> ENode:
        return ENode(term.name, tuple(value(a) for a in term.args))

    found = []
    for term in terms:
        node = enode(term)
        found.append((index[node_key(node)], node))
        located[term] = found[-1][0]
    return found
