"""The pre-ranking request path in one process, without HTTP: CPU time per stage of a request.

    python -m benchmarks.serving_path --workdir /tmp/serving-path --out /tmp/path.json
    python -m benchmarks.serving_path --workdir /tmp/serving-path --requests 300 --cprofile 25
    python -m benchmarks.serving_path --workdir /tmp/serving-pipeline --training-config pipeline

The first run builds a private stack in ``--workdir`` as ``cascade bench serving --quick`` does
(:func:`benchmarks.serving_load.build_stack`: the engine's partitions of today in the lake and
the SQLite online store, the ``debug`` network trained and promoted to ``champion``; the FSCD
cascade with its compiled package, or ``--model cold``: the pre-ranker's network trained in
process and scored eagerly); later runs with the same folder reuse it (the online views'
two-day ttl: rebuild it on a later day). The champion is then loaded in this process by
:class:`serving.preranking.PreRankingModel` with the server's defaults (feedback logged to the
private lake, one torch thread, freed memory kept by the allocator) and its ``infer_v2`` called
on ``--requests`` requests of 1 user x ``--candidates`` items, drawn and encoded beforehand by
the load generator's :class:`benchmarks.load_generator.RequestMaker` (JSON, then the v2 binary
tensor extension), after ``--warmup`` requests of each kind.

Each request's stages are timed by the server's own :class:`serving.request_profile.StageClock`
(its ``Server-Timing``). The result (JSON, and a table on stdout) holds, per encoding:

* ``stage_cpu_ms``: per stage (:data:`serving.request_profile.STAGES`) the mean and median
  thread-CPU ms, and ``in_handler``, the stages added up;
* ``thread_cpu_ms_per_request``: the request thread's CPU from the call to the answer (the
  stages and what lies between them), mean;
* ``process_cpu_ms_per_request``: the whole process's CPU over the requests and the feedback
  log's final write, over the requests (the feedback writer's thread included): what the
  server's process spends on a request outside HTTP and the event loop;
* ``wall_ms``: median and p99 of each call (noisy on a shared machine: compare CPU).

``held_vs_full``: requests scored both from the user's held share of the inputs
(:mod:`serving.user_sides`) and by the full path, with how many came out bit-identical.

Thread CPU does not count time the machine gave to other processes, so figures taken on a busy
shared machine compare with each other. With ``--cprofile N`` the JSON requests run once more
under cProfile (thread-CPU clock) and the N functions with the most own time are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.request_profile import STAGES, parse_server_timing

IN_HANDLER = "in_handler"


def stack_env(workdir: Path) -> dict[str, str]:
    """The private stack's settings in ``workdir`` (no server port is opened here)."""
    from benchmarks.serving_load import private_stack_env
    from cascade.ports import free_port

    return {
        **private_stack_env(workdir / "home", free_port()),
        "CASCADE_SERVING_MAX_CANDIDATES": "10000",
        "CASCADE_SERVING_PROFILE": "1",
        "CASCADE_SERVING_TORCH_THREADS": "1",
    }


def prepare(workdir: Path, *, model: str, config: str | None = None) -> Path:
    """The ids file of the stack in ``workdir``, built first when the folder has none: the
    ``debug`` network, or the training config named by ``config`` (``pipeline``: the network
    ``cascade bench serving`` serves, on its full log; several minutes to build)."""
    ids = workdir / "ids.json"
    if ids.exists():
        return ids
    from benchmarks.serving_load import build_stack
    from cascade.config import load_settings, scoped_environ

    env = {**stack_env(workdir), "CASCADE_BENCH_SERVING_MODEL": model}
    if config is not None:
        env["CASCADE_BENCH_SERVING_CONFIG"] = config
    with scoped_environ(env):
        settings = load_settings()
        stack = build_stack(workdir, settings, quick=True, candidates=1, cross_wanted=True)
    return stack.ids


def requests(ids: Path, *, count: int, candidates: int, binary: bool, seed: int) -> list[Any]:
    """``count`` request bodies with their headers, as :meth:`infer_v2` takes them."""
    from benchmarks.load_generator import RequestMaker
    from serving.v2_codec import INFERENCE_HEADER_BYTES

    drawn = json.loads(ids.read_text())
    make = RequestMaker(
        drawn["users"], drawn["items"], candidates=candidates, seed=seed, binary=binary
    )
    made = []
    for _ in range(count):
        extra, body = make.encode()
        headers: list[tuple[bytes, bytes]] = []
        if extra:  # "Inference-Header-Content-Length: N\r\n"
            headers.append((INFERENCE_HEADER_BYTES, extra.split(b":")[1].strip()))
            headers.append((b"content-type", b"application/octet-stream"))
        made.append((body, headers))
    return made


async def _call_all(model: Any, bodies: list[Any]) -> list[tuple[int, int, bytes | None]]:
    """Each request's ``(thread CPU ns, wall ns, Server-Timing)``."""
    out = []
    for body, headers in bodies:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        answer = await model.infer_v2(body, headers)
        out.append((time.thread_time_ns() - cpu, time.perf_counter_ns() - wall, answer.timing))
    return out


def summarize(timed: list[tuple[int, int, bytes | None]], process_cpu_ns: int) -> dict[str, Any]:
    """The figures of one kind of request (see the module docstring)."""
    per_stage: dict[str, list[float]] = {stage: [] for stage in (*STAGES, IN_HANDLER)}
    for _, _, timing in timed:
        stages = parse_server_timing((timing or b"").decode("ascii"))
        for stage in STAGES:
            per_stage[stage].append(stages.get(stage, (0.0, 0.0))[1])
        per_stage[IN_HANDLER].append(sum(cpu for _, cpu in stages.values()))
    wall = np.array([w for _, w, _ in timed]) / 1e6
    return {
        "requests": len(timed),
        "stage_cpu_ms": {
            stage: {"mean": statistics.fmean(values), "median": statistics.median(values)}
            for stage, values in per_stage.items()
        },
        "thread_cpu_ms_per_request": statistics.fmean(c for c, _, _ in timed) / 1e6,
        "process_cpu_ms_per_request": process_cpu_ns / 1e6 / len(timed),
        "wall_ms": {"median": float(np.median(wall)), "p99": float(np.percentile(wall, 99))},
    }


def profile_path(
    workdir: Path,
    *,
    count: int,
    candidates: int,
    warmup: int,
    seed: int = 11,
    cprofile: int = 0,
) -> dict[str, Any]:
    """Load the champion of the stack in ``workdir`` and time ``count`` requests of each
    encoding (module docstring); ``cprofile``: print that many functions of a profiled run."""
    from cascade.config import load_settings, scoped_environ
    from serving.allocator import keep_freed_memory
    from serving.preranking import PreRankingModel, ServingConfig
    from serving.server import set_torch_threads

    ids = workdir / "ids.json"
    env = stack_env(workdir)
    with scoped_environ(env):
        keep_freed_memory()  # as the server does
        set_torch_threads()
        model = PreRankingModel(settings=load_settings(), config=ServingConfig.from_env())
        if not model.load():
            raise RuntimeError(f"no champion served from {workdir}; remove the folder to rebuild")
        result: dict[str, Any] = {
            "candidates": candidates,
            "model_version": model.served_version,
            "backend": model._serving().backend,
            "online_fields": sorted(model._serving().online.fields),
            "feedback": model.observer is not None and model.observer.feedback is not None,
        }
        try:
            for name, binary in (("json", False), ("binary", True)):
                drawn = requests(
                    ids, count=warmup + count, candidates=candidates, binary=binary, seed=seed
                )
                asyncio.run(_call_all(model, drawn[:warmup]))
                _flush_feedback(model)
                started = time.process_time_ns()
                timed = asyncio.run(_call_all(model, drawn[warmup:]))
                _flush_feedback(model)
                result[name] = summarize(timed, time.process_time_ns() - started)
            result["held_vs_full"] = held_vs_full(
                model, ids, count=min(count, 500), candidates=candidates, seed=seed
            )
            if cprofile:
                drawn = requests(ids, count=count, candidates=candidates, binary=False, seed=seed)
                profiler = cProfile.Profile(time.thread_time)  # CPU: robust on a busy machine
                profiler.enable()
                asyncio.run(_call_all(model, drawn))
                profiler.disable()
                pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(
                    cprofile
                )
        finally:
            model.stop()
    return result


def held_vs_full(
    model: Any, ids: Path, *, count: int, candidates: int, seed: int
) -> dict[str, Any]:
    """Each of ``count`` requests scored twice in this process, from the user's held share of
    the inputs (:mod:`serving.user_sides`) and by the full path (read and encode per request):
    how many came out bit-identical, the largest difference, and the held sides' counts.
    ``{"held_sides": False}`` when the served version holds none."""
    served = model._serving()
    sides = served.user_sides
    if sides is None:
        return {"held_sides": False}
    drawn = json.loads(ids.read_text())
    rng = np.random.default_rng(seed)
    users = np.asarray(drawn["users"], dtype=np.int64)
    items = np.asarray(drawn["items"], dtype=np.int64)
    identical, worst = 0, 0.0
    for _ in range(count):
        user = int(users[rng.integers(len(users))])
        chosen = rng.choice(items, candidates, replace=False)
        held = model.score_request(served, user, chosen, None).scores
        full = model.score_request(served, user, chosen, None, held=False).scores
        identical += bool(np.array_equal(held, full))
        worst = max(worst, float(np.abs(held.astype(np.float64) - full).max()))
    return {
        "held_sides": True,
        "views": list(sides.views),
        "requests": count,
        "identical": identical,
        "max_abs_diff": worst,
        "users_held": len(sides),
        "builds": sides.builds,
        "hits": sides.hits,
    }


def held_vs_full_of_stack(
    env: dict[str, str], ids: Path, *, count: int, candidates: int, seed: int = 11
) -> dict[str, Any]:
    """:func:`held_vs_full` on the champion of a private stack (``env``: its settings), loaded
    in this process as the server loads it."""
    from cascade.config import load_settings, scoped_environ
    from serving.preranking import PreRankingModel, ServingConfig

    with scoped_environ(env):
        model = PreRankingModel(settings=load_settings(), config=ServingConfig.from_env())
        if not model.load():
            return {"held_sides": None, "error": "no champion to load"}
        try:
            return held_vs_full(model, ids, count=count, candidates=candidates, seed=seed)
        finally:
            model.stop()


def _flush_feedback(model: Any) -> None:
    """Write what the feedback log holds now (its writer thread's work for the requests)."""
    feedback = model.observer.feedback if model.observer is not None else None
    if feedback is not None:
        feedback.flush()


def table(result: dict[str, Any]) -> str:
    """The figures as lines: per stage the mean CPU ms of each encoding."""
    lines = [f"{'stage (CPU ms, mean)':<28}{'json':>10}{'binary':>10}"]
    for stage in (*STAGES, IN_HANDLER):
        row = [result[side]["stage_cpu_ms"][stage]["mean"] for side in ("json", "binary")]
        lines.append(f"{stage:<28}{row[0]:>10.4f}{row[1]:>10.4f}")
    for key in ("thread_cpu_ms_per_request", "process_cpu_ms_per_request"):
        row = [result[side][key] for side in ("json", "binary")]
        lines.append(f"{key:<28}{row[0]:>10.4f}{row[1]:>10.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="the private stack's folder")
    parser.add_argument("--model", choices=("fscd", "cold"), default="fscd")
    parser.add_argument(
        "--training-config",
        help="training config of the network the stack serves (default: debug; pipeline: the "
        "one cascade bench serving serves); read when the stack is built",
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--cprofile", type=int, default=0, help="functions to print (0: none)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warmup < 0 or args.candidates < 1:
        parser.error("--requests and --candidates must be >= 1, --warmup >= 0")
    args.workdir.mkdir(parents=True, exist_ok=True)
    prepare(args.workdir, model=args.model, config=args.training_config)
    result = profile_path(
        args.workdir,
        count=args.requests,
        candidates=args.candidates,
        warmup=args.warmup,
        cprofile=args.cprofile,
    )
    result["pid"] = os.getpid()
    print(table(result))
    print("held vs full path:", json.dumps(result["held_vs_full"]))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
