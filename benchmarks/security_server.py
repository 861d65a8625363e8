"""The security benchmark's attacks on a running model server (:mod:`benchmarks.security`):
oversized and slowly sent bodies against the guard's limits and deadlines, and the schemathesis
fuzzer over the server's OpenAPI document, with well-formed requests beside the malformed ones
(:mod:`benchmarks.security_fuzz`)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections import Counter
from typing import Any

from benchmarks import security_fuzz as fuzz_cases

MB = 1 << 20
BODY_LIMIT = MB
INFER = "/v2/models/preranking/infer"


class RawHttp:
    """One keep-alive connection for bodies no HTTP client library would send."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)

    def close(self) -> None:
        self.sock.close()

    def start(self, content_type: str, framing: str) -> None:
        self.sock.sendall(
            (
                f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Authorization: Bearer {self.token}\r\nContent-Type: {content_type}\r\n"
                f"{framing}\r\n\r\n"
            ).encode()
        )

    def chunked(self, total: int, piece: int = 256 << 10) -> None:
        frame = b"%x\r\n%s\r\n" % (piece, b"7" * piece)
        for _ in range(total // piece):
            self.sock.sendall(frame)
        self.sock.sendall(b"0\r\n\r\n")

    def raw(self, total: int) -> None:
        block = b"7" * MB
        for _ in range(total // MB):
            self.sock.sendall(block)

    def answer(self) -> tuple[int, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            got = self.sock.recv(65536)
            if not got:
                raise ConnectionError(f"the server closed the connection after {data[:200]!r}")
            data += got
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(body) < length:
            body += self.sock.recv(65536)
        return int(lines[0].split()[1]), body[:length]


def server_rss_mb(pid: int) -> float:
    import psutil

    parent = psutil.Process(pid)
    total = 0
    for process in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total / MB


def oversize_bodies(port: int, token: str, pid: int, *, body_mb: int) -> dict[str, Any]:
    """Bodies far past the limit, chunked and with a Content-Length, and chunked bodies of the
    wrong type, on one connection: their statuses and the server's RSS growth."""
    kinds = [
        ("application/json", "Transfer-Encoding: chunked", "chunked"),
        ("text/plain", "Transfer-Encoding: chunked", "chunked"),
        ("application/x-www-form-urlencoded", "Transfer-Encoding: chunked", "chunked"),
        ("application/json", f"Content-Length: {body_mb * MB}", "raw"),
    ]
    http = RawHttp(port, token)
    try:

        def send(content_type: str, framing: str, how: str, size: int) -> int:
            http.start(content_type, framing)
            (http.chunked if how == "chunked" else http.raw)(size)
            return http.answer()[0]

        # One of each first (the allocator's pools, each path's first use), then measure.
        warm = [send(t, f.replace(str(body_mb * MB), str(2 * MB)), h, 2 * MB) for t, f, h in kinds]
        before = peak = server_rss_mb(pid)
        statuses = []
        for content_type, framing, how in kinds:
            statuses.append(send(content_type, framing, how, body_mb * MB))
            peak = max(peak, server_rss_mb(pid))
        good = json.dumps(
            {
                "inputs": [
                    {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [3]},
                    {"name": "item_ids", "datatype": "INT64", "shape": [3], "data": [1, 2, 3]},
                ]
            }
        ).encode()
        http.start("application/json", f"Content-Length: {len(good)}")
        http.sock.sendall(good)
        after_status, _ = http.answer()
    finally:
        http.close()
    after = server_rss_mb(pid)
    return {
        "oversize_rss_growth_mb": round(max(peak, after) - before, 2),
        "oversize_statuses": statuses,
        "oversize_warmup_statuses": warm,
        "oversize_body_mb": body_mb,
        "oversize_bodies": len(kinds),
        "server_rss_mb_before": round(before, 1),
        "good_request_after_status": after_status,
    }


def fuzz_server(
    url: str,
    token: str,
    *,
    per_operation: int,
    budget_s: float,
    limits: fuzz_cases.ServedLimits | None = None,
) -> dict[str, Any]:
    """Schemathesis over every operation of the server's OpenAPI document (schema-valid and,
    where there is something to violate, schema-violating requests), within ``budget_s``; with
    ``limits``, also ``per_operation`` well-formed requests to the pre-ranker's infer route
    (:func:`benchmarks.security_fuzz.valid_infer_bodies`, shaped by the same document), which
    must reach scoring (``fuzz_infer_2xx``)."""
    import requests
    import schemathesis
    from schemathesis.generation import GenerationMode

    headers = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers, timeout=10)
    document = requests.get(f"{url}/openapi.json", headers=headers, timeout=10).json()
    operations = [result.ok() for result in schema.get_all_operations()]
    session = requests.Session()
    statuses: dict[str, Counter[int]] = {}
    failures: list[str] = []
    deadline = time.monotonic() + budget_s
    started = time.monotonic()
    for operation in operations:
        seen = statuses.setdefault(f"{operation.method.upper()} {operation.path}", Counter())
        modes = [operation.as_strategy(GenerationMode.POSITIVE)]
        with contextlib.suppress(Exception):  # nothing to violate (no parameters, no body)
            modes.append(operation.as_strategy(GenerationMode.NEGATIVE))
        # The budget is shared: each operation gets its share of what is left.
        share = max(0.0, deadline - time.monotonic()) / max(1, len(operations) - len(statuses) + 1)
        stop_at = time.monotonic() + share

        _fuzz_operation(
            modes, per_operation, url, session, headers, seen, failures, stop_at=stop_at
        )
    valid: Counter[int] = Counter()
    if limits is not None:
        bodies = fuzz_cases.valid_infer_bodies(limits, fuzz_cases.infer_tensor_fields(document))
        _send_valid(bodies, per_operation, f"{url}{INFER}", session, headers, valid, failures)
        infer_ops = [op for op in statuses if op.endswith(fuzz_cases.INFER_SUFFIX)]
        statuses.setdefault(infer_ops[0] if infer_ops else f"POST {INFER}", Counter()).update(valid)
    requests_sent = sum(sum(c.values()) for c in statuses.values())
    return {
        "fuzz_requests": requests_sent,
        "fuzz_5xx": sum(n for c in statuses.values() for code, n in c.items() if code >= 500),
        "fuzz_infer_2xx": fuzz_cases.infer_2xx(statuses),
        "fuzz_valid_requests": sum(valid.values()),
        "fuzz_valid_statuses": dict(sorted(valid.items())),
        "fuzz_operations": len(operations),
        "fuzz_operations_without_requests": sorted(op for op, c in statuses.items() if not c),
        "fuzz_statuses": {op: dict(sorted(c.items())) for op, c in statuses.items()},
        "fuzz_s": round(time.monotonic() - started, 1),
        "fuzz_per_operation": per_operation,
        "fuzz_budget_s": budget_s,
        "fuzz_failures": failures,
    }


def _derandomized(examples: int) -> Any:
    """Hypothesis settings of the fuzzer: ``examples`` examples, the same on every run."""
    from hypothesis import HealthCheck, Phase
    from hypothesis import settings as hsettings

    return hsettings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def _fuzz_operation(
    modes: list[Any],
    per_operation: int,
    url: str,
    session: Any,
    headers: dict[str, str],
    seen: Counter[int],
    failures: list[str],
    *,
    stop_at: float,
) -> None:
    """Up to ``per_operation`` requests per mode of one operation, until ``stop_at``."""
    import requests
    from hypothesis import given
    from hypothesis import strategies as st

    @given(case=st.one_of(modes))
    @_derandomized(per_operation * len(modes))
    def call(case: Any) -> None:
        if time.monotonic() > stop_at and seen:
            return
        try:
            response = case.call(base_url=url, session=session, headers=headers, timeout=10)
        except requests.RequestException as exc:
            seen[599] += 1  # no answer at all counts as a server failure
            failures.append(f"{case.method} {case.formatted_path}: {exc}")
            return
        seen[response.status_code] += 1
        if response.status_code >= 500 and len(failures) < 5:
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: "
                f"{response.text[:200]}"
            )

    call()


def _send_valid(
    bodies: Any,
    count: int,
    url: str,
    session: Any,
    headers: dict[str, str],
    seen: Counter[int],
    failures: list[str],
) -> None:
    """``count`` well-formed bodies posted to ``url``, their statuses counted in ``seen``."""
    import requests
    from hypothesis import given

    @given(body=bodies)
    @_derandomized(count)
    def call(body: bytes) -> None:
        try:
            response = session.post(
                url,
                data=body,
                headers={**headers, "Content-Type": "application/json"},
                timeout=10,
            )
        except requests.RequestException as exc:
            seen[599] += 1
            failures.append(f"POST {url} (well-formed): {exc}")
            return
        seen[response.status_code] += 1
        if response.status_code != 200 and len(failures) < 5:
            failures.append(
                f"POST {url} (well-formed) -> {response.status_code}: {response.text[:200]}"
            )

    call()


def served_version(url: str, token: str) -> str | None:
    import requests

    response = requests.post(
        f"{url}{INFER}",
        json={
            "inputs": [
                {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [3]},
                {"name": "item_ids", "datatype": "INT64", "shape": [2], "data": [1, 2]},
            ]
        },
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    if response.status_code != 200:
        return None
    return str(response.json().get("parameters", {}).get("model_version"))


# --- the registry -------------------------------------------------------------------------------
