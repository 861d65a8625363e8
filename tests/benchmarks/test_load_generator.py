"""The load generator's requests, answer checks and load modes (against a stand-in server)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np
import orjson
import pytest

from benchmarks.load_generator import (
    RequestMaker,
    ServerCpu,
    check_response,
    generate,
    request_bodies,
)


def test_request_bodies_are_id_only_v2_requests_with_distinct_candidates() -> None:
    bodies = request_bodies([1, 2, 3], list(range(100)), candidates=40, count=5, seed=1)
    assert len(bodies) == 5
    first = orjson.loads(bodies[0])
    user, items = first["inputs"]
    assert (user["name"], user["datatype"], user["shape"]) == ("user_id", "INT64", [1])
    assert user["data"][0] in (1, 2, 3)
    assert (items["name"], items["shape"]) == ("item_ids", [40])
    assert len(set(items["data"])) == 40 and set(items["data"]) <= set(range(100))
    assert len({b for b in bodies}) == 5  # a pool of different requests
    assert bodies == request_bodies([1, 2, 3], list(range(100)), candidates=40, count=5, seed=1)
    with pytest.raises(ValueError, match="only 10 item ids"):
        request_bodies([1], list(range(10)), candidates=11, count=1, seed=0)


def test_check_response_accepts_only_one_finite_score_per_candidate() -> None:
    good = orjson.dumps({"outputs": [{"name": "scores", "data": [0.1, 0.9]}]})
    assert check_response(200, good, 2) is None
    assert "HTTP 400" in (check_response(400, b'{"error": "x"}', 2) or "")
    assert "expected 3" in (check_response(200, good, 3) or "")
    assert "unreadable" in (check_response(200, b"{}", 2) or "")
    nan = b'{"outputs": [{"data": [0.1, NaN]}]}'
    assert check_response(200, nan, 2) is not None


def test_request_maker_draws_and_encodes_each_request_when_called() -> None:
    make = RequestMaker([7], list(range(1, 51)), candidates=50, seed=(3, 0))
    first, second = orjson.loads(make()), orjson.loads(make())
    assert (first["id"], second["id"]) == ("load-1", "load-2")
    assert sorted(first["inputs"][1]["data"]) == list(range(1, 51))  # all distinct, as ints
    assert first["inputs"][1]["data"] != second["inputs"][1]["data"]  # drawn anew per request
    assert first["inputs"][0]["data"] == [7]


async def _scoring_server(delay_s: float) -> asyncio.Server:
    """A stand-in model server: answers each request with one score per candidate, after
    ``delay_s``, and serves requests on different connections concurrently."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).lower()
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                timing = b"server-timing: parse;dur=0.1, parse-cpu;dur=0.05, score;dur=0.2"
                if b"inference-header-content-length: " in head:  # binary in, binary out
                    size = int(head.split(b"inference-header-content-length: ")[1].split(b"\r")[0])
                    count = len(body[size:]) // 8 - 1  # the user id, then the item ids
                    header = orjson.dumps(
                        {
                            "outputs": [
                                {
                                    "name": "scores",
                                    "datatype": "FP32",
                                    "shape": [count],
                                    "parameters": {"binary_data_size": 4 * count},
                                }
                            ]
                        }
                    )
                    body = header + np.full(count, 0.5, dtype="<f4").tobytes()
                    extra = b"inference-header-content-length: %d\r\n%s" % (len(header), timing)
                else:
                    scores = [0.5] * len(orjson.loads(body)["inputs"][1]["data"])
                    body = orjson.dumps({"outputs": [{"name": "scores", "data": scores}]})
                    extra = timing
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n\r\n%s"
                    % (len(body), extra, body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _load(delay_s: float, **kwargs: Any) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        server = await _scoring_server(delay_s)
        port = server.sockets[0].getsockname()[1]
        clients = kwargs.pop("clients", 1)
        binary = kwargs.pop("binary", False)
        makers = [
            RequestMaker([1, 2], list(range(20)), candidates=5, seed=i, binary=binary)
            for i in range(clients)
        ]
        async with server:
            return await generate(
                f"http://127.0.0.1:{port}", makers, clients=clients, candidates=5, **kwargs
            )

    return asyncio.run(main())


def test_open_loop_sends_on_schedule_while_answers_are_slow() -> None:
    # 100 ms answers: one closed-loop client would manage 10/s; the open loop keeps 40/s.
    result = _load(0.1, rate=40.0, seconds=0.75, warmup_seconds=0.25, server_pid=os.getpid())
    assert result["mode"] == "open" and result["errors"] == 0
    assert 28 <= result["requests"] <= 31  # the sends scheduled in the window, none held back
    assert result["achieved_rps"] > 15 and result["max_in_flight"] >= 3
    assert result["p50_ms"] >= 100 and result["rate_rps"] == 40.0
    # The warm-up's sends were answered too (feedback), but are not in the figures.
    assert result["answered_total"] > result["requests"]
    assert result["server_cpu_s"] >= 0 and "server_cpu_ms_per_request" in result
    assert 0 <= result["cpu_busy_fraction"] < 4
    # Enough connections: the server keeps up, the latency does not grow over the window.
    assert result["latency_growth"] < 1.5


def test_open_loop_latency_runs_from_the_scheduled_time() -> None:
    # One connection, 50 ms answers, 40 requests/s offered: the queue grows, and each request's
    # latency includes its wait to go out (coordinated omission would report ~50 ms).
    result = _load(0.05, rate=40.0, seconds=1.0, warmup_seconds=0.0, max_connections=1)
    assert result["errors"] == 0 and result["max_in_flight"] == 1
    assert result["late_sends"] > result["requests"] / 2
    assert result["p99_ms"] > 300 and result["max_ms"] >= result["p99_ms"]
    # The queue builds over the window: the last answers waited far longer than the first.
    assert result["latency_growth"] > 3


def test_closed_loop_clients_wait_for_their_answers() -> None:
    result = _load(0.05, clients=2, seconds=0.5, warmup_seconds=0.1)
    assert result["mode"] == "closed" and result["errors"] == 0
    assert result["p50_ms"] >= 50
    # Two clients, 50 ms each answer: at most ~40 requests/s, whatever the machine.
    assert 0 < result["rps"] <= 42 and "server_cpu_s" not in result


def test_server_cpu_is_the_window_difference_per_process() -> None:
    before, after = {1: 2.0, 2: 1.0}, {1: 2.5, 2: 1.25, 3: 0.5}
    assert ServerCpu.spent(before, after) == 1.25  # a process started in between: all of it
    assert ServerCpu(None).sample() == {}
    assert os.getpid() in ServerCpu(os.getpid()).sample()


def test_binary_requests_and_the_servers_stage_timings_are_tallied() -> None:
    for binary in (False, True):
        result = _load(0.01, clients=2, seconds=0.3, warmup_seconds=0.05, binary=binary)
        assert result["errors"] == 0 and result["binary"] is binary
        stages = result["stage_ms"]
        assert set(stages) == {"parse", "score", "in_handler"}
        assert stages["parse"] == {"median": 0.1, "p99": pytest.approx(0.1)}
        assert stages["in_handler"]["median"] == pytest.approx(0.3)
        # A stage without a CPU figure counts none; the profiled answers are the measured ones.
        assert result["stage_cpu_ms"] == {"parse": 0.05, "score": 0.0, "in_handler": 0.05}
        assert result["profiled_requests"] == result["requests"] > 0
        assert result["load_generator_cpu_ms_per_request"] > 0


def test_a_binary_answer_must_carry_one_finite_score_per_candidate() -> None:
    header = orjson.dumps(
        {"outputs": [{"name": "scores", "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}
    )
    good = header + np.array([0.1, 0.9], dtype="<f4").tobytes()
    assert check_response(200, good, 2, len(header)) is None
    assert "expected 3" in (check_response(200, good, 3, len(header)) or "")
    nan = header + np.array([0.1, np.nan], dtype="<f4").tobytes()
    assert "finite" in (check_response(200, nan, 2, len(header)) or "")
    assert "unreadable" in (check_response(200, good, 2, 3) or "")
