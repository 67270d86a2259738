"""Kernels a plan lowers alike (a model's layers) are lowered once; the others replay the steps.

The layers of a model are the same kernels over other tensors, and lowering
(`knopt.cuda.lower`) would write the same sources again for each. A generator is a
deterministic function of what it reads: the kernel (kind, op and bodies, not its tensor ids)
and the dtype, layout and buffer of each of its tensors. So the planner lowers the first kernel
of each class (`kernel_classes`: kernels equal but for their tensors) at each signature of its
tensors, records what the lowering added (temporaries, buffers, steps), and replays that for
the next kernel with the same class and signature, its tensors mapped to the next one's.

A lowering is recorded only when all it did shows in what it added: one that read a
constant's value or the derived tensors (`LoweringContext.derived`, which name tensors beyond
the kernel's own), changed a tensor or buffer it did not make, or made a step reading a tensor
it was not given, is lowered anew every time. A replayed plan equals the plan lowered kernel by
kernel (tests/cuda/test_replay.py).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from knopt.cuda.context import Buffer, LoweringContext
from knopt.cuda.layout import Layout, view_layout
from knopt.cuda.steps import Step, map_step_tensors, step_tensors
from knopt.ir.dtype import DType
from knopt.ir.op import ConstData, Op
from knopt.ir.program import Kernel, Program

KernelClasses = tuple[int | None, ...]  # per kernel: its class, or None (never replayed)
_UNSEEN = object()  # a key not looked up before
Lowering = Callable[[LoweringContext, Kernel], None]


class WatchedDict(dict[Any, Any]):
    """A dict that notes whether a value was read or written since `read` was last cleared.

    Args:
        keys_read: Whether asking if a key is there (`in`, `get` of a missing key) counts as
            a read. Not for the constants: whether a buffer holds one shows in its region,
            which the signature of a kernel's tensors includes; only their values are read.
    """

    read = False

    def __init__(self, *, keys_read: bool) -> None:
        super().__init__()
        self.keys_read = keys_read

    def __contains__(self, key: object) -> bool:
        if self.keys_read:
            self.read = True
        return super().__contains__(key)

    def __getitem__(self, key: Any) -> Any:
        self.read = True
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of `key` (a read), else `default`."""
        if super().__contains__(key):
            self.read = True
            return super().__getitem__(key)
        if self.keys_read:
            self.read = True
        return default

    def __setitem__(self, key: Any, value: Any) -> None:
        self.read = True
        super().__setitem__(key, value)

    def __iter__(self) -> Any:
        self.read = True
        return super().__iter__()

    def values(self) -> Any:
        """The values (a read)."""
        self.read = True
        return super().values()

    def items(self) -> Any:
        """The items (a read)."""
        self.read = True
        return super().items()


class _Unkeyable(Exception):
    """A value `structure_key` does not know how to compare exactly."""


def structure_key(value: object) -> Hashable:
    """A key equal for two values exactly when they hold the same data.

    Exact where `==` is not: 0.0 and -0.0, 1 and 1.0, and an enum and its integer differ.

    Raises:
        _Unkeyable: For a value of a type it does not know (an array, say).
    """
    cls = type(value)
    kind = _KINDS.get(cls) or _classify(cls)
    if kind is _Kind.PLAIN:
        return (cls, value)
    if kind is _Kind.DATACLASS:
        return (cls, tuple(structure_key(getattr(value, name)) for name in _FIELDS[cls]))
    if kind is _Kind.SEQUENCE:
        return (cls, tuple(structure_key(v) for v in value))  # type: ignore[attr-defined]
    if kind is _Kind.FLOAT:
        return (float, value.hex())  # type: ignore[attr-defined]
    if kind is _Kind.NUMPY:
        return (cls, value.tobytes())  # type: ignore[attr-defined]
    if kind is _Kind.SET:
        return (cls, frozenset(structure_key(v) for v in value))  # type: ignore[attr-defined]
    if kind is _Kind.CONST_DATA:
        return (cls, value.digest)  # type: ignore[attr-defined]
    raise _Unkeyable(cls.__name__)


class _Kind(enum.Enum):
    """How `structure_key` keys a value of some type."""

    PLAIN = enum.auto()  # None, str, bytes, bool, int, enums: exact by type and ==
    FLOAT = enum.auto()
    NUMPY = enum.auto()  # numpy scalars, by type and bytes
    SEQUENCE = enum.auto()
    SET = enum.auto()
    CONST_DATA = enum.auto()  # by digest
    DATACLASS = enum.auto()  # by type and fields
    UNKNOWN = enum.auto()


_KINDS: dict[type, _Kind] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _classify(cls: type) -> _Kind:
    """The kind of `cls` (found once per type)."""
    if issubclass(cls, np.generic):  # first: np.float64 is a float too
        kind = _Kind.NUMPY
    elif cls is type(None) or issubclass(cls, str | bytes | bool | int | enum.Enum):
        kind = _Kind.PLAIN
    elif issubclass(cls, float):
        kind = _Kind.FLOAT
    elif issubclass(cls, tuple | list):
        kind = _Kind.SEQUENCE
    elif issubclass(cls, frozenset):
        kind = _Kind.SET
    elif issubclass(cls, ConstData):
        kind = _Kind.CONST_DATA
    elif dataclasses.is_dataclass(cls):
        kind = _Kind.DATACLASS
        _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    else:
        kind = _Kind.UNKNOWN
    _KINDS[cls] = kind
    return kind


def kernel_classes(program: Program) -> KernelClasses:
    """Each kernel's class: kernels equal in all but their tensor ids (and names) share one.

    Binding sizes keeps classes (equal kernels bind alike), so the classes of a symbolic
    program serve each of its bindings.
    """
    ids: dict[Hashable, int] = {}
    found: list[int | None] = []
    for kernel in program.kernels:
        try:
            key = structure_key(
                (kernel.kind, kernel.op, kernel.body, kernel.prologue, kernel.epilogue)
            )
        except _Unkeyable:
            found.append(None)
            continue
        found.append(ids.setdefault(key, len(ids)))
    return tuple(found)


@dataclass(frozen=True)
class _Recording:
    """What one lowering added, in terms of the tensors and buffers it was given.

    Attributes:
        tensors: The kernel's distinct tensors, in order of first use.
        buffers: Their distinct buffers, in order of first use.
        first_tensor: The id of the first tensor the lowering made (the others follow).
        first_buffer: The id of the first buffer it made.
        new_buffers: (nbytes, region, offset) of each buffer it made.
        new_tensors: (dtype, layout, buffer) of each tensor it made.
        steps: The steps it appended.
    """

    tensors: tuple[int, ...]
    buffers: tuple[int, ...]
    first_tensor: int
    first_buffer: int
    new_buffers: tuple[tuple[int, str, int], ...]
    new_tensors: tuple[tuple[DType, Layout, int], ...]
    steps: tuple[Step, ...]


class LoweringMemo:
    """Lowers the kernels of one plan, replaying lowerings recorded for their class.

    Args:
        ctx: The plan's lowering context; its `constants` and `derived` must be
            `WatchedDict`s, so that lowerings that read them are seen.
        classes: Each kernel's class (`kernel_classes`), by position in the program.
        lowering: What lowers one kernel (`knopt.cuda.lower.lower_kernel`).
    """

    def __init__(self, ctx: LoweringContext, classes: KernelClasses, lowering: Lowering) -> None:
        assert isinstance(ctx.constants, WatchedDict) and isinstance(ctx.derived, WatchedDict)
        self.ctx = ctx
        self.classes = classes
        self.lowering = lowering
        self._recorded: dict[Hashable, _Recording | object | None] = {}
        self._views: dict[tuple[object, ...], Layout | None] = {}

    def lower(self, kernel: Kernel, index: int) -> None:
        """Append the steps of kernel number `index` of the program."""
        cls = self.classes[index]
        if cls is None:
            self.lowering(self.ctx, kernel)
            return
        tensors, buffers, signature = self._signature(kernel)
        key = (cls, signature)
        found = self._recorded.get(key, _UNSEEN)
        if found is _UNSEEN:
            self._recorded[key] = self._record(kernel, tensors, buffers)
        elif isinstance(found, _Recording):
            self._replay(found, tensors, buffers)
        else:  # not replayable: lowered anew each time
            self.lowering(self.ctx, kernel)

    def view_layout(self, index: int, op: Op, source: Layout) -> Layout | None:
        """`view_layout(op, source)` for view kernel number `index`, once per class and layout."""
        cls = self.classes[index]
        if cls is None:
            return view_layout(op, source)
        key = (cls, *_layout_key(source))
        found = self._views.get(key, _UNSEEN)
        if found is _UNSEEN:
            found = self._views[key] = view_layout(op, source)
        return found  # type: ignore[return-value]

    def _signature(self, kernel: Kernel) -> tuple[list[int], list[int], tuple[object, ...]]:
        """The kernel's distinct tensors and buffers, and what lowering reads of them."""
        ctx = self.ctx
        order: dict[int, int] = {}
        buffers: dict[int, int] = {}
        parts: list[object] = []
        for tid in (*kernel.inputs, kernel.output):
            seen = order.get(tid)
            if seen is not None:
                parts.append(seen)
                continue
            order[tid] = len(order)
            tensor = ctx.tensors[tid]
            if tensor.buffer < 0:
                parts.append((tensor.dtype, *_layout_key(tensor.layout)))
                continue
            # Lowerings read a buffer's region, never its size or (resident) offset.
            buffer = ctx.buffers[tensor.buffer]
            slot = buffers.setdefault(buffer.id, len(buffers))
            parts.append((tensor.dtype, *_layout_key(tensor.layout), buffer.region, slot))
        return list(order), list(buffers), tuple(parts)

    def _record(self, kernel: Kernel, tensors: list[int], buffers: list[int]) -> _Recording | None:
        """Lower `kernel` and return what it added (None if that cannot be replayed)."""
        ctx = self.ctx
        first_tensor, first_buffer, first_step = len(ctx.tensors), len(ctx.buffers), len(ctx.steps)
        before = [_tensor_state(ctx, t) for t in tensors]
        buffers_before = [_buffer_state(ctx.buffers[b]) for b in buffers]
        constants, derived = ctx.constants, ctx.derived
        assert isinstance(constants, WatchedDict) and isinstance(derived, WatchedDict)
        constants.read = derived.read = False
        self.lowering(ctx, kernel)
        if (
            constants.read
            or derived.read
            or before != [_tensor_state(ctx, t) for t in tensors]
            or buffers_before != [_buffer_state(ctx.buffers[b]) for b in buffers]
        ):
            return None
        new_buffers = ctx.buffers[first_buffer:]
        if any(b.first >= 0 or b.last >= 0 for b in new_buffers):
            return None
        known_buffers = {*buffers, *(b.id for b in new_buffers)}
        new_tensors = ctx.tensors[first_tensor:]
        if any(t.buffer not in known_buffers for t in new_tensors):
            return None
        known_tensors = {*tensors, *(t.id for t in new_tensors)}
        steps = ctx.steps[first_step:]
        if any(t not in known_tensors for step in steps for t in step_tensors(step)):
            return None
        return _Recording(
            tuple(tensors),
            tuple(buffers),
            first_tensor,
            first_buffer,
            tuple((b.nbytes, b.region, b.offset) for b in new_buffers),
            tuple((t.dtype, t.layout, t.buffer) for t in new_tensors),
            tuple(steps),
        )

    def _replay(self, recording: _Recording, tensors: list[int], buffers: list[int]) -> None:
        ctx = self.ctx
        buffer_map = dict(zip(recording.buffers, buffers, strict=True))
        for i, (nbytes, region, offset) in enumerate(recording.new_buffers):
            buffer_map[recording.first_buffer + i] = len(ctx.buffers)
            ctx.buffers.append(Buffer(len(ctx.buffers), nbytes, region, offset))
        tensor_map = dict(zip(recording.tensors, tensors, strict=True))
        for i, (dtype, layout, buffer) in enumerate(recording.new_tensors):
            tensor_map[recording.first_tensor + i] = ctx.add_tensor(
                dtype, layout, buffer_map[buffer]
            )
        for step in recording.steps:
            ctx.emit(map_step_tensors(step, tensor_map))


def _layout_key(layout: Layout) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A layout as plain tuples, which hash faster than the dataclass."""
    return layout.shape, layout.strides, layout.offset


def _tensor_state(ctx: LoweringContext, tid: int) -> tuple[object, ...]:
    tensor = ctx.tensors[tid]
    return (tensor.dtype, tensor.layout, tensor.buffer)


def _buffer_state(buffer: Buffer) -> tuple[object, ...]:
    return (buffer.nbytes, buffer.region, buffer.offset, buffer.first, buffer.last)
