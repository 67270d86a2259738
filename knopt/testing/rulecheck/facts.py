"""Facts of a serialized e-graph: the rows of its functions and relations, as Python values.

`knopt.opt.serialized` keeps what extraction needs (tensor classes, shapes, dtypes, one-class
relations); the rule checker also needs the other rows (`numel-from`, `full`, `gelu-core`...)
to compare each one a rule derived with what it claims.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

from knopt.opt.serialized import Ref, SRef

Fact = tuple[str, tuple[Any, ...], Any]  # name, arguments, value (None for relations)
_PRIMITIVES: dict[str, Callable[[str], Any]] = {
    "i64": int,
    "f64": float,
    "bool": lambda text: text == "true",
}


def read_facts(text: str, names: Collection[str]) -> set[Fact]:
    """The rows of the functions and relations in `names`, with tensor classes as `Ref`s."""
    raw = json.loads(text)
    nodes: dict[str, dict[str, Any]] = raw["nodes"]
    sorts = {name: data["type"] for name, data in raw["class_data"].items()}
    spelling: dict[str, str] = {}
    for node_id, node in nodes.items():
        if node_id.startswith("primitive-") or not node["children"]:
            spelling.setdefault(node["eclass"], node_id)
    cache: dict[str, Any] = {}

    def value_of(eclass: str) -> Any:
        if eclass not in cache:
            cache[eclass] = _value(eclass)
        return cache[eclass]

    def _value(eclass: str) -> Any:
        sort = sorts[eclass]
        if sort in ("T", "S"):
            index = int(eclass.rsplit("-", 1)[1])
            return Ref(index) if sort == "T" else SRef(index)
        if eclass not in spelling:
            return None
        node = nodes[spelling[eclass]]
        if sort in _PRIMITIVES:
            return _PRIMITIVES[sort](node["op"])
        if sort == "String":
            return node["op"][1:-1]
        if node["op"] == "vec-of":
            return tuple(value_of(nodes[c]["eclass"]) for c in node["children"])
        if node["op"] == "vec-empty":
            return ()
        return node["op"]

    found: set[Fact] = set()
    for node in nodes.values():
        if node["op"] not in names:
            continue
        args = tuple(value_of(nodes[c]["eclass"]) for c in node["children"])
        result = None if sorts[node["eclass"]].startswith("@") else value_of(node["eclass"])
        found.add((node["op"], args, result))
    return found
