"""Per-op laws written once: the `fold-`, `varies-`, `runtime-` and `leaf-` rules, at load time.

Some laws hold for every IR op alike: an op whose tensor arguments all fold, folds; an op that
reads a varying tensor varies; an op that reads a tensor computed at run time is computed at
run time; an op that is not elementwise is read by loading it. Writing such a law once per
constructor makes copies that drift, so each law here is a template, instantiated
for every IR constructor of `schema.egg` in its op group, in schema order. A shipped rule file
asks for a law's rules with a marker line, `;; @generate fold`, which `expand_laws` replaces
with them; `knopt check-rules --show-generated` prints what was generated.

Generated rules keep the names the hand-written copies had (`fold-view`, `varies-where-then`),
so reports and `--explain` name them as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from egglog import bindings as eb

from knopt.errors import RuleFileError
from knopt.ir.op import OP_CLASSES

# Constructors of IR ops: one per op class, plus `Splat` (a constant whose elements are equal).
IR_CONSTRUCTORS = frozenset({cls.__name__ for cls in OP_CLASSES} | {"Splat"})
# Leaves that are constants: they fold (fold.egg), so the `leaf-constant` rule covers them.
CONSTANT_LEAVES = frozenset({"Constant", "Splat"})
# Ops that fusion.egg inlines into a scalar body instead of loading them.
ELEMENTWISE = frozenset({"UnaryOp", "BinaryOp", "Clamp", "Cast", "Where"})
# Ops whose folded value must be small (at most 2^20 elements), not only static: they can make
# more elements than they read (Broadcast, Pad, Gather, the products, Pool, Attention), or they
# cost more than a pass over their data on the CPU while compiling (Scatter and the same
# contractions and windows). The others make at most as many elements as they read, once each.
GROWING = frozenset(
    {
        "Broadcast",
        "Pad",
        "Gather",
        "Scatter",
        "MatMul",
        "Conv",
        "Pool",
        "Attention",
        "IntMatMul",
        "IntConv",
        "Int4MatMul",
    }
)
# Names of the tensor arguments of ops with more than one; `varies-<op>-<role>` rules use them.
ROLES: dict[str, tuple[str, ...]] = {
    "Gather": ("data", "indices"),
    "Scatter": ("data", "indices", "updates"),
    "BinaryOp": ("left", "right"),
    "Where": ("condition", "then", "else"),
    "MatMul": ("left", "right"),
    "Conv": ("input", "weight"),
    "Attention": ("q", "k", "v", "bias"),
    "Rope": ("x", "cos", "sin"),
    "IntMatMul": ("left", "right", "left-zero", "right-zero"),
    "IntConv": ("input", "weight", "input-zero", "weight-zero"),
    "Int4MatMul": ("a", "packed", "scales", "zeros"),
}
# Rule-name stems that are not the constructor in kebab case (kept as the rules were named
# before they were generated).
_STEMS = {"CumSum": "cumsum", "MatMul": "matmul"}
_MARKER = re.compile(r"^;; @generate ([\w-]+)[^\n]*$", re.MULTILINE)


@dataclass(frozen=True)
class Constructor:
    """One IR constructor of schema.egg: its name and the sorts of its arguments."""

    name: str
    sorts: tuple[str, ...]

    @property
    def tensors(self) -> list[int]:
        """Positions of the tensor arguments (sort `T`)."""
        return [i for i, sort in enumerate(self.sorts) if sort == "T"]

    @property
    def stem(self) -> str:
        """The op's part of a rule name: `ArgReduce` -> `arg-reduce`, `UnaryOp` -> `unary`."""
        if self.name in _STEMS:
            return _STEMS[self.name]
        return re.sub(r"(?<!^)(?=[A-Z])", "-", self.name.removesuffix("Op")).lower()

    def roles(self) -> tuple[str, ...]:
        """The variable names of the tensor arguments, in order.

        Raises:
            RuleFileError: If an op with several tensor arguments has no names in `ROLES`.
        """
        count = len(self.tensors)
        names = ROLES.get(self.name, ("x",) if count == 1 else ())
        if len(names) != count:
            raise RuleFileError(
                f"schema.egg: {self.name} has {count} tensor arguments; name them in "
                "knopt/opt/laws.py ROLES so its generated rules can be named"
            )
        return names

    def term(self) -> str:
        """The constructor applied to variables: tensors by role, the others `a<position>`."""
        roles = iter(self.roles())
        args = [next(roles) if sort == "T" else f"a{i}" for i, sort in enumerate(self.sorts)]
        return f"({' '.join([self.name, *args])})"


def read_constructors(schema: str) -> list[Constructor]:
    """The IR constructors `schema` declares, in its order.

    Raises:
        RuleFileError: If the schema does not parse.
    """
    try:
        commands = eb.EGraph().parse_program(schema, filename="schema.egg")
    except eb.EggSmolError as err:
        raise RuleFileError(f"schema.egg: {err}") from err
    found = []
    for command in commands:
        if not isinstance(command, eb.Datatypes):
            continue
        for _, _, variants in command.datatypes:
            for variant in getattr(variants, "variants", ()):
                if variant.name in IR_CONSTRUCTORS:
                    found.append(Constructor(variant.name, tuple(variant.types)))
    return found


def _rule(query: Sequence[str], action: str, ruleset: str, name: str) -> str:
    return f'(rule ({" ".join(query)})\n      ({action}) :ruleset {ruleset} :name "{name}")'


def _folds(op: Constructor) -> list[str]:
    guard = "(small e)" if op.name in GROWING else "(static e)"
    query = [f"(= e {op.term()})", *(f"(folds {x})" for x in op.roles()), guard]
    return [_rule(query, "(folds e)", "fold", f"fold-{op.stem}")]


def _varies(op: Constructor) -> list[str]:
    roles = op.roles()
    return [
        _rule(
            [f"(= e {op.term()})", f"(varies {x})"],
            "(varies e)",
            "fold",
            f"varies-{op.stem}" + (f"-{x}" if len(roles) > 1 else ""),
        )
        for x in roles
    ]


def _runtime(op: Constructor) -> list[str]:
    roles = op.roles()
    return [
        _rule(
            [f"(= e {op.term()})", f"(runtime {x})"],
            "(runtime e)",
            "fold",
            f"runtime-{op.stem}" + (f"-{x}" if len(roles) > 1 else ""),
        )
        for x in roles
    ]


def _leaf(op: Constructor) -> list[str]:
    return [_rule([f"(= e {op.term()})"], "(leaf e)", "fusion-facts", f"leaf-{op.stem}")]


def _computes(op: Constructor) -> bool:
    """Ops that compute from tensor arguments; a vector of them is written by hand.

    (Concat's parts: fold.egg and fusion.egg. An opaque op's inputs: it never folds, and it
    varies whatever it reads, fold.egg.)
    """
    return bool(op.tensors) and "TVec" not in op.sorts


@dataclass(frozen=True)
class Law:
    """A law for every op of a group: which ops (`applies`) and the rules for one (`rules`)."""

    name: str
    statement: str
    applies: Callable[[Constructor], bool]
    rules: Callable[[Constructor], list[str]]


LAWS: dict[str, Law] = {
    law.name: law
    for law in (
        Law(
            "fold",
            "an op whose tensor arguments all fold, folds, if its result is static (small, for "
            "ops in GROWING)",
            _computes,
            _folds,
        ),
        Law("varies", "an op that reads a varying tensor varies", _computes, _varies),
        Law(
            "runtime",
            "an op that reads a tensor computed at run time is computed at run time",
            _computes,
            _runtime,
        ),
        Law(
            "leaf",
            "an op that is not elementwise (nor a constant, which folds) is read by loading it",
            lambda op: op.name not in ELEMENTWISE | CONSTANT_LEAVES,
            _leaf,
        ),
    )
}


def generate(law: Law, constructors: Sequence[Constructor]) -> str:
    """The rules of one law for every constructor it applies to, as rule-file text."""
    header = f";; generated by knopt/opt/laws.py, law `{law.name}`: {law.statement}."
    rules = [rule for op in constructors if law.applies(op) for rule in law.rules(op)]
    return "\n".join([header, *rules])


def expand_laws(text: str, constructors: Sequence[Constructor], file: str) -> str:
    """`text` with each `;; @generate LAW` line replaced by that law's rules.

    Raises:
        RuleFileError: If a marker names no law.
    """

    def replace(match: re.Match[str]) -> str:
        law = LAWS.get(match[1])
        if law is None:
            raise RuleFileError(
                f"{file}: `@generate {match[1]}` names no law (known: {', '.join(LAWS)})"
            )
        return generate(law, constructors)

    return _MARKER.sub(replace, text)


def generated_sections(text: str, constructors: Sequence[Constructor]) -> list[str]:
    """The generated text of each marker in `text`, in order (for showing rule authors)."""
    return [generate(LAWS[m[1]], constructors) for m in _MARKER.finditer(text) if m[1] in LAWS]
