"""Dynamic batching: concurrent requests stacked along the batch axis into one session run.

Requests whose inputs agree past the batch axis (`ModelSpec.signature`) are packed, in arrival
order, into runs of at most `max_batch_size` rows. Each run is padded up to a batch size the
session has compiled already (the smallest one that fits), so a burst of odd sizes reuses a few
programs instead of compiling one per size; when none fits, the run is padded to the next power
of two (at most `max_batch_size`), which becomes a compiled size. Padding repeats the last row,
so padded rows hold realistic values (zeros could overflow or divide by zero in them, though
their results are dropped). A request larger than `max_batch_size` runs alone at its own size.

If a stacked run fails, its requests are run one by one, so that only the culprit gets the
error.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knopt.errors import KnoptError
from knopt.serve.spec import ModelSpec
from knopt.session import Session

Feeds = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]


@dataclass
class BatchStats:
    """What a `Batcher` ran, for metrics and tests.

    Attributes:
        requests: Requests answered (with outputs or an error).
        runs: Session runs.
        rows: Rows of real requests that went through runs.
        padded_rows: Rows added by padding.
        largest: The most requests one run served.
        sizes: Runs per batch size (padded rows included).
    """

    requests: int = 0
    runs: int = 0
    rows: int = 0
    padded_rows: int = 0
    largest: int = 0
    sizes: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The counters as JSON."""
        return {
            "requests": self.requests,
            "runs": self.runs,
            "rows": self.rows,
            "padded_rows": self.padded_rows,
            "largest": self.largest,
            "sizes": {str(size): count for size, count in sorted(self.sizes.items())},
        }


def pack(rows: Sequence[int], max_batch_size: int) -> list[list[int]]:
    """Indices of `rows` grouped, in order, into runs of at most `max_batch_size` rows.

    A request with more rows than that is a run of its own.
    """
    runs: list[list[int]] = []
    total = 0
    for index, count in enumerate(rows):
        if runs and total + count <= max_batch_size:
            runs[-1].append(index)
            total += count
        else:
            runs.append([index])
            total = count
    return runs


def padded_size(rows: int, compiled: set[int], max_batch_size: int) -> int:
    """The batch size to run `rows` rows at.

    That is the smallest compiled size that fits, else the next power of two, never above
    `max_batch_size` (and never below `rows`).
    """
    if rows >= max_batch_size:
        return rows
    fitting = [size for size in compiled if rows <= size <= max_batch_size]
    if fitting:
        return min(fitting)
    return min(1 << (rows - 1).bit_length(), max_batch_size)


class Batcher:
    """Runs lists of checked requests on a session, stacking what can be stacked.

    Not thread-safe: one batch at a time (the session is not either).

    Args:
        session: The compiled model.
        spec: Its `ModelSpec` (`batch` None: every request runs alone, unpadded).
        max_batch_size: The most rows one run takes.
    """

    def __init__(self, session: Session, spec: ModelSpec, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise KnoptError(f"max_batch_size must be at least 1, not {max_batch_size}")
        self.session = session
        self.spec = spec
        self.max_batch_size = max_batch_size if spec.batch is not None else 1
        self.compiled: dict[tuple[tuple[int, ...], ...], set[int]] = {}
        self.stats = BatchStats()

    def run(self, requests: Sequence[Feeds]) -> list[Outputs | KnoptError]:
        """Every output of the model for each request, or the error of that request alone."""
        results: list[Outputs | KnoptError | None] = [None] * len(requests)
        groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
        for index, feeds in enumerate(requests):
            groups.setdefault(self.spec.signature(feeds), []).append(index)
        for signature, indices in groups.items():
            rows = [self.spec.rows(requests[i]) for i in indices]
            for run in pack(rows, self.max_batch_size):
                members = [indices[i] for i in run]
                answers = self._run_stacked(signature, [requests[i] for i in members])
                for index, answer in zip(members, answers, strict=True):
                    results[index] = answer
        self.stats.requests += len(requests)
        answered = [r for r in results if r is not None]
        assert len(answered) == len(requests), "every request is in exactly one run"
        return answered

    def _run_stacked(
        self, signature: tuple[tuple[int, ...], ...], requests: Sequence[Feeds]
    ) -> list[Outputs | KnoptError]:
        if self.spec.batch is None:
            return [self._run_alone(feeds) for feeds in requests]
        rows = [self.spec.rows(feeds) for feeds in requests]
        compiled = self.compiled.setdefault(signature, set())
        size = padded_size(sum(rows), compiled, self.max_batch_size)
        stacked = {name: _stack([feeds[name] for feeds in requests], size) for name in requests[0]}
        try:
            outputs = self._run(stacked, sum(rows), len(requests))
        except KnoptError as err:
            if len(requests) == 1:
                return [err]
            return [self._run_alone(feeds) for feeds in requests]
        compiled.add(size)
        offsets = np.cumsum([0, *rows])
        return [
            {name: np.ascontiguousarray(out[start:stop]) for name, out in outputs.items()}
            for start, stop in itertools.pairwise(offsets)
        ]

    def _run_alone(self, feeds: Feeds) -> Outputs | KnoptError:
        try:
            return self._run(feeds, self.spec.rows(feeds), 1)
        except KnoptError as err:
            return err

    def _run(self, feeds: Feeds, rows: int, requests: int) -> Outputs:
        try:
            outputs = self.session.run(None, feeds)
        except KnoptError:
            raise
        except Exception as err:
            # Such as an IndexError from a token id past the vocabulary: still this request's
            # failure, not the server's, so it is answered like knopt's own errors.
            raise KnoptError(f"running the model failed: {type(err).__name__}: {err}") from err
        size = self.spec.rows(feeds)
        self.stats.runs += 1
        self.stats.rows += rows
        self.stats.padded_rows += size - rows
        self.stats.largest = max(self.stats.largest, requests)
        self.stats.sizes[size] = self.stats.sizes.get(size, 0) + 1
        return dict(zip(self.session.output_names, outputs, strict=True))


def _stack(arrays: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The arrays concatenated along axis 0 and padded to `size` rows with copies of the last."""
    stacked = np.concatenate(arrays, axis=0) if len(arrays) > 1 else arrays[0]
    missing = size - stacked.shape[0]
    if missing <= 0:
        return stacked
    return np.concatenate([stacked, np.repeat(stacked[-1:], missing, axis=0)], axis=0)
