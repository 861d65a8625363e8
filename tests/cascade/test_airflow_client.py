"""The REST client rides out a busy API server instead of failing the caller."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cascade.airflow_client import AirflowClient
from cascade.config import load_settings


class FlakyAirflow(BaseHTTPRequestHandler):
    failures_left = 2
    calls: list[str] = []

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.calls.append("token")
        self._reply(201, {"access_token": "t"})

    def do_GET(self) -> None:  # noqa: N802
        self.calls.append(self.path)
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            self._reply(503, {"detail": "busy"})
        elif self.path.startswith("/api/v2/dags/missing"):
            self._reply(404, {"detail": "no such dag"})
        else:
            self._reply(200, {"dag_runs": [{"dag_run_id": "r1", "state": "success"}]})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = HTTPServer(("127.0.0.1", 0), FlakyAirflow)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()


def client_for(port: int, monkeypatch: pytest.MonkeyPatch, attempts: int) -> AirflowClient:
    monkeypatch.setenv("CASCADE_AIRFLOW_PORT", str(port))
    return AirflowClient(load_settings(), password="pw", timeout_s=5, attempts=attempts)


def test_retries_5xx_then_succeeds(server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    FlakyAirflow.failures_left, FlakyAirflow.calls = 2, []
    client = client_for(server, monkeypatch, attempts=4)
    monkeypatch.setattr("cascade.airflow_client.time.sleep", lambda _s: None)
    assert client.dag_runs("ctr_preranking")[0]["dag_run_id"] == "r1"
    assert FlakyAirflow.calls.count("token") == 1
    assert len([c for c in FlakyAirflow.calls if c != "token"]) == 3


def test_gives_up_after_the_last_attempt_and_does_not_retry_4xx(
    server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import requests

    monkeypatch.setattr("cascade.airflow_client.time.sleep", lambda _s: None)
    FlakyAirflow.failures_left, FlakyAirflow.calls = 5, []
    with pytest.raises(requests.HTTPError, match="503"):
        client_for(server, monkeypatch, attempts=2).dag_runs("ctr_preranking")
    FlakyAirflow.failures_left, FlakyAirflow.calls = 0, []
    with pytest.raises(requests.HTTPError, match="404"):
        client_for(server, monkeypatch, attempts=3).get("/dags/missing")
    assert len([c for c in FlakyAirflow.calls if c != "token"]) == 1
