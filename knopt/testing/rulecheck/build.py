"""Proposing an instance top-down and building it bottom-up.

`Proposer` walks the pattern from its roots: each constructor's sampler proposes its
attributes and the types of its tensor arguments, from the type its result should have.
`Builder` then builds the graph with the `GraphBuilder`, which types every node with
`Op.infer` and rejects what does not fit: operands that are not leaves first, then the leaves
(which take the types of their built neighbours), then the op.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from knopt.errors import InvalidGraphError
from knopt.ir.dtype import DType
from knopt.ir.graph import Graph, Value
from knopt.ir.shape import Dim, sym
from knopt.opt.terms import DECODERS
from knopt.testing.arrays import random_array
from knopt.testing.opaque import kept_constant
from knopt.testing.rulecheck.draft import Draft, size, sizes
from knopt.testing.rulecheck.pattern import LEAVES
from knopt.testing.rulecheck.sampler import DERIVED, SAMPLERS, Hint
from knopt.testing.rulecheck.sexpr import Sym

_SAME_TYPE = frozenset({"BinaryOp", "Where"})  # operands of one shape (and mostly one dtype)
_SAME_SHAPE = frozenset({"BinaryOp", "UnaryOp", "Cast", "Clamp", "Where"})  # operand shapes
# Ops whose result shape is an attribute, and where.
_SHAPED = {"View": 1, "Broadcast": 1, "Input": 1, "Constant": 1, "Splat": 1}
_INDEXED = {"Gather": 2, "Scatter": 3}  # ops with an index operand, and where their axis is
_TRIES = 16  # proposals drawn for an op whose operand is typed already, until one fits


class _Shim:
    """What `DECODERS` needs of a rebuilder: sizes are integers, negative ones symbolic."""

    def size(self, code: int) -> Dim:
        """A size code as a size."""
        return code if code >= 0 else sym(f"n{-code}")

    def shape(self, codes: tuple[int, ...]) -> tuple[Dim, ...]:
        """Size codes as a shape."""
        return tuple(self.size(c) for c in codes)


class Proposer:
    """Proposes attributes and operand types top-down, from the roots' random types."""

    def __init__(self, draft: Draft) -> None:
        self.draft = draft

    def known(self, arg: Any) -> tuple[bool, Any]:
        """Whether an argument has a value yet, and the value."""
        if isinstance(arg, Sym):
            return (arg.name in self.draft.assign), self.draft.assign.get(arg.name)
        return True, arg

    def visit(self, var: str, hint: Hint) -> None:
        """Propose `var`'s attributes and its operands' types from the type it should have."""
        if var in self.draft.hints:
            return
        if var in self.draft.forced.dtypes:  # forced shapes are of leaves: `leaf` applies them
            hint = Hint(hint.shape, DType[self.draft.forced.dtypes[var]], hint.bound)
        self.draft.hints[var] = hint
        call = self.draft.pattern.bindings.get(var)
        if call is None:
            return
        signature = self.draft.book.signatures[call.name]
        derived = DERIVED.get(call.name, frozenset())
        fixed = {}
        for i, (arg, sort) in enumerate(zip(call.args, signature.args, strict=True)):
            if sort not in ("T", "TVec") and i not in derived:
                ok, value = self.known(arg)
                if ok:
                    fixed[i] = value
        attrs, child_hints = SAMPLERS[call.name](self.draft.sampling, hint, fixed)
        for _ in range(_TRIES):  # an operand another root typed already: propose to fit it
            if self.fits(var, child_hints):
                break
            attrs, child_hints = SAMPLERS[call.name](self.draft.sampling, hint, fixed)
        self.settle(var, child_hints)
        self.draft.attrs[var] = attrs
        for i, value in attrs.items():
            arg = call.args[i]
            if isinstance(arg, Sym) and arg.name not in self.draft.assign:
                self.draft.assign[arg.name] = value
        for i, arg in self.draft.tensor_args(var):
            wanted = child_hints.get(i)
            if wanted is None:
                continue
            if isinstance(wanted, list):
                names = (
                    [a.name for a in arg]
                    if isinstance(arg, tuple)
                    else self.draft.parts.setdefault(
                        arg.name, [f"{arg.name}#{k}" for k in range(len(wanted))]
                    )
                )
                if len(names) != len(wanted):
                    raise InvalidGraphError(
                        f"{len(wanted)} parts proposed for a concat of {len(names)} named ones"
                    )
                for name, part in zip(names, wanted, strict=True):
                    self.visit(name, part)
            else:
                self.visit(arg.name, wanted)

    def fits(self, var: str, child_hints: dict[int, Hint | list[Hint]]) -> bool:
        """Whether a proposal agrees with the operands of `var` that are typed already."""
        for i, arg in self.draft.tensor_args(var):
            wanted = child_hints.get(i)
            if isinstance(wanted, Hint) and isinstance(arg, Sym):
                known = self.draft.hints.get(arg.name)
                if known is not None and (known.shape, known.dtype) != (wanted.shape, wanted.dtype):
                    return False
                if known is None and self.clashes(arg.name, wanted.shape):
                    return False
        return True

    def clashes(self, var: str, shape: tuple[int, ...]) -> bool:
        """Whether an untyped `var` of `shape` would clash with an operand typed already.

        Elementwise ops keep the shape, so a nibble mask `(p & 15)` proposed a shape clashes
        with `p` typed by another view of it.
        """
        stack = [var]
        while stack:
            current = stack.pop()
            known = self.draft.hints.get(current)
            if known is not None:
                if known.shape != shape:
                    return True
                continue
            call = self.draft.pattern.bindings.get(current)
            if call is not None and call.name in _SAME_SHAPE:
                stack.extend(self.draft.children(current))
            elif call is not None and call.name == "View":  # a view keeps the element count
                inner = self.implied(self.draft.children(current)[0])
                if inner is not None and math.prod(inner) != math.prod(shape):
                    return True
        return False

    def below(self, var: str) -> set[str]:
        """`var` and every variable its bindings reach."""
        found: set[str] = set()
        stack = [var]
        while stack:
            current = stack.pop()
            if current not in found:
                found.add(current)
                stack.extend(self.draft.children(current))
        return found

    def implied(self, var: str, seen: frozenset[str] = frozenset()) -> tuple[int, ...] | None:
        """The shape `var` must have by what is fixed below it, if that says.

        A view's or a leaf's shape attribute fixed already (by a repair), a leaf's forced
        shape, an elementwise op's operand's, a concat of such parts along a fixed axis.
        """
        if var in seen:
            return None
        seen = seen | {var}
        hint = self.draft.hints.get(var)
        if hint is not None:
            return hint.shape
        if var in self.draft.forced.shapes:
            forced = self.draft.forced.shapes[var]
            sizes = tuple(d for d in forced if isinstance(d, int))
            return sizes if len(sizes) == len(forced) else None
        call = self.draft.pattern.bindings.get(var)
        if call is None:
            return None
        if call.name in _SHAPED:
            ok, value = self.known(call.args[_SHAPED[call.name]])
            return tuple(value) if ok and isinstance(value, tuple) else None
        kids = self.draft.children(var)
        if call.name == "Permute":
            ok, perm = self.known(call.args[1])
            inner = self.implied(kids[0], seen)
            if not ok or inner is None or sorted(perm) != list(range(len(inner))):
                return None
            return tuple(inner[p] for p in perm)
        if call.name == "MatMul":
            a, w = (self.implied(k, seen) for k in kids)
            return None if a is None or w is None else (*a[:-1], w[-1])
        if call.name in _SAME_SHAPE:
            return next((s for k in kids if (s := self.implied(k, seen)) is not None), None)
        if call.name == "Concat":
            ok, axis = self.known(call.args[1])
            parts = [self.implied(k, seen) for k in kids]
            known = [p for p in parts if p is not None]
            if not ok or not isinstance(axis, int) or not known or len(known) < len(parts):
                return None
            if not all(0 <= axis < len(p) for p in known):
                return None
            return (*known[0][:axis], sum(p[axis] for p in known), *known[0][axis + 1 :])
        return None

    def product_shape(self, var: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """`shape`, or for a matmul whose right operand's shape is implied, one that fits it."""
        call = self.draft.pattern.bindings.get(var)
        if call is None or call.name != "MatMul":
            return shape
        w = self.implied(self.draft.children(var)[1])
        if w is None or len(w) < 2:
            return shape
        lead = list(shape[:-1])
        while len(lead) < len(w) - 1:
            lead.insert(0, self.draft.sampling.dim())
        return (*w[:-2], lead[-1], w[-1])

    def settle(self, var: str, child_hints: dict[int, Hint | list[Hint]]) -> None:
        """Give operands whose shape is implied below them that shape (see `implied`).

        A matmul's left operand then takes the summed size of its right one.
        """
        for i, arg in self.draft.tensor_args(var):
            wanted = child_hints.get(i)
            if isinstance(wanted, Hint) and isinstance(arg, Sym):
                shape = self.implied(arg.name)
                if shape is not None and shape != wanted.shape:
                    child_hints[i] = Hint(shape, wanted.dtype, wanted.bound)
        call = self.draft.pattern.bindings.get(var)
        a, w = child_hints.get(0), child_hints.get(1)
        if call is None or call.name != "MatMul":
            return
        if isinstance(a, Hint) and isinstance(w, Hint) and min(len(a.shape), len(w.shape)) >= 2:
            child_hints[0] = Hint((*a.shape[:-1], w.shape[-2]), a.dtype, a.bound)

    def depths(self, root: str) -> dict[str, int]:
        """How many bindings down from `root` each variable below it is first reached."""
        found = {root: 0}
        queue = [root]
        while queue:
            current = queue.pop(0)
            for kid in self.draft.children(current):
                if kid not in found:
                    found[kid] = found[current] + 1
                    queue.append(kid)
        return found

    def ordered_roots(self) -> list[str]:
        """The roots, those closest to an operand they share with another root first.

        The closer root types the shared operand most directly; the other reaches it through
        more ops (a broadcast of a scale), whose proposals are retried until they fit.
        """
        roots = self.draft.roots()
        depths = {root: self.depths(root) for root in roots}

        def nearest(root: str) -> int:
            shared = [
                d
                for var, d in depths[root].items()
                if any(var in depths[other] for other in roots if other != root)
            ]
            return min(shared, default=0)

        return sorted(roots, key=nearest)

    def sample(self) -> None:
        """Propose every root a random type, and everything below it from there.

        Roots that share an operand (two matmuls of one input, as multi-pattern rules match)
        take the type of the first such root, so that their proposals can agree on it.
        """
        reached: list[tuple[set[str], Hint]] = []
        for root in self.ordered_roots():
            below = self.below(root)
            hint = next((h for seen, h in reached if seen & below), None)
            if hint is None:
                shape = self.implied(root) or self.product_shape(root, self.draft.sampling.shape())
                hint = Hint(shape, self.draft.sampling.dtype())
            reached.append((below, hint))
            self.visit(root, hint)


class Builder:
    """Builds the proposed instance bottom-up."""

    def __init__(self, draft: Draft) -> None:
        self.draft = draft

    def leaf(self, var: str) -> Value:
        """Build a leaf: an input, or a constant where the pattern asks for one."""
        draft = self.draft
        hint = draft.hints.get(var) or Hint(draft.sampling.shape(), DType.F32)
        call = draft.pattern.bindings.get(var)
        shape: tuple[Dim, ...] = hint.shape
        if var in draft.hints:  # a sampled leaf takes the shape a repair forced, if any
            shape = draft.forced.shapes.get(var, shape)
        dtype = hint.dtype
        if call is not None:
            attrs = draft.attrs.get(var, {})
            shape, dtype = tuple(attrs.get(1, shape)), DType[attrs.get(2, dtype.name)]
        if hint.bound is not None:
            data = draft.rng.integers(-hint.bound, hint.bound, sizes(shape)).astype(dtype.numpy)
            return draft.builder.constant(data)
        vector = var.split("#")[0]  # a Concat's part `xs#k` folds when `xs` does
        constant = var in draft.constants or vector in draft.constants
        kind = call.name if call is not None else ("Constant" if constant else "Input")
        if kind == "Input":
            if any(isinstance(d, int) and d < 0 for d in shape):
                raise InvalidGraphError(f"input shape {shape} has a negative size")
            draft.inputs += 1
            return draft.builder.input(f"in{draft.inputs}", shape, dtype)
        if kind == "Opaque":  # an ONNX Constant node holding random values, kept as it is
            return kept_constant(draft.builder, random_array(draft.rng, sizes(shape), dtype))
        if kind == "Splat" or (kind == "Constant" and call is None and draft.sampling.boolean(0.2)):
            value = draft.attrs.get(var, {}).get(0, draft.sampling.value())
            return draft.builder.constant(np.full(sizes(shape), value, dtype.numpy))
        return draft.builder.constant(random_array(draft.rng, sizes(shape), dtype))

    def build(self, var: str) -> Value:
        """Build `var` and what it needs: operands that are not leaves first, then the leaves.

        The leaves come after the other operands because an elementwise op's leaves take the
        type of its built operands; the op comes last.
        """
        stack = [(var, 0)]
        while stack:
            current, stage = stack.pop()
            if current in self.draft.values:
                continue
            call = self.draft.pattern.bindings.get(current)
            if call is None or call.name in LEAVES:
                self.draft.values[current] = self.leaf(current)
                continue
            kids = [k for k in self.draft.children(current) if k not in self.draft.values]
            if stage == 0:
                stack.append((current, 1))
                stack.extend((k, 0) for k in kids if not self.draft.is_leaf(k))
            elif stage == 1:
                if call.name in _SAME_TYPE:
                    self.adapt_leaves(current, call.name)
                if call.name in _INDEXED:
                    self.bound_indices(current, call.name)
                stack.append((current, 2))
                stack.extend((k, 0) for k in kids)
            else:
                attrs = self.draft.attrs.get(current, {})
                args = tuple(attrs.get(i) for i in range(len(call.args)))
                op = DECODERS[call.name](_Shim(), args)
                inputs = [self.draft.values[k] for k in self.draft.children(current)]
                self.draft.values[current] = self.draft.builder.apply(op, inputs)
        return self.draft.values[var]

    def bound_indices(self, var: str, name: str) -> None:
        """Keep a Gather's or Scatter's index leaf inside the axis of its built data."""
        kids = self.draft.children(var)
        axis = self.draft.attrs.get(var, {}).get(_INDEXED[name])
        if (
            kids[0] not in self.draft.values
            or len(kids) < 2
            or kids[1] in self.draft.values
            or not isinstance(axis, int)
            or not 0 <= axis < self.draft.values[kids[0]].rank
        ):
            return
        length = size(self.draft.values[kids[0]].shape[axis])
        old = self.draft.hints.get(kids[1])
        if old is not None:
            self.draft.hints[kids[1]] = Hint(old.shape, old.dtype, bound=length)

    def adapt_leaves(self, var: str, name: str) -> None:
        """Give unbuilt leaf operands of an elementwise op the type of a built operand."""
        kids = self.draft.children(var)
        built = [self.draft.values[k] for k in kids if k in self.draft.values]
        if not built:
            return
        model = built[-1]
        for index, kid in enumerate(kids):
            if kid in self.draft.values or kid in self.draft.forced.shapes:
                continue
            if not self.draft.is_leaf(kid):
                continue
            dtype = model.dtype
            if name == "Where" and index == 0:
                dtype = DType.BOOL
            elif name == "Where" and model.dtype is DType.BOOL and len(built) == 1:
                dtype = self.draft.hints[kid].dtype if kid in self.draft.hints else dtype
            shape = sizes(model.shape)
            self.draft.hints[kid] = Hint(
                shape, dtype, self.draft.hints[kid].bound if kid in self.draft.hints else None
            )
            call = self.draft.pattern.bindings.get(kid)
            if call is not None:
                for position, value in ((1, shape), (2, dtype.name)):
                    arg = call.args[position]
                    if isinstance(arg, Sym) and arg.name not in self.draft.forced.values:
                        self.draft.assign[arg.name] = value
                        self.draft.attrs.setdefault(kid, {})[position] = value

    def graph(self) -> Graph:
        """The instance graph, one output per root of the pattern."""
        for index, root in enumerate(self.draft.roots()):
            self.draft.builder.output(self.build(root), f"r{index}")
        return self.draft.builder.build()
