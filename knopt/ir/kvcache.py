"""Resident outputs and the static key/value cache of a decoding session.

A session made with `resident={"present.0.key": "past_key_values.0.key", ...}` keeps those
outputs after each run and feeds them back as the matching inputs of the next run (feeding
the inputs explicitly starts over from them). Each pair must be a cache: the output is the
input with new positions appended along one axis, as a decoder exported with its past
key/values writes `present = Concat(past, new)`. The cached length (`past`) grows by the new
positions (`seq`) every run, and the caches stay where the session runs (on the GPU for cuda).

With `cache_mask` (the attention mask input, `[batch, past + seq]`, 1 = attend) the caches are
static, as torch's static cache: allocated once for the profile's largest `past + seq`, and
runs are planned for a few cached lengths instead of each one. A run whose cache holds `P`
real positions and adds `S` is planned as if it held `Pb >= P` (`planned_length`; for decoding,
`Pb + 1` is the next multiple of BUCKET): the caches are read as their first `Pb` rows, the new
positions land at rows `Pb ...`, and the mask is widened with zeros over rows `P ... Pb - 1`
(`widen_mask`). The model then attends to exactly the real positions, since attention sums
over keys and a masked key adds an exact zero; its causal mask still holds, since new position
i sits at row `Pb + i` and sees the real past, masked padding and new positions up to i. After
the run the new rows move to rows `P ...` (`relocate`), where the next run reads them. Padded
rows are zeros or earlier copies of real rows, never NaN, so the masked products stay zero.

Positions must come from an input (`position_ids`), as the usual exports of HF decoders take
them: a model that derives positions from the cache's shape would see the padded length.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from knopt.errors import InputError, KnoptError
from knopt.ir.dims import SizeProfile
from knopt.ir.graph import Graph, Value
from knopt.ir.shape import Sym, bind

BUCKET = 64  # rows per bucket of cached lengths: one plan serves BUCKET decoding steps
SHAPES_KEPT = 64  # sets of input shapes (and buckets of each) whose sizes `CacheSteps` keeps


@dataclass(frozen=True)
class CacheSlot:
    """One resident pair: `output` is `input` with new positions appended along `axis`."""

    output: str
    input: str
    axis: int


@dataclass(frozen=True)
class CacheLayout:
    """The resident pairs of a model and how its caches grow.

    Attributes:
        past: The symbol of the cached length (the inputs' size along the axis).
        new: The symbol of the positions a run adds (the outputs' size less `past`).
        mask: The attention mask input of a static cache, else None.
        rows: Rows each static cache holds: the profile's largest `past` plus largest `new`
            (0 when not static: the caches grow as needed).
        limit: The largest cached length the profile allows (static caches).
    """

    slots: tuple[CacheSlot, ...]
    past: str
    new: str
    mask: str | None = None
    rows: int = 0
    limit: int = 0

    @cached_property
    def inputs(self) -> frozenset[str]:
        """The resident inputs' names."""
        return frozenset(s.input for s in self.slots)

    @cached_property
    def outputs(self) -> frozenset[str]:
        """The resident outputs' names."""
        return frozenset(s.output for s in self.slots)

    def planned_length(self, length: int, added: int) -> int:
        """The cached length a run with `length` real positions adding `added` is planned for.

        Static caches round `length + added` up to a multiple of BUCKET, so that a decoding
        step (one new position) shares its plan with the BUCKET - 1 steps around it. The new
        rows must not overlap the rows they move to (`relocate`), and the length stays in the
        profile; otherwise the run is planned for its exact length.
        """
        if self.mask is None:
            return length
        planned = -(-(length + added) // BUCKET) * BUCKET - added
        if 0 < planned - length < added:
            planned += BUCKET
        return planned if planned <= self.limit else length


def describe_cache(
    graph: Graph, resident: Mapping[str, str], mask: str | None, sizes: SizeProfile
) -> CacheLayout:
    """Check the resident pairs of `graph` and find how its caches grow.

    Raises:
        KnoptError: If a name is not an output or input of the model, a pair is not a cache
            growing along one axis by the same sizes as the others, or a static cache lacks
            its mask input or the largest sizes in the profile.
    """
    inputs = dict(zip(graph.input_names, graph.inputs, strict=True))
    outputs = dict(zip(graph.output_names, graph.outputs, strict=True))
    slots, growth = [], set()
    for output, source in resident.items():
        if output not in outputs:
            raise KnoptError(f"resident: '{output}' is not an output of the model")
        if source not in inputs:
            raise KnoptError(f"resident: '{source}' is not an input of the model")
        axis, past, new = _growth(outputs[output], inputs[source], f"'{output}' <- '{source}'")
        slots.append(CacheSlot(output, source, axis))
        growth.add((past, new))
    if len(growth) != 1:
        raise KnoptError(f"resident: the caches grow by different sizes ({sorted(growth)})")
    ((past, new),) = growth
    if mask is None:
        return CacheLayout(tuple(slots), past, new)
    if mask not in inputs or mask in resident.values():
        raise KnoptError(f"cache_mask: '{mask}' is not a (non-resident) input of the model")
    missing = [name for name in (past, new) if name not in sizes.ranges]
    if missing:
        raise KnoptError(
            "cache_mask: a static cache is allocated for the largest sizes; give ranges for "
            f"{missing} in dims (such as dims={{'{missing[0]}': (0, 128, 1024)}})"
        )
    rows = sizes.ranges[past].max + sizes.ranges[new].max
    return CacheLayout(tuple(slots), past, new, mask, rows, sizes.ranges[past].max)


def _growth(output: Value, source: Value, where: str) -> tuple[int, str, str]:
    """(axis, past symbol, new symbol) of a pair whose output is `past + new` along one axis."""
    where = f"resident pair {where}"
    if output.dtype != source.dtype or output.rank != source.rank:
        raise KnoptError(f"{where}: types differ ({output.type} and {source.type})")
    differ = [i for i, (a, b) in enumerate(zip(output.shape, source.shape, strict=True)) if a != b]
    if len(differ) != 1:
        raise KnoptError(f"{where}: shapes must differ along one axis ({differ} differ)")
    (axis,) = differ
    past, grown = source.shape[axis], output.shape[axis]
    past_name = past.as_symbol() if isinstance(past, Sym) else None
    extra = grown - past
    new_name = extra.as_symbol() if isinstance(extra, Sym) else None
    if past_name is None or new_name is None:
        raise KnoptError(
            f"{where}: along axis {axis} the input has {past} and the output {grown}; a cache "
            "has a named length and grows by a named size"
        )
    return axis, past_name, new_name


@dataclass(frozen=True)
class CacheStep:
    """What one run of a cached session appends, and the sizes it is planned for.

    Attributes:
        length: Real cached positions before the run (`P`).
        added: New positions the run appends (`S`).
        planned: The cached length the plan takes (`Pb >= P`; equal without a static cache).
        sizes: Every named size of the run as planned (`past` is `planned`).
        actual: The named sizes of the inputs as given (`past` is `length`).
    """

    length: int
    added: int
    planned: int
    sizes: Mapping[str, int]
    actual: Mapping[str, int]


def cache_step(
    graph: Graph, layout: CacheLayout, shapes: Mapping[str, tuple[int, ...]], length: int
) -> CacheStep:
    """The sizes of a run on inputs of `shapes` (resident ones left out) after `length` rows.

    Raises:
        InputError: If the inputs disagree on a size or the mask does not cover the cache and
            the new positions.
    """
    return CacheSteps(graph, layout).step(shapes, length)


class CacheSteps:
    """`cache_step` of one graph and layout, remembering what depends only on the shapes.

    A decoding loop feeds the same shapes at every step but for the mask, which grows by one
    position: the sizes that the shapes name are found once per set of shapes (the mask's
    last axis left out), and the sizes a run is planned for once per bucket, so a step costs
    a few dictionary lookups. The planned sizes of a bucket are one shared mapping: read it,
    never change it.
    """

    def __init__(self, graph: Graph, layout: CacheLayout) -> None:
        self.layout = layout
        self._symbols = {
            name: _named_axes(value)
            for name, value in zip(graph.input_names, graph.inputs, strict=True)
        }
        self._mask_symbol: str | None = None
        if layout.mask is not None:
            mask = graph.inputs[graph.input_names.index(layout.mask)]
            self._mask_symbol = dict(_named_axes(mask)).get(mask.rank - 1)
        self._named: dict[tuple[Any, ...], dict[str, int]] = {}
        self._planned: dict[tuple[Any, ...], dict[str, int]] = {}

    def step(self, shapes: Mapping[str, tuple[int, ...]], length: int) -> CacheStep:
        """The sizes of a run on inputs of `shapes` (resident ones left out) after `length`.

        Raises:
            InputError: If the inputs disagree on a size or the mask does not cover the cache
                and the new positions.
        """
        layout = self.layout
        width = shapes[layout.mask][-1] if layout.mask is not None else 0
        key = tuple(
            (name, shape[:-1] if name == layout.mask else shape) for name, shape in shapes.items()
        )
        named = self._named.get(key)
        if named is None:
            named = self._named_sizes(shapes)
            _bounded(self._named)[key] = named
        mask_symbol = self._mask_symbol
        if mask_symbol is not None and named.get(mask_symbol, width) != width:
            raise InputError(
                f"input '{layout.mask}': size '{mask_symbol}' is {width} here but "
                f"{named[mask_symbol]} in another input"
            )
        if layout.new not in named:
            raise InputError(f"no input gives the number of new positions ('{layout.new}')")
        added = named[layout.new]
        planned = layout.planned_length(length, added)
        actual = {**named, layout.past: length}
        if layout.mask is not None:
            if width != length + added:
                raise InputError(
                    f"input '{layout.mask}' covers {width} positions; the cache holds {length} "
                    f"and the run adds {added}, so it must cover {length + added}"
                )
            if mask_symbol is not None:
                actual[mask_symbol] = width
        sizes = self._planned.get((key, planned))
        if sizes is None:
            sizes = dict(named)
            if mask_symbol is not None:
                sizes[mask_symbol] = planned + added
            sizes[layout.past] = planned
            _bounded(self._planned)[key, planned] = sizes
        return CacheStep(length, added, planned, sizes, actual)

    def _named_sizes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The sizes the inputs' shapes name (but the mask's last axis).

        Raises:
            InputError: If two inputs disagree on a size.
        """
        sizes: dict[str, int] = {}
        for name, symbols in self._symbols.items():
            shape = shapes.get(name)
            if shape is None:
                continue
            rank = len(shape) - 1 if name == self.layout.mask else len(shape)
            for axis, symbol in symbols:
                if axis >= rank:
                    continue
                size = shape[axis]
                if sizes.setdefault(symbol, size) != size:
                    raise InputError(
                        f"input '{name}': size '{symbol}' is {size} here but {sizes[symbol]} "
                        "in another input"
                    )
        return sizes


def _named_axes(value: Value) -> tuple[tuple[int, str], ...]:
    """(axis, symbol) of each axis of `value` whose size is a plain symbol."""
    found = []
    for axis, dim in enumerate(value.shape):
        symbol = dim.as_symbol() if isinstance(dim, Sym) else None
        if symbol is not None:
            found.append((axis, symbol))
    return tuple(found)


def _bounded(memo: dict[Any, Any]) -> dict[Any, Any]:
    """`memo`, emptied when it holds more than a few buckets of SHAPES_KEPT shapes."""
    if len(memo) > 4 * SHAPES_KEPT:
        memo.clear()
    return memo


def decoding_steps(graph: Graph, layout: CacheLayout, step: CacheStep) -> list[CacheStep]:
    """Decoding steps (one new position) that may follow `step`, for kernels to prepare.

    The next step, then cached lengths doubling up to the profile's largest: kernels change
    shape with the length only at a few thresholds (a block's thread count, a split of the
    keys), which these cross.
    """
    steps = [later_step(graph, layout, step, step.length + step.added)]
    length = 2 * (step.length + step.added)
    while layout.mask is not None and length < layout.limit:
        steps.append(later_step(graph, layout, step, length))
        length *= 2
    if layout.mask is not None and layout.limit > step.length + step.added:
        steps.append(later_step(graph, layout, step, layout.limit))
    return steps


def later_step(
    graph: Graph, layout: CacheLayout, step: CacheStep, length: int, added: int = 1
) -> CacheStep:
    """A run like `step` (same batch) that appends `added` positions to `length` cached ones."""
    sizes = {**step.sizes, layout.new: added}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, value in zip(graph.input_names, graph.inputs, strict=True):
        if name in layout.inputs:
            continue
        shape = list(bind(value.shape, sizes))
        if name == layout.mask:
            shape[-1] = length + added
        shapes[name] = tuple(shape)
    return cache_step(graph, layout, shapes, length)


def widen_mask(mask: Any, step: CacheStep) -> np.ndarray:
    """The mask of a padded run: the real past, zeros over the padding, then the new positions."""
    mask = np.asarray(mask)
    if step.planned == step.length:
        return mask
    widened = np.empty((*mask.shape[:-1], step.planned + step.added), mask.dtype)
    widened[..., : step.length] = mask[..., : step.length]
    widened[..., step.length : step.planned] = 0
    widened[..., step.planned :] = mask[..., step.length :]
    return widened


def cache_shape(graph: Graph, slot: CacheSlot, sizes: Mapping[str, int], rows: int) -> list[int]:
    """The shape of a cache holding `rows` positions, with the other sizes from `sizes`."""
    shape = list(bind(graph.inputs[graph.input_names.index(slot.input)].shape, sizes))
    shape[slot.axis] = rows
    return shape


def _along(axis: int, start: int, stop: int, rank: int) -> tuple[slice, ...]:
    index = [slice(None)] * rank
    index[axis] = slice(start, stop)
    return tuple(index)


class HostCaches:
    """Resident caches held as numpy arrays (the CPU session's).

    The first `length` rows of each are real; a static cache has `layout.rows` rows, others
    grow as needed.
    """

    def __init__(self, graph: Graph, layout: CacheLayout) -> None:
        self.graph = graph
        self.layout = layout
        self.length = 0
        self.arrays: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        """Forget the caches: the next run starts from empty ones."""
        self.length = 0
        self.arrays = {}

    def load(self, feeds: Mapping[str, Any]) -> None:
        """Start from the resident inputs given in `feeds` (all of them, or none).

        Raises:
            InputError: If only some are given, or they disagree on the cached length.
        """
        given = {s.input: np.asarray(feeds[s.input]) for s in self.layout.slots if s.input in feeds}
        if not given:
            return
        if len(given) != len(self.layout.slots):
            missing = sorted(self.layout.inputs - set(given))
            raise InputError(f"give every resident input or none; missing {missing}")
        lengths = {given[s.input].shape[s.axis] for s in self.layout.slots}
        if len(lengths) != 1:
            raise InputError(f"resident inputs disagree on the cached length ({sorted(lengths)})")
        self.reset()
        for slot in self.layout.slots:
            self._write(slot, given[slot.input], 0)
        self.length = lengths.pop()

    def inputs(self, step: CacheStep) -> dict[str, np.ndarray]:
        """The resident inputs of a run: each cache's first `step.planned` rows."""
        found = {}
        for slot in self.layout.slots:
            array = self.arrays.get(slot.input)
            if array is None or array.shape[slot.axis] < step.planned:
                shape = cache_shape(self.graph, slot, step.sizes, step.planned)
                dtype = self.graph.inputs[self.graph.input_names.index(slot.input)].dtype
                array = np.zeros(shape, dtype.numpy)
                if slot.input in self.arrays:
                    old = self.arrays[slot.input]
                    array[_along(slot.axis, 0, old.shape[slot.axis], old.ndim)] = old
                self.arrays[slot.input] = array
            found[slot.input] = array[_along(slot.axis, 0, step.planned, array.ndim)]
        return found

    def update(self, outputs: Mapping[str, np.ndarray], step: CacheStep) -> None:
        """Keep a run's resident outputs: its new rows move to rows `length ...` (relocate)."""
        for slot in self.layout.slots:
            out = outputs[slot.output]
            new = out[_along(slot.axis, step.planned, step.planned + step.added, out.ndim)]
            self._write(slot, new, step.length)
        self.length = step.length + step.added

    def output(self, name: str) -> np.ndarray:
        """A resident output as the model computes it: the real rows of its cache."""
        (slot,) = [s for s in self.layout.slots if s.output == name]
        array = self.arrays[slot.input]
        return np.ascontiguousarray(array[_along(slot.axis, 0, self.length, array.ndim)])

    def _write(self, slot: CacheSlot, rows: np.ndarray, start: int) -> None:
        stop = start + rows.shape[slot.axis]
        array = self.arrays.get(slot.input)
        capacity = max(self.layout.rows, stop)
        if array is None or array.shape[slot.axis] < stop:
            shape = list(rows.shape)
            shape[slot.axis] = capacity
            grown = np.zeros(shape, rows.dtype)
            if array is not None:
                grown[_along(slot.axis, 0, array.shape[slot.axis], array.ndim)] = array
            array = self.arrays[slot.input] = grown
        array[_along(slot.axis, start, stop, array.ndim)] = rows
