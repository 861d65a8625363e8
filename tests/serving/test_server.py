"""The real KServe ModelServer (subprocess) with fake registry/store: protocol, errors, hot swap."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import requests
import serving_fakes
from conftest import RunningServer, start_server

from serving.preranking_client import roll_out, score

pytestmark = pytest.mark.slow


def body(user_id: Any, item_ids: list[Any], request_id: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "inputs": [
            {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [user_id]},
            {"name": "item_ids", "datatype": "INT64", "shape": [len(item_ids)], "data": item_ids},
        ]
    }
    if request_id is not None:
        payload["id"] = request_id
    return payload


def post(server: RunningServer, payload: Any, **kwargs: Any) -> requests.Response:
    return requests.post(
        f"{server.url}/v2/models/preranking/infer", json=payload, timeout=10, **kwargs
    )


def test_scores_one_finite_probability_per_candidate(champion_server: RunningServer) -> None:
    candidates = [1, 2, 3, 150, 424_242]  # the last one is unknown to the store
    response = post(champion_server, body(3, candidates, request_id="abc"))
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["id"] == "abc"
    assert payload["parameters"]["model_version"] == "1"
    (output,) = payload["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("scores", "FP32", [5])
    assert len(output["data"]) == 5
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in output["data"])
    assert len(set(output["data"])) > 1  # candidates are told apart


def test_same_request_same_scores_and_a_generated_id(champion_server: RunningServer) -> None:
    first = post(champion_server, body(8, [5, 6, 7])).json()
    second = post(champion_server, body(8, [5, 6, 7])).json()
    assert first["outputs"][0]["data"] == second["outputs"][0]["data"]
    assert first["id"] and second["id"] and first["id"] != second["id"]


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"inputs": [body(1, [1])["inputs"][0]]}, 400, "missing input 'item_ids'"),
        (body(1, [1.5, 2]), 400, "ids must be integers"),
        (body(1, []), 400, "'item_ids' is empty"),
        (body(1, list(range(2_001))), 400, "at most 2000"),
        (
            {
                "inputs": [
                    {**body(1, [1])["inputs"][0], "datatype": "FP32"},
                    body(1, [1])["inputs"][1],
                ]
            },
            400,
            "datatype FP32",
        ),
        (
            {"inputs": [{**body(1, [1])["inputs"][0], "shape": [1, 1]}, body(1, [1])["inputs"][1]]},
            400,
            "one-dimensional",
        ),
        ({"inputs": 5}, 422, "list"),
        ({"id": "x"}, 422, "inputs"),
    ],
)
def test_malformed_requests_get_4xx_naming_the_problem(
    champion_server: RunningServer, payload: Any, status: int, message: str
) -> None:
    response = post(champion_server, payload)
    assert response.status_code == status, response.text
    assert message in response.text


def test_invalid_json_gets_4xx(champion_server: RunningServer) -> None:
    response = requests.post(
        f"{champion_server.url}/v2/models/preranking/infer",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert 400 <= response.status_code < 500


def test_binds_loopback_only(champion_server: RunningServer) -> None:
    listening = [
        c.laddr
        for c in psutil.Process(champion_server.proc.pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", champion_server.port)]


def test_client_and_roll_out_against_the_server(champion_server: RunningServer) -> None:
    scored = score(3, [1, 2, 3], settings=champion_server.settings)
    assert scored["model_version"] == "1" and len(scored["scores"]) == 3
    # The binary tensor extension over HTTP: the same scores, bit for bit, as JSON's.
    binary = score(3, [1, 2, 3], settings=champion_server.settings, binary=True)
    as_fp32 = [np.float32(s) for s in scored["scores"]]  # JSON: each FP32's shortest decimal
    assert [np.float32(s) for s in binary["scores"]] == as_fp32
    assert binary["model_version"] == "1"
    infer = f"{champion_server.url}/v2/models/preranking/infer"
    unprofiled = requests.post(infer, json=body(3, [1]), timeout=10)
    assert "server-timing" not in unprofiled.headers  # off unless CASCADE_SERVING_PROFILE=1
    headerless = requests.post(
        infer, data=b"{}", headers={"Content-Type": "application/octet-stream"}, timeout=10
    )
    assert headerless.status_code == 400
    assert "inference-header-content-length" in headerless.json()["error"]
    done = roll_out("2026-11-22", settings=champion_server.settings, champion_version=lambda s: "1")
    assert done["served_version"] == done["champion_version"] == "1"
    assert done["url"].startswith(champion_server.url)
    with pytest.raises(TimeoutError, match="champion is '7'"):
        roll_out(
            "2026-11-22",
            settings=champion_server.settings,
            champion_version=lambda s: "7",
            timeout_s=0.5,
            poll_s=0.1,
        )
    with pytest.raises(RuntimeError, match="no champion"):
        roll_out("2026-11-22", settings=champion_server.settings, champion_version=lambda s: None)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        roll_out("yesterday", settings=champion_server.settings, champion_version=lambda s: "1")


def test_latency_of_one_user_by_1000_candidates(champion_server: RunningServer) -> None:
    payload = body(3, list(range(1, 1001)))
    latencies = []
    with requests.Session() as session:
        for _ in range(40):
            t0 = time.perf_counter()
            response = session.post(
                f"{champion_server.url}/v2/models/preranking/infer", json=payload, timeout=10
            )
            latencies.append(time.perf_counter() - t0)
            assert response.status_code == 200
    p50 = statistics.median(latencies[5:]) * 1000
    print(
        f"p50 latency 1 user x 1000 candidates: {p50:.1f} ms "
        f"(server startup {champion_server.started_s:.1f} s)"
    )
    assert p50 < 500, f"p50 {p50:.0f} ms"


def test_not_ready_then_champion_then_hot_swap_without_restart(tmp_path: Path) -> None:
    server = start_server(tmp_path, poll_s=0.2)
    try:
        ready_url = f"{server.url}/v2/models/preranking/ready"
        assert requests.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
        assert requests.get(ready_url, timeout=5).status_code == 503
        not_ready = post(server, body(1, [1, 2]))
        assert not_ready.status_code == 503 and "not ready" in not_ready.text

        serving_fakes.write_champion(server.champion_file, "1", seed=1)
        first = roll_out(
            "2026-11-22", settings=server.settings, champion_version=lambda s: "1", timeout_s=20
        )
        assert first["served_version"] == "1"
        v1 = post(server, body(4, [1, 2, 3])).json()

        serving_fakes.write_champion(server.champion_file, "2", seed=2)
        second = roll_out(
            "2026-11-23", settings=server.settings, champion_version=lambda s: "2", timeout_s=20
        )
        assert second["served_version"] == "2"
        v2 = post(server, body(4, [1, 2, 3])).json()
        assert (v1["parameters"]["model_version"], v2["parameters"]["model_version"]) == ("1", "2")
        assert v1["outputs"][0]["data"] != v2["outputs"][0]["data"]
        assert server.proc.poll() is None  # same process: no restart
    finally:
        exit_s = server.stop()
    assert server.proc.returncode is not None
    assert exit_s < 15, f"took {exit_s:.1f}s to stop on SIGTERM"


def test_two_workers_share_one_port_and_stop_together(tmp_path: Path) -> None:
    serving_fakes.write_champion(tmp_path / "champion.json", "1", seed=1)
    server = start_server(tmp_path, workers=2)
    try:
        workers = psutil.Process(server.proc.pid).children()
        assert len(workers) == 2, server.log()
        _wait_ready(server)
        for n in range(20):
            response = post(server, body(n + 1, [1, 2, 3]))
            assert response.status_code == 200, response.text
        assert post(server, body(1, [])).status_code == 400
        listening = [
            (c.laddr.ip, c.laddr.port)
            for process in [psutil.Process(server.proc.pid), *workers]
            for c in process.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        # One listening socket, inherited by both workers, on the loopback port only.
        assert listening == [("127.0.0.1", server.port)] * 2
    finally:
        exit_s = server.stop()
    assert exit_s < 15, f"took {exit_s:.1f}s to stop on SIGTERM"
    assert not any(w.is_running() for w in workers)


def _wait_ready(server: RunningServer, in_a_row: int = 10) -> None:
    deadline = time.monotonic() + 30
    ready = 0
    while ready < in_a_row and time.monotonic() < deadline:
        # A new connection each time, accepted by either worker.
        answer = requests.get(f"{server.url}/v2/models/preranking/ready", timeout=5)
        ready = ready + 1 if answer.status_code == 200 else 0
        time.sleep(0.05)
    assert ready >= in_a_row, server.log()


def test_two_workers_split_keep_alive_clients_evenly(tmp_path: Path) -> None:
    """Eight keep-alive clients are held four by each worker: with one socket per worker
    (SO_REUSEPORT) the kernel's hash split them unevenly most of the time."""
    serving_fakes.write_champion(tmp_path / "champion.json", "1", seed=1)
    server = start_server(tmp_path, workers=2)
    sessions = [requests.Session() for _ in range(8)]
    try:
        _wait_ready(server)
        for n, session in enumerate(sessions):  # opened one after the other, each kept open
            answer = session.post(
                f"{server.url}/v2/models/preranking/infer", json=body(n + 1, [1, 2]), timeout=10
            )
            assert answer.status_code == 200, answer.text
        workers = psutil.Process(server.proc.pid).children()
        held = sorted(
            sum(
                1
                for c in worker.net_connections(kind="tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == server.port
            )
            for worker in workers
        )
        assert held == [4, 4], server.log()
    finally:
        for session in sessions:
            session.close()
        server.stop()
    assert server.proc.returncode == 0, server.log()  # a clean stop, not a worker's exit 1


def test_every_scored_candidate_is_in_the_lake_after_sigterm(tmp_path: Path) -> None:
    """Feedback is logged by default; buffered rows and open part files are written and
    published when the server stops, by every worker."""
    import pandas as pd

    from serving.feedback_read import with_item_features, with_request_features

    serving_fakes.write_champion(tmp_path / "champion.json", "1", seed=1)
    server = start_server(tmp_path, workers=2)
    try:
        _wait_ready(server)
        with requests.Session() as first, requests.Session() as second:
            for n in range(60):
                session = first if n % 2 else second
                answer = session.post(
                    f"{server.url}/v2/models/preranking/infer",
                    json=body(n % 11 + 1, list(range(1, 51)), request_id=f"fb-{n}"),
                    timeout=10,
                )
                assert answer.status_code == 200, answer.text
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()
    lake = tmp_path / "home" / "lake" / "feedback"
    raw = pd.concat([pd.read_parquet(p) for p in lake.rglob("part-*.parquet")])
    assert len(raw) == 60 * 50
    assert not list(lake.rglob("*.tmp"))
    # The request's columns and the user's features: one request row per request, published
    # with the candidates.
    asked = pd.concat(
        pd.read_parquet(p) for p in (lake.parent / "feedback_requests").rglob("part-*.parquet")
    )
    assert sorted(asked.request_id) == sorted(raw.request_id.unique())
    assert (asked.candidates == 50).all()
    frame = with_request_features(raw, asked)
    assert len(frame) == 60 * 50
    # Rows carry the server's own request ids; the client's is kept beside them, untrusted.
    assert frame.groupby("client_request_id").size().to_dict() == {f"fb-{n}": 50 for n in range(60)}
    assert (
        frame.groupby("request_id").size().to_dict()
        == {rid: 50 for rid in frame.request_id.unique()}
        and frame.request_id.nunique() == 60
    )
    # Both workers logged the same item table: one snapshot, joined back on every row.
    (snapshot,) = (tmp_path / "home" / "lake" / "feedback_items").rglob("*.parquet")
    assert frame.item_snapshot.unique().tolist() == [snapshot.stem]
    frame = with_item_features(frame, tmp_path / "home" / "lake")
    for name in serving_fakes.USER_FIELDS:  # as read from the store: NaN for ABSENT_USER
        want = [serving_fakes.user_value(name, u) for u in frame.user_id]
        pd.testing.assert_series_equal(
            frame[name].reset_index(drop=True), pd.Series(want, name=name), check_dtype=False
        )
    assert frame.genre.notna().all()
