"""Size-generic kernels: one compiled kernel for every size a launch is planned at.

Generators write a concrete source per size (planning is cheap). Size lifting turns such a
source into a template: its integer and float literals are found by a small C tokenizer, and
the ones that take other values at other sizes become kernel parameters, passed at launch.

- The *structure* of a source is its text with every literal masked, plus each literal's C
  type class (an int that fits in 32 bits, long long, float, double): sources of one kernel at
  different sizes share a structure unless the generator chose differently (a vector width,
  a merged axis, a wider index type).
- A family (one structure) remembers a reference instance and the positions where instances
  seen since differ from it: those are *varying*. A template lifts the varying positions and
  pins the others to the values it was made for; an instance whose pinned values match uses
  it, any other gets another template (compiled lazily, then cached). So a template is used
  only for the sources it reproduces exactly: substituting an instance's values for the
  template's parameters gives back its source text (`Template.instance_source`), which
  tests check.
- Literals in places that need compile-time constants are never lifted: preprocessor lines,
  template argument lists (`kn::Vec<float, 4>`), `__launch_bounds__`, `__cluster_dims__`,
  `constexpr` initializers, `case` labels and anything written alone between brackets (array
  sizes).
  These lexical rules hold for knopt's own generated code, which writes comparisons with
  spaces around `<` and templates without. Numbers inside comments and strings are text.

`KernelLibrary` holds the families and templates of one program; the executor compiles the
templates it hands out and launches them with `Template.arguments`.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from knopt.cuda.gen.indexing import PLACEHOLDER
from knopt.cuda.steps import Launch
from knopt.errors import CodegenError

PARAMETER = "kn_p"  # lifted literal j becomes parameter kn_p<j>
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class LiteralClass(enum.Enum):
    """The C type of a numeric literal, which its parameter takes when lifted."""

    INT = "int"
    LONG = "long long"
    FLOAT = "float"
    DOUBLE = "double"
    OTHER = "other"  # hex, octal, unsigned, ...: never lifted


NUMPY_TYPES: dict[LiteralClass, type[np.generic]] = {
    LiteralClass.INT: np.int32,
    LiteralClass.LONG: np.int64,
    LiteralClass.FLOAT: np.float32,
    LiteralClass.DOUBLE: np.float64,
}

_NUMBER_CORE = (
    r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fFlL]?|\d+[eE][+-]?\d+[fFlL]?"
    r"|0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*"
)
# Numbers anywhere (comments and strings too), found at C speed; `_TOKEN` says which are
# literals of the code, once per structure.
_NUMBER = re.compile(rf"(?=[\d.])(?<![\w.])(?:{_NUMBER_CORE})(?![\w.])")
_TOKEN = re.compile(
    rf"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
    |(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
    |(?P<directive>^[ \t]*\#(?:\\\n|[^\n])*)
    |(?P<number>{_NUMBER_CORE})
    |(?P<name>[A-Za-z_]\w*)
    |(?P<space>\s+)
    |(?P<punct>.)
    """,
    re.VERBOSE | re.MULTILINE | re.DOTALL,
)
_FLOAT = re.compile(r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?|\d+[eE][+-]?\d+[fF]?")
_PINNING_CALLS = frozenset(
    {"__launch_bounds__", "__cluster_dims__", "static_assert", "alignas", "__align__"}
)
_CODES = {kind: chr(ord("a") + i) for i, kind in enumerate(LiteralClass)}


def literal_class(text: str) -> LiteralClass:
    """The C type class of a numeric literal as written."""
    if text.isdigit():
        if text != "0" and text[0] == "0":
            return LiteralClass.OTHER  # octal
        return LiteralClass.INT if len(text) < 10 or int(text) <= INT32_MAX else LiteralClass.LONG
    if _FLOAT.fullmatch(text):
        return LiteralClass.FLOAT if text[-1] in "fF" else LiteralClass.DOUBLE
    digits = text[:-2]
    if text[-2:] in ("LL", "ll") and digits.isdigit() and digits[0] != "0":
        return LiteralClass.LONG if int(digits) <= INT64_MAX else LiteralClass.OTHER
    return LiteralClass.OTHER


@dataclass(frozen=True)
class Literal:
    """A numeric literal of a source: its text, C type class and whether it may be lifted."""

    text: str
    kind: LiteralClass
    liftable: bool


@dataclass(frozen=True)
class Tokenized:
    """A source split at its numbers: `pieces[0]`, number 0, `pieces[1]`, number 1, ...

    Numbers inside comments, strings and preprocessor lines count too, as literals that are
    never lifted.

    Attributes:
        structure: The source with each number masked, and each one's class: equal for
            sources that differ only in literal values.
    """

    pieces: tuple[str, ...]
    literals: tuple[Literal, ...]
    structure: str

    @property
    def values(self) -> tuple[str, ...]:
        """The literals' texts."""
        return tuple(lit.text for lit in self.literals)

    def render(self, texts: Sequence[str]) -> str:
        """The source with number i written as `texts[i]`."""
        parts = [self.pieces[0]]
        for text, piece in zip(texts, self.pieces[1:], strict=True):
            parts += [text, piece]
        return "".join(parts)


_PINNED_BY_SKELETON: dict[str, tuple[bool, ...]] = {}


def tokenize(source: str) -> Tokenized:
    """Split a kernel source at its numbers and mark the ones that may be lifted.

    The C scan that decides what may be lifted runs once per skeleton (the source with its
    numbers masked): sizes seen later cost two regular-expression passes.
    """
    spans = [m.span() for m in _NUMBER.finditer(source)]
    texts = [source[a:b] for a, b in spans]
    ends = [0] + [b for _, b in spans]
    starts = [a for a, _ in spans] + [len(source)]
    pieces = [source[a:b] for a, b in zip(ends, starts, strict=True)]
    skeleton = "\0".join(pieces)
    pinned = _PINNED_BY_SKELETON.get(skeleton)
    if pinned is None:
        pinned = _PINNED_BY_SKELETON[skeleton] = _pinned(source)
        if len(_PINNED_BY_SKELETON) > 65536:  # a bound far above any program's kernels
            _PINNED_BY_SKELETON.pop(next(iter(_PINNED_BY_SKELETON)))
    kinds = [literal_class(t) for t in texts]
    literals = tuple(
        Literal(t, k, not p and k is not LiteralClass.OTHER)
        for t, k, p in zip(texts, kinds, pinned, strict=True)
    )
    structure = skeleton + "\0" + "".join(_CODES[k] for k in kinds)
    return Tokenized(tuple(pieces), literals, structure)


def _pinned(source: str) -> tuple[bool, ...]:
    """For each number `_NUMBER` finds in `source`: True unless it is a liftable literal."""
    literal_at: dict[int, bool] = {}
    angle = 0  # depth of template argument lists
    paren = 0  # depth inside a pinning call's parentheses
    constexpr = False  # inside a constexpr declaration (up to its ';')
    previous = ""  # the previous significant token
    tokens = [(m.lastgroup, m.group(), m.start()) for m in _TOKEN.finditer(source)]
    for index, (kind, text, start) in enumerate(tokens):
        if kind == "number":
            bracketed = previous == "[" and _next_significant(tokens, index) == "]"
            literal_at[start] = bool(angle or paren or constexpr or previous == "case" or bracketed)
        if kind in ("space", "comment", "string", "directive"):
            continue
        if text == "<" and (tokens[index - 1][0] == "name" or previous == "template"):
            angle += 1
        elif text == ">" and angle:
            angle -= 1
        elif text == "(" and (paren or previous in _PINNING_CALLS):
            paren += 1
        elif text == ")" and paren:
            paren -= 1
        elif text == "constexpr":
            constexpr = True
        elif text == ";":
            constexpr = False
        previous = text
    return tuple(literal_at.get(m.start(), True) for m in _NUMBER.finditer(source))


def _next_significant(tokens: list[tuple[str | None, str, int]], index: int) -> str:
    for kind, text, _ in tokens[index + 1 :]:
        if kind not in ("space", "comment"):
            return text
    return ""


@dataclass
class Template:
    """A size-generic kernel: a family's structure with some literals lifted to parameters.

    Attributes:
        name: The kernel's name (a hash of its source).
        source: The compilable source, defining `extern "C"` kernel `name`.
        lifted: The literal positions passed as parameters, in parameter order.
        pinned: The text every other liftable-or-not literal must have.
    """

    name: str
    source: str
    lifted: tuple[int, ...]
    pinned: dict[int, str]
    kinds: tuple[LiteralClass, ...]
    tokenized: Tokenized = field(repr=False)

    def matches(self, instance: Tokenized) -> bool:
        """True when `instance` has this template's structure and pinned values."""
        return instance.structure == self.tokenized.structure and all(
            instance.literals[i].text == text for i, text in self.pinned.items()
        )

    def arguments(self, instance: Tokenized) -> tuple[np.generic, ...]:
        """The parameter values that make this template compute `instance`."""
        values = []
        for position in self.lifted:
            literal = instance.literals[position]
            number = literal.text.rstrip("fFlL")
            kind = NUMPY_TYPES[literal.kind]
            values.append(kind(float(number) if kind in (np.float32, np.float64) else int(number)))
        return tuple(values)

    def instance_source(self, instance: Tokenized) -> str:
        """The source this template stands for at `instance`'s values (its text exactly)."""
        texts = [
            instance.literals[i].text if i in set(self.lifted) else self.pinned[i]
            for i in range(len(self.tokenized.literals))
        ]
        return self.tokenized.render(texts)


def make_template(instance: Tokenized, lifted: Sequence[int]) -> Template:
    """The template of `instance`'s structure that lifts `lifted` and pins the rest.

    Raises:
        CodegenError: If the source does not define the placeholder kernel, or a position
            may not be lifted.
    """
    lifted = tuple(sorted(lifted))
    for position in lifted:
        if not instance.literals[position].liftable:
            raise CodegenError(f"literal {position} of a kernel source cannot be lifted")
    names = {p: f"{PARAMETER}{j}" for j, p in enumerate(lifted)}
    texts = [names.get(i, lit.text) for i, lit in enumerate(instance.literals)]
    body = instance.render(texts)
    parameters = ", ".join(f"const {instance.literals[p].kind.value} {names[p]}" for p in lifted)
    source = _add_parameters(body, parameters)
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    name = f"kn_g_{digest}"
    pinned = {i: lit.text for i, lit in enumerate(instance.literals) if i not in names}
    kinds = tuple(lit.kind for lit in instance.literals)
    return Template(name, source.replace(PLACEHOLDER, name), lifted, pinned, kinds, instance)


def _add_parameters(source: str, parameters: str) -> str:
    """`source` with `parameters` appended to the placeholder kernel's parameter list."""
    start = source.find(PLACEHOLDER + "(")
    if start < 0:
        raise CodegenError("a kernel source does not define its kernel by the placeholder name")
    depth, index = 0, start + len(PLACEHOLDER)
    for index in range(start + len(PLACEHOLDER), len(source)):
        depth += {"(": 1, ")": -1}.get(source[index], 0)
        if depth == 0:
            break
    if not parameters:
        return source
    inside = source[start + len(PLACEHOLDER) + 1 : index].strip()
    joined = f", {parameters}" if inside else parameters
    return source[:index] + joined + source[index:]


@dataclass
class Family:
    """The instances of one structure: a reference, the positions seen to vary, templates."""

    reference: Tokenized
    varying: set[int] = field(default_factory=set)
    templates: list[Template] = field(default_factory=list)

    def observe(self, instance: Tokenized) -> None:
        """Mark the liftable positions where `instance` differs from the reference."""
        for i, (ours, theirs) in enumerate(
            zip(self.reference.literals, instance.literals, strict=True)
        ):
            if ours.text != theirs.text and ours.liftable:
                self.varying.add(i)


def generic_source(launch: Launch) -> str:
    """A launch's source with its kernel named by the placeholder again (names hash sizes)."""
    return launch.source.replace(launch.name, PLACEHOLDER)


class KernelLibrary:
    """The size-generic kernels of one program: families by structure, and their templates.

    Args:
        lift: False makes every literal a constant (a kernel per size, as without lifting):
            the baseline the benchmarks compare size-generic kernels with.

    Attributes:
        made: Templates made so far, in order (the executor compiles the new ones).
    """

    def __init__(self, lift: bool = True) -> None:
        self.lift = lift
        self.families: dict[str, Family] = {}
        self.made: list[Template] = []
        self._tokenized: dict[str, Tokenized] = {}
        # By launch source: the template that runs it, its instance and its arguments.
        self._chosen: dict[str, tuple[Template, Tokenized, tuple[np.generic, ...]]] = {}

    def tokenized(self, launch: Launch) -> Tokenized:
        """A launch's tokenized generic source (kept: sizes seen again cost nothing)."""
        source = generic_source(launch)
        found = self._tokenized.get(source)
        if found is None:
            found = self._tokenized[source] = tokenize(source)
            if len(self._tokenized) > 4096:  # a bound, well above a plan's launches
                self._tokenized.pop(next(iter(self._tokenized)))
        return found

    def observe(self, launch: Launch) -> Tokenized:
        """Record a launch's instance in its family (before any template is asked for)."""
        instance = self.tokenized(launch)
        family = self.families.get(instance.structure)
        if family is None:
            self.families[instance.structure] = Family(instance)
        else:
            family.observe(instance)
        return instance

    def is_known(self, launch: Launch) -> bool:
        """Whether a launch of this structure was observed (or run) before."""
        return launch.source in self._chosen or self.tokenized(launch).structure in self.families

    def template(self, launch: Launch) -> tuple[Template, Tokenized]:
        """The template that runs `launch`, made (and listed in `made`) if none fits."""
        template, instance, _ = self._choose(launch)
        return template, instance

    def arguments(self, launch: Launch) -> tuple[Template, tuple[np.generic, ...]]:
        """The template that runs `launch` and the values of its parameters there."""
        template, _, arguments = self._choose(launch)
        return template, arguments

    def _choose(self, launch: Launch) -> tuple[Template, Tokenized, tuple[np.generic, ...]]:
        """The template of `launch`, its instance and arguments (kept by source).

        The answer for a source never changes once given: observing the source again
        changes no family, and templates are only ever added after those that matched it.
        """
        found = self._chosen.get(launch.source)
        if found is not None:
            return found
        instance = self.observe(launch)
        family = self.families[instance.structure]
        template = next((t for t in family.templates if t.matches(instance)), None)
        if template is None:
            template = make_template(instance, sorted(family.varying) if self.lift else [])
            family.templates.append(template)
            self.made.append(template)
        found = self._chosen[launch.source] = (template, instance, template.arguments(instance))
        if len(self._chosen) > 4096:  # a bound, well above a plan's launches
            self._chosen.pop(next(iter(self._chosen)))
        return found
