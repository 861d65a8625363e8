"""The real model server (subprocess, fake registry and store) at its trust boundary: oversized,
chunked and wrong-type bodies refused without its memory growing, the repository routes gone,
request ids bounded, 500s without exception text, and a fuzz of its own OpenAPI document."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests
import serving_fakes
from conftest import RunningServer, start_server
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serving.guard import GuardPolicy
from serving.server import JsonInferRoutes, LocalRESTServer

TOKEN = "t0ken-for-the-boundary-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
INFER = "/v2/models/preranking/infer"
MB = 1 << 20


def infer_body(request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [3]},
            {"name": "item_ids", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]},
        ]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The server with the cluster profile's bearer token on and a 1 MiB body limit."""
    workdir = tmp_path_factory.mktemp("boundary")
    serving_fakes.write_champion(workdir / "champion.json", "1", seed=1)
    server = start_server(
        workdir,
        env={
            "CASCADE_SERVING_AUTH": "1",
            "CASCADE_SERVING_TOKEN": TOKEN,
            "CASCADE_SERVING_MAX_BODY_BYTES": str(MB),
            "CASCADE_FEEDBACK": "0",
        },
    )
    try:
        deadline = time.monotonic() + 30
        while (
            requests.get(
                f"{server.url}/v2/models/preranking/ready", headers=AUTH, timeout=2
            ).status_code
            != 200
        ):
            if time.monotonic() > deadline:
                pytest.fail(f"model never became ready:\n{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        server.stop()


def rss_mb(server: RunningServer) -> float:
    return psutil.Process(server.proc.pid).memory_info().rss / MB


def head(server: RunningServer, *, content_type: str, extra: str = "") -> bytes:
    return (
        f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: {content_type}\r\n{extra}\r\n"
    ).encode()


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    length = next(
        int(v)
        for k, _, v in (line.partition(": ") for line in lines[1:])
        if k.lower() == "content-length"
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), body[:length]


def send_chunked(sock: socket.socket, total: int, *, piece: int = 256 << 10) -> None:
    chunk = b"%x\r\n%s\r\n" % (piece, b"7" * piece)
    for _ in range(total // piece):
        sock.sendall(chunk)
    sock.sendall(b"0\r\n\r\n")


@pytest.mark.slow
def test_oversized_chunked_and_wrong_type_bodies_leave_memory_flat(
    guarded_server: RunningServer,
) -> None:
    server = guarded_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        # Warm up every path once (and the allocator), then measure.
        sock.sendall(head(server, content_type="application/json", extra="Content-Length: 3\r\n"))
        sock.sendall(b"{}x")
        assert read_answer(sock)[0] == 422
        sock.sendall(
            head(server, content_type="application/json", extra="Transfer-Encoding: chunked\r\n")
        )
        send_chunked(sock, 2 * MB)
        assert read_answer(sock)[0] == 413
        before = rss_mb(server)
        peak = before
        answers = []
        # 50 MB each, all sent on one keep-alive connection: the server answers early and
        # reads and drops the rest of each body.
        for content_type, extra in [
            ("application/json", "Transfer-Encoding: chunked\r\n"),
            ("text/plain", "Transfer-Encoding: chunked\r\n"),
            ("application/x-www-form-urlencoded", "Transfer-Encoding: chunked\r\n"),
        ]:
            sock.sendall(head(server, content_type=content_type, extra=extra))
            send_chunked(sock, 50 * MB)
            answers.append(read_answer(sock))
            peak = max(peak, rss_mb(server))
        sock.sendall(
            head(server, content_type="application/json", extra=f"Content-Length: {50 * MB}\r\n")
        )
        for _ in range(50):
            sock.sendall(b"7" * MB)
        answers.append(read_answer(sock))
        peak = max(peak, rss_mb(server))
        refused = rss_mb(server)  # before the good request's own (scoring) allocations
        # The connection still serves a good request afterwards.
        good = json.dumps(infer_body()).encode()
        sock.sendall(
            head(server, content_type="application/json", extra=f"Content-Length: {len(good)}\r\n")
            + good
        )
        status, body = read_answer(sock)
        assert status == 200, body
    after = rss_mb(server)
    assert [status for status, _ in answers] == [413, 415, 415, 413]
    assert b"1048576 bytes" in answers[0][1] and b"application/json" in answers[1][1]
    growth = max(peak, refused) - before
    print(f"server RSS {before:.1f} MB -> peak {peak:.1f} MB, {refused:.1f} MB after the refused")
    print(f"bodies, {after:.1f} MB after a good request")
    # One buffered body would be 50 MB; allocator noise on a loaded machine is a few MB.
    assert growth < 10, f"RSS grew {growth:.1f} MB for 200 MB of refused bodies"


@pytest.mark.slow
def test_a_streamed_body_is_refused_before_it_ends(guarded_server: RunningServer) -> None:
    server = guarded_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            head(server, content_type="application/json", extra="Transfer-Encoding: chunked\r\n")
        )
        piece = 64 << 10
        for _ in range(2 * MB // piece):  # 2 MB sent, the body never terminated
            sock.sendall(b"%x\r\n%s\r\n" % (piece, b"7" * piece))
        status, body = read_answer(sock)
    assert status == 413 and b"over 1048576 bytes" in body


@pytest.mark.slow
def test_unload_is_gone_and_the_model_keeps_serving(guarded_server: RunningServer) -> None:
    url = guarded_server.url
    for action in ("unload", "load"):
        response = requests.post(
            f"{url}/v2/repository/models/preranking/{action}", headers=AUTH, timeout=5
        )
        assert response.status_code == 404, response.text
    openapi = requests.get(f"{url}/openapi.json", headers=AUTH, timeout=5).json()
    assert not [path for path in openapi["paths"] if "repository" in path]
    assert requests.get(f"{url}/v2/models/preranking/ready", headers=AUTH, timeout=5).ok
    response = requests.post(
        f"{url}{INFER}", json=infer_body("after-unload"), headers=AUTH, timeout=5
    )
    assert response.status_code == 200 and response.json()["id"] == "after-unload"


@pytest.mark.slow
def test_host_token_and_request_id_on_the_real_server(guarded_server: RunningServer) -> None:
    url = f"{guarded_server.url}{INFER}"
    assert requests.post(url, json=infer_body(), timeout=5).status_code == 401
    assert (
        requests.post(
            url, json=infer_body(), headers={**AUTH, "Host": "rebound.example"}, timeout=5
        ).status_code
        == 400
    )
    for bad in ("has space", "x" * 129, "<img src=x>"):
        response = requests.post(url, json=infer_body(bad), headers=AUTH, timeout=5)
        assert response.status_code == 400, response.text
        assert bad not in response.text
    # The probes answer without a token, as a kubelet asks.
    assert requests.get(f"{guarded_server.url}/v2/health/live", timeout=5).status_code == 200


def test_a_500_names_a_log_reference_not_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    secret = "/home/ops/.cascade/secrets/token.txt"

    async def broken(_body: bytes) -> bytes:
        raise RuntimeError(f"could not open {secret}")

    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise KeyError(secret)

    @app.post("/typed")
    async def typed(body: dict[str, int]) -> None:
        return None

    LocalRESTServer._add_exception_handlers(None, app)  # type: ignore[arg-type]
    fast = JsonInferRoutes(app, {INFER: broken})
    with TestClient(fast, raise_server_exceptions=False) as client:
        for response in (client.post(INFER, content=b"{}"), client.get("/boom")):
            assert response.status_code == 500
            assert secret not in response.text and "Error" not in response.text
            assert "internal error (ref " in response.json()["error"]
        # A schema mismatch names the field, not the input (FastAPI's default echoes it).
        echoed = client.post("/typed", json={"count": secret})
        assert echoed.status_code == 422 and secret not in echoed.text
        assert "body.count" in echoed.json()["error"]
    assert secret in caplog.text  # the cause is in the log, under the reference


FUZZ_EXAMPLES = 25
"""Generated requests per operation and mode (positive and negative) of the fuzz test."""


def fuzz_operation(
    server: RunningServer, session: requests.Session, operation: Any, statuses: list[int]
) -> None:
    """FUZZ_EXAMPLES schema-valid and as many schema-violating requests (where the operation
    has something to violate) to one operation; a 5xx fails with the request and the log."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis.generation import GenerationMode

    modes = [operation.as_strategy(GenerationMode.POSITIVE)]
    try:
        modes.append(operation.as_strategy(GenerationMode.NEGATIVE))
    except Exception:  # nothing to violate (no parameters, no body)
        pass

    @given(case=st.one_of(modes))
    @settings(
        max_examples=FUZZ_EXAMPLES * len(modes),
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def call(case: Any) -> None:
        response = case.call(base_url=server.url, session=session, headers=AUTH, timeout=10)
        statuses.append(response.status_code)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} answered {response.status_code}: "
            f"{response.text[:300]}\n{server.log()[-1500:]}"
        )

    call()


@pytest.mark.slow
def test_fuzz_every_route_of_the_servers_openapi(guarded_server: RunningServer) -> None:
    """Schemathesis requests, from the server's own OpenAPI document, for every operation in
    it (schema-valid and schema-violating): never a 5xx, the process alive, memory bounded."""
    import schemathesis

    server = guarded_server
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=AUTH, timeout=10)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v2/models/{model_name}/infer", "/v2/health/live"}
    session = requests.Session()
    seen: dict[str, list[int]] = {}
    before = rss_mb(server)
    started = time.monotonic()
    for operation in operations:
        statuses = seen.setdefault(f"{operation.method.upper()} {operation.path}", [])
        fuzz_operation(server, session, operation, statuses)
        assert server.proc.poll() is None, f"server died:\n{server.log()}"
    elapsed = time.monotonic() - started
    growth = rss_mb(server) - before
    total = sum(len(v) for v in seen.values())
    print(f"fuzz: {total} requests, {len(seen)} operations, {elapsed:.1f} s, RSS +{growth:.1f} MB")
    print({op: sorted(set(codes)) for op, codes in seen.items()})
    assert all(seen.values()), "an operation got no request"
    assert growth < 20, f"RSS grew {growth:.1f} MB over {total} fuzz requests"
    # Some infer requests got past the door to the model (not all refused by the guard).
    assert set(seen["POST /v2/models/{model_name}/infer"]) - {401, 413, 415}


def test_the_guard_policy_of_the_real_server_settings() -> None:
    from cascade.config import load_settings

    policy = GuardPolicy.from_settings(
        load_settings(
            {"CASCADE_SERVING_MAX_BODY_BYTES": "2048", "CASCADE_SERVING_MAX_CONCURRENT": "3"}
        ),
        route_body_bytes={"/v2/models/asr/infer": 16 * MB},
    )
    assert (policy.max_body_bytes, policy.max_concurrent, policy.token) == (2048, 3, None)
    assert policy.body_limit("/v2/models/asr/infer") == 16 * MB
    assert policy.body_limit(INFER) == 2048


def test_the_fast_and_the_logged_infer_routes_send_the_same_v2_answer() -> None:
    """A model's ``infer_v2`` answer goes out with its headers on both routes: the fast ASGI
    route and the app's own (used when requests are logged); the request headers come in."""
    from serving.server import add_v2_infer_route
    from serving.v2_codec import MalformedRequest, V2Answer

    seen: list[dict[bytes, bytes]] = []

    async def infer_v2(body: bytes, headers: Any) -> V2Answer:
        seen.append(dict(headers))
        if body == b"bad":
            raise MalformedRequest("not a v2 request")
        return V2Answer(b'{"outputs":[]}' + b"\x00\x00\x80?", json_length=14, timing=b"parse;dur=1")

    logged = FastAPI()
    add_v2_infer_route(logged, "preranking", infer_v2)
    fast = JsonInferRoutes(FastAPI(), {}, {INFER: infer_v2})
    for app in (fast, logged):
        with TestClient(app) as client:
            sent = {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": "9",
            }
            answer = client.post(INFER, content=b"x", headers=sent)
            assert answer.status_code == 200 and answer.content.endswith(b"\x00\x00\x80?")
            assert answer.headers["inference-header-content-length"] == "14"
            assert answer.headers["content-type"] == "application/octet-stream"
            assert answer.headers["server-timing"] == "parse;dur=1"
            assert seen[-1][b"inference-header-content-length"] == b"9"
            refused = client.post(INFER, content=b"bad", headers=sent)
            assert refused.status_code == 422 and "not a v2 request" in refused.json()["error"]
