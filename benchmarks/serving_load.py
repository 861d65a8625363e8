"""Benchmark ``serving``: the real pre-ranking server under load, user and cross features
read from the online store per request.

    cascade bench serving --candidates 1000 --clients 8 --out bench-results/serving.json
    cascade bench serving --out /tmp/serving.json --quick         # smoke, ~1 min
    cascade bench serving --no-cross-features --out /tmp/serving-plain.json

It builds a private stack in a temporary folder, started and stopped by the benchmark, so a
running local stack is never touched; its partition is today's (UTC), where its log ends:

* the cross-statistics engine's partitions of a synthetic log (943 users, 1,682 items:
  MovieLens-100k's sizes; :data:`LOG_ROWS` rows, :data:`QUICK_LOG_ROWS` under ``debug``;
  ``setup.log_rows``): the pairs a request keys (``user``, ``item``, ``user_cat``) for
  partition ``ds`` and the training days before it, with each day's item catalogue, written
  where the engine writes them and partition ``ds`` bulk-loaded into the SQLite online store
  (:func:`benchmarks.serving_cross_features.publish_engine_partitions`; ``cross_statistics``
  says how, and that the Spark gate was not run);
* the pipeline's training set of ``ds`` joined from them (every statistic a candidate field;
  ``--no-cross-features``: the id fields only). The server reads the statistics the served
  model keeps from the online store: item-keyed ones once per version load for every catalogue
  item, user-keyed ones per request (one batched read per view, the candidates' categories
  deduplicated). ``cross_features`` is true when the server said it reads fields online and
  its ``cascade_online_feature_read_seconds`` histogram counted reads; ``cross_fields_served``
  names those it said it reads per request (FSCD may drop declared ones:
  ``cross_fields_declared`` / ``cross_fields_kept``), ``online_reads`` holds the histogram
  summed over the workers, with the server's good answers (``answers``) and its reads and read
  milliseconds per answer; ``online_read_ms_per_request`` is the latter (the run's whole life,
  warm-ups and version loads included). A user's share of the network's inputs is held between
  its requests (:mod:`serving.user_sides`), so the views are read when a user's share is
  built, not on every request; ``scores_held_vs_full`` scores requests in process both from
  the held shares and by the full path (read and encode per request), and ``scores_identical``
  is true when every one came out bit-identical;
* the network the pipeline's train step trains, trained on that set, logged to a SQLite MLflow
  and promoted to ``champion`` by :func:`cascade.promotion.register_and_promote` under the
  pipeline's promotion rule. The kind is ``fscd`` (or ``CASCADE_BENCH_SERVING_MODEL``), the
  config is named by ``--config``, else the pipeline's (``CASCADE_PRERANKING_CONFIG``, else
  ``pipeline``); ``--quick`` trains ``debug`` instead and says so (``training_config``,
  ``is_pipeline_network``). ``fscd``: the FSCD cascade, trained as the train step trains it
  (DeepSpeed), then compiled and gated by the compile step, so the server scores with its
  AOTInductor package. ``cold``: the FSCD pre-ranker's network over every field, trained in
  process (plain Adam, seconds; no selection, no compile step: scored eagerly), what the
  ``--quick`` test serves. The dense ``mlp`` is refused: it reads a MovieLens-shaped contract
  the engine does not build. ``model_digest`` and ``model_provenance`` name what was served;
* ``python -m serving.server`` with ``--workers`` processes (default 2, one per core here),
  which loads the champion from the registry and the catalogue's items with their item-keyed
  fields, and reads each request's user-keyed fields from the online store.
  ``setup.torch_threads_per_worker`` is what each worker reports on ``/metrics``
  (``cascade_serving_torch_threads``).

A load generator in a separate process (:mod:`benchmarks.load_generator`) then loads it in
measured windows of two kinds, alternating (the order rotating each round), ``--repeats``
windows each (default 3, 1 with ``--quick``):

* closed loop: ``--clients`` clients, each sending 1 user x ``--candidates`` item ids per
  request and the next one when the answer is in. The top-level figures (``p50_ms``,
  ``p99_ms``, ``rps``, ``server_cpu_ms_per_request``, ...) are medians over its windows, each
  window's in ``*_runs``;
* open loop (``open_loop``): requests sent at a fixed ``--rate`` (default 70% of the first
  closed window's throughput) whatever the answers are doing, latency from each request's
  scheduled send time, so queueing shows (no coordinated omission);
* binary (``binary_vs_json``): the closed loop again with the ids sent and the scores answered
  as raw bytes (the v2 binary tensor extension): p50, p99, requests/s and server CPU per
  request beside the JSON loop's, the ``parse``, ``validate`` and ``respond`` stages' CPU of
  each, and
  ``p99_binary_over_json`` / ``server_cpu_binary_over_json``.

Then ``latency_by_load``: one open-loop window at each of :data:`LOAD_STEPS` (shares of the
first closed window's throughput; :data:`QUICK_LOAD_STEPS` with ``--quick``), lowest first,
each with its offered and achieved requests/s, p50, p99, errors, and the CPU per request of the
server and of the load generator (which shares the cores); ``p99_crossing`` says between which
steps the p99 goes over :data:`P99_CROSSING_MS` (``crossing_rps``: where the line between them
crosses it). The chart draws them as the latency-against-load curve.

The server runs with ``CASCADE_SERVING_PROFILE=8`` (:data:`PROFILE_EVERY`): one answer in
eight carries a ``Server-Timing`` header with the wall and thread-CPU time of each stage of the
request (:mod:`serving.request_profile`: parse, validate, features, encode, score, feedback,
respond), which the load generator reads. ``stage_ms`` holds per stage the median over the
closed windows of each window's median and p99 wall ms, ``stage_cpu_ms`` the median CPU ms,
both with ``in_handler`` (the stages of a request added up);
``cpu_outside_stages_ms_per_request`` is the server CPU per request not in them (HTTP, the
guard, the event loop, the feedback writer).

Each request is drawn and encoded when it is sent, inside the timed path. Server CPU per
request is the server processes' CPU time over the measured window only (sampled at its start
and end, warm-up excluded) over the window's requests. The machine's load average is recorded
(other work on a shared machine shows up in p99).
The server logs every scored candidate as feedback (its default); after the server stopped,
the rows in the private lake are counted against the good answers (``feedback_complete``:
none was dropped, none was lost at shutdown).
Before the load, malformed requests (JSON and binary) are sent to check that each is answered
4xx. ``backend``
says how the server scored (``compiled``: the package). A full run then repeats the load scored
by eager PyTorch (``eager_scorer``, ``CASCADE_SERVING_COMPILED=0``; ``compiled_vs_eager_cpu``:
eager server CPU per request / compiled) and with the other process count (``with_1_workers``).
Options (environment variable): ``--candidates`` (CASCADE_BENCH_SERVING_CANDIDATES), ``--clients``
(CASCADE_BENCH_SERVING_CLIENTS), ``--seconds`` (CASCADE_BENCH_SERVING_SECONDS, each measured
window), ``--workers`` (CASCADE_BENCH_SERVING_WORKERS), ``--config``
(CASCADE_BENCH_SERVING_CONFIG), ``--rate`` (CASCADE_BENCH_SERVING_RATE), ``--cross-features``
(CASCADE_BENCH_SERVING_CROSS_FEATURES, ``1``; ``--no-cross-features``: ``0``), ``--repeats``
(CASCADE_BENCH_REPEATS).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.goals import goal, goals_met
from benchmarks.provenance import bench_repeats, rotated
from benchmarks.serving_path import held_vs_full_of_stack
from cascade.config import REPO_ROOT, Settings, load_settings
from cascade.lake import Lake
from cascade.ports import free_port

USERS, ITEMS = 943, 1_682
LOG_ROWS = 400_000
"""Rows of the generated click log a pipeline-config network is trained on and served from:
about 40,000 training rows on the served day, enough for the pipeline's FSCD sweep to keep a
model within its cost budget (on a tenth of that every model kept every field, over budget)."""
QUICK_LOG_ROWS = 40_000
"""The log under ``debug``, which has no cost budget: seconds to build."""
GOAL_P99_MS = goal("serving", "p99_ms").bound
"""The closed loop's p99 goal the docs state (``meets_goal``)."""
P99_CROSSING_MS = GOAL_P99_MS
"""The p99 whose crossing ``p99_crossing`` locates on the open-loop steps: the closed loop's
goal."""

QUICK_CONFIG = "debug"
"""The training config ``--quick`` serves when no ``--config`` is given (seconds to train)."""


DEBUG_NETWORK: dict[str, Any] = {"training_config": QUICK_CONFIG, "epochs": None, "lr": None}
"""What the trainers below train when given no network: the ``debug`` config, as it stands."""


def serving_network(settings: Settings, *, quick: bool) -> dict[str, Any]:
    """Which network the benchmark trains and serves: the model kind, the training config by
    name (and where the name came from), the pipeline's own config for that kind, and the
    pipeline's epoch and learning-rate knobs, which its train step applies too."""
    from cascade.config import load_group
    from models.preranking.config_registry import get_cascade_config
    from pipelines.ctr_preranking import DEFAULT_CONFIG, PrerankingSettings

    options = settings.bench
    kind = options.serving_model or "fscd"
    knobs = load_group(PrerankingSettings)
    # ``cold``: the FSCD pre-ranker's network, so the pipeline's FSCD config is its reference.
    pipeline_config = knobs.config or DEFAULT_CONFIG
    if options.serving_config:
        name, source = options.serving_config, "--config"
    elif quick:
        name, source = QUICK_CONFIG, "--quick (not the pipeline's config)"
    else:
        name, source = pipeline_config, "the pipeline's train step"
    # A bad name fails here.
    get_cascade_config(name)
    return {
        "model": kind,
        "training_config": name,
        "log_rows": QUICK_LOG_ROWS if name == QUICK_CONFIG else LOG_ROWS,
        "config_source": source,
        "pipeline_config": pipeline_config,
        "is_pipeline_network": kind != "cold" and name == pipeline_config,
        "epochs": knobs.epochs,
        "lr": knobs.lr,
    }


def train_fscd_and_promote(
    settings: Settings, ds: str, network: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train the FSCD cascade of config ``network["training_config"]`` (default ``debug``) on
    the training set of partition ``ds`` as the pipeline's train step does (DeepSpeed,
    ``settings.train_processes`` processes), compile and gate it as its compile step does,
    register the pre-ranker and make it champion."""
    from compilers.preranking_gate import compile_and_gate
    from models.preranking.cascade_train import launch_pipeline
    from models.preranking.registration import register_and_promote
    from pipelines.ctr_preranking import PIPELINE

    network = network or DEBUG_NETWORK
    trained = launch_pipeline(
        ds,
        config=network["training_config"],
        settings=settings,
        epochs=network["epochs"],
        lr=network["lr"],
    )
    # The pipeline's compile step: the package the server scores with when the gate passes.
    gate = compile_and_gate(ds, settings=settings)
    return {
        **register_and_promote(ds, settings=settings, promotion=PIPELINE.promotion()),
        "test_auc": trained["test_auc"],
        "trainer": "the pipeline's train step (models.preranking.cascade_train, DeepSpeed)",
        "compile_gate": {
            k: gate.get(k) for k in ("passed", "reasons", "speedup_vs_eager", "max_abs_diff")
        },
    }


def _post(url: str, body: bytes, json_length: int | None = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    from cascade.config import load_settings

    headers = {"Content-Type": "application/json", **load_settings().serving.auth_headers()}
    if json_length is not None:  # the binary tensor extension (-1: the header left out)
        headers["Content-Type"] = "application/octet-stream"
        if json_length >= 0:
            headers["Inference-Header-Content-Length"] = str(json_length)
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


BAD_REQUESTS: dict[str, bytes] = {
    "not JSON": b"{not json",
    "JSON, not an object": b"[1, 2, 3]",
    "inputs not a list": b'{"inputs": "user_id"}',
    "no inputs": b'{"inputs": []}',
    "float ids": (
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [2], "data": [1.5, 2]}]}'
    ),
    "string ids": (
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": ["a"]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [1], "data": [1]}]}'
    ),
    "shape and data disagree": (
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [3], "data": [1, 2]}]}'
    ),
    "id beyond INT64": (
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], '
        b'"data": [99999999999999999999999]},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [1], "data": [1]}]}'
    ),
    "data not a list": (
        b'{"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": 1},'
        b'{"name": "item_ids", "datatype": "INT64", "shape": [1], "data": [1]}]}'
    ),
}
"""Malformed requests, each of which must get a 4xx (never a 5xx, never a score)."""


def _binary_request(item_ids: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "user_id",
                    "datatype": "INT64",
                    "shape": [1],
                    "parameters": {"binary_data_size": 8},
                },
                {"name": "item_ids", "shape": [2], **item_ids},
            ]
        }
    ).encode()
    return header + b"".join(chunks), len(header)


_ONE, _TWO = (1).to_bytes(8, "little"), (1).to_bytes(8, "little") + (2).to_bytes(8, "little")
BAD_BINARY_REQUESTS: dict[str, tuple[bytes, int]] = {
    "binary: size disagrees with shape": _binary_request(
        {"datatype": "INT64", "parameters": {"binary_data_size": 8}}, _ONE, _ONE
    ),
    "binary: bytes missing": _binary_request(
        {"datatype": "INT64", "parameters": {"binary_data_size": 16}}, _ONE, _ONE
    ),
    "binary: bytes left over": _binary_request(
        {"datatype": "INT64", "parameters": {"binary_data_size": 16}}, _ONE, _TWO, _ONE
    ),
    "binary: unknown datatype": _binary_request(
        {"datatype": "BF16", "parameters": {"binary_data_size": 4}}, _ONE, _ONE[:4]
    ),
    "binary: no header length": (_binary_request({"datatype": "INT64"}, _ONE)[0], -1),
}
"""Malformed bodies of the v2 binary tensor extension ``(body, JSON header length)``: each
must get a 4xx too."""


def probe_bad_requests(base_url: str) -> dict[str, int]:
    """HTTP status per malformed request (JSON, then binary)."""
    url = f"{base_url}/v2/models/preranking/infer"
    status = {name: _post(url, body)[0] for name, body in BAD_REQUESTS.items()}
    for name, (body, json_length) in BAD_BINARY_REQUESTS.items():
        status[name] = _post(url, body, json_length)[0]
    return status


class Server:
    """``python -m serving.server`` in its own session, against the private stack."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "serving.server"],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout_s: float) -> float:
        import urllib.error
        import urllib.request

        from cascade.config import load_settings

        ready = urllib.request.Request(
            f"{self.url}/v2/models/preranking/ready",
            headers=load_settings().serving.auth_headers(),
        )
        started = time.monotonic()
        ready_in_a_row = 0
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"serving.server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    ready_in_a_row = ready_in_a_row + 1 if answer.status == 200 else 0
            except (urllib.error.URLError, OSError):
                ready_in_a_row = 0
            # Each probe is a new connection, taken by whichever worker accepts first: a run
            # of successes means every worker has loaded the champion.
            if ready_in_a_row >= 10:
                return time.monotonic() - started
            time.sleep(0.05 if ready_in_a_row else 0.2)
        raise TimeoutError(f"model not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def torch_threads(self, workers: int, tries: int = 60) -> dict[str, int]:
        """Intra-op threads per server process, as each reports it on ``/metrics``: every
        probe is a new connection, answered by whichever worker accepts it, so probing until
        ``workers`` processes have answered reads them all (fewer if some never did)."""
        import urllib.request

        from cascade.config import load_settings

        probe = urllib.request.Request(
            f"{self.url}/metrics", headers=load_settings().serving.auth_headers()
        )
        seen: dict[str, int] = {}
        for _ in range(tries):
            with urllib.request.urlopen(probe, timeout=10) as answer:
                seen.update(torch_threads_from_metrics(answer.read().decode()))
            if len(seen) >= workers:
                break
        return seen

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


THREADS_METRIC = "cascade_serving_torch_threads"


def torch_threads_from_metrics(text: str) -> dict[str, int]:
    """``{pid: threads}`` from a Prometheus exposition's ``cascade_serving_torch_threads``."""
    found = {}
    for line in text.splitlines():
        if line.startswith(THREADS_METRIC + "{"):
            labels, _, value = line.rpartition(" ")
            pid = labels.split('pid="', 1)[1].split('"', 1)[0]
            found[pid] = int(float(value))
    return found


def served_backend(log: str) -> str:
    """How the server's log says it scores: ``compiled`` (the version's AOTInductor package),
    ``eager`` (without a usable package), ``unknown`` when the log says neither."""
    if "scoring with its compiled package" in log:
        return "compiled"
    if "scoring with eager PyTorch" in log:
        return "eager"
    return "unknown"


OPEN_LOOP_FRACTION = 0.7
"""Default open-loop rate: this share of the first closed-loop window's throughput."""
LOAD_MODES = ("closed", "open", "binary")
"""The measured windows of each round: closed loop (JSON), open loop (JSON), closed loop with
the v2 binary tensor extension (``binary_vs_json``)."""
LOAD_STEPS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2)
"""``latency_by_load``: open-loop steps at these shares of the first closed-loop window's
throughput, lowest first."""
QUICK_LOAD_STEPS = (0.3, 0.7, 1.1)
LOAD_STEP_WARMUP_S = (1.0, 0.5)
"""Warm-up of each load step (full run, ``--quick``): the server is warm by then."""


def run_load(
    server: Server,
    *,
    workdir: Path,
    env: dict[str, str],
    ids: Path,
    clients: int,
    candidates: int,
    seconds: float,
    warmup: float,
    rate: float | None,
    name: str,
    binary: bool = False,
    rates: tuple[float, ...] = (),
) -> dict[str, Any]:
    """One measured window of the load generator against ``server`` (open loop at ``rate``
    requests/s, else closed loop; ``binary``: requests and answers in the v2 binary tensor
    extension), with the server's CPU time over the window; with ``rates``, one open-loop
    window at each in turn (the result's ``steps``)."""
    load_out = workdir / f"{name}.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.load_generator",
        "--url",
        server.url,
        "--ids",
        str(ids),
        "--clients",
        str(clients),
        "--candidates",
        str(candidates),
        "--seconds",
        str(seconds),
        "--warmup-seconds",
        str(warmup),
        "--server-pid",
        str(server.proc.pid),
        "--out",
        str(load_out),
    ]
    if rate is not None:
        command += ["--rate", repr(rate)]
    if rates:
        command += ["--rates", ",".join(repr(r) for r in rates)]
    if binary:
        command.append("--binary")
    load_before = os.getloadavg()[0]
    done = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=max(1, len(rates)) * (seconds + warmup) + 120,
    )
    if done.returncode != 0 or not load_out.exists():
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {
        **json.loads(load_out.read_text()),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
    }


def _progress(line: str) -> None:
    print(f"[bench serving] {line}", flush=True)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _median(windows: list[dict[str, Any]], key: str) -> float | None:
    values = [w[key] for w in windows if w.get(key) is not None]
    return statistics.median(values) if values else None


def closed_loop_summary(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The closed-loop windows as the top-level figures: medians of each window's latency,
    throughput and server CPU per request (each window's in ``*_runs``), counts summed."""
    status: dict[str, int] = {}
    for window in windows:
        for code, count in window["status_counts"].items():
            status[code] = status.get(code, 0) + count
    first = windows[0]
    summary: dict[str, Any] = {
        "clients": first["clients"],
        "candidates": first["candidates"],
        "warmup_s": first["warmup_s"],
        "windows": len(windows),
        "duration_s": sum(w["duration_s"] for w in windows),
        "requests": sum(w["requests"] for w in windows),
        "errors": sum(w["errors"] for w in windows),
        "error_samples": [e for w in windows for e in w["error_samples"]][:5],
        "status_counts": status,
        "answered_total": sum(w["answered_total"] for w in windows),
        "load_generator_cpu_s": sum(w["load_generator_cpu_s"] for w in windows),
        "requests_encoded_per_send": True,
        "max_ms": max((w["max_ms"] for w in windows if w["max_ms"] is not None), default=None),
        "load_average_before": first["load_average_before"],
        "load_average_after": windows[-1]["load_average_after"],
    }
    for key in (
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "mean_ms",
        "rps",
        "server_cpu_ms_per_request",
        "cpu_busy_fraction",
    ):
        summary[key] = _median(windows, key)
    for key in ("p50_ms", "p99_ms", "rps", "server_cpu_ms_per_request"):
        summary[f"{key}_runs"] = [w[key] for w in windows if w.get(key) is not None]
    summary.update(stage_summary(windows, summary["server_cpu_ms_per_request"]))
    return summary


def stage_summary(windows: list[dict[str, Any]], server_cpu_ms: float | None) -> dict[str, Any]:
    """The server's time per stage of a request (its ``Server-Timing``, read by the load
    generator) over ``windows``: ``stage_ms`` (per stage, the median over the windows of each
    window's median and p99), ``stage_cpu_ms`` (per stage, the median of the windows' median
    CPU ms), ``profiled_requests``, and ``cpu_outside_stages_ms_per_request``: the server's
    CPU per request (a mean) less the stages' (``in_handler``, a median): HTTP, the request
    guard, the event loop, sending, the feedback writer's thread. Empty when the server did
    not profile."""
    profiled = [w for w in windows if w.get("stage_ms")]
    if not profiled or len(profiled) != len(windows):
        return {}
    stages = list(profiled[0]["stage_ms"])
    result: dict[str, Any] = {
        "stage_ms": {
            stage: {
                quantile: statistics.median(w["stage_ms"][stage][quantile] for w in profiled)
                for quantile in ("median", "p99")
            }
            for stage in stages
        },
        "stage_cpu_ms": {
            stage: statistics.median(w["stage_cpu_ms"][stage] for w in profiled) for stage in stages
        },
        "profiled_requests": sum(w["profiled_requests"] for w in profiled),
    }
    in_handler = result["stage_cpu_ms"].get("in_handler")
    if server_cpu_ms is not None and in_handler is not None:
        result["cpu_outside_stages_ms_per_request"] = server_cpu_ms - in_handler
    return result


BINARY_VS_JSON_KEYS = (
    "p50_ms",
    "p99_ms",
    "rps",
    "errors",
    "server_cpu_ms_per_request",
    "p99_ms_runs",
    "server_cpu_ms_per_request_runs",
)


def binary_vs_json(closed: dict[str, Any], binary_windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The closed loop with JSON bodies (the top-level figures) beside the same load in the v2
    binary tensor extension: p99 and server CPU per request of each, the CPU of the stages the
    encoding touches (parse, validate, respond), and binary over JSON."""
    binary = closed_loop_summary(binary_windows)

    def side(summary: dict[str, Any]) -> dict[str, Any]:
        stages = summary.get("stage_cpu_ms") or {}
        return {
            **{key: summary.get(key) for key in BINARY_VS_JSON_KEYS},
            "parse_cpu_ms": stages.get("parse"),
            "validate_cpu_ms": stages.get("validate"),
            "respond_cpu_ms": stages.get("respond"),
        }

    def ratio(key: str) -> float | None:
        ours, theirs = binary.get(key), closed.get(key)
        return ours / theirs if ours is not None and theirs else None

    return {
        "json": side(closed),
        "binary": side(binary),
        "answered_total": binary["answered_total"],
        "p99_binary_over_json": ratio("p99_ms"),
        "server_cpu_binary_over_json": ratio("server_cpu_ms_per_request"),
    }


def latency_by_load(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per open-loop step, lowest offered rate first: offered and achieved
    requests/s, p50, p99, errors, and the CPU per request of the server and of the load
    generator itself (it shares the cores)."""
    keys = (
        "achieved_rps",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "max_ms",
        "errors",
        "requests",
        "answered_total",
        "late_sends",
        "latency_growth",
        "server_cpu_ms_per_request",
        "load_generator_cpu_ms_per_request",
        "cpu_busy_fraction",
    )
    ordered = sorted(steps, key=lambda step: step["rate_rps"])
    return [{"offered_rps": s["rate_rps"], **{k: s.get(k) for k in keys}} for s in ordered]


def p99_crossing(steps: list[dict[str, Any]], at_ms: float) -> dict[str, Any]:
    """Where the p99 of ``latency_by_load`` first goes over ``at_ms`` as the load rises:
    the achieved requests/s of the last step within it and of the first step over it (a step
    with errors counts as over), and the load between them where the line joining their p99s
    crosses ``at_ms`` (None where the steps do not bracket it)."""
    within = over = None
    for step in steps:
        p99 = step.get("p99_ms")
        if p99 is None or step.get("errors") or p99 > at_ms:
            over = step
            break
        within = step
    crossing = None
    if within is not None and over is not None and over.get("p99_ms") is not None:
        (x0, y0), (x1, y1) = (
            (within["achieved_rps"], within["p99_ms"]),
            (over["achieved_rps"], over["p99_ms"]),
        )
        crossing = x0 + (at_ms - y0) * (x1 - x0) / (y1 - y0) if y1 != y0 else x0
    return {
        "p99_ms": at_ms,
        "within_up_to_rps": None if within is None else within["achieved_rps"],
        "over_from_rps": None if over is None else over["achieved_rps"],
        "crossing_rps": crossing,
    }


OVERLOAD_GROWTH = 5.0
"""An open-loop window whose last fifth of answers took this many times the first fifth's
median latency was fed faster than it was answered (``overloaded`` in the summary)."""


def open_loop_summary(windows: list[dict[str, Any]], rate_source: str) -> dict[str, Any]:
    """The open-loop windows: medians (each window's in ``*_runs``), counts summed."""
    summary: dict[str, Any] = {
        "rate_rps": windows[0]["rate_rps"],
        "rate_source": rate_source,
        "windows": len(windows),
        "achieved_rps": _median(windows, "achieved_rps"),
        "p50_ms": _median(windows, "p50_ms"),
        "p90_ms": _median(windows, "p90_ms"),
        "p99_ms": _median(windows, "p99_ms"),
        "max_ms": max((w["max_ms"] for w in windows if w["max_ms"] is not None), default=None),
        "late_sends": sum(w["late_sends"] for w in windows),
        "late_send_threshold_ms": windows[0]["late_send_threshold_ms"],
        "errors": sum(w["errors"] for w in windows),
        "error_samples": [e for w in windows for e in w["error_samples"]][:5],
        "requests": sum(w["requests"] for w in windows),
        "answered_total": sum(w["answered_total"] for w in windows),
        "max_in_flight": max(w["max_in_flight"] for w in windows),
        "connections_opened": max(w["connections_opened"] for w in windows),
        "server_cpu_ms_per_request": _median(windows, "server_cpu_ms_per_request"),
        "cpu_busy_fraction": _median(windows, "cpu_busy_fraction"),
        "latency_growth": _median(windows, "latency_growth"),
        "latency_from": "scheduled send time",
    }
    worst = max(windows, key=lambda w: w.get("latency_growth") or 0)
    if (worst.get("latency_growth") or 0) > OVERLOAD_GROWTH:
        busy = worst.get("cpu_busy_fraction")
        summary["overloaded"] = (
            f"latency grew {worst['latency_growth']:.0f}x from the first fifth of a window to "
            "the last: the rate is more than the machine answers (that window's "
            f"cpu_busy_fraction {'n/a' if busy is None else f'{busy:.2f}'}); --rate sets a "
            "lower one"
        )
    for key in ("p50_ms", "p99_ms", "achieved_rps", "late_sends", "latency_growth"):
        summary[f"{key}_runs"] = [w[key] for w in windows if w.get(key) is not None]
    return summary


def measure(
    *,
    workdir: Path,
    env: dict[str, str],
    port: int,
    workers: int,
    ids: Path,
    clients: int,
    candidates: int,
    seconds: float,
    warmup: float,
    repeats: int,
    rate: float | None,
    cross_fields: tuple[str, ...] = (),
    load_steps: tuple[float, ...] = (),
    step_seconds: float = 0.0,
    step_warmup: float = 0.0,
) -> dict[str, Any]:
    """Start the server with ``workers`` processes, probe bad requests, read its torch
    threads, then run ``repeats`` rounds of closed-loop, open-loop and binary closed-loop
    windows, alternating; with ``load_steps`` (shares of the first closed window's
    throughput), an open-loop window of ``step_seconds`` at each (``latency_by_load``); with
    ``cross_fields`` (those the served model reads), read each worker's online-read histogram
    (:mod:`benchmarks.serving_cross_features`) before stopping it."""
    from benchmarks.serving_cross_features import cross_fields_read, scrape_online_reads

    tag = f"{workers}-{int(load_settings(env).serving.compiled)}"
    server = Server(
        {**env, "CASCADE_SERVING_WORKERS": str(workers)}, workdir / f"server-{tag}.log", port
    )
    feedback = load_settings(env).lake_root / "feedback"
    shutil.rmtree(feedback, ignore_errors=True)  # this run's rows only
    windows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in LOAD_MODES}
    open_rate, rate_source = rate, "--rate"
    scorer = "compiled package when gated" if load_settings(env).serving.compiled else "eager"
    try:
        ready_s = server.wait_ready(240)
        _progress(f"server up in {ready_s:.1f} s: {workers} worker(s), {scorer}")
        bad = probe_bad_requests(server.url)
        threads = server.torch_threads(workers)
        load = functools.partial(
            run_load,
            server,
            workdir=workdir,
            env=env,
            ids=ids,
            clients=clients,
            candidates=candidates,
        )
        for round_ in range(repeats):
            # Round 0 runs the closed loop first: the default open-loop rate comes from it.
            for mode in rotated(LOAD_MODES, round_):
                if mode == "open" and open_rate is None:
                    measured = windows["closed"][0]["rps"]
                    open_rate = max(1.0, round(OPEN_LOOP_FRACTION * measured, 1))
                    rate_source = (
                        f"{OPEN_LOOP_FRACTION:.0%} of the first closed-loop window's "
                        f"{measured:.1f} requests/s"
                    )
                windows[mode].append(
                    load(
                        seconds=seconds,
                        warmup=warmup,
                        rate=open_rate if mode == "open" else None,
                        name=f"load-{tag}-{mode}-{round_}",
                        binary=mode == "binary",
                    )
                )
                window = windows[mode][-1]
                _progress(
                    f"{mode} window {round_ + 1}/{repeats} ({workers} worker(s), {scorer}): "
                    f"p50 {_ms(window.get('p50_ms'))}, p99 {_ms(window.get('p99_ms'))}, "
                    f"{window.get('rps') or 0:.0f} requests/s, {window.get('errors', 0)} errors"
                )
        steps: list[dict[str, Any]] = []
        if load_steps:
            measured = windows["closed"][0]["rps"]
            rates = tuple(max(1.0, round(share * measured, 1)) for share in load_steps)
            steps = load(
                seconds=step_seconds,
                warmup=step_warmup,
                rate=None,
                name=f"load-{tag}-steps",
                rates=rates,
            )["steps"]
            _progress(
                "open-loop steps: "
                + ", ".join(
                    f"{s['rate_rps']:.0f}/s p99 {_ms(s.get('p99_ms'))} ({s['errors']} errors)"
                    for s in steps
                )
            )
        online_reads = None
        if cross_fields:
            headers = load_settings(env).serving.auth_headers()
            online_reads = scrape_online_reads(server.url, headers, workers)
        server_log = server.log_path.read_text(errors="replace")
        backend = served_backend(server_log)
    finally:
        server.stop()
    closed = closed_loop_summary(windows["closed"])
    open_ = open_loop_summary(windows["open"], rate_source)
    binary = binary_vs_json(closed, windows["binary"])
    if "overloaded" in open_:
        _progress(f"open loop at {open_['rate_rps']:.0f} requests/s: {open_['overloaded']}")
    # Every good answer (warm-ups included) logged all its candidates, written by shutdown.
    logged = sum(pq.ParquetFile(p).metadata.num_rows for p in feedback.rglob("part-*.parquet"))
    answered = closed["answered_total"] + open_["answered_total"] + binary["answered_total"]
    answered += sum(s["answered_total"] for s in steps)
    expected = answered * candidates
    if online_reads is not None:
        online_reads = per_answer(online_reads, answered)
    by_load = latency_by_load(steps)
    return {
        **closed,
        "load_order": [list(rotated(LOAD_MODES, r)) for r in range(repeats)],
        "open_loop": open_,
        "binary_vs_json": binary,
        **(
            {"latency_by_load": by_load, "p99_crossing": p99_crossing(by_load, P99_CROSSING_MS)}
            if by_load
            else {}
        ),
        "feedback_rows_logged": logged,
        "feedback_rows_expected": expected,
        "feedback_complete": logged == expected,
        "workers": workers,
        "backend": backend,
        "server_ready_s": ready_s,
        "server_cpu_window_only": True,
        "torch_threads_by_worker": threads,
        "bad_request_status": bad,
        "online_reads": online_reads,
        "cross_fields_read_online": cross_fields_read(server_log, cross_fields),
    }


def per_answer(reads: dict[str, Any], answered: int) -> dict[str, Any]:
    """The online-read summary with the server's good answers over its life (``answers``)
    and, per answer, its reads (``reads_per_answer``) and read milliseconds
    (``ms_per_answer``): a user's share of the inputs is held between its requests
    (:mod:`serving.user_sides`), so a view is read when a user's share is built, not on
    every request."""
    total_ms = sum(
        view["mean_ms"] * view["reads"]
        for view in reads["by_view"].values()
        if view["mean_ms"] is not None
    )
    return {
        **reads,
        "answers": answered,
        "reads_per_answer": reads["reads"] / answered if answered else None,
        "ms_per_answer": total_ms / answered if answered else None,
    }


def served_model(settings: Settings, promoted: dict[str, Any]) -> dict[str, Any]:
    """The served version in the private registry: its name, version and training, and
    ``digest``, a SHA-256 of the file digests its registration recorded."""
    from cascade.registry import recorded_version_digests
    from models.preranking import REGISTERED_MODEL

    name, version = REGISTERED_MODEL, str(promoted["version"])
    digests = recorded_version_digests(settings, name, version)
    return {
        "registry": "private MLflow (sqlite)",
        "name": name,
        "version": version,
        "network": promoted["model"],
        "training_config": promoted["training_config"],
        "config_source": promoted["config_source"],
        "is_pipeline_network": promoted["is_pipeline_network"],
        "pipeline_config": promoted["pipeline_config"],
        "trainer": promoted["trainer"],
        "training_data": f"synthetic log, {promoted['log_rows']:,} rows "
        "(models.preranking.synthetic_data), joined with the cross-statistics engine's "
        "partitions of its training days",
        "run_id": promoted.get("run_id"),
        "digest": "sha256:"
        + hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest(),
    }


def absent_cross_reason(wanted: bool, kept: tuple[str, ...]) -> str:
    """Why a run served no cross features."""
    if not wanted:
        return "--no-cross-features"
    if not kept:
        return "the trained network kept none of the declared cross fields (FSCD's selection)"
    return "the server counted no online reads of them (see online_reads and its log)"


def private_stack_env(home: Path, port: int) -> dict[str, str]:
    """The settings of a private stack in ``home``: local profile, a SQLite MLflow, the model
    server on ``port``."""
    return {
        "CASCADE_PROFILE": "local",
        "CASCADE_HOME": str(home),
        "CASCADE_MLFLOW_URI": f"sqlite:///{home / 'mlflow.db'}",
        "CASCADE_SERVING_PORT": str(port),
    }


@dataclass(frozen=True)
class ServedStack:
    """A private stack that serves a champion, as :func:`build_stack` left it."""

    ds: str
    """The served partition: today (UTC)."""
    network: dict[str, Any]
    """Which network (:func:`serving_network`)."""
    statistics: dict[str, Any]
    """How the engine's partitions were computed and loaded (``cross_statistics``)."""
    items: list[int]
    """The catalogue's item ids."""
    training: Any
    """The training set of the served day (a DataFrame)."""
    declared: list[str]
    """Cross fields the training set declares."""
    cross_fields: tuple[str, ...]
    """Cross fields the served network kept."""
    promoted: dict[str, Any]
    """The registered, promoted version with its training."""
    model_provenance: dict[str, Any]
    ids: Path
    """``{"users", "items"}`` the load generator draws requests from (JSON)."""
    setup_s: float


def build_stack(
    workdir: Path, settings: Settings, *, quick: bool, candidates: int, cross_wanted: bool
) -> ServedStack:
    """In the private home of ``settings`` (:func:`private_stack_env`, below ``workdir``): the
    engine's partitions of a synthetic log ending today (UTC) in the lake and the online store,
    the training set, the network trained on it and promoted to ``champion``, and
    ``workdir/ids.json``."""
    from benchmarks import serving_cross_features as cross
    from domains.ctr.catalogue import read_newest_catalogue
    from models.preranking.fields import FieldSet
    from models.preranking.synthetic_data import synthetic_training_frame

    # Today's partition: the cross views' ttl (two days) would serve an older one as missing.
    ds = cross.today_ds()
    network = serving_network(settings, quick=quick)
    settings.home.mkdir(parents=True)
    started = time.monotonic()
    frame = synthetic_training_frame(network["log_rows"], users=USERS, items=ITEMS, seed=7, end=ds)
    log = cross.engine_log(frame)
    statistics = cross.publish_engine_partitions(log, settings, ds, workdir)
    catalogue = read_newest_catalogue(Lake(settings.lake_root), cross.SOURCE)
    assert catalogue is not None  # publish_engine_partitions wrote partition ds
    items = sorted(int(i) for i in catalogue[1]["item_id"])
    if candidates > len(items):
        raise ValueError(
            f"--candidates {candidates}: the benchmark catalogue has {len(items)} items"
        )
    _progress(
        f"engine partitions {statistics['days'][0]}..{ds} ({', '.join(statistics['pairs'])}) "
        f"in {statistics['statistics_s']:.1f} s, {statistics['materialized_rows']:,} rows "
        "in the online store"
    )
    training, folder = cross.write_engine_training_set(
        log, settings, ds, cross_features=cross_wanted
    )
    fields = FieldSet.beside(folder)
    _progress(
        f"training {network['model']} ({network['training_config']}) on {len(training):,} "
        f"rows, {len(fields)} fields"
    )
    if network["model"] == "fscd":
        trained = train_fscd_and_promote(settings, ds, network)
    else:
        trained = cross.train_cold_and_promote(settings, ds, network)
    promoted = {**trained, **network}
    kept = cross.served_fields(settings, ds)
    ids = workdir / "ids.json"
    users = sorted(int(u) for u in training["user_id"].unique())
    ids.write_text(json.dumps({"users": users, "items": items}))
    return ServedStack(
        ds=ds,
        network=network,
        statistics=statistics,
        items=items,
        training=training,
        declared=[n for n in fields.names if n not in cross.ID_FIELDS],
        cross_fields=tuple(name for name in kept if name not in cross.ID_FIELDS),
        promoted=promoted,
        model_provenance=served_model(settings, promoted),
        ids=ids,
        setup_s=time.monotonic() - started,
    )


PROFILE_EVERY = 8
"""The server times one request in this many (``CASCADE_SERVING_PROFILE``)."""
HELD_VS_FULL_REQUESTS = {False: 300, True: 40}
"""Requests ``scores_held_vs_full`` scores both ways (full run, ``--quick``)."""


def run(out: Path, quick: bool) -> dict[str, Any]:
    options = load_settings().bench
    candidates = options.serving_candidates
    clients = options.serving_clients
    seconds = options.serving_seconds or (3 if quick else 30)
    workers = options.serving_workers
    warmup = 1.0 if quick else 5.0
    repeats = bench_repeats(3, quick=quick, quick_default=1)
    cross_wanted = options.serving_cross_features
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        workdir = Path(tmp)
        home = workdir / "home"
        port = free_port()
        env = {
            **os.environ,
            **private_stack_env(home, port),
            "CASCADE_SERVING_MAX_CANDIDATES": str(max(candidates, 10_000)),
            # One answer in PROFILE_EVERY says where its time went (Server-Timing): stage_ms,
            # stage_cpu_ms; the clocks of the others would count in the server's CPU.
            "CASCADE_SERVING_PROFILE": str(PROFILE_EVERY),
        }
        settings = load_settings(env)
        stack = build_stack(
            workdir, settings, quick=quick, candidates=candidates, cross_wanted=cross_wanted
        )
        network, statistics, training = stack.network, stack.statistics, stack.training
        promoted, cross_fields, ids = stack.promoted, stack.cross_fields, stack.ids
        model_provenance = dict(stack.model_provenance)
        declared, items, setup_s, ds = stack.declared, stack.items, stack.setup_s, stack.ds
        load = functools.partial(
            measure,
            workdir=workdir,
            port=port,
            ids=ids,
            clients=clients,
            candidates=candidates,
            seconds=seconds,
            warmup=warmup,
            repeats=repeats,
            rate=options.serving_rate,
            cross_fields=cross_fields,
        )
        main = load(
            workers=workers,
            env=env,
            load_steps=QUICK_LOAD_STEPS if quick else LOAD_STEPS,
            step_seconds=seconds if quick else max(5.0, seconds / 3),
            step_warmup=LOAD_STEP_WARMUP_S[quick],
        )
        # Side by side, for the record: the same load scored by eager PyTorch (when the main
        # run used the compiled package), and the other process count.
        eager = None
        if main["backend"] == "compiled" and not quick:
            eager = load(workers=workers, env={**env, "CASCADE_SERVING_COMPILED": "0"})
        other = None if quick else load(workers=1 if workers > 1 else 2, env=env)
        # The same requests scored from the held user shares and by the full path, in process.
        held = held_vs_full_of_stack(
            env, ids, count=HELD_VS_FULL_REQUESTS[quick], candidates=candidates
        )
    threads = set(main["torch_threads_by_worker"].values())
    reads = main["online_reads"]
    read_online = main["cross_fields_read_online"]
    # The served version read cross features from the online store per request, and the
    # server's histogram counted those reads.
    served_cross = bool(read_online) and bool(reads and reads["reads"] > 0)
    result = {
        **main,
        "cross_features": served_cross,
        "cross_features_requested": cross_wanted,
        "cross_features_absent_because": None
        if served_cross
        else absent_cross_reason(cross_wanted, cross_fields),
        "cross_fields_declared": declared,
        "cross_fields_kept": list(cross_fields),
        "cross_fields_served": read_online,
        "online_read_ms_per_request": reads["ms_per_answer"] if reads else None,
        "scores_held_vs_full": held,
        "scores_identical": (
            held["identical"] == held["requests"] if held.get("held_sides") else None
        ),
        "cross_statistics": statistics,
        "repeats": repeats,
        "training_config": network["training_config"],
        "is_pipeline_network": network["is_pipeline_network"],
        "model_digest": model_provenance.pop("digest"),
        "model_provenance": model_provenance,
        "goal_p99_ms": GOAL_P99_MS,
        "meets_goal": main["p99_ms"] is not None and main["p99_ms"] <= GOAL_P99_MS,
        **goals_met("serving", main, skip={"meets_goal"}),
        "quick": quick,
        "bad_requests_all_4xx": all(400 <= s < 500 for s in main["bad_request_status"].values()),
        "setup": {
            "users": USERS,
            "items": ITEMS,
            "catalogue_items": len(items),
            "training_rows": len(training),
            "log_rows": network["log_rows"],
            "online_store": "sqlite (local profile), bulk-loaded",
            "ds": ds,
            "registry": "mlflow sqlite",
            "model": promoted["model"],
            "model_version": promoted["version"],
            "model_test_auc": promoted["test_auc"],
            "training_config": network["training_config"],
            "compile_gate": promoted.get("compile_gate"),
            "setup_s": setup_s,
            # As the workers report it; None when they disagree (see torch_threads_by_worker).
            "torch_threads_per_worker": threads.pop() if len(threads) == 1 else None,
            "feedback_logging": load_settings().serving.feedback,
        },
    }
    summary = (
        "backend",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "rps",
        "errors",
        "server_cpu_ms_per_request",
        "load_average_before",
        "feedback_complete",
        "p50_ms_runs",
        "p99_ms_runs",
        "rps_runs",
        "server_cpu_ms_per_request_runs",
        "open_loop",
        "online_reads",
        "stage_ms",
        "stage_cpu_ms",
        "binary_vs_json",
    )
    if eager is not None:
        result["eager_scorer"] = {k: eager.get(k) for k in summary}
        result["compiled_vs_eager_cpu"] = (
            eager["server_cpu_ms_per_request"] / main["server_cpu_ms_per_request"]
        )
    if other is not None:
        result[f"with_{other['workers']}_workers"] = {k: other.get(k) for k in summary}
    return result
