"""Where one request's time goes: wall and thread-CPU time per stage of the infer path.

With ``CASCADE_SERVING_PROFILE=N`` the pre-ranking server times each stage of one infer
request in N (``1``: every request) with two clocks (``time.perf_counter_ns`` and
``time.thread_time_ns``: about a microsecond for both, eight laps a request) and answers it
with a ``Server-Timing`` header (W3C Server Timing) holding them, in milliseconds::

    Server-Timing: parse;dur=0.041, parse-cpu;dur=0.040, validate;dur=0.012, ...

The stages, in order (:data:`STAGES`): ``parse`` (the body into tensors, JSON or binary),
``validate`` (the inputs checked against the served version), ``features`` (the candidates'
table rows and the online store's reads), ``encode`` (fields into the network's codes),
``score`` (the network and the sigmoid), ``feedback`` (the request counted and its rows handed
to the feedback writer) and ``respond`` (the answer's body). What happens outside them (HTTP
parsing, the request guard, the event loop, sending, the feedback writer's thread) is not in
the header. The header reaches only a client the guard let in (a token when auth is on), and
the load generator of ``cascade bench serving`` reads it into ``stage_ms`` and ``stage_cpu_ms``
(:func:`parse_server_timing`).
"""

from __future__ import annotations

import time

STAGES = ("parse", "validate", "features", "encode", "score", "feedback", "respond")
"""The stages of an infer request, in the order they run."""
HEADER = b"server-timing"
CPU_SUFFIX = "-cpu"


class StageClock:
    """Wall and thread-CPU nanoseconds of each stage of one request, from its creation on:
    :meth:`lap` closes the stage that ran since the previous lap (or the start)."""

    __slots__ = ("laps", "_wall", "_cpu")

    def __init__(self) -> None:
        self.laps: list[tuple[str, int, int]] = []
        self._wall = time.perf_counter_ns()
        self._cpu = time.thread_time_ns()

    def lap(self, stage: str) -> None:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        self.laps.append((stage, wall - self._wall, cpu - self._cpu))
        self._wall, self._cpu = wall, cpu

    def header_value(self) -> bytes:
        """The laps as a ``Server-Timing`` value: ``STAGE;dur=MS`` and ``STAGE-cpu;dur=MS``;
        a stage that ran more than once (none does) is summed by the reader."""
        return ", ".join(
            f"{stage};dur={wall / 1e6:.4f}, {stage}{CPU_SUFFIX};dur={cpu / 1e6:.4f}"
            for stage, wall, cpu in self.laps
        ).encode("ascii")


def parse_server_timing(value: str) -> dict[str, tuple[float, float]]:
    """``{stage: (wall ms, cpu ms)}`` of a ``Server-Timing`` value written by
    :meth:`StageClock.header_value` (metrics without a ``dur`` are skipped; repeats add up)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for metric in value.split(","):
        name, _, params = metric.strip().partition(";")
        duration = None
        for param in params.split(";"):
            key, _, number = param.partition("=")
            if key.strip() == "dur":
                try:
                    duration = float(number)
                except ValueError:
                    duration = None
        if not name or duration is None:
            continue
        if name.endswith(CPU_SUFFIX):
            stage = name.removesuffix(CPU_SUFFIX)
            cpu[stage] = cpu.get(stage, 0.0) + duration
        else:
            wall[name] = wall.get(name, 0.0) + duration
    return {stage: (ms, cpu.get(stage, 0.0)) for stage, ms in wall.items()}
