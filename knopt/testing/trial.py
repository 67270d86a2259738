"""Trying a model as a user would, in a worker process with a time limit and a memory cap.

`try_model` loads a model's bytes, runs it on random inputs, optimizes it under small limits and
runs the result, and says how that ended: fine, refused with a `KnoptError` (what knopt promises
for a bad model), or failed with any other exception (a bug). `Trials` does that in a worker
process, so that a hang is cut off after a timeout and a crash or a memory blow-up cannot take
the caller down; the worker is started again after either. `run_campaign` tries many mutants
(`knopt.testing.mutation`) and collects what went wrong.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

import knopt
from knopt.ir.dtype import DType
from knopt.onnx.load import load_model
from knopt.opt.egraph import Limits
from knopt.testing.arrays import random_array
from knopt.testing.mutation import Mutant, make_mutant

OK = "ok"  # ran to the end
REFUSED = "refused"  # a KnoptError: a typed error naming the culprit
FAILED = "failed"  # any other exception: a bug
HANG = "hang"  # still running at the timeout
CRASH = "crash"  # the worker process died (a signal, an abort, the memory cap)

MAX_FEED_ELEMENTS = 2**20  # larger inputs are not drawn: the point is the code, not the data


@dataclass(frozen=True)
class Outcome:
    """How trying one model ended.

    Attributes:
        status: OK, REFUSED, FAILED, HANG or CRASH.
        detail: The error's class and message (REFUSED), its traceback (FAILED), or empty.
        seconds: Processor time of the trial (wall time where the worker was stopped).
        peak_bytes: The worker's peak resident memory so far (0 where it died).
    """

    status: str
    detail: str
    seconds: float
    peak_bytes: int


def try_model(
    data: bytes, *, optimize: bool, seed: int = 0, seconds: float = 2.0, nodes: int = 20_000
) -> tuple[str, str]:
    """Load, run, optimize and run again a model in this process; (status, detail).

    Args:
        data: The model file's bytes.
        optimize: Whether to optimize it (under `seconds` and `nodes`) and run the result too.
        seed: Seeds the random inputs.
        seconds: The optimizer's time limit per phase.
        nodes: The optimizer's e-node limit.
    """
    try:
        session = knopt.compile(data)
        feeds = _feeds(data, session.input_names, np.random.default_rng(seed))
        if feeds is not None:
            session.run(None, feeds)
        if optimize and not isinstance(session, knopt.session.PerSizeSession):
            result = knopt.optimize(session.graph, limits=Limits(seconds, nodes), ilp=False)
            if feeds is not None:
                knopt.compile(result.graph).run(None, feeds)
    except knopt.KnoptError as err:
        return REFUSED, f"{type(err).__name__}: {err}"
    except BaseException:  # Rust panics from egglog are BaseExceptions: all are findings
        return FAILED, traceback.format_exc()
    return OK, ""


def _feeds(data: bytes, names: list[str], rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Random inputs of the declared shapes (symbolic sizes 2), or None if they are too big."""
    declared = {info.name: info for info in load_model(data).graph.input}
    feeds = {}
    for name in names:
        tensor = declared[name].type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor.shape.dim]
        if int(np.prod(shape, dtype=np.float64)) > MAX_FEED_ELEMENTS:
            return None
        feeds[name] = random_array(rng, shape, DType.from_onnx(tensor.elem_type, name))
    return feeds


class Trials:
    """A worker process that tries models one at a time (`try_model`).

    A trial that takes more than `timeout` seconds of processor time is a hang; one still
    running after `patience` times that in wall time is stopped (a busy machine slows a trial
    down without making it a hang, so wall time alone would not do).

    Args:
        timeout: Processor seconds a trial may take before it counts as a hang.
        memory_limit: The knopt memory budget in the worker, in bytes.
        address_space: The worker's cap on virtual memory, in bytes (Linux), so that a memory
            blow-up ends the worker instead of the machine.
        patience: How many times `timeout` of wall time to wait before stopping the worker.
    """

    def __init__(
        self,
        timeout: float = 10.0,
        memory_limit: int = 256 * 2**20,
        address_space: int = 2**33,
        patience: float = 6.0,
    ) -> None:
        self.timeout = timeout
        self.patience = patience
        self.memory_limit = memory_limit
        self.address_space = address_space
        self._process: Any = None
        self._connection: Connection | None = None

    def run(self, data: bytes, *, optimize: bool, seed: int = 0) -> Outcome:
        """Try one model in the worker (started first if needed)."""
        if self._connection is None:
            self._start()
        assert self._connection is not None
        began = time.perf_counter()
        self._connection.send((data, optimize, seed))
        try:
            if not self._connection.poll(self.timeout * self.patience):
                self.close()
                waited = time.perf_counter() - began
                return Outcome(HANG, f"still running after {waited:.0f} s", waited, 0)
            status, detail, seconds, peak = self._connection.recv()
        except (EOFError, OSError):
            code = self._process.exitcode if self._process is not None else None
            self.close()
            return Outcome(CRASH, f"worker died (exit code {code})", time.perf_counter() - began, 0)
        if seconds > self.timeout:
            detail = f"took {seconds:.1f} s of processor time ({status})"
            return Outcome(HANG, detail, seconds, peak)
        return Outcome(status, detail, seconds, peak)

    def close(self) -> None:
        """Stop the worker (it is started again by the next `run`)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None

    def __enter__(self) -> Trials:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=_serve, args=(child, self.memory_limit, self.address_space), daemon=True
        )
        saved = {k: os.environ.get(k) for k in _ONE_THREAD}
        os.environ.update(_ONE_THREAD)  # read by BLAS when the worker imports numpy
        try:
            process.start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        child.close()
        self._process, self._connection = process, parent


_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _serve(connection: Connection, memory_limit: int, address_space: int) -> None:
    """The worker's loop: try each model it is sent and send back how that ended."""
    knopt.set_memory_limit(memory_limit)
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    while True:
        try:
            data, optimize, seed = connection.recv()
        except EOFError:
            return
        before = resource.getrusage(resource.RUSAGE_SELF)
        status, detail = try_model(data, optimize=optimize, seed=seed)
        after = resource.getrusage(resource.RUSAGE_SELF)
        seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        connection.send((status, detail, seconds, after.ru_maxrss * 1024))  # KiB on Linux


@dataclass
class Campaign:
    """What trying many mutants gave.

    Attributes:
        counts: Trials by status.
        findings: The mutants that failed, hung or crashed, with how.
        peak_bytes: The largest peak resident memory of a worker.
        slowest: The longest trial, in processor seconds.
    """

    counts: dict[str, int]
    findings: list[tuple[Mutant, Outcome]]
    peak_bytes: int = 0
    slowest: float = 0.0


def run_campaign(
    models: Sequence[tuple[str, bytes]],
    seed: int,
    count: int,
    *,
    optimize_every: int = 1,
    trials: Trials | None = None,
) -> Campaign:
    """Try mutants `0 .. count - 1` of run `seed` (`make_mutant`), each in a worker process.

    Args:
        models: (name, serialized model) pairs to mutate.
        seed: The run's seed; the same seed and count give the same mutants.
        count: How many mutants.
        optimize_every: Optimize every n-th mutant (1: all of them), to bound the time.
        trials: The worker to use (default: a new one with its default limits).
    """
    campaign = Campaign({}, [])
    owned = trials is None
    worker = trials or Trials()
    try:
        for index in range(count):
            mutant = make_mutant(models, seed, index)
            outcome = worker.run(mutant.data, optimize=index % optimize_every == 0, seed=index)
            campaign.counts[outcome.status] = campaign.counts.get(outcome.status, 0) + 1
            campaign.peak_bytes = max(campaign.peak_bytes, outcome.peak_bytes)
            campaign.slowest = max(campaign.slowest, outcome.seconds)
            if outcome.status in (FAILED, HANG, CRASH):
                campaign.findings.append((mutant, outcome))
    finally:
        if owned:
            worker.close()
    return campaign
