"""Load generator for the pre-ranking server: closed-loop clients or an open-loop arrival rate.

    python -m benchmarks.load_generator --url http://127.0.0.1:28081 --ids ids.json \\
        --clients 8 --candidates 1000 --seconds 30 --warmup-seconds 5 --out load.json
    python -m benchmarks.load_generator ... --rate 400 --server-pid 1234 --out open.json

``ids.json`` is ``{"users": [...], "items": [...]}``: each request asks for one random user and
``--candidates`` distinct random items, drawn and encoded when the request is sent, inside the
timed path (:class:`RequestMaker`), as a client building its request would.

Closed loop (default): ``--clients`` clients, each on one keep-alive HTTP/1.1 connection, send
their next request as soon as the previous answer has been read in full and checked (status
200, one finite score per candidate); latency runs from just before the request is built.

Open loop (``--rate R``): requests are scheduled every ``1/R`` seconds and each is sent at its
time whatever the earlier ones are doing, on a pool of keep-alive connections that grows as
requests are in flight (at most ``--max-connections``), so a slow answer never holds back the
next send. Latency runs from the *scheduled* send time, so time a request spent waiting to go
out counts (no coordinated omission); a send that went out more than ``LATE_SEND_MS`` after
its time is counted in ``late_sends``.

Requests scheduled (or started) during the warm-up are not counted. With ``--server-pid``, the
CPU time of that process and its children is sampled at the start and the end of the measured
window, so ``server_cpu_ms_per_request`` covers the window only, and ``cpu_busy_fraction`` is
the server's and this process's CPU over the cores' time in the window (near 1: the machine
is saturated, whatever the server's code does).

It runs in its own process, apart from the server, so the client's CPU time is not the
server's; a raw asyncio HTTP/1.1 client keeps that CPU time small on a 2-core machine, where
every cycle the client spends is one the server cannot. The result (JSON) holds ``p50_ms``,
``p90_ms``, ``p99_ms``, ``rps``, ``errors`` and the setup (and, open loop, ``rate_rps``,
``achieved_rps``, ``late_sends``, ``latency_growth``: the median latency of the window's last
fifth of answers over its first fifth's, ~1 when the server keeps up, growing when the rate
is more than it answers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import statistics
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import orjson

from benchmarks.provenance import usable_cpus
from serving.request_profile import parse_server_timing

MODEL_PATH = "/v2/models/preranking/infer"
IN_HANDLER = "in_handler"
"""``stage_ms`` and ``stage_cpu_ms``'s entry for all the stages of a request added up."""
LATE_SEND_MS = 5.0
"""An open-loop send this much after its scheduled time counts as late."""
T = TypeVar("T")


@dataclass
class Tally:
    """What the clients saw during the measured window."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    status: dict[str, int] = field(default_factory=dict)
    answered: int = 0
    """Good answers (HTTP 200, checked) over the whole run, warm-up included: each one is a
    request the server scored, and logged as feedback."""
    late_sends: int = 0
    """Open loop: measured requests sent more than ``LATE_SEND_MS`` after their time."""
    stages: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Per stage of the server's ``Server-Timing`` (when it profiles): ``(wall ms, cpu ms)``
    of each measured good answer."""

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(message[:300])

    def count(
        self,
        *,
        measured: bool,
        status: int,
        problem: str | None,
        elapsed: float,
        timing: str | None = None,
    ) -> None:
        """One finished request; only ``measured`` ones (not warm-up) enter the figures.
        ``timing``: the answer's ``Server-Timing`` value, if any."""
        if problem is None:
            self.answered += 1
        if not measured:
            return
        self.status[str(status)] = self.status.get(str(status), 0) + 1
        if problem is None:
            self.latencies.append(elapsed)
            if timing:
                for stage, laps in parse_server_timing(timing).items():
                    self.stages.setdefault(stage, []).append(laps)
        else:
            self.error(problem)

    def stage_figures(self) -> dict[str, Any]:
        """``stage_ms`` (per stage: median and p99 wall ms), ``stage_cpu_ms`` (per stage: median
        CPU ms), both with ``in_handler``, the stages of one request added up, and
        ``profiled_requests``; empty when the server sent no ``Server-Timing``."""
        if not self.stages:
            return {}
        wall = {stage: np.asarray([w for w, _ in laps]) for stage, laps in self.stages.items()}
        cpu = {stage: np.asarray([c for _, c in laps]) for stage, laps in self.stages.items()}
        counts = {len(laps) for laps in self.stages.values()}
        if len(counts) == 1:  # every answer named every stage: their sums are per request
            wall[IN_HANDLER] = sum(wall.values())  # type: ignore[assignment]
            cpu[IN_HANDLER] = sum(cpu.values())  # type: ignore[assignment]
        return {
            "stage_ms": {
                stage: {
                    "median": float(np.median(values)),
                    "p99": float(np.percentile(values, 99)),
                }
                for stage, values in wall.items()
            },
            "stage_cpu_ms": {stage: float(np.median(values)) for stage, values in cpu.items()},
            "profiled_requests": max(counts),
        }


class RequestMaker:
    """Draws and encodes one v2 request per call: one random user, ``candidates`` distinct
    random items (a client's work per request, done while it is timed)."""

    def __init__(
        self,
        users: Sequence[int],
        items: Sequence[int],
        *,
        candidates: int,
        seed: Any,
        binary: bool = False,
    ) -> None:
        if candidates > len(items):
            raise ValueError(
                f"{candidates} candidates per request, but only {len(items)} item ids to draw from"
            )
        if not users:
            raise ValueError("no user ids to draw requests from")
        self.users = np.asarray(users, dtype=np.int64)
        self.items = np.asarray(items, dtype=np.int64)
        self.candidates = candidates
        self.rng = np.random.default_rng(seed)
        self.made = 0
        self.binary = binary
        """Send the ids as raw INT64 bytes and ask for the scores as raw FP32 bytes (the v2
        binary tensor extension), instead of JSON."""

    def __call__(self) -> bytes:
        return self.encode()[1]

    def encode(self) -> tuple[bytes, bytes]:
        """``(extra request header lines, body)`` of the next request."""
        user = int(self.users[self.rng.integers(len(self.users))])
        chosen = self.rng.choice(self.items, self.candidates, replace=False)
        self.made += 1
        if self.binary:
            header = orjson.dumps(
                {
                    "id": f"load-{self.made}",
                    "inputs": [
                        {
                            "name": "user_id",
                            "datatype": "INT64",
                            "shape": [1],
                            "parameters": {"binary_data_size": 8},
                        },
                        {
                            "name": "item_ids",
                            "datatype": "INT64",
                            "shape": [self.candidates],
                            "parameters": {"binary_data_size": 8 * self.candidates},
                        },
                    ],
                    "parameters": {"binary_data_output": True},
                }
            )
            ids = np.empty(self.candidates + 1, dtype="<i8")
            ids[0], ids[1:] = user, chosen
            extra = b"Inference-Header-Content-Length: %d\r\n" % len(header)
            return extra, header + ids.tobytes()
        return b"", orjson.dumps(
            {
                "id": f"load-{self.made}",
                "inputs": [
                    {"name": "user_id", "datatype": "INT64", "shape": [1], "data": [user]},
                    {
                        "name": "item_ids",
                        "datatype": "INT64",
                        "shape": [self.candidates],
                        "data": chosen,
                    },
                ],
            },
            option=orjson.OPT_SERIALIZE_NUMPY,
        )


def request_bodies(
    users: list[int], items: list[int], *, candidates: int, count: int, seed: int
) -> list[bytes]:
    """``count`` requests as :class:`RequestMaker` draws them (for inspection and tests)."""
    make = RequestMaker(users, items, candidates=candidates, seed=seed)
    return [make() for _ in range(count)]


def check_response(
    status: int, body: bytes, candidates: int, json_length: int | None = None
) -> str | None:
    """None for a good answer, else what is wrong with it. ``json_length``: the answer's
    ``Inference-Header-Content-Length`` (scores as raw FP32 bytes after a JSON header)."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
    if json_length is not None:
        return _check_binary(body, candidates, json_length)
    try:
        payload = orjson.loads(body)
        scores = payload["outputs"][0]["data"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        return f"unreadable response ({type(exc).__name__}): {body[:200]!r}"
    # All floats, and finite: a NaN or an infinity anywhere makes the sum non-finite. (Both
    # at C speed: a Python loop over the 1,000 scores was a sixth of the client's CPU time,
    # time the server, on the same cores, did not get.)
    if (
        not isinstance(scores, list)
        or len(scores) != candidates
        or set(map(type, scores)) != {float}
        or not math.isfinite(sum(scores))
    ):
        return f"expected {candidates} finite scores, got {len(scores)}"
    return None


def _check_binary(body: bytes, candidates: int, json_length: int) -> str | None:
    try:
        header = orjson.loads(body[:json_length])
        (output,) = header["outputs"]
        size = output["parameters"]["binary_data_size"]
    except (orjson.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
        return f"unreadable binary response ({type(exc).__name__}): {body[:200]!r}"
    fits = size == 4 * candidates and len(body) == json_length + size
    if output.get("datatype") != "FP32" or not fits:
        return f"expected {candidates} FP32 scores after the header, got {size} bytes"
    scores = np.frombuffer(body, dtype="<f4", count=candidates, offset=json_length)
    if not np.isfinite(scores).all():
        return f"expected {candidates} finite scores"
    return None


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool, dict[str, str]]:
    """``(status, body, keep_alive, headers)`` of one HTTP/1.1 response with a Content-Length
    (header names in lower case)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    if "content-length" not in headers:
        raise ConnectionError(f"response without Content-Length (headers {sorted(headers)})")
    body = await reader.readexactly(int(headers["content-length"]))
    return status, body, headers.get("connection", "").lower() != "close", headers


def request_header(host: str, port: int, path: str, *, binary: bool = False) -> bytes:
    """The fixed start of every request (auth included); ``Content-Length`` comes next."""
    from cascade.config import load_settings

    auth = "".join(f"{k}: {v}\r\n" for k, v in load_settings().serving.auth_headers().items())
    kind = "application/octet-stream" if binary else "application/json"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
        f"Content-Type: {kind}\r\nContent-Length: "
    ).encode("latin-1")


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
FAILURES = (OSError, asyncio.IncompleteReadError, ValueError, ConnectionError)
"""What a request can fail with on the client side (the connection is then dropped)."""


async def exchange(
    connection: Connection, header: bytes, request: tuple[bytes, bytes], candidates: int
) -> tuple[int, str | None, bool, str | None]:
    """Send one request (``(extra header lines, body)``) on ``connection`` and read its
    answer: ``(status, problem, keep, Server-Timing value)``."""
    reader, writer = connection
    extra, body = request
    writer.write(b"%s%d\r\n%s\r\n%s" % (header, len(body), extra, body))
    status, answer, keep_alive, headers = await read_response(reader)
    length = headers.get("inference-header-content-length")
    problem = check_response(status, answer, candidates, None if length is None else int(length))
    return status, problem, keep_alive, headers.get("server-timing")


async def client(
    host: str,
    port: int,
    path: str,
    make: RequestMaker,
    *,
    candidates: int,
    measure_from: float,
    stop_at: float,
    tally: Tally,
) -> None:
    """One closed-loop client on one keep-alive connection (reconnects after a failure)."""
    header = request_header(host, port, path, binary=make.binary)
    connection: Connection | None = None
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        timing = None
        try:
            request = make.encode()
            if connection is None:
                connection = await asyncio.open_connection(host, port)
            status, problem, keep_alive, timing = await exchange(
                connection, header, request, candidates
            )
            if not keep_alive:
                connection[1].close()
                connection = None
        except FAILURES as exc:
            status, problem = 0, f"{type(exc).__name__}: {exc}"
            if connection is not None:
                connection[1].close()
            connection = None
        elapsed = time.perf_counter() - started
        tally.count(
            measured=started >= measure_from,
            status=status,
            problem=problem,
            elapsed=elapsed,
            timing=timing,
        )
    if connection is not None:
        connection[1].close()


class ConnectionPool:
    """Keep-alive connections for the open loop: an idle one is reused, else a new one is
    opened, up to ``limit`` requests in flight (a request beyond waits for a free one)."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port = host, port
        self.slots = asyncio.Semaphore(limit)
        self.idle: list[Connection] = []
        self.opened = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def acquire(self) -> Connection:
        await self.slots.acquire()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.idle:
            return self.idle.pop()
        try:
            connection = await asyncio.open_connection(self.host, self.port)
        except BaseException:
            self.release(None)
            raise
        self.opened += 1
        return connection

    def release(self, connection: Connection | None) -> None:
        """Return a slot; ``connection`` is kept for reuse (None: it was dropped)."""
        if connection is not None:
            self.idle.append(connection)
        self.in_flight -= 1
        self.slots.release()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def open_loop(
    host: str,
    port: int,
    path: str,
    make: RequestMaker,
    *,
    rate: float,
    candidates: int,
    start: float,
    measure_from: float,
    stop_at: float,
    tally: Tally,
    max_connections: int,
) -> dict[str, int]:
    """Send a request every ``1 / rate`` seconds from ``start`` until ``stop_at``, each on
    schedule whatever the earlier ones are doing; latency from the scheduled time."""
    header = request_header(host, port, path, binary=make.binary)
    pool = ConnectionPool(host, port, max_connections)
    late_s = LATE_SEND_MS / 1e3

    async def send(scheduled: float) -> None:
        measured = scheduled >= measure_from
        problem: str | None
        try:
            connection = await pool.acquire()
        except FAILURES as exc:
            elapsed = time.perf_counter() - scheduled
            problem = f"{type(exc).__name__}: {exc}"
            tally.count(measured=measured, status=0, problem=problem, elapsed=elapsed)
            return
        timing = None
        try:
            request = make.encode()
            if measured and time.perf_counter() - scheduled > late_s:
                tally.late_sends += 1
            status, problem, keep_alive, timing = await exchange(
                connection, header, request, candidates
            )
        except FAILURES as exc:
            status, problem, keep_alive = 0, f"{type(exc).__name__}: {exc}", False
        elapsed = time.perf_counter() - scheduled
        if not keep_alive:
            connection[1].close()
        pool.release(connection if keep_alive else None)
        tally.count(
            measured=measured, status=status, problem=problem, elapsed=elapsed, timing=timing
        )

    in_flight: set[asyncio.Task[None]] = set()
    interval = 1.0 / rate
    scheduled_total = 0
    while (scheduled := start + scheduled_total * interval) < stop_at:
        delay = scheduled - time.perf_counter()
        # Behind schedule (a busy loop): send at once, but let the others run in between.
        await asyncio.sleep(max(0.0, delay))
        task = asyncio.create_task(send(scheduled))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        scheduled_total += 1
    await asyncio.gather(*in_flight)
    pool.close()
    return {
        "scheduled_total": scheduled_total,
        "connections_opened": pool.opened,
        "max_in_flight": pool.max_in_flight,
    }


def latency_growth(latencies: Sequence[float]) -> float | None:
    """Median latency of the last fifth of the answers over that of the first fifth (in the
    order they came back): ~1 when the server keeps up with an open loop's rate, growing with
    the window when the rate is more than it can answer and the queue builds (overload)."""
    fifth = len(latencies) // 5
    if fifth < 1:
        return None
    first = statistics.median(latencies[:fifth])
    return statistics.median(latencies[-fifth:]) / first if first > 0 else None


class ServerCpu:
    """CPU seconds (user + system) of a server process and its children, per process."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def sample(self) -> dict[int, float]:
        if self.pid is None:
            return {}
        import psutil

        try:
            parent = psutil.Process(self.pid)
            processes = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        times: dict[int, float] = {}
        for process in processes:
            try:
                cpu = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            times[process.pid] = cpu.user + cpu.system
        return times

    @staticmethod
    def spent(before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds between two samples (a process that appeared in between: all of its)."""
        return sum(t - before.get(pid, 0.0) for pid, t in after.items())


async def generate(
    url: str,
    make: RequestMaker | Sequence[RequestMaker],
    *,
    clients: int,
    candidates: int,
    seconds: float,
    warmup_seconds: float,
    rate: float | None = None,
    max_connections: int = 256,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Run the load (closed loop, or open loop at ``rate`` requests/s) and summarize the
    measured window. ``make``: one request maker per client (closed loop) or one (open)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"--url must look like http://HOST:PORT, got {url!r}")
    makers = [make] if isinstance(make, RequestMaker) else list(make)
    tally = Tally()
    server = ServerCpu(server_pid)
    start = time.perf_counter()
    measure_from = start + warmup_seconds
    stop_at = measure_from + seconds
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)

    async def sample_at_window_start() -> dict[int, float]:
        await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
        return server.sample()

    window_start = asyncio.create_task(sample_at_window_start())
    open_stats: dict[str, int] = {}
    if rate is None:
        if len(makers) != clients:
            raise ValueError(f"{clients} clients need {clients} request makers")
        await asyncio.gather(
            *(
                client(
                    parts.hostname,
                    parts.port,
                    MODEL_PATH,
                    makers[i],
                    candidates=candidates,
                    measure_from=measure_from,
                    stop_at=stop_at,
                    tally=tally,
                )
                for i in range(clients)
            )
        )
    else:
        open_stats = await open_loop(
            parts.hostname,
            parts.port,
            MODEL_PATH,
            makers[0],
            rate=rate,
            candidates=candidates,
            start=start,
            measure_from=measure_from,
            stop_at=stop_at,
            tally=tally,
            max_connections=max_connections,
        )
    server_cpu_s = ServerCpu.spent(await window_start, server.sample())
    # The last requests may end after stop_at; the window is what they actually spanned.
    window = max(time.perf_counter(), stop_at) - measure_from
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    lat_ms = np.asarray(tally.latencies) * 1e3
    good = len(lat_ms)
    requests = good + tally.errors
    result: dict[str, Any] = {
        "mode": "closed" if rate is None else "open",
        "clients": clients,
        "candidates": candidates,
        "duration_s": window,
        "warmup_s": warmup_seconds,
        "requests": requests,
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "status_counts": tally.status,
        "answered_total": tally.answered,
        "rps": good / window,
        "load_generator_cpu_s": (cpu_after.ru_utime + cpu_after.ru_stime)
        - (cpu_before.ru_utime + cpu_before.ru_stime),
        "requests_encoded_per_send": True,
        "binary": makers[0].binary,
        **tally.stage_figures(),
    }
    result["load_generator_cpu_ms_per_request"] = (
        result["load_generator_cpu_s"] / max(1, requests) * 1e3
    )
    if server_pid is not None:
        result["server_cpu_s"] = server_cpu_s
        result["server_cpu_ms_per_request"] = server_cpu_s / max(1, requests) * 1e3
        # The server's and this process's CPU against what the machine's cores offered in the
        # window: near 1, a queue grows whatever the server's code does.
        result["cpu_busy_fraction"] = (server_cpu_s + result["load_generator_cpu_s"]) / (
            window * usable_cpus()
        )
    if rate is not None:
        result.update(
            {
                "rate_rps": rate,
                "achieved_rps": good / window,
                "late_sends": tally.late_sends,
                "late_send_threshold_ms": LATE_SEND_MS,
                "max_connections": max_connections,
                "latency_growth": latency_growth(tally.latencies),
                **open_stats,
            }
        )
    if good:
        result.update(
            {
                "p50_ms": float(np.percentile(lat_ms, 50)),
                "p90_ms": float(np.percentile(lat_ms, 90)),
                "p99_ms": float(np.percentile(lat_ms, 99)),
                "max_ms": float(lat_ms.max()),
                "mean_ms": float(lat_ms.mean()),
            }
        )
    else:
        result.update({k: None for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms")})
    return result


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on uvloop when it is installed: the clients' event loop and
    streams then cost ~20% less CPU per request (0.19 vs 0.24 ms), CPU the server shares the
    machine's cores with. The load itself is the same: each client still waits for its
    answer. ``CASCADE_LOAD_GENERATOR_LOOP=asyncio`` runs it on asyncio's own loop."""
    from cascade.config import load_settings

    if load_settings().serving.load_generator_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="server root, http://HOST:PORT")
    parser.add_argument("--ids", required=True, type=Path, help="JSON: users and items lists")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup-seconds", type=float, default=5.0, help="not counted")
    parser.add_argument(
        "--rate", type=float, default=None, help="open loop: requests per second (sent on time)"
    )
    parser.add_argument(
        "--max-connections", type=int, default=256, help="open loop: most requests in flight"
    )
    parser.add_argument(
        "--server-pid", type=int, default=None, help="sample this process tree's CPU time"
    )
    parser.add_argument(
        "--rates",
        type=str,
        default=None,
        help="open loop at each of these requests/s in turn (comma-separated), each with its "
        "own warm-up and window: the result's 'steps'",
    )
    parser.add_argument(
        "--binary",
        action="store_true",
        help="send ids and take scores as raw bytes (v2 binary tensor extension), not JSON",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path, help="result JSON")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.candidates < 1 or args.max_connections < 1:
        parser.error("--clients, --candidates and --max-connections must be >= 1")
    if not args.seconds > 0 or args.warmup_seconds < 0:
        parser.error("--seconds must be > 0 and --warmup-seconds >= 0")
    if args.rate is not None and not (args.rate > 0 and math.isfinite(args.rate)):
        parser.error("--rate must be a finite number of requests per second > 0")
    if args.rates is not None:
        try:
            args.rates = [float(r) for r in args.rates.split(",")]
        except ValueError:
            parser.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
        if args.rate is not None or not all(r > 0 and math.isfinite(r) for r in args.rates):
            parser.error("--rates takes finite requests/s > 0, and not with --rate")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ids = json.loads(args.ids.read_text())
    users, items = [int(u) for u in ids["users"]], [int(i) for i in ids["items"]]
    open_loop = args.rate is not None or args.rates is not None
    # One request stream per closed-loop client (the open loop draws from the first).
    makers = [
        RequestMaker(
            users, items, candidates=args.candidates, seed=(args.seed, i), binary=args.binary
        )
        for i in range(1 if open_loop else args.clients)
    ]

    def run_at(rate: float | None) -> dict[str, Any]:
        return run_event_loop(
            generate(
                args.url,
                makers,
                clients=args.clients,
                candidates=args.candidates,
                seconds=args.seconds,
                warmup_seconds=args.warmup_seconds,
                rate=rate,
                max_connections=args.max_connections,
                server_pid=args.server_pid,
            )
        )

    if args.rates is None:
        result = run_at(args.rate)
    else:  # one step after the other, from the same process and request stream
        result = {"mode": "steps", "steps": [run_at(rate) for rate in args.rates]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
