"""Closed-loop load generator for the pre-ranking server: N clients sending id-only v2 requests.

    python -m benchmarks.load_generator --url http://127.0.0.1:28081 --ids ids.json \\
        --clients 8 --candidates 1000 --seconds 30 --warmup-seconds 5 --out load.json

``ids.json`` is ``{"users": [...], "items": [...]}``: each request asks for one random user and
``--candidates`` distinct random items (a pool of pre-encoded bodies, so building requests costs
nothing while measuring). Each client holds one keep-alive HTTP/1.1 connection and sends its
next request as soon as the previous answer has been read in full and checked (status 200, one
finite score per candidate). Requests that start during the warm-up are not counted.

It runs in its own process, apart from the server, so the client's CPU time is not the
server's; a raw asyncio HTTP/1.1 client keeps that CPU time small on a 2-core machine, where
every cycle the client spends is one the server cannot. The result (JSON) holds ``p50_ms``,
``p90_ms``, ``p99_ms``, ``rps``, ``errors`` and the setup.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import resource
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import orjson

MODEL_PATH = "/v2/models/preranking/infer"
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

    def error(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(message[:300])


def request_bodies(
    users: list[int], items: list[int], *, candidates: int, count: int, seed: int
) -> list[bytes]:
    """``count`` encoded v2 requests: one random user, ``candidates`` distinct random items."""
    if candidates > len(items):
        raise ValueError(
            f"{candidates} candidates per request, but only {len(items)} item ids to draw from"
        )
    if not users:
        raise ValueError("no user ids to draw requests from")
    rng = random.Random(seed)
    bodies = []
    for n in range(count):
        chosen = rng.sample(items, candidates)
        bodies.append(
            orjson.dumps(
                {
                    "id": f"load-{n}",
                    "inputs": [
                        {
                            "name": "user_id",
                            "datatype": "INT64",
                            "shape": [1],
                            "data": [rng.choice(users)],
                        },
                        {
                            "name": "item_ids",
                            "datatype": "INT64",
                            "shape": [candidates],
                            "data": chosen,
                        },
                    ],
                }
            )
        )
    return bodies


def check_response(status: int, body: bytes, candidates: int) -> str | None:
    """None for a good answer, else what is wrong with it."""
    if status != 200:
        return f"HTTP {status}: {body[:200]!r}"
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


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """``(status, body, keep_alive)`` of one HTTP/1.1 response with a Content-Length."""
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
    return status, body, headers.get("connection", "").lower() != "close"


async def client(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    *,
    offset: int,
    candidates: int,
    measure_from: float,
    stop_at: float,
    tally: Tally,
) -> None:
    """One closed-loop client on one keep-alive connection (reconnects after a failure)."""
    from cascade.config import load_settings

    auth = "".join(f"{k}: {v}\r\n" for k, v in load_settings().serving.auth_headers().items())
    header = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode("latin-1")
    n = offset
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    while time.perf_counter() < stop_at:
        body = bodies[n % len(bodies)]
        n += 1
        started = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            assert reader is not None
            writer.write(b"%s%d\r\n\r\n%s" % (header, len(body), body))
            status, answer, keep_alive = await read_response(reader)
            elapsed = time.perf_counter() - started
            problem = check_response(status, answer, candidates)
            if not keep_alive:
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, ValueError, ConnectionError) as exc:
            elapsed = time.perf_counter() - started
            status, problem = 0, f"{type(exc).__name__}: {exc}"
            if writer is not None:
                writer.close()
            writer = None
        if problem is None:
            tally.answered += 1
        if started < measure_from:
            continue
        tally.status[str(status)] = tally.status.get(str(status), 0) + 1
        if problem is None:
            tally.latencies.append(elapsed)
        else:
            tally.error(problem)
    if writer is not None:
        writer.close()


async def generate(
    url: str,
    bodies: list[bytes],
    *,
    clients: int,
    candidates: int,
    seconds: float,
    warmup_seconds: float,
) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"--url must look like http://HOST:PORT, got {url!r}")
    tally = Tally()
    start = time.perf_counter()
    measure_from = start + warmup_seconds
    stop_at = measure_from + seconds
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(
        *(
            client(
                parts.hostname,
                parts.port,
                MODEL_PATH,
                bodies,
                offset=i * (len(bodies) // clients),
                candidates=candidates,
                measure_from=measure_from,
                stop_at=stop_at,
                tally=tally,
            )
            for i in range(clients)
        )
    )
    # The last requests may end after stop_at; the window is what they actually spanned.
    window = max(time.perf_counter(), stop_at) - measure_from
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    lat_ms = np.asarray(tally.latencies) * 1e3
    good = len(lat_ms)
    result: dict[str, Any] = {
        "clients": clients,
        "candidates": candidates,
        "duration_s": window,
        "warmup_s": warmup_seconds,
        "requests": good + tally.errors,
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "status_counts": tally.status,
        "answered_total": tally.answered,
        "rps": good / window,
        "load_generator_cpu_s": (cpu_after.ru_utime + cpu_after.ru_stime)
        - (cpu_before.ru_utime + cpu_before.ru_stime),
    }
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
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup-seconds", type=float, default=5.0, help="not counted")
    parser.add_argument("--pool", type=int, default=256, help="distinct request bodies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path, help="result JSON")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.candidates < 1 or args.pool < 1:
        parser.error("--clients, --candidates and --pool must be >= 1")
    if not args.seconds > 0 or args.warmup_seconds < 0:
        parser.error("--seconds must be > 0 and --warmup-seconds >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ids = json.loads(args.ids.read_text())
    bodies = request_bodies(
        [int(u) for u in ids["users"]],
        [int(i) for i in ids["items"]],
        candidates=args.candidates,
        count=args.pool,
        seed=args.seed,
    )
    result = run_event_loop(
        generate(
            args.url,
            bodies,
            clients=args.clients,
            candidates=args.candidates,
            seconds=args.seconds,
            warmup_seconds=args.warmup_seconds,
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
