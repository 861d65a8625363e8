"""The server's trust boundary (serving/guard.py) on its own: each check, driven through the ASGI
interface with the body in chunks, in front of a small app that records what reached it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from kserve.errors import InvalidInput

from cascade.config import Ports, ServingSettings, Settings, load_settings
from serving.guard import GuardPolicy, RequestGuard, ServingSetupError, host_of
from serving.v2_codec import (
    MalformedRequest,
    check_request_id,
    decode_binary_request,
    decode_v2_tensors,
)

INFER = "/v2/models/m/infer"
JSON = [(b"content-type", b"application/json")]


class Recorder:
    """An ASGI app that reads the body and answers 200 with its length."""

    def __init__(self, *, hold: asyncio.Event | None = None) -> None:
        self.bodies: list[bytes] = []
        self.hold = hold

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        self.bodies.append(b"".join(chunks))
        if self.hold is not None:
            await self.hold.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class Client:
    """Sends one request through an ASGI app and records the answer and the chunks read."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def request(
        self,
        method: str = "POST",
        path: str = INFER,
        *,
        chunks: Sequence[bytes] = (b"{}",),
        headers: Sequence[tuple[bytes, bytes]] = (),
        host: bytes | None = b"127.0.0.1:8080",
    ) -> dict[str, Any]:
        raw = list(headers) + ([(b"host", host)] if host is not None else [])
        scope = {"type": "http", "method": method, "path": path, "headers": raw}
        sent: list[dict[str, Any]] = []
        read = 0

        async def receive() -> dict[str, Any]:
            nonlocal read
            if read >= len(chunks):
                await asyncio.sleep(3600)  # the client sends nothing more
            read += 1
            return {
                "type": "http.request",
                "body": chunks[read - 1],
                "more_body": read < len(chunks),
            }

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = sent[0]
        return {
            "status": start["status"],
            "headers": {k.decode(): v.decode() for k, v in start["headers"]},
            "body": b"".join(m.get("body", b"") for m in sent[1:]),
            "chunks_read": read,
        }


def guard(policy: GuardPolicy | None = None, app: Any = None) -> tuple[RequestGuard, Recorder]:
    app = app or Recorder()
    return RequestGuard(app, policy or GuardPolicy(max_body_bytes=1_000)), app


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_chunked_body_past_the_limit_is_refused_at_the_chunk_that_crosses_it() -> None:
    app, inner = guard()
    # 10 chunks of 300 bytes and no Content-Length: the fourth crosses 1,000 bytes.
    answer = run(Client(app).request(chunks=[b"x" * 300] * 10, headers=JSON))
    assert answer["status"] == 413
    assert answer["chunks_read"] == 4
    assert inner.bodies == []
    assert b"1000 bytes" in answer["body"]


def test_a_declared_length_past_the_limit_is_refused_before_any_byte_is_read() -> None:
    app, inner = guard()
    answer = run(
        Client(app).request(chunks=[b"x" * 10], headers=[*JSON, (b"content-length", b"5000")])
    )
    assert (answer["status"], answer["chunks_read"], inner.bodies) == (413, 0, [])
    bad = run(Client(app).request(headers=[*JSON, (b"content-length", b"-1")]))
    assert bad["status"] == 400


def test_a_body_within_the_limit_reaches_the_app_whole() -> None:
    app, inner = guard()
    answer = run(Client(app).request(chunks=[b"a" * 400, b"b" * 400, b"c" * 200], headers=JSON))
    assert answer["status"] == 200
    assert inner.bodies == [b"a" * 400 + b"b" * 400 + b"c" * 200]


def test_a_route_with_its_own_limit() -> None:
    policy = GuardPolicy(max_body_bytes=100, route_body_bytes={INFER: 2_000})
    app, _ = guard(policy)
    assert run(Client(app).request(chunks=[b"x" * 1_500], headers=JSON))["status"] == 200
    other = run(Client(app).request(path="/v1/models/m:predict", chunks=[b"x" * 150], headers=JSON))
    assert other["status"] == 413


@pytest.mark.parametrize(
    "content_type",
    [None, b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; b=x"],
)
def test_only_json_is_taken_where_json_is_expected(content_type: bytes | None) -> None:
    app, inner = guard()
    headers = [] if content_type is None else [(b"content-type", content_type)]
    answer = run(Client(app).request(headers=headers))
    assert answer["status"] == 415 and inner.bodies == []
    assert answer["chunks_read"] == 0


def test_json_with_a_charset_and_binary_on_a_binary_route() -> None:
    app, _ = guard(GuardPolicy(max_body_bytes=1_000, binary_paths=frozenset({INFER})))
    charset = [(b"content-type", b"Application/JSON; charset=utf-8")]
    assert run(Client(app).request(headers=charset))["status"] == 200
    binary = [(b"content-type", b"application/octet-stream")]
    assert run(Client(app).request(headers=binary))["status"] == 200
    assert run(Client(app).request(path="/v2/models/x/infer", headers=binary))["status"] == 415


@pytest.mark.parametrize(
    ("host", "status"),
    [
        (b"127.0.0.1:28081", 200),
        (b"localhost", 200),
        (b"LOCALHOST.:80", 200),
        (b"[::1]:28081", 200),
        (b"serving.internal", 200),
        (b"attacker.example", 400),
        (b"127.0.0.1.attacker.example", 400),
        (b"", 400),
        (None, 400),
    ],
)
def test_host_allow_list(host: bytes | None, status: int) -> None:
    settings = Settings(serving=ServingSettings(allowed_hosts=("serving.internal",)))
    app, _ = guard(GuardPolicy.from_settings(settings))
    assert run(Client(app).request(headers=JSON, host=host))["status"] == status


def test_host_allow_list_names_the_bound_host_and_can_be_off() -> None:
    bound = GuardPolicy.from_settings(Settings(host="10.1.2.3", ports=Ports()))
    assert bound.allowed_hosts is not None and "10.1.2.3" in bound.allowed_hosts
    assert GuardPolicy.from_settings(load_settings({"CASCADE_HOST": "0.0.0.0"})).allowed_hosts == (
        frozenset({"127.0.0.1", "localhost", "::1"})
    )
    anyone = GuardPolicy.from_settings(load_settings({"CASCADE_SERVING_ALLOWED_HOSTS": "*"}))
    app, _ = guard(anyone)
    assert run(Client(app).request(headers=JSON, host=b"x.example"))["status"] == 200
    assert host_of("[::1]") == "::1" and host_of("a.example:99") == "a.example"


def test_bearer_token() -> None:
    settings = load_settings({"CASCADE_SERVING_AUTH": "1", "CASCADE_SERVING_TOKEN": "s3cret"})
    app, inner = guard(GuardPolicy.from_settings(settings))
    client = Client(app)
    for authorization in (None, b"Bearer wrong", b"Basic s3cret", b"Bearer s3cre", b"s3cret"):
        headers = JSON + ([(b"authorization", authorization)] if authorization else [])
        answer = run(client.request(headers=headers))
        assert answer["status"] == 401, authorization
        assert answer["headers"]["www-authenticate"] == "Bearer"
        assert b"s3cret" not in answer["body"]
    assert inner.bodies == []
    good = run(client.request(headers=[*JSON, (b"authorization", b"bearer s3cret")]))
    assert good["status"] == 200
    # The probes answer without a token (a kubelet sends none), nothing else does.
    assert run(client.request("GET", "/v2/health/live", host=b"10.0.0.7"))["status"] == 200
    assert run(client.request("GET", "/v2/models", headers=JSON))["status"] == 401
    assert settings.serving.auth_headers() == {"Authorization": "Bearer s3cret"}


def test_auth_is_on_in_the_cluster_profile_and_needs_a_token() -> None:
    assert load_settings({}).serving.auth is False
    cluster = load_settings({"CASCADE_PROFILE": "cluster"})
    assert cluster.serving.auth is True
    with pytest.raises(ServingSetupError, match="CASCADE_SERVING_TOKEN"):
        GuardPolicy.from_settings(cluster)
    with_token = load_settings({"CASCADE_PROFILE": "cluster", "CASCADE_SERVING_TOKEN": "t"})
    assert GuardPolicy.from_settings(with_token).token == "t"


def test_model_load_and_unload_routes_are_gone() -> None:
    app, inner = guard()
    for action in ("load", "unload"):
        answer = run(Client(app).request(path=f"/v2/repository/models/m/{action}", headers=JSON))
        assert answer["status"] == 404
    assert run(Client(app).request("GET", "/v2/repository/index"))["status"] == 404
    assert inner.bodies == []


def test_concurrent_requests_past_the_bound_get_503_with_retry_after() -> None:
    async def scenario() -> list[dict[str, Any]]:
        hold = asyncio.Event()
        app, _ = guard(GuardPolicy(max_body_bytes=1_000, max_concurrent=2), Recorder(hold=hold))
        client = Client(app)
        first = [asyncio.create_task(client.request(headers=JSON)) for _ in range(2)]
        await asyncio.sleep(0.05)
        busy = await client.request(headers=JSON)
        # A probe is neither counted nor refused: it reaches the app (which holds it too).
        probe = asyncio.create_task(client.request("GET", "/v2/health/ready"))
        await asyncio.sleep(0.05)
        assert not probe.done() and app.active == 2
        hold.set()
        done = [await task for task in first]
        assert app.active == 0
        after = await client.request(headers=JSON)
        return [busy, *done, after, await probe]

    busy, one, two, after, probe = run(scenario())
    assert busy["status"] == 503 and busy["headers"]["retry-after"] == "1"
    assert busy["chunks_read"] == 0
    assert [one["status"], two["status"], after["status"]] == [200, 200, 200]
    assert probe["status"] == 200


@pytest.mark.parametrize(
    "request_id",
    ["abc", "rollout-probe-" + "f" * 32, "load-12", "a.b_c:d-e", "x" * 128],
)
def test_bounded_request_ids_pass(request_id: str) -> None:
    body = orjson.dumps({"id": request_id, "inputs": []})
    assert decode_v2_tensors(body)[0] == request_id
    assert check_request_id(request_id) == request_id


@pytest.mark.parametrize(
    "request_id", ["", "x" * 129, "a b", "a/b", "<script>", "é", "a\nb", "a\x00b"]
)
def test_unbounded_request_ids_get_400_without_echo(request_id: str) -> None:
    body = orjson.dumps({"id": request_id, "inputs": []})
    with pytest.raises(InvalidInput) as caught:
        decode_v2_tensors(body)
    assert not isinstance(caught.value, MalformedRequest)  # 400, not 422
    if len(request_id) > 2:
        assert request_id not in str(caught.value)
    header = orjson.dumps({"id": request_id, "inputs": []})
    with pytest.raises(InvalidInput):
        decode_binary_request(header, str(len(header)), "m")


def test_not_json_names_the_position_not_the_parser_message() -> None:
    with pytest.raises(MalformedRequest) as caught:
        decode_v2_tensors(b'{"inputs": [1,, 2]}')
    assert str(caught.value) == "the request body is not JSON (line 1, column 15)"


class InProcessServer:
    """uvicorn in a thread on a free loopback port, serving ``app`` with the servers' protocol
    (a header deadline of ``header_deadline_s``)."""

    def __init__(self, app: Any, *, header_deadline_s: float) -> None:
        import threading

        import uvicorn

        from cascade.ports import free_port
        from serving.server import CoalescingHttpToolsProtocol, connection_limit

        class Protocol(CoalescingHttpToolsProtocol):
            pass

        Protocol.header_deadline_s = header_deadline_s
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                http=Protocol, limit_concurrency=connection_limit(1),
                                lifespan="off")  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> InProcessServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def post(self, body: bytes = b"{}") -> int:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("POST", INFER, body, {"Content-Type": "application/json"})
            return connection.getresponse().status
        finally:
            connection.close()


def test_a_slow_body_gets_408_and_its_slot_serves_others_again() -> None:
    import socket
    import time

    guard = RequestGuard(
        Recorder(), GuardPolicy(max_body_bytes=1000, max_concurrent=1, body_deadline_s=0.6)
    )
    with InProcessServer(guard, header_deadline_s=5) as server:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        head = (f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Content-Length: 100\r\n\r\n{")  # fmt: skip
        started = time.monotonic()
        slow.sendall(head.encode())
        time.sleep(0.2)
        assert guard.active == 1 and server.post() == 503  # the one slot is the slow body's
        answer = slow.recv(4096)
        held = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408") and b"within 0.6 s" in answer
        assert 0.5 < held < 3 and guard.slow_bodies == 1
        assert slow.recv(4096) == b""  # closed: the rest of that body is never waited for
        assert guard.active == 0 and server.post() == 200


def test_a_connection_whose_headers_do_not_end_is_closed() -> None:
    import socket
    import time

    with InProcessServer(RequestGuard(Recorder(), GuardPolicy(max_body_bytes=1000)),
                         header_deadline_s=0.5) as server:  # fmt: skip
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        started = time.monotonic()
        slow.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127")
        assert idle.recv(4096) == b"" and slow.recv(4096) == b""
        assert time.monotonic() - started < 3
        assert server.post() == 200  # others are served as before
