"""``benchmarks.serving_path``: the per-stage CPU figures of in-process requests."""

from __future__ import annotations

import pytest

from benchmarks.serving_path import IN_HANDLER, summarize, table
from serving.request_profile import STAGES


def _timing(cpu_ms: dict[str, float]) -> bytes:
    return ", ".join(
        f"{stage};dur={ms * 2:.4f}, {stage}-cpu;dur={ms:.4f}" for stage, ms in cpu_ms.items()
    ).encode("ascii")


def test_stage_cpu_is_summed_per_request_and_averaged_over_requests() -> None:
    first = {stage: 0.1 for stage in STAGES} | {"features": 0.5}
    second = {stage: 0.1 for stage in STAGES} | {"features": 0.9}
    timed = [(1_500_000, 3_000_000, _timing(first)), (2_500_000, 5_000_000, _timing(second))]
    result = summarize(timed, process_cpu_ns=6_000_000)
    assert result["requests"] == 2
    assert result["stage_cpu_ms"]["features"] == {"mean": 0.7, "median": 0.7}
    assert result["stage_cpu_ms"]["parse"]["mean"] == pytest.approx(0.1)
    handled = result["stage_cpu_ms"][IN_HANDLER]
    assert handled["mean"] == pytest.approx((0.6 * 2 + 0.5 + 0.9) / 2)
    assert result["thread_cpu_ms_per_request"] == pytest.approx(2.0)
    assert result["process_cpu_ms_per_request"] == pytest.approx(3.0)
    assert result["wall_ms"]["median"] == pytest.approx(4.0)
    # A stage the server did not time (no profile) counts 0, not a missing key.
    bare = summarize([(1_000, 1_000, None)], process_cpu_ns=1_000)
    assert bare["stage_cpu_ms"]["score"]["mean"] == 0.0
    lines = table({"json": result, "binary": result}).splitlines()
    assert lines[0].split()[-2:] == ["json", "binary"]
    assert any(line.startswith("features") and "0.7000" in line for line in lines)
