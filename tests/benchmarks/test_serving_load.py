"""``cascade bench serving``: which network it serves, how its load windows are summarized, and
``--quick`` end to end (the private stack, the real server and the load generator)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.registry import BENCHMARKS, OPTIONS, run_benchmark


def test_the_served_network_is_the_pipelines_by_config_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks.serving_load import serving_network
    from cascade.config import load_settings

    for name in ("CASCADE_BENCH_SERVING_MODEL", "CASCADE_BENCH_SERVING_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CASCADE_PRERANKING_CONFIG", raising=False)
    full = serving_network(load_settings(), quick=False)
    assert (full["model"], full["training_config"], full["is_pipeline_network"]) == (
        "fscd",
        "pipeline",
        True,
    )
    quick = serving_network(load_settings(), quick=True)
    assert (quick["training_config"], quick["is_pipeline_network"]) == ("debug", False)
    # The pipeline's FSCD sweep needs the larger log to keep a model within its cost budget.
    assert full["log_rows"] > quick["log_rows"]
    assert "--quick" in quick["config_source"]
    # The pipeline's own config setting names the network; --config wins over both.
    monkeypatch.setenv("CASCADE_PRERANKING_CONFIG", "ml100k")
    assert serving_network(load_settings(), quick=False)["training_config"] == "ml100k"
    monkeypatch.setenv("CASCADE_BENCH_SERVING_MODEL", "cold")
    monkeypatch.setenv("CASCADE_BENCH_SERVING_CONFIG", "debug")
    given = serving_network(load_settings(), quick=False)
    assert (given["model"], given["training_config"], given["config_source"]) == (
        "cold",
        "debug",
        "--config",
    )
    monkeypatch.setenv("CASCADE_BENCH_SERVING_CONFIG", "nope")
    with pytest.raises(ValueError, match="unknown cascade config 'nope'"):
        serving_network(load_settings(), quick=False)


def _window(mode: str, p50: float, rps: float, cpu: float) -> dict[str, Any]:
    window: dict[str, Any] = {
        "mode": mode,
        "clients": 2,
        "candidates": 5,
        "warmup_s": 1.0,
        "duration_s": 1.0,
        "requests": 10,
        "errors": 0,
        "error_samples": [],
        "status_counts": {"200": 10},
        "answered_total": 12,
        "load_generator_cpu_s": 0.1,
        "p50_ms": p50,
        "p90_ms": p50 * 2,
        "p99_ms": p50 * 3,
        "max_ms": p50 * 4,
        "mean_ms": p50,
        "rps": rps,
        "server_cpu_ms_per_request": cpu,
        "load_average_before": 1.0,
        "load_average_after": 2.0,
    }
    if mode == "open":
        window |= {"rate_rps": 7.0, "achieved_rps": rps, "late_sends": 1}
        window |= {"late_send_threshold_ms": 5.0, "max_in_flight": 3, "connections_opened": 3}
    return window


def test_load_windows_give_medians_with_each_window_in_runs() -> None:
    from benchmarks.provenance import spreads
    from benchmarks.serving_load import closed_loop_summary, open_loop_summary

    closed = closed_loop_summary(
        [_window("closed", 4.0, 10.0, 2.0), _window("closed", 2.0, 12.0, 3.0)]
        + [_window("closed", 3.0, 11.0, 9.0)]
    )
    assert (closed["p50_ms"], closed["rps"], closed["server_cpu_ms_per_request"]) == (3, 11, 3)
    assert closed["p50_ms_runs"] == [4.0, 2.0, 3.0] and closed["max_ms"] == 16.0
    assert (closed["requests"], closed["answered_total"], closed["status_counts"]) == (
        30,
        36,
        {"200": 30},
    )
    open_ = open_loop_summary([_window("open", 5.0, 6.0, 2.0)], "--rate")
    assert (open_["rate_rps"], open_["achieved_rps"], open_["late_sends"]) == (7.0, 6.0, 1)
    assert open_["p99_ms"] == 15.0 and open_["rate_source"] == "--rate"
    assert "overloaded" not in open_ and open_["latency_growth"] is None
    # A window whose answers slowed down as it went was fed more than the server answers.
    steady = _window("open", 5.0, 6.0, 2.0) | {"latency_growth": 1.1, "cpu_busy_fraction": 0.7}
    piling = _window("open", 90.0, 5.0, 2.0) | {"latency_growth": 40.0, "cpu_busy_fraction": 0.99}
    assert "overloaded" not in open_loop_summary([steady], "--rate")
    overloaded = open_loop_summary([steady, piling], "--rate")
    assert overloaded["latency_growth_runs"] == [1.1, 40.0]
    assert "grew 40x" in overloaded["overloaded"] and "0.99" in overloaded["overloaded"]
    figures = spreads({**closed, "open_loop": open_})
    assert figures["p99_ms"] == {"min": 6.0, "median": 9.0, "max": 12.0, "n": 3}
    assert figures["open_loop.achieved_rps"]["n"] == 1


def test_stage_timings_binary_beside_json_and_the_load_steps_are_summarized() -> None:
    from benchmarks.serving_load import (
        binary_vs_json,
        closed_loop_summary,
        latency_by_load,
        p99_crossing,
    )

    def profiled(window: dict[str, Any], parse: float, cpu: float) -> dict[str, Any]:
        stages = {"parse": {"median": parse, "p99": 2 * parse}, "in_handler": {"median": 1.0}}
        stages["in_handler"]["p99"] = 3.0
        return window | {
            "stage_ms": stages,
            "stage_cpu_ms": {"parse": cpu, "in_handler": 0.5},
            "profiled_requests": 10,
        }

    closed = closed_loop_summary(
        [profiled(_window("closed", 4.0, 10.0, 2.0), 0.1, 0.05)]
        + [profiled(_window("closed", 2.0, 12.0, 3.0), 0.3, 0.07)]
        + [profiled(_window("closed", 3.0, 11.0, 9.0), 0.2, 0.06)]
    )
    assert closed["stage_ms"]["parse"] == {"median": 0.2, "p99": 0.4}
    assert closed["stage_cpu_ms"] == {"parse": 0.06, "in_handler": 0.5}
    assert closed["profiled_requests"] == 30
    assert closed["cpu_outside_stages_ms_per_request"] == 3.0 - 0.5
    # Unprofiled windows (a server without CASCADE_SERVING_PROFILE): no stage figures.
    assert "stage_ms" not in closed_loop_summary([_window("closed", 4.0, 10.0, 2.0)])
    versus = binary_vs_json(closed, [profiled(_window("closed", 1.0, 20.0, 1.5), 0.01, 0.01)])
    assert versus["json"]["p99_ms"] == 9.0 and versus["binary"]["p99_ms"] == 3.0
    assert versus["binary"]["parse_cpu_ms"] == 0.01 and versus["json"]["parse_cpu_ms"] == 0.06
    assert versus["p99_binary_over_json"] == 3.0 / 9.0
    assert versus["server_cpu_binary_over_json"] == 1.5 / 3.0
    # Steps come back lowest offered rate first; p99 crosses 10 ms between 600 and 900/s.
    raw = [
        _window("open", p50, rps, 1.0) | {"rate_rps": rate, "p99_ms": p99}
        for rate, rps, p50, p99 in ((900, 880, 6, 16), (300, 300, 2, 4), (600, 598, 3, 8))
    ]
    steps = latency_by_load(raw)
    assert [s["offered_rps"] for s in steps] == [300, 600, 900]
    assert steps[1]["achieved_rps"] == 598 and steps[1]["errors"] == 0
    assert steps[0]["answered_total"] == 12
    crossing = p99_crossing(steps, 10.0)
    assert (crossing["within_up_to_rps"], crossing["over_from_rps"]) == (598, 880)
    assert crossing["crossing_rps"] == pytest.approx(598 + (10 - 8) * (880 - 598) / (16 - 8))
    assert p99_crossing(steps[:2], 10.0)["crossing_rps"] is None  # never over
    with_errors = [steps[0], steps[1] | {"errors": 3}]
    assert p99_crossing(with_errors, 10.0)["over_from_rps"] == 598  # errors count as over


def test_torch_threads_are_read_per_worker_from_the_metrics() -> None:
    from benchmarks.serving_load import torch_threads_from_metrics

    text = (
        "# HELP cascade_serving_torch_threads Intra-op threads\n"
        "# TYPE cascade_serving_torch_threads gauge\n"
        'cascade_serving_torch_threads{pid="41"} 1.0\n'
        'cascade_serving_torch_threads{pid="42"} 2.0\n'
        'cascade_inference_errors_total{model_name="m",kind="model"} 0.0\n'
    )
    assert torch_threads_from_metrics(text) == {"41": 1, "42": 2}


@pytest.mark.slow
def test_quick_serving_benchmark_reports_latency_without_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The FSCD pre-ranker's network trained in process (seconds): the pipeline's FSCD champion
    # is served in the e2e pipeline run.
    monkeypatch.setenv("CASCADE_BENCH_SERVING_MODEL", "cold")
    monkeypatch.delenv("CASCADE_BENCH_SERVING_CROSS_FEATURES", raising=False)
    assert BENCHMARKS["serving"] == "benchmarks.serving_load:run"
    assert set(OPTIONS["serving"]) == {
        "candidates",
        "clients",
        "seconds",
        "workers",
        "config",
        "rate",
        "cross-features",
    }
    out = tmp_path / "serving.json"
    result = run_benchmark(
        "serving",
        out,
        quick=True,
        options={"candidates": "200", "clients": "2", "seconds": "1", "workers": "1"},
    )
    assert json.loads(out.read_text())["benchmark"] == "serving"
    # Progress while it runs: the setup, then each measured window with its figures.
    said = capsys.readouterr().out
    assert "[bench serving] engine partitions" in said and "[bench serving] training cold" in said
    for mode in ("closed", "open", "binary"):
        assert f"[bench serving] {mode} window 1/1 (1 worker(s), " in said, said[-2000:]
    assert "[bench serving] open-loop steps: " in said
    for key in ("p50_ms", "p99_ms", "rps", "errors", "candidates", "clients", "duration_s"):
        assert key in result, key
    assert result["errors"] == 0 and result["requests"] > 10
    assert (result["candidates"], result["clients"], result["workers"]) == (200, 2, 1)
    assert 0 < result["p50_ms"] <= result["p99_ms"] and result["rps"] > 0
    assert result["machine"]["cpus"] >= 1 and result["warmup_s"] > 0
    assert result["bad_requests_all_4xx"], result["bad_request_status"]
    assert result["setup"]["model_version"] == "1" and result["setup"]["model"] == "cold"
    assert result["backend"] == "eager"  # trained in process: no compiled package
    # Engine features: the user, item and user x category statistics computed into the lake,
    # bulk-loaded into the online store; the server reads the item-keyed ones once per version
    # load, the user-keyed ones per request (its histogram counted the reads).
    statistics = result["cross_statistics"]
    assert statistics["pairs"] == ["user", "item", "user_cat"]
    assert statistics["materialize_engine"] == "bulk"
    assert statistics["materialized_rows"] > 1_000
    assert result["cross_features"] is True and result["cross_features_absent_because"] is None
    served = result["cross_fields_served"]
    assert served and set(served) <= set(result["cross_fields_kept"])
    assert {name.split("_")[0] for name in served} == {"user"}  # user, user_cat
    assert not any(name.startswith("item_") for name in served)
    assert "user_cat_ctr_7d" in served and "user_ctr_7d" in served
    reads = result["online_reads"]
    # Both views read together, when a user's share of the inputs is built (at most once per
    # user and worker while the store does not change), the probes' 4xx answers read nothing;
    # the item view is read when the version loads, not per request.
    assert set(reads["by_view"]) == {"cross_user", "cross_user_cat"}
    steps = result["latency_by_load"]
    every_answer = (
        result["answered_total"]
        + result["open_loop"]["answered_total"]
        + result["binary_vs_json"]["answered_total"]
        + sum(step["answered_total"] for step in steps)
    )
    users = result["setup"]["users"]  # the requests' users are among them
    built = reads["by_view"]["cross_user"]["reads"]
    assert reads["by_view"]["cross_user_cat"]["reads"] == built
    assert 0 < built <= min(every_answer, users * result["workers"])
    assert reads["answers"] == every_answer
    assert reads["reads_per_answer"] == pytest.approx(2 * built / every_answer)
    assert result["setup"]["catalogue_items"] >= 200 and result["setup"]["training_rows"] > 1_000
    assert 0 < result["online_read_ms_per_request"] < reads["one_read_per_view_ms"]
    # The held shares score the requests bit for bit as the full path does.
    held = result["scores_held_vs_full"]
    assert held["held_sides"] and held["views"] == ["cross_user", "cross_user_cat"]
    assert held["requests"] == 40 and result["scores_identical"] is True
    # Every candidate of every good answer (warm-up included) was logged, none lost at stop.
    assert result["setup"]["feedback_logging"]
    assert result["feedback_complete"], (result["feedback_rows_logged"], result["answered_total"])
    open_loop = result["open_loop"]
    assert result["feedback_rows_expected"] == every_answer * 200 > 0
    # --quick serves the debug config, and says it is not the pipeline's network.
    assert result["training_config"] == "debug" and not result["is_pipeline_network"]
    assert result["model_provenance"]["pipeline_config"] == "pipeline"
    assert result["model_digest"].startswith("sha256:")
    # One window per load mode; the open loop at 70% of the closed loop's throughput, latency
    # from the scheduled send time.
    assert result["repeats"] == 1 and result["p50_ms_runs"] == [result["p50_ms"]]
    assert open_loop["rate_rps"] == pytest.approx(max(1.0, 0.7 * result["rps"]), abs=0.1)
    assert open_loop["errors"] == 0 and open_loop["achieved_rps"] > 0
    assert 0 < open_loop["p50_ms"] <= open_loop["p99_ms"] <= open_loop["max_ms"]
    assert open_loop["late_sends"] >= 0 and open_loop["latency_from"] == "scheduled send time"
    assert result["spread"]["open_loop.p99_ms"]["n"] == 1
    # Server CPU of the measured window only, and the torch threads the worker reported.
    assert result["server_cpu_window_only"] and result["server_cpu_ms_per_request"] > 0
    assert list(result["torch_threads_by_worker"].values()) == [1]
    assert result["setup"]["torch_threads_per_worker"] == 1
    from benchmarks.docs import FIGURES
    from benchmarks.provenance import non_finite
    from benchmarks.serving_load import BAD_REQUESTS

    for path in FIGURES["serving"]:  # each figure of the docs page is in the result
        value: object = result
        for part in path.split("."):
            assert isinstance(value, dict) and part in value, path
            value = value[part]
    assert non_finite(result) == []
    # Where the server's time went, stage by stage, as each answer's Server-Timing said.
    from serving.request_profile import STAGES

    stage_ms, stage_cpu = result["stage_ms"], result["stage_cpu_ms"]
    assert list(stage_ms) == list(stage_cpu) == [*STAGES, "in_handler"]
    for stage in STAGES:
        assert 0 <= stage_ms[stage]["median"] <= stage_ms[stage]["p99"], stage
        assert 0 <= stage_cpu[stage] <= stage_ms[stage]["p99"] + 0.5, stage
    assert stage_ms["score"]["median"] > 0 and stage_ms["features"]["median"] > 0
    handled = stage_ms["in_handler"]["median"]
    assert 0 < handled < result["p50_ms"]  # the handler is part of the round trip
    # One request in PROFILE_EVERY is timed, each worker counting its own (the window's first
    # and last of each worker's cycle may fall outside it).
    from benchmarks.serving_load import PROFILE_EVERY

    timed, requests = result["profiled_requests"], result["requests"]
    assert abs(timed * PROFILE_EVERY - requests) <= 2 * PROFILE_EVERY * result["workers"], timed
    assert result["cpu_outside_stages_ms_per_request"] is not None
    # The same load in the binary tensor extension, without errors, beside the JSON figures.
    versus = result["binary_vs_json"]
    assert versus["json"]["p99_ms"] == result["p99_ms"]
    assert versus["binary"]["errors"] == 0 and versus["binary"]["rps"] > 0
    for side in ("json", "binary"):
        assert versus[side]["server_cpu_ms_per_request"] > 0 and versus[side]["p99_ms"] > 0
        assert versus[side]["parse_cpu_ms"] > 0 and versus[side]["respond_cpu_ms"] > 0
        assert versus[side]["validate_cpu_ms"] > 0
    assert versus["p99_binary_over_json"] > 0 and versus["server_cpu_binary_over_json"] > 0
    assert all(
        name.startswith("binary: ")
        for name in result["bad_request_status"]
        if name not in BAD_REQUESTS
    ) and len(result["bad_request_status"]) > len(BAD_REQUESTS)
    # Open-loop steps, lowest offered rate first, with the load generator's own CPU.
    assert [round(s["offered_rps"] / result["rps"], 1) for s in steps] == [0.3, 0.7, 1.1]
    for step in steps:
        assert step["errors"] == 0 and step["achieved_rps"] > 0
        assert 0 < step["p50_ms"] <= step["p99_ms"]
        assert step["load_generator_cpu_ms_per_request"] > 0
        assert step["server_cpu_ms_per_request"] > 0
    crossing = result["p99_crossing"]
    assert crossing["p99_ms"] == 10.0
    assert crossing["within_up_to_rps"] is not None or crossing["over_from_rps"]
