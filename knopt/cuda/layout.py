"""Where a tensor's elements sit in its buffer: shape, strides and offset, all in elements.

Views (View, Broadcast, Permute, Slice, Flip) are layouts over their input's buffer, so they
cost nothing on the GPU. Strides of size-1 axes are always 0 (their value never matters), which
makes layouts compare equal whenever they address the same elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from knopt.ir import op as ops


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of `shape`, with 0 for size-1 axes."""
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step if size != 1 else 0)
        step *= size
    return tuple(reversed(strides))


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Dense strides of N, C, spatial... stored channels last (N, spatial..., C), 0 for size 1."""
    order = [0, *range(2, len(shape)), 1] if len(shape) > 2 else list(range(len(shape)))
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step if shape[axis] != 1 else 0
        step *= shape[axis]
    return tuple(strides)


def numel(shape: Sequence[int]) -> int:
    """The number of elements of a shape."""
    total = 1
    for size in shape:
        total *= size
    return total


@dataclass(frozen=True)
class Layout:
    """A strided view of a buffer. `offset` is the element that index (0, ..., 0) reads."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def contiguous(shape: Sequence[int]) -> Layout:
        """The row-major layout of `shape` at the start of a buffer."""
        return Layout(tuple(shape), contiguous_strides(shape))

    @property
    def numel(self) -> int:
        """The number of elements."""
        return numel(self.shape)

    @property
    def is_contiguous(self) -> bool:
        """True when the elements are dense and in row-major order."""
        return self.strides == contiguous_strides(self.shape)

    @property
    def dense_order(self) -> tuple[int, ...] | None:
        """The axis order in which the elements are dense and row-major, or None.

        The identity for a contiguous layout; (0, 2, 3, 1) for a channels-last NCHW tensor.
        """
        if self.is_contiguous:
            return tuple(range(len(self.shape)))
        # Outermost first; size-1 axes (stride 0) go last, where they do not matter.
        order = tuple(sorted(range(len(self.shape)), key=lambda a: -self.strides[a]))
        return order if self.permute(order).is_contiguous else None

    def permute(self, perm: Sequence[int]) -> Layout:
        """Axes reordered: result axis i is axis `perm[i]`."""
        return Layout(
            tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm), self.offset
        )

    def broadcast(self, shape: Sequence[int]) -> Layout:
        """Size-1 axes repeated up to `shape` (stride 0)."""
        strides = tuple(
            0 if old == 1 else s for old, s in zip(self.shape, self.strides, strict=True)
        )
        return _canonical(tuple(shape), strides, self.offset)

    def slice(self, axis: int, start: int, stop: int, step: int) -> Layout:
        """Every `step`-th element of `axis` from `start` below `stop`."""
        size = max(0, -(-(stop - start) // step))
        shape = list(self.shape)
        shape[axis] = size
        strides = list(self.strides)
        offset = self.offset + (start * self.strides[axis] if size else 0)
        strides[axis] = self.strides[axis] * step
        return _canonical(tuple(shape), tuple(strides), offset)

    def flip(self, axis: int) -> Layout:
        """`axis` in reverse order (a negative stride)."""
        size = self.shape[axis]
        strides = list(self.strides)
        strides[axis] = -self.strides[axis]
        offset = self.offset + (size - 1) * self.strides[axis] if size else self.offset
        return _canonical(self.shape, tuple(strides), offset)

    def reshape(self, shape: Sequence[int]) -> Layout | None:
        """The same elements in row-major order with a new shape, or None if that needs a copy."""
        shape = tuple(shape)
        if self.numel == 0 or self.is_contiguous:
            return Layout(shape, contiguous_strides(shape), self.offset)
        strides = _reshape_strides(self.shape, self.strides, shape)
        return None if strides is None else _canonical(shape, strides, self.offset)


def _canonical(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Layout:
    return Layout(
        shape, tuple(0 if d == 1 else s for d, s in zip(shape, strides, strict=True)), offset
    )


def _reshape_strides(
    old_shape: tuple[int, ...], old_strides: tuple[int, ...], new_shape: tuple[int, ...]
) -> tuple[int, ...] | None:
    # numpy's _attempt_nocopy_reshape: group old and new axes into runs of equal element
    # counts; each run of old axes must be dense among itself to be re-split.
    old = [(d, s) for d, s in zip(old_shape, old_strides, strict=True) if d != 1]
    new_strides = [0] * len(new_shape)
    oi, ni = 0, 0
    while oi < len(old) and ni < len(new_shape):
        if new_shape[ni] == 1:
            ni += 1
            continue
        oj, nj = oi + 1, ni + 1
        old_count, new_count = old[oi][0], new_shape[ni]
        while old_count != new_count:
            if new_count < old_count:
                new_count *= new_shape[nj]
                nj += 1
            else:
                old_count *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        new_strides[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            new_strides[k - 1] = new_strides[k] * new_shape[k]
        oi, ni = oj, nj
    return tuple(new_strides)


def view_layout(op: ops.Op, source: Layout) -> Layout | None:
    """The layout of a view op's result over its input's layout (None: needs a copy).

    Raises:
        TypeError: If `op` is not a view op (a knopt bug).
    """
    if isinstance(op, ops.View):
        return source.reshape([int(d) for d in op.shape])  # type: ignore[arg-type]
    if isinstance(op, ops.Broadcast):
        return source.broadcast([int(d) for d in op.shape])  # type: ignore[arg-type]
    if isinstance(op, ops.Permute):
        return source.permute(op.perm)
    if isinstance(op, ops.Slice):
        stop = min(int(op.stop), source.shape[op.axis])  # type: ignore[arg-type]
        return source.slice(op.axis, int(op.start), stop, op.step)  # type: ignore[arg-type]
    if isinstance(op, ops.Flip):
        return source.flip(op.axis)
    raise TypeError(f"{op.name} is not a view op")


def merge_axes(
    shape: Sequence[int], strides_list: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 axes and merge neighbours that every layout walks densely.

    Returns the merged shape and each layout's strides over it: fewer axes means less index
    arithmetic in generated kernels. An empty shape is a single element.
    """
    axes = [i for i, d in enumerate(shape) if d != 1]
    merged: list[int] = []
    merged_strides: list[list[int]] = [[] for _ in strides_list]
    for i in axes:
        if merged and all(
            st[-1] == strides[i] * shape[i]
            for st, strides in zip(merged_strides, strides_list, strict=True)
        ):
            merged[-1] *= shape[i]
            for st, strides in zip(merged_strides, strides_list, strict=True):
                st[-1] = strides[i]
            continue
        merged.append(shape[i])
        for st, strides in zip(merged_strides, strides_list, strict=True):
            st.append(strides[i])
    return tuple(merged), [tuple(st) for st in merged_strides]
