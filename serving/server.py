"""The model server: KServe's ``ModelServer`` with the pre-ranking model, HTTP only.

Run it (binds ``settings.host``:``settings.ports.serving``, 127.0.0.1:28081 by default)::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m serving.server

It starts before any champion exists: ``/v2/health/live`` answers at once, the model reports
not ready (503) until the registry's champion alias appears, then it loads it by itself.
Environment: ``CASCADE_*`` (see :mod:`cascade.config`), ``CASCADE_SERVING_POLL_S``,
``CASCADE_SERVING_MAX_CANDIDATES`` (see :class:`serving.preranking.ServingConfig`),
``CASCADE_SERVING_REQUEST_LOG=1`` to log a line per request (the uvicorn access log and KServe's
timing trace; off by default, see :func:`stdout_log_config`), ``CASCADE_SERVING_TORCH_THREADS``
(default 1, see :func:`set_torch_threads`), ``CASCADE_SERVING_WORKERS`` (server processes,
default 1, see :func:`serve`). Stop it with SIGTERM or SIGINT.

Every request passes :class:`serving.guard.RequestGuard` first: byte limit while the body streams
(``CASCADE_SERVING_MAX_BODY_BYTES``, 413), JSON only (415; the infer routes also take the v2
binary tensor extension as ``application/octet-stream``), at most
``CASCADE_SERVING_MAX_CONCURRENT`` requests at once (503), a Host allow-list
(``CASCADE_SERVING_ALLOWED_HOSTS``, 400), a bearer token with ``CASCADE_SERVING_AUTH=1``
(``CASCADE_SERVING_TOKEN``, 401); KServe's model load/unload routes are off (404) and a 500 names
a log reference, never the exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from kserve import ModelServer
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
from kserve.errors import (
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    ServerNotLive,
    ServerNotReady,
    invalid_input_handler,
    model_not_found_handler,
    model_not_ready_handler,
    server_not_live_handler,
    server_not_ready_handler,
)
from kserve.logging import KSERVE_LOG_CONFIG, configure_logging
from kserve.model import BaseKServeModel
from kserve.protocol.rest.server import RESTServer
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cascade.config import Settings, load_settings
from cascade.tracking_auth import READER, use_tracking_credentials
from serving.allocator import keep_freed_memory
from serving.guard import GuardPolicy, RequestGuard, internal_error_body, send_json
from serving.metrics import TORCH_THREADS
from serving.request_profile import HEADER as TIMING_HEADER
from serving.v2_codec import INFERENCE_HEADER_BYTES, MalformedRequest, V2Answer

# Not __name__: under ``python -m`` that is "__main__", which the "serving" logger misses.
log = logging.getLogger("serving.server")


def request_log_enabled() -> bool:
    return load_settings().serving.request_log


def stdout_log_config(*, request_log: bool = False) -> dict[str, Any]:
    """KServe's logging config with every handler on stdout (KServe's default is stderr).

    Per-request lines (uvicorn's access log, KServe's ``kserve.trace`` timings) only with
    ``request_log``: at hundreds of requests per second they cost ~0.5 ms of CPU each, a
    quarter of what a request may cost on this 2-core machine. Errors are logged either way.
    """
    config = copy.deepcopy(KSERVE_LOG_CONFIG)
    for handler in config["handlers"].values():
        handler["stream"] = "ext://sys.stdout"
    config["handlers"]["cascade"] = dict(config["handlers"]["kserve"])
    config["loggers"]["serving"] = {"handlers": ["cascade"], "level": "INFO", "propagate": False}
    if not request_log:
        for name in ("kserve.trace", "uvicorn.access"):
            config["loggers"].setdefault(name, {})["level"] = "WARNING"
    return config


JsonInfer = Callable[[bytes], Awaitable[bytes]]
HttpInfer = Callable[[bytes, Mapping[str, str]], Awaitable[bytes]]
V2Infer = Callable[[bytes, Sequence[tuple[bytes, bytes]]], Awaitable[V2Answer]]
"""A model's ``infer_v2``: the body and the raw request headers (lower-case names) in, the
answer (JSON, or the binary tensor extension; with its ``Server-Timing`` when profiled) out."""


def answer_headers(answer: V2Answer) -> list[tuple[bytes, bytes]]:
    """The response headers of ``answer``: its content type and length, the binary
    extension's ``Inference-Header-Content-Length``, its ``Server-Timing``."""
    if answer.json_length is None:
        headers = [(b"content-type", b"application/json")]
    else:
        headers = [
            (b"content-type", b"application/octet-stream"),
            (INFERENCE_HEADER_BYTES, b"%d" % answer.json_length),
        ]
    headers.append((b"content-length", b"%d" % len(answer.body)))
    if answer.timing is not None:
        headers.append((TIMING_HEADER, answer.timing))
    return headers


def add_v2_infer_route(app: FastAPI, model_name: str, infer_v2: V2Infer) -> None:
    """:func:`add_http_infer_route` for a model's ``infer_v2`` (the route the app serves when
    requests are logged, so that KServe's timing middleware and the access log see it)."""

    from starlette.routing import Route

    async def route(request: Request) -> Response:
        try:
            answer = await infer_v2(await request.body(), request.headers.raw)
        except MalformedRequest as exc:
            return Response(orjson.dumps({"error": str(exc)}), 422, media_type="application/json")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in answer_headers(answer)}
        return Response(answer.body, headers=headers)

    app.router.routes.insert(0, Route(f"/v2/models/{model_name}/infer", route, methods=["POST"]))


T = TypeVar("T")


def add_json_infer_route(app: FastAPI, model_name: str, infer_json: JsonInfer) -> None:
    """Serve ``POST /v2/models/<model_name>/infer`` with ``infer_json`` (bytes in, bytes out).

    Registered ahead of KServe's generic ``/v2/models/{model_name}/infer``, so it wins the
    match for this model; every other route, KServe's exception handlers (400/500/503) and
    middleware stay as they are. A body that is not a v2 request gets 422, as on KServe's route.
    """

    async def infer(body: bytes, _headers: Mapping[str, str]) -> bytes:
        return await infer_json(body)

    add_http_infer_route(app, model_name, infer)


def add_http_infer_route(app: FastAPI, model_name: str, infer_http: HttpInfer) -> None:
    """:func:`add_json_infer_route` for a handler that also reads the request headers (the v2
    binary tensor extension puts the JSON header's length in one). An error with an HTTP
    ``status`` attribute (an InvalidInput subclass that knows its 4xx) is answered with that
    status. The body's size and type were checked by :class:`serving.guard.RequestGuard`."""
    from starlette.routing import Route

    def error(status: int, message: str) -> Response:
        return Response(
            orjson.dumps({"error": message}), status_code=status, media_type="application/json"
        )

    async def infer(request: Request) -> Response:
        try:
            body = await infer_http(await request.body(), request.headers)
        except MalformedRequest as exc:
            return error(422, str(exc))
        except InvalidInput as exc:
            status = getattr(exc, "status", None)
            if not isinstance(status, int):
                raise  # KServe's handler answers 400
            return error(status, str(exc))
        return Response(body, media_type="application/json")

    # A plain Starlette route: FastAPI's dependency resolution has nothing to do for a handler
    # that reads the raw body, yet cost ~0.1 ms per request.
    app.router.routes.insert(0, Route(f"/v2/models/{model_name}/infer", infer, methods=["POST"]))


class JsonInferRoutes:
    """ASGI app in front of KServe's FastAPI app that answers ``POST /v2/models/<name>/infer``
    of the models with an ``infer_json`` method itself; every other request goes to the app.

    The same bytes in and out as :func:`add_json_infer_route`, and the same statuses as
    KServe's exception handlers (422 not a v2 request, 400 invalid input, 503 not ready,
    500 inference error or anything else, each with ``{"error": ...}``; a 500 names a log
    reference, not the exception: :func:`serving.guard.internal_error_body`), without the
    middleware stack, routing and Request/Response objects of Starlette in between: those
    cost ~0.3 ms of a request that has ~1.5 ms of CPU on this machine.
    """

    def __init__(
        self,
        app: Any,
        routes: Mapping[str, JsonInfer],
        v2_routes: Mapping[str, V2Infer] | None = None,
    ) -> None:
        self.app = app
        self.routes = dict(routes)
        self.v2_routes = dict(v2_routes or {})
        """Paths answered by a model's ``infer_v2`` (request headers in, a :class:`V2Answer`
        out: JSON or binary tensors, with its ``Server-Timing`` when profiled)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            infer_v2 = self.v2_routes.get(scope["path"])
            if infer_v2 is not None:
                headers = scope["headers"]
                await self._infer(lambda body: infer_v2(body, headers), receive, send)
                return
            infer_json = self.routes.get(scope["path"])
            if infer_json is not None:
                await self._infer(infer_json, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _infer(
        infer_json: Callable[[bytes], Awaitable[bytes | V2Answer]], receive: Any, send: Any
    ) -> None:
        from kserve.errors import InvalidInput, ModelNotReady

        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        status = 200
        try:
            body = await infer_json(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        except MalformedRequest as exc:
            status, body = 422, orjson.dumps({"error": str(exc)})
        except InvalidInput as exc:
            status, body = 400, orjson.dumps({"error": str(exc)})
        except ModelNotReady as exc:
            status, body = 503, orjson.dumps({"error": str(exc)})
        except Exception as exc:
            status, body = 500, internal_error_body("inference", exc)
        if isinstance(body, V2Answer):
            headers = answer_headers(body)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body.body})
            return
        if 400 <= status < 500:
            log.warning("infer answered %d: %s", status, body[:300].decode(errors="replace"))
        await send_json(send, status, body)


class LocalModelServer(ModelServer):
    """``ModelServer`` that binds one host, serves REST only, and starts with unready models.

    KServe 0.21's ``ModelServer.start`` hard-codes ``host="0.0.0.0"`` in its uvicorn config,
    starts gRPC unless told otherwise, registers only models that are ready and raises
    ``NoModelReady`` when none is. A model that waits for its first registry version must be
    registered anyway, so ``start`` is replaced by the single-worker branch of the original.
    A model with an ``infer_json`` (or ``infer_http``) method also gets its own infer route
    (:func:`add_json_infer_route`, :func:`add_http_infer_route`); the access log and
    per-request latency lines are on only with ``request_log``. Every request passes
    :class:`serving.guard.RequestGuard` first, with the settings' limits and a model's own
    ``max_body_bytes`` on its infer route.
    """

    def __init__(
        self,
        *,
        host: str,
        http_port: int,
        request_log: bool = False,
        settings: Settings | None = None,
        **kwargs: Any,
    ) -> None:
        self.settings = settings or load_settings()
        super().__init__(
            http_port=http_port,
            workers=1,
            enable_grpc=False,
            enable_latency_logging=request_log,
            **kwargs,
        )
        self.host = host
        self.request_log = request_log

    def start(self, models: list[BaseKServeModel], balance: SharedListener | None = None) -> None:
        """Serve until SIGTERM/SIGINT; on ``balance``'s shared listening socket when given."""
        if not models:
            raise ValueError("LocalModelServer.start needs at least one model to serve")
        from kserve.model_server import app

        routes: dict[str, JsonInfer] = {}
        v2_routes: dict[str, V2Infer] = {}
        route_body_bytes: dict[str, int] = {}
        binary_paths: list[str] = []
        for model in models:
            self.register_model(model)
            model.enable_latency_logging = self.enable_latency_logging
            model.start()
            infer_http = getattr(model, "infer_http", None)
            infer_v2 = getattr(model, "infer_v2", None)
            infer_json = getattr(model, "infer_json", None)
            path = f"/v2/models/{model.name}/infer"
            max_body_bytes = getattr(model, "max_body_bytes", None)
            if max_body_bytes is not None:
                route_body_bytes[path] = int(max_body_bytes)
            if infer_http is not None:
                add_http_infer_route(app, model.name, infer_http)
                binary_paths.append(path)
            elif infer_v2 is not None:
                add_v2_infer_route(app, model.name, infer_v2)
                v2_routes[path] = infer_v2
                binary_paths.append(path)
            elif infer_json is not None:
                add_json_infer_route(app, model.name, infer_json)
                routes[path] = infer_json
        name_models_in_openapi(app, [model.name for model in models])
        policy = GuardPolicy.from_settings(
            self.settings, route_body_bytes=route_body_bytes, binary_paths=binary_paths
        )
        self._rest_server = LocalRESTServer(
            FASTAPI_APP_IMPORT_STRING,
            self.dataplane,
            self.model_repository_extension,
            self.http_port,
            access_log_format=self.access_log_format,
            workers=1,
            grace_period=self.grace_period,
            event_loop=self.event_loop,
            timeout_keep_alive=self.timeout_keep_alive,
            request_log=self.request_log,
        )
        self._rest_server.config.host = self.host
        self._rest_server.config.http = CoalescingHttpToolsProtocol
        self._rest_server.config.limit_concurrency = connection_limit(policy.max_concurrent)
        if (routes or v2_routes) and not self.request_log:
            # With request logging on, the infer route stays inside the app, where KServe's
            # timing middleware and the access log see it.
            self._rest_server.config.app = JsonInferRoutes(app, routes, v2_routes)
        inner = self._rest_server.config.app
        # Still the import string when no fast route wraps the app (uvicorn would import it).
        self._rest_server.config.app = RequestGuard(
            app if isinstance(inner, str) else inner, policy
        )
        if balance is None:
            self.servers.append(self._rest_server.start())
        else:
            self.servers.append(_serve_balanced(self._rest_server, balance))
        self.setup_event_loop()
        self.register_signal_handler()
        run_event_loop(self._serve())

    def register_signal_handler(self) -> None:
        """KServe's handler (stop: unload the models, i.e. write their buffers), run once.

        uvicorn holds SIGTERM/SIGINT while it shuts down and raises each again afterwards;
        a second SIGTERM (``killpg`` of the whole group plus the one the supervisor forwards)
        made KServe unload the models twice: the second raised KeyError, so the worker
        exited 1 after a clean shutdown.
        """
        stopping = False

        def stop(sig: int, _frame: Any) -> None:
            nonlocal stopping
            if not stopping:
                stopping = True
                self.stop(sig)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, stop)


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop when it is installed (uvicorn's own choice with
    ``loop="auto"``, which KServe's start bypasses by running the server in
    ``asyncio.run``): its C event loop and transports took ~0.1 ms less CPU per request."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


REMOVED_ROUTES = (
    "/v2/repository/models/{model_name}/load",
    "/v2/repository/models/{model_name}/unload",
    "/v2/models/{model_name}/versions/{model_version}",
    "/v2/models/{model_name}/versions/{model_version}/ready",
    "/v2/models/{model_name}/versions/{model_version}/infer",
    "/v1/models/{model_name}:explain",
)
"""KServe routes this server does not offer: model load/unload (they would stop a model's
champion poller while the fast route kept answering with a stale version), the versioned
routes (KServe raises NotImplementedError for each: the served version is the champion's)
and explain (no model here has an explainer)."""


class LocalRESTServer(RESTServer):
    """KServe's REST server without the routes in :data:`REMOVED_ROUTES`, with 5xx answers
    that never carry exception text, and without its timing middleware unless requests are
    logged.

    That middleware reads the process CPU time twice per request (``getrusage``) only to
    log it in ``kserve.trace`` lines, which :func:`stdout_log_config` silences by default.
    """

    def __init__(self, *args: Any, request_log: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_log = request_log

    def _add_middlewares(self, app: FastAPI) -> None:
        if self.request_log:
            super()._add_middlewares(app)

    def _register_endpoints(self, app: FastAPI) -> None:
        super()._register_endpoints(app)
        app.router.routes[:] = [
            route
            for route in app.router.routes
            if getattr(route, "path", None) not in REMOVED_ROUTES
        ]
        app.openapi_schema = None

    def _add_exception_handlers(self, app: FastAPI) -> None:
        """KServe's handlers for the 4xx and 503 it raises (their messages are written for the
        client); NotImplementedError, which KServe raises for what it does not offer (a
        ``model_version`` query parameter), is 404; a body that does not fit KServe's schema
        is 422 naming at most five fields, without FastAPI's echo of the input; everything
        else is a 500 with a log reference (KServe's own handler answers
        ``"<type> : <exception text>"``)."""
        app.add_exception_handler(InvalidInput, invalid_input_handler)
        app.add_exception_handler(ModelNotFound, model_not_found_handler)
        app.add_exception_handler(ModelNotReady, model_not_ready_handler)
        app.add_exception_handler(ServerNotLive, server_not_live_handler)
        app.add_exception_handler(ServerNotReady, server_not_ready_handler)
        app.add_exception_handler(NotImplementedError, not_offered_handler)
        app.add_exception_handler(RequestValidationError, validation_error_handler)
        app.add_exception_handler(Exception, internal_error_handler)


async def not_offered_handler(request: Request, exc: Exception) -> Response:
    log.info("%s %s: not offered (%s)", request.method, request.url.path, exc)
    body = orjson.dumps({"error": "not offered by this server (one version per model)"})
    return Response(body, status_code=404, media_type="application/json")


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    where = "; ".join(
        f"{'.'.join(str(part) for part in error.get('loc', ()))[:80]}: "
        f"{str(error.get('msg', ''))[:80]}"
        for error in errors[:5]
    )
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    body = orjson.dumps({"error": f"the request does not fit the schema: {where}{more}"})
    return Response(body, status_code=422, media_type="application/json")


async def internal_error_handler(request: Request, exc: Exception) -> Response:
    body = internal_error_body(f"{request.method} {request.url.path}", exc)
    return Response(body, status_code=500, media_type="application/json")


def name_models_in_openapi(app: FastAPI, names: list[str]) -> None:
    """The app's OpenAPI document lists the served models as the values of ``model_name``, so
    a client (or a fuzzer) generated from it sends requests to real models."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    for parameter in operation.get("parameters", []):
                        if parameter.get("name") == "model_name" and parameter.get("in") == "path":
                            parameter["schema"] = {"type": "string", "enum": list(names)}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


@dataclass(frozen=True)
class SharedListener:
    """One listening socket shared by the worker processes, and each worker's connection
    count in shared memory (``loads[index]`` is written by worker ``index`` only)."""

    sock: socket.socket
    loads: Any
    """``multiprocessing.RawArray("i", workers)``."""
    index: int

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])


class CoalescingTransport:
    """A connection's transport whose write is held until the next write or the end of the
    event loop's turn, whichever comes first, so that two writes in a row leave in one send.

    uvicorn writes a response's status line and headers, then its body, in two sends; over
    loopback each send runs the peer's TCP receive and wakes it, so a 1,000-score answer
    cost two wake-ups of the client and two system calls where one does. Everything but
    ``write`` (and closing, which sends what is held first) goes to the real transport.
    """

    __slots__ = ("_transport", "_loop", "_held", "_flush_handle")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is None:
            self._held = bytes(data)
            self._flush_handle = self._loop.call_soon(self.flush)
            return
        self._held = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._transport.write(held + bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Send what is held now."""
        held, self._held = self._held, None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


HEADER_DEADLINE_S = 10.0
"""Seconds from a connection's opening, or from a request's first byte, to the end of its
headers; a slower client is disconnected (the guard's body deadline takes over from there)."""


def connection_limit(max_concurrent: int) -> int:
    """uvicorn's ``limit_concurrency`` (open connections plus requests; past it uvicorn answers
    503 itself): room for idle keep-alive connections beyond the guard's request bound."""
    return max(1024, 4 * max_concurrent)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol writing through a :class:`CoalescingTransport`: a response's
    headers and its whole body leave in one send. A connection that sends nothing, or whose
    request headers do not end within :data:`HEADER_DEADLINE_S`, is closed (uvicorn has no
    header timeout: slow headers would hold a connection, and a file descriptor, forever)."""

    header_deadline_s = HEADER_DEADLINE_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._headers_due: asyncio.TimerHandle | None = None
        self._expect_headers()

    def _expect_headers(self) -> None:
        if self._headers_due is None:
            self._headers_due = self.loop.call_later(self.header_deadline_s, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._expect_headers()

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)


class BalancedServer(uvicorn.Server):
    """uvicorn on a listening socket shared by the workers, accepting a connection only while
    this worker holds no more connections than the least loaded one.

    Keep-alive clients stay on the worker that accepted them, so how connections are split
    decides how load is split. With ``SO_REUSEPORT`` the kernel hashes each connection to a
    worker: 8 clients split 4/4 only 27% of the time, and 6/2 or worse 29%, when the busier
    worker's clients queue behind each other while the other worker's core idles (p99 ~1.5x).
    With one shared socket, whichever worker woke first took a whole burst (8/0 seen). Here
    a worker that is ahead stops accepting until the others catch up, so 8 clients split 4/4.
    """

    POLL_S = 0.002
    """How often a worker that is ahead checks whether it may accept again."""

    def __init__(self, config: uvicorn.Config, listener: SharedListener) -> None:
        super().__init__(config)
        self.listener = listener
        self._accepting: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # lifespan and state; the accept loop listens
        if self.started:
            self._accepting = asyncio.get_running_loop().create_task(self._accept_forever())

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        await super().shutdown(sockets=[])

    def _publish(self) -> None:
        self.listener.loads[self.listener.index] = len(self.server_state.connections)

    def _protocol(self, loop: asyncio.AbstractEventLoop) -> asyncio.Protocol:
        # What uvicorn's own startup passes to create_server, plus a fresh count on close.
        protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
            _loop=loop,
        )
        lost = protocol.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            lost(exc)
            self._publish()

        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        sock, loads, index = self.listener.sock, self.listener.loads, self.listener.index
        while True:
            self._publish()
            if loads[index] > min(loads):
                await asyncio.sleep(self.POLL_S)
                continue
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:  # e.g. EMFILE: back off rather than spin
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            loads[index] += 1  # at once: the other workers see it before the next accept
            try:
                await loop.connect_accepted_socket(lambda: self._protocol(loop), conn)
            except OSError:
                conn.close()


async def _serve_balanced(rest: RESTServer, listener: SharedListener) -> None:
    rest.create_application()
    await BalancedServer(rest.config, listener).serve()


def workers_from_env(env: Mapping[str, str] | None = None) -> int:
    return load_settings(env).serving.workers


ModelFactory = Callable[[], list[BaseKServeModel]]


def listening_socket(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections whose
    # socket says it is TCP. Without it Nagle held every response ~40 ms for the client's
    # delayed ACK (seen: p50 48 ms for a request that takes 6).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port}: {exc}; stop what uses it or set CASCADE_SERVING_PORT"
        ) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    models: list[BaseKServeModel] | ModelFactory,
    settings: Settings,
    *,
    workers: int = 1,
    port: int | None = None,
) -> None:
    """Serve on ``settings.host:port`` (default ``settings.ports.serving``) until SIGTERM/SIGINT.

    ``workers`` > 1 forks that many server processes, each with its own models (``models``
    must then be a factory, called in each process): a Python server uses one core for most of
    a request, so on a 2-core machine one process leaves a core idle. The workers share one
    listening socket and split connections evenly (:class:`BalancedServer`).
    Each worker polls the registry and swaps versions on its own, so for up to one poll
    interval after a promotion two workers may answer with different versions.
    """
    port = settings.ports.serving if port is None else port
    GuardPolicy.from_settings(settings)  # auth on without a token fails here, before any fork
    request_log = request_log_enabled()
    configure_logging(stdout_log_config(request_log=request_log))
    allocator = keep_freed_memory()  # before the fork: the workers inherit it
    log.info(
        "model server on http://%s:%d, %d worker(s), freed memory kept: %s",
        settings.host,
        port,
        workers,
        allocator.get("applied"),
    )
    if workers == 1:
        LocalModelServer(
            host=settings.host, http_port=port, request_log=request_log, settings=settings
        ).start(models() if callable(models) else models)
        return
    if not callable(models):
        raise TypeError("serve(workers > 1) needs a model factory, called in each worker")
    # Bound here, before any worker starts, so a busy port fails the server at once.
    sock = listening_socket(settings.host, port)
    sock.setblocking(False)
    context = multiprocessing.get_context("fork")
    loads = context.RawArray("i", workers)
    processes = [
        context.Process(
            target=_worker,
            args=(models, settings, SharedListener(sock, loads, n), request_log),
            name=f"serving-{n}",
        )
        for n in range(workers)
    ]
    for process in processes:
        process.start()
    sock.close()  # it now lives in the workers only, and closes with the last of them

    def forward(signum: int, _frame: Any) -> None:
        for process in processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # A worker that dies takes the others down with it: the supervisor (cascade up, the
    # cluster) restarts the server as a whole rather than leave it at half capacity.
    while all(p.is_alive() for p in processes):
        multiprocessing.connection.wait([p.sentinel for p in processes])
    forward(signal.SIGTERM, None)
    for process in processes:
        process.join()
    failed = [p for p in processes if p.exitcode not in (0, -signal.SIGTERM)]
    if failed:
        log.error("server workers exited with %s", [p.exitcode for p in failed])
        raise SystemExit(1)


def _worker(
    models: ModelFactory, settings: Settings, listener: SharedListener, request_log: bool
) -> None:
    set_torch_threads()
    LocalModelServer(
        host=settings.host, http_port=listener.port, request_log=request_log, settings=settings
    ).start(models(), balance=listener)


def set_torch_threads(env: dict[str, str] | None = None) -> int:
    """One intra-op thread per process unless ``CASCADE_SERVING_TORCH_THREADS`` says otherwise.

    Concurrent requests already keep the cores busy; splitting each small forward pass over
    two OpenMP threads made the threads wait on each other under load (seen: ``log1p`` over
    1,000 x 11 values taking 2 ms) and multiplied the CPU time of a request by about five.
    """
    import torch

    threads = load_settings(env).serving.torch_threads
    torch.set_num_threads(threads)
    # What this process now uses, as ``/metrics`` reports it (a forked worker drops the value
    # it inherited from its parent).
    TORCH_THREADS.clear()
    TORCH_THREADS.labels(pid=str(os.getpid())).set(torch.get_num_threads())
    return threads


def main() -> None:
    from serving.preranking import PreRankingModel, ServingConfig

    set_torch_threads()
    settings = load_settings()
    use_tracking_credentials(settings, READER)  # a server reads the registry, never writes it
    config = ServingConfig.from_env()
    serve(
        lambda: [PreRankingModel(settings=settings, config=config)],
        settings,
        workers=workers_from_env(),
    )


if __name__ == "__main__":
    main()
