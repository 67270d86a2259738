"""cuDNN attention plans built in a helper process, so that a new input size does not wait.

cuDNN compiles a kernel for each attention shape (40-700 ms a shape on an H200), and its Python
frontend holds the interpreter's lock while it does, so a thread would stall the serving thread
just as long. The runtime (`knopt.cuda.executor.Runtime`) therefore builds the attention plans
of the first size it runs itself and hands those of later sizes to a child process, started on
first need and shared by every runtime of the process (`shared_builder`): `python -m
knopt.cuda.sdpa DEVICE`, whose loop is `serve` here. The child builds each graph, serializes
its plan, and the runtime loads the bytes (about 5 ms) when they are back; until then the step
runs knopt's own attention kernel, which is correct and slower on long sequences.

Protocol. Requests on the child's stdin, one JSON object a line: {"id": n, "spec": graph_spec}.
Replies on the descriptor that was its stdout (whatever the libraries print goes to stderr
instead): a JSON line {"id": n, "size": bytes} followed by the plan's bytes, or {"id": n,
"error": why} for a graph cuDNN declined. The child holds a CUDA context of its own (a few
hundred MiB of GPU memory) and exits when its stdin closes.

`KNOPT_SDPA_WORKER=0` builds every plan in the process that runs the model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from knopt.cuda.steps import AttentionView, Sdpa
from knopt.ir.dtype import DType

HELPER = "knopt.cuda.sdpa"  # the module the helper process runs (its `__main__`)
WORKER_ENV = "KNOPT_SDPA_WORKER"  # "0": build every attention plan in the running process
DTYPE_NAMES = {DType.F16: "f16", DType.BF16: "bf16"}


def worker_enabled() -> bool:
    """Whether later attention plans are built in the helper process (`KNOPT_SDPA_WORKER`)."""
    return os.environ.get(WORKER_ENV, "1").strip() != "0"


def graph_spec(step: Sdpa) -> dict[str, Any]:
    """What cuDNN's graph of `step` is made of, as JSON values (`knopt.cuda.sdpa.build_graph`)."""

    def view(v: AttentionView | None) -> list[list[int]] | None:
        return None if v is None else [list(v.dims), list(v.strides)]

    return {
        "dtype": DTYPE_NAMES[step.dtype],
        "q": view(step.q_view),
        "k": view(step.k_view),
        "v": view(step.v_view),
        "out": view(step.out_view),
        "bias": view(step.bias_view),
        "scale": float(step.scale),
        "causal": bool(step.causal),
    }


@dataclass(frozen=True)
class BuildFailed:
    """Why the helper gave no plan for a request.

    Attributes:
        reason: cuDNN's message, or what happened to the helper.
        lost: The helper is gone (exited, or its pipe broke), not that cuDNN declined.
    """

    reason: str
    lost: bool = False


class PlanBuilder:
    """The parent's side of the helper process: send graphs, collect their plans.

    Args:
        command: The helper's command line (tests give another; by default this module
            run by the same interpreter, on `device`).
        device: The CUDA device ordinal the plans are for.

    Raises:
        OSError: If the process cannot be started.
    """

    def __init__(self, device: int = 0, command: Sequence[str] | None = None) -> None:
        argv = list(command) if command else [sys.executable, "-m", HELPER, str(device)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self._lock = threading.Condition()
        self._writing = threading.Lock()
        self._results: dict[int, bytes | BuildFailed] = {}
        self._dropped: set[int] = set()  # tickets whose answer nobody will collect
        self._lost: str | None = None
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="knopt-sdpa-plans", daemon=True)
        self._reader.start()
        self._finalizer = weakref.finalize(self, _stop, self._process)

    def submit(self, spec: dict[str, Any]) -> int:
        """Send a graph to build; returns its ticket for `result`."""
        with self._lock:
            ticket = self._next
            self._next += 1
        request = json.dumps({"id": ticket, "spec": spec}).encode() + b"\n"
        try:
            stdin = self._process.stdin
            assert stdin is not None
            with self._writing:
                stdin.write(request)
                stdin.flush()
        except (OSError, ValueError) as err:  # a broken pipe, or closed
            with self._lock:
                self._lost = self._lost or f"cannot reach the helper process ({err})"
                self._lock.notify_all()
        return ticket

    def result(self, ticket: int, timeout: float | None = 0.0) -> bytes | BuildFailed | None:
        """The plan's bytes, why there is none, or None if not back within `timeout` seconds.

        `timeout` None waits as long as it takes (until the helper answers or is gone).
        """
        with self._lock:
            self._lock.wait_for(
                lambda: ticket in self._results or self._lost is not None, timeout=timeout
            )
            if ticket in self._results:
                return self._results.pop(ticket)
            if self._lost is not None:
                return BuildFailed(self._lost, lost=True)
            return None

    def discard(self, ticket: int) -> None:
        """Forget a request: its answer, now or when it comes, is dropped."""
        with self._lock:
            if self._results.pop(ticket, None) is None:
                self._dropped.add(ticket)

    @property
    def lost(self) -> bool:
        """Whether the helper is gone (no later request will be answered)."""
        with self._lock:
            return self._lost is not None

    def close(self) -> None:
        """Stop the helper (requests not answered yet are dropped)."""
        self._finalizer()

    def _read(self) -> None:
        stream = self._process.stdout
        assert stream is not None
        why = "the helper process closed its output"
        try:
            while line := stream.readline():
                header = json.loads(line)
                if "error" in header:
                    found: bytes | BuildFailed = BuildFailed(str(header["error"]))
                else:
                    found = stream.read(int(header["size"]))
                    if len(found) != int(header["size"]):
                        break
                with self._lock:
                    ticket = int(header["id"])
                    if ticket in self._dropped:
                        self._dropped.discard(ticket)
                    else:
                        self._results[ticket] = found
                    self._lock.notify_all()
        except (OSError, ValueError, KeyError) as err:
            why = f"unreadable reply from the helper process ({err})"
        code = self._process.poll()
        with self._lock:
            self._lost = why if code is None else f"the helper process exited (code {code})"
            self._lock.notify_all()


_SHARED: dict[int, PlanBuilder] = {}
_SHARED_LOCK = threading.Lock()


def shared_builder(device: int) -> PlanBuilder:
    """The process's helper for CUDA device `device`, started on first need (again if lost).

    Every runtime of the process shares it: one more process and CUDA context in all.

    Raises:
        OSError: If the process cannot be started.
    """
    with _SHARED_LOCK:
        builder = _SHARED.get(device)
        if builder is None or builder.lost:
            builder = _SHARED[device] = PlanBuilder(device)
        return builder


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Close the helper's input (it exits) and wait a moment for it, else kill it."""
    try:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=2.0)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()


def serve(requests: IO[bytes], replies: IO[bytes], build: Callable[[Any], bytes]) -> None:
    """The child's loop: `build` each requested graph, reply its plan's bytes or the error."""
    for line in requests:
        request = json.loads(line)
        try:
            blob = build(request["spec"])
        except Exception as err:  # cuDNN reports graphs it cannot serve by exceptions
            replies.write(json.dumps({"id": request["id"], "error": str(err)}).encode() + b"\n")
        else:
            replies.write(json.dumps({"id": request["id"], "size": len(blob)}).encode() + b"\n")
            replies.write(blob)
        replies.flush()
