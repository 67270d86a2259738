"""The two Ray Serve deployments of a served model.

`ModelReplica` holds a knopt session (one GPU each on cuda) and batches the requests that reach
it with `@serve.batch`. `Ingress` is what clients call, over HTTP or through a handle: it reads
request bodies, gives every request an id and calls a model replica, retrying once (with the
same id) when the replica dies under the call; Serve starts a replacement meanwhile. A replica
remembers the ids it is answering and has answered lately, so a retry that reaches a replica
that did see the request gets that answer instead of a second run.

Importing this module needs Ray Serve (`pip install knopt[serve]`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import knopt
from knopt.errors import CudaError, InputError, KnoptError
from knopt.serve.batching import Batcher, Outputs
from knopt.serve.protocol import JSON, UnsupportedMediaError, decode_request, encode_response
from knopt.serve.spec import ModelSpec

logger = logging.getLogger("ray.serve")

REMEMBERED = 64  # answers a replica keeps for retried ids (each holds the request's outputs)
HEALTH_TIMEOUT_S = 10.0  # a model replica that is up answers `metadata` at once


class ReplicaLostError(KnoptError):
    """The model replica died under a request twice (the first try and its one retry)."""


@dataclass(frozen=True)
class ReplicaOptions:
    """How each model replica compiles and batches (see `knopt.serve.deployment`)."""

    device: str
    precision: str
    optimize: bool | None
    profile: str | None
    cache: str | None
    max_batch_size: int
    batch_wait_timeout_s: float


class ModelReplica:
    """One copy of the model: a knopt session behind a request batcher."""

    def __init__(self, model: str, options: ReplicaOptions) -> None:
        self._options = options
        self.session = knopt.compile(
            model,
            options.device,
            precision=options.precision,
            optimize=options.optimize,
            profile=options.profile,
            cache=None if options.cache is None else os.path.expanduser(options.cache),
        )
        self.spec = ModelSpec.of(self.session)
        self.batcher = Batcher(self.session, self.spec, options.max_batch_size)
        batch: Any = self._batch  # Serve's batch wrapper, typed as the plain method
        batch.set_max_batch_size(self.batcher.max_batch_size)
        batch.set_batch_wait_timeout_s(options.batch_wait_timeout_s)
        # One thread runs the session, so the event loop keeps taking requests (and forming
        # the next batch) while a batch runs; the session itself is not thread-safe.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="knopt-session")
        self._running: dict[str, asyncio.Future[Outputs]] = {}
        self._answered: OrderedDict[str, Outputs] = OrderedDict()
        self._fault: str | None = None
        self.replica = serve.get_replica_context().replica_id.unique_id

    async def infer(
        self, request_id: str, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> Outputs | KnoptError:
        """The requested outputs (default: all) for one request's inputs, or its error.

        The error is returned, not raised: a bad request is the client's fault, not this
        replica's, and Serve logs every raised error as a failure with its traceback.
        """
        try:
            wanted = self.spec.select(outputs)
            if request_id in self._answered:
                answer = self._answered[request_id]
            elif request_id in self._running:
                answer = await asyncio.shield(self._running[request_id])
            else:
                answer = await self._answer(request_id, self.spec.check(feeds))
        except KnoptError as err:
            return err
        return {name: answer[name] for name in wanted}

    async def _answer(self, request_id: str, feeds: dict[str, np.ndarray]) -> Outputs:
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        self._running[request_id] = future
        try:
            result = await self._batch(feeds)
            if isinstance(result, KnoptError):
                raise result
            future.set_result(result)
            self._answered[request_id] = result
            while len(self._answered) > REMEMBERED:
                self._answered.popitem(last=False)
            return result
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as err:
            future.set_exception(err)
            future.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            del self._running[request_id]

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def _batch(self, requests: list[dict[str, np.ndarray]]) -> list[Outputs | KnoptError]:
        loop = asyncio.get_running_loop()
        answers = await loop.run_in_executor(self._executor, self.batcher.run, requests)
        for answer in answers:
            if isinstance(answer, CudaError):
                # A CUDA error can leave the context unusable: let Serve replace this replica.
                self._fault = str(answer)
        return answers

    def metadata(self) -> dict[str, Any]:
        """The model's inputs, outputs and batch axis, and how it is served."""
        return {
            **self.spec.to_json(),
            "device": self.session.device,
            "precision": self._options.precision,
            "max_batch_size": self.batcher.max_batch_size,
        }

    def stats(self) -> dict[str, Any]:
        """This replica's batching counters, its compiled batch sizes and its cache counters."""
        compiled = sorted({size for sizes in self.batcher.compiled.values() for size in sizes})
        cache = self.session.cache
        return {
            "replica": self.replica,
            "compiled": compiled,
            "cache": None if cache is None else dataclasses.asdict(cache.stats),
            **self.batcher.stats.to_json(),
        }

    def check_health(self) -> None:
        """Serve's health check: fails after a CUDA error, so that Serve restarts the replica.

        Raises:
            KnoptError: Naming the fault.
        """
        if self._fault is not None:
            raise KnoptError(f"replica {self.replica} is unhealthy after: {self._fault}")


class Ingress:
    """The front of a served model: HTTP and handle requests in, one retry on a lost replica.

    HTTP routes (under the application's route prefix): `POST /` runs the model (see
    `knopt.serve.protocol` for the bodies); `GET /` describes the model; `GET /health` answers
    200 when a model replica answers (503 if none does within `HEALTH_TIMEOUT_S`); `GET /stats`
    gives one replica's batching counters.
    """

    def __init__(self, model: DeploymentHandle) -> None:
        self.model = model
        self.retries = 0
        self._spec: ModelSpec | None = None
        self._metadata: dict[str, Any] | None = None

    async def run(
        self,
        feeds: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        request_id: str | None = None,
    ) -> Outputs:
        """The model's outputs for `feeds` (arrays by input name), as numpy arrays by name.

        Raises:
            InputError: If the inputs or output names do not fit the model.
            ReplicaLostError: If the replica died under the request and under its retry.
            KnoptError: If running the model fails.
        """
        request_id = request_id or uuid.uuid4().hex
        for attempt in range(2):
            try:
                result: Outputs | KnoptError = await self.model.infer.remote(
                    request_id, dict(feeds), outputs
                )
            except RayActorError as err:
                if attempt:
                    raise ReplicaLostError(
                        f"request {request_id}: the model replica died under it twice ({err})"
                    ) from err
                logger.warning("request %s: model replica died (%s); retrying", request_id, err)
                self.retries += 1
                continue
            if isinstance(result, KnoptError):
                raise result
            return result
        raise AssertionError("unreachable: the loop returns or raises")

    async def metadata(self) -> dict[str, Any]:
        """What `GET /` answers: the model's inputs and outputs and how it is served."""
        if self._metadata is None:
            self._metadata = await self.model.metadata.remote()
        return self._metadata

    async def stats(self) -> dict[str, Any]:
        """The counters of one model replica (whichever answers) and this ingress's retries."""
        result: dict[str, Any] = await self.model.stats.remote()
        return {**result, "retries": self.retries}

    async def __call__(self, request: Request) -> Response:
        """Answer one HTTP request."""
        try:
            if request.method == "GET":
                return await self._get(request.url.path.rstrip("/").rsplit("/", 1)[-1])
            if request.method != "POST":
                return _error(405, f"method {request.method} is not allowed: POST to run")
            return await self._post(request)
        except UnsupportedMediaError as err:
            return _error(415, str(err))
        except InputError as err:
            return _error(400, str(err))
        except ReplicaLostError as err:
            return _error(503, str(err))
        except KnoptError as err:
            return _error(500, f"{type(err).__name__}: {err}")

    async def _get(self, route: str) -> Response:
        if route == "health":
            try:
                await asyncio.wait_for(self.model.metadata.remote(), HEALTH_TIMEOUT_S)
            except TimeoutError:
                return _error(503, f"no model replica answered within {HEALTH_TIMEOUT_S} s")
            return JSONResponse({"status": "ok"})
        if route == "stats":
            return JSONResponse(await self.stats())
        return JSONResponse(await self.metadata())

    async def _post(self, request: Request) -> Response:
        if self._spec is None:
            self._spec = ModelSpec.from_json(await self.metadata())
        decoded = decode_request(
            await request.body(),
            request.headers.get("content-type", ""),
            request.query_params,
            self._spec,
        )
        request_id = decoded.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex
        outputs = await self.run(decoded.feeds, decoded.outputs, request_id)
        body = encode_response(outputs, decoded.media_type, request_id)
        return Response(body, media_type=decoded.media_type, headers={"x-request-id": request_id})


def _error(status: int, message: str) -> Response:
    return Response(json.dumps({"error": message}), status_code=status, media_type=JSON)
