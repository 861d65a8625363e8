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
"""

from __future__ import annotations

import asyncio
import copy
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from kserve import ModelServer
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING
from kserve.errors import InvalidInput
from kserve.logging import KSERVE_LOG_CONFIG, configure_logging
from kserve.model import BaseKServeModel
from kserve.protocol.rest.server import RESTServer

from cascade.config import Settings, load_settings

# Not __name__: under ``python -m`` that is "__main__", which the "serving" logger misses.
log = logging.getLogger("serving.server")


REQUEST_LOG_ENV = "CASCADE_SERVING_REQUEST_LOG"


def request_log_enabled() -> bool:
    return os.environ.get(REQUEST_LOG_ENV, "0").lower() in ("1", "true", "yes")


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


def add_json_infer_route(app: FastAPI, model_name: str, infer_json: JsonInfer) -> None:
    """Serve ``POST /v2/models/<model_name>/infer`` with ``infer_json`` (bytes in, bytes out).

    Registered ahead of KServe's generic ``/v2/models/{model_name}/infer``, so it wins the
    match for this model; every other route, KServe's exception handlers (400/500/503) and
    middleware stay as they are. A body that is not a v2 request gets 422, as on KServe's route.
    """

    async def infer(body: bytes, _headers: Mapping[str, str]) -> bytes:
        return await infer_json(body)

    add_http_infer_route(app, model_name, infer)


def add_http_infer_route(
    app: FastAPI, model_name: str, infer_http: HttpInfer, *, max_body_bytes: int | None = None
) -> None:
    """:func:`add_json_infer_route` for a handler that also reads the request headers (the v2
    binary tensor extension puts the JSON header's length in one). A body declared longer than
    ``max_body_bytes`` gets 413 before it is read; an error with an HTTP ``status`` attribute
    (an InvalidInput subclass that knows its 4xx) is answered with that status."""
    from starlette.routing import Route

    from serving.preranking import MalformedRequest

    def error(status: int, message: str) -> Response:
        return Response(
            orjson.dumps({"error": message}), status_code=status, media_type="application/json"
        )

    async def infer(request: Request) -> Response:
        declared = request.headers.get("content-length", "")
        if max_body_bytes is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return error(413, f"request body of {declared} bytes; at most {max_body_bytes}")
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


class LocalModelServer(ModelServer):
    """``ModelServer`` that binds one host, serves REST only, and starts with unready models.

    KServe 0.21's ``ModelServer.start`` hard-codes ``host="0.0.0.0"`` in its uvicorn config,
    starts gRPC unless told otherwise, registers only models that are ready and raises
    ``NoModelReady`` when none is. A model that waits for its first registry version must be
    registered anyway, so ``start`` is replaced by the single-worker branch of the original.
    A model with an ``infer_json`` (or ``infer_http``) method also gets its own infer route
    (:func:`add_json_infer_route`, :func:`add_http_infer_route`); the access log and
    per-request latency lines are on only with ``request_log``.
    """

    def __init__(
        self, *, host: str, http_port: int, request_log: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(
            http_port=http_port,
            workers=1,
            enable_grpc=False,
            enable_latency_logging=request_log,
            **kwargs,
        )
        self.host = host
        self.request_log = request_log

    def start(
        self, models: list[BaseKServeModel], sockets: list[socket.socket] | None = None
    ) -> None:
        """Serve until SIGTERM/SIGINT; on ``sockets`` (already listening) when given."""
        if not models:
            raise ValueError("LocalModelServer.start needs at least one model to serve")
        from kserve.model_server import app

        for model in models:
            self.register_model(model)
            model.enable_latency_logging = self.enable_latency_logging
            model.start()
            infer_http = getattr(model, "infer_http", None)
            infer_json = getattr(model, "infer_json", None)
            if infer_http is not None:
                add_http_infer_route(
                    app,
                    model.name,
                    infer_http,
                    max_body_bytes=getattr(model, "max_body_bytes", None),
                )
            elif infer_json is not None:
                add_json_infer_route(app, model.name, infer_json)
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
        if sockets is None:
            self.servers.append(self._rest_server.start())
        else:
            self.servers.append(_serve_on(self._rest_server, sockets))
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())


class LocalRESTServer(RESTServer):
    """KServe's REST server, without its timing middleware unless requests are logged.

    That middleware reads the process CPU time twice per request (``getrusage``) only to
    log it in ``kserve.trace`` lines, which :func:`stdout_log_config` silences by default.
    """

    def __init__(self, *args: Any, request_log: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_log = request_log

    def _add_middlewares(self, app: FastAPI) -> None:
        if self.request_log:
            super()._add_middlewares(app)


async def _serve_on(rest: RESTServer, sockets: list[socket.socket]) -> None:
    """``RESTServer.start`` on an already listening socket (shared by worker processes)."""
    import uvicorn

    rest.create_application()
    await uvicorn.Server(rest.config).serve(sockets=sockets)


WORKERS_ENV = "CASCADE_SERVING_WORKERS"


def positive_int_env(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    """Integer setting ``name`` from the environment (``default`` when unset), at least 1;
    ValueError naming the variable otherwise."""
    value = (os.environ if env is None else env).get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None
    if number < 1:
        raise ValueError(f"{name} must be >= 1, got {number}")
    return number


def workers_from_env(env: dict[str, str] | None = None) -> int:
    return positive_int_env(WORKERS_ENV, 1, env)


ModelFactory = Callable[[], list[BaseKServeModel]]


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections whose
    # socket says it is TCP. Without it Nagle held every response ~40 ms for the client's
    # delayed ACK (seen: p50 48 ms for a request that takes 6).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
    a request, so on a 2-core machine one process leaves a core idle. Each worker listens on
    its own ``SO_REUSEPORT`` socket, so the kernel spreads connections over the workers; with
    one shared socket, whichever worker woke first accepted a whole burst of keep-alive
    connections (seen: 8/0, 7/1 and 0/8 splits of 8 clients) and the other core stayed idle.
    Each worker polls the registry and swaps versions on its own, so for up to one poll
    interval after a promotion two workers may answer with different versions.
    """
    port = settings.ports.serving if port is None else port
    request_log = request_log_enabled()
    configure_logging(stdout_log_config(request_log=request_log))
    log.info("model server on http://%s:%d, %d worker(s)", settings.host, port, workers)
    if workers == 1:
        LocalModelServer(host=settings.host, http_port=port, request_log=request_log).start(
            models() if callable(models) else models
        )
        return
    if not callable(models):
        raise TypeError("serve(workers > 1) needs a model factory, called in each worker")
    # Bound here, before any worker starts, so a busy port fails the server at once.
    sockets = [listening_socket(settings.host, port, reuse_port=True) for _ in range(workers)]
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(
            target=_worker, args=(models, settings, sockets, n, request_log), name=f"serving-{n}"
        )
        for n in range(workers)
    ]
    for process in processes:
        process.start()
    for sock in sockets:  # each now lives in its worker only, and closes with it
        sock.close()

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
    models: ModelFactory,
    settings: Settings,
    sockets: list[socket.socket],
    index: int,
    request_log: bool,
) -> None:
    sock = sockets[index]
    for other in sockets:
        if other is not sock:
            other.close()
    set_torch_threads()
    LocalModelServer(
        host=settings.host, http_port=int(sock.getsockname()[1]), request_log=request_log
    ).start(models(), sockets=[sock])


TORCH_THREADS_ENV = "CASCADE_SERVING_TORCH_THREADS"


def set_torch_threads(env: dict[str, str] | None = None) -> int:
    """One intra-op thread per process unless ``CASCADE_SERVING_TORCH_THREADS`` says otherwise.

    Concurrent requests already keep the cores busy; splitting each small forward pass over
    two OpenMP threads made the threads wait on each other under load (seen: ``log1p`` over
    1,000 x 11 values taking 2 ms) and multiplied the CPU time of a request by about five.
    """
    import torch

    threads = positive_int_env(TORCH_THREADS_ENV, 1, env)
    torch.set_num_threads(threads)
    return threads


def main() -> None:
    from serving.preranking import PreRankingModel, ServingConfig

    set_torch_threads()
    settings = load_settings()
    config = ServingConfig.from_env()
    serve(
        lambda: [PreRankingModel(settings=settings, config=config)],
        settings,
        workers=workers_from_env(),
    )


if __name__ == "__main__":
    main()
