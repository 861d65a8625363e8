"""The model servers' trust boundary: one ASGI middleware in front of KServe's app.

Every request passes these checks, in this order, before any route sees it (each answer is
``{"error": ...}`` JSON that names the rule, never the request's content or an exception):

1. ``/v2/repository/...`` (KServe's model load/unload) is 404: unloading a model would stop its
   champion poller while the fast infer route kept answering with a stale version.
2. ``Host`` must name an allowed host (:attr:`GuardPolicy.allowed_hosts`: 127.0.0.1, localhost,
   ``CASCADE_HOST`` and ``CASCADE_SERVING_ALLOWED_HOSTS``), else 400: a page on another site
   that rebinds its DNS name to 127.0.0.1 cannot reach the server through the browser.
3. With a token (``CASCADE_SERVING_AUTH=1``), ``Authorization: Bearer <token>`` (compared in
   constant time), else 401.
4. A request with a body method (POST, PUT, PATCH) must say ``Content-Type: application/json``
   (the ASR and pre-ranking infer routes also take ``application/octet-stream``: the v2
   binary tensor extension), else 415: a browser form or
   a ``text/plain`` fetch from another site is refused before its body is read.
5. A declared ``Content-Length`` above the route's byte limit is 413 before any byte is read.
6. At most :attr:`GuardPolicy.max_concurrent` requests at once per process; one more is
   answered 503 with ``Retry-After: 1`` at once, without queueing (a bounded queue would only
   move the wait into the server and hold the bodies of the queued requests in memory). So
   at most ``max_concurrent`` bodies of at most the byte limit are in memory at once.
7. The body is read here, chunk by chunk, counting bytes: the chunk that crosses the limit
   is answered 413 at once, whether the client declared a length or streams a chunked body;
   the route gets the body as one message. The whole body must arrive within
   :attr:`GuardPolicy.body_deadline_s` (:data:`BODY_DEADLINE_S`), else 408 and the connection
   is closed: a client sending a byte a minute holds its slot for that long at most, not for
   as long as it likes (64 such clients would otherwise turn every other request into a 503).

The health probes (``GET /v2/health/live`` and ``/v2/health/ready``) skip 2, 3 and 6: a
kubelet names the pod's IP and sends no token, and a busy server is still alive. After an
early answer (413, 415, 503) the connection stays open and uvicorn reads and drops the rest of
the body: closing it with unread bytes would reset the connection, and the client might never
read the answer.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from cascade.config import Settings

log = logging.getLogger("serving.guard")

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
PROBE_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
"""GET paths answered without the Host, token and concurrency checks."""
BLOCKED_PREFIX = "/v2/repository"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
BODY_DEADLINE_S = 10.0
"""Seconds a request's whole body may take to arrive once its headers did (16 MiB of ASR
audio is 13 Mbit/s; a v2 JSON pre-ranking request is a few hundred bytes)."""
ANY_HOST = "*"


class ServingSetupError(ValueError):
    """Serving settings that cannot make a safe server (e.g. auth on without a token)."""


@dataclass(frozen=True, kw_only=True)
class GuardPolicy:
    """What :class:`RequestGuard` enforces (built from the settings by :meth:`from_settings`)."""

    max_body_bytes: int
    """Byte limit of a request body on every path without its own."""
    route_body_bytes: Mapping[str, int] = field(default_factory=dict)
    """Path -> its own byte limit (a model's ``max_body_bytes``, e.g. ASR's 16 MiB)."""
    binary_paths: frozenset[str] = frozenset()
    """Paths that also take ``application/octet-stream`` (the v2 binary tensor extension)."""
    max_concurrent: int = 64
    """Requests handled at once in this process; more get 503."""
    allowed_hosts: frozenset[str] | None = frozenset(LOOPBACK_HOSTS)
    """Host names (lower case, no port) a request may name; None: any."""
    token: str | None = None
    """Bearer token every request but the probes must carry; None: none needed."""
    body_deadline_s: float = BODY_DEADLINE_S
    """Seconds the whole body may take; a slower one is answered 408 and its slot freed."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_concurrent < 1:
            raise ValueError("max_body_bytes and max_concurrent must be >= 1")
        if not self.body_deadline_s > 0:
            raise ValueError(f"body_deadline_s must be > 0, got {self.body_deadline_s}")
        if self.token is not None and not self.token:
            raise ServingSetupError("an empty bearer token; set CASCADE_SERVING_TOKEN")

    def body_limit(self, path: str) -> int:
        return self.route_body_bytes.get(path, self.max_body_bytes)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        route_body_bytes: Mapping[str, int] | None = None,
        binary_paths: Iterable[str] = (),
    ) -> GuardPolicy:
        """The policy of ``settings.serving`` (ServingSetupError when auth is on without a
        token: a server that would answer every request 401, or none, is refused at start)."""
        serving = settings.serving
        token: str | None = None
        if serving.auth:
            if not serving.token:
                raise ServingSetupError(
                    "CASCADE_SERVING_AUTH=1 needs a bearer token in CASCADE_SERVING_TOKEN "
                    "(the cluster profile turns auth on); set it, or CASCADE_SERVING_AUTH=0"
                )
            token = serving.token
        hosts: frozenset[str] | None
        if ANY_HOST in serving.allowed_hosts:
            hosts = None
        else:
            named = [*LOOPBACK_HOSTS, *serving.allowed_hosts]
            if settings.host not in ("0.0.0.0", "::", ""):
                named.append(settings.host)
            hosts = frozenset(normal_host(name) for name in named)
        return cls(
            max_body_bytes=serving.max_body_bytes,
            route_body_bytes=dict(route_body_bytes or {}),
            binary_paths=frozenset(binary_paths),
            max_concurrent=serving.max_concurrent,
            allowed_hosts=hosts,
            token=token,
        )


def normal_host(name: str) -> str:
    """A host name as compared: lower case, without brackets or a trailing dot."""
    return name.strip().lower().strip("[]").rstrip(".")


def host_of(value: str) -> str:
    """The host part of a ``Host`` header value (``[::1]:8080`` -> ``::1``)."""
    value = value.strip()
    if value.startswith("["):
        return normal_host(value[1 : value.find("]")] if "]" in value else value)
    name, colon, port = value.rpartition(":")
    if colon and port.isdigit():
        return normal_host(name)
    return normal_host(value)


def media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


class RequestGuard:
    """ASGI middleware that enforces a :class:`GuardPolicy` (see the module docstring)."""

    def __init__(self, app: Any, policy: GuardPolicy) -> None:
        self.app = app
        self.policy = policy
        self.active = 0
        """Requests in flight in this process (past the checks, not yet answered)."""
        self.slow_bodies = 0
        """Requests answered 408: their body did not arrive within the deadline."""
        self._token = policy.token.encode() if policy.token else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path == BLOCKED_PREFIX or path.startswith(BLOCKED_PREFIX + "/"):
            await reject(send, 404, "not found: model load and unload are off on this server")
            return
        headers = header_values(scope["headers"])
        probe = method in ("GET", "HEAD") and path in PROBE_PATHS
        if not probe:
            problem = self._refused(headers)
            if problem is not None:
                status, message, extra = problem
                await reject(send, status, message, extra)
                return
        if method in BODY_METHODS:
            allowed = (JSON_TYPE, BINARY_TYPE) if path in self.policy.binary_paths else (JSON_TYPE,)
            given = headers.get(b"content-type", [b""])
            if len(given) != 1 or media_type(given[0].decode("latin-1")) not in allowed:
                await reject(send, 415, f"send Content-Type: {' or '.join(allowed)}")
                return
        limit = self.policy.body_limit(path)
        content_length = headers.get(b"content-length")
        if content_length is not None:
            declared = content_length[0]
            if len(content_length) > 1 or not declared.isdigit():
                await reject(send, 400, "Content-Length must be one non-negative integer")
                return
            if int(declared) > limit:
                await reject(send, 413, body_too_large(limit))
                return
        if probe:
            await self.app(scope, receive, send)
            return
        if self.active >= self.policy.max_concurrent:
            await reject(
                send,
                503,
                f"busy: {self.policy.max_concurrent} requests in flight; retry shortly",
                [(b"retry-after", b"1")],
            )
            return
        self.active += 1
        try:
            try:
                async with asyncio.timeout(self.policy.body_deadline_s):
                    body = await read_body(receive, limit)
            except TimeoutError:
                self.slow_bodies += 1
                late = f"request body not received within {self.policy.body_deadline_s:g} s"
                close = [(b"connection", b"close")]
                await reject(send, 408, f"{late}; send the whole body at once", close)
                return
            if body is None:  # the client went away
                return
            if isinstance(body, int):
                await reject(send, 413, body_too_large(limit))
                return
            await self.app(scope, replay(body, receive), send)
        finally:
            self.active -= 1

    def _refused(
        self, headers: Mapping[bytes, list[bytes]]
    ) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """Host and token checks: ``(status, message, extra headers)`` or None."""
        hosts = self.policy.allowed_hosts
        if hosts is not None:
            given = headers.get(b"host", [])
            if len(given) != 1 or host_of(given[0].decode("latin-1")) not in hosts:
                return 400, "this Host is not served here (CASCADE_SERVING_ALLOWED_HOSTS)", []
        if self._token is not None:
            given = headers.get(b"authorization", [])
            scheme, _, credential = (given[0] if len(given) == 1 else b"").partition(b" ")
            # compare_digest takes as long for any credential of a given length.
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credential.strip(), self._token
            ):
                return 401, "send Authorization: Bearer <token>", [(b"www-authenticate", b"Bearer")]
        return None


def header_values(raw: Iterable[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    """The headers the guard reads, each with all its values (a repeated one is refused)."""
    found: dict[bytes, list[bytes]] = {}
    for name, value in raw:
        name = name.lower()
        if name in (b"host", b"authorization", b"content-type", b"content-length"):
            found.setdefault(name, []).append(value)
    return found


def body_too_large(limit: int) -> str:
    return f"request body over {limit} bytes; send at most {limit}"


async def read_body(receive: Any, limit: int) -> bytes | int | None:
    """The whole body, or its byte count so far once it passes ``limit`` (the rest is left
    unread), or None when the client disconnects."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return size
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` as one message, then what the connection says."""
    pending = True

    async def receive_again() -> Any:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


async def reject(
    send: Any, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``status`` with ``{"error": message}``."""
    await send_json(send, status, orjson.dumps({"error": message}), extra)


async def send_json(
    send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send one whole JSON response through ASGI ``send``."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def internal_error_body(where: str, exc: BaseException) -> bytes:
    """The body of a 500: a reference to the log line that holds the cause, never the cause.

    Exception text can name files, hosts, settings or the model's internals."""
    import uuid

    ref = uuid.uuid4().hex[:12]
    log.error("%s failed (ref %s)", where, ref, exc_info=exc)
    return orjson.dumps({"error": f"internal error (ref {ref}); the server log has the cause"})
