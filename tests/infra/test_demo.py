"""The demo's path through the chained DAGs: the impressions event starts ``ctr_cross``, whose
published partition starts ``ctr_preranking``; the demo waits for each in turn."""

from __future__ import annotations

from typing import Any

import pytest

from infra import demo


def test_an_event_for_the_pre_ranker_goes_through_ctr_cross_and_is_followed_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    triggered = demo.Triggered(
        "ctr_preranking", "e1", {"old"}, 0.0, upstream={"ctr_cross": {"old-cross"}}
    )
    upstream = triggered.of("ctr_cross")
    assert (upstream.dag_id, upstream.event_id, upstream.runs_before) == (
        "ctr_cross",
        "e1",
        {"old-cross"},
    )
    assert triggered.of("ctr_preranking") is triggered
    assert demo.STARTED_BY["ctr_preranking"] == ("ctr_cross", "impressions")

    waited: list[str] = []
    states = {"ctr_cross": "success", "ctr_preranking": "success"}

    def wait(t: demo.Triggered, **kwargs: Any) -> dict[str, Any]:
        waited.append(t.dag_id)
        return {"dag_run_id": f"{t.dag_id}-run", "dag_run_state": states[t.dag_id]}

    monkeypatch.setattr(demo, "trigger", lambda ds, **kwargs: triggered)
    monkeypatch.setattr(demo, "wait_for_triggered", wait)
    settings: Any = object()
    done = demo.trigger_and_wait("2026-11-22", settings=settings, timeout_s=1, echo=print)
    assert waited == ["ctr_cross", "ctr_preranking"] and done["dag_run_id"] == "ctr_preranking-run"

    # A failed upstream run is the outcome, named; nothing waits for a run that cannot come.
    waited.clear()
    states["ctr_cross"] = "failed"
    failed = demo.trigger_and_wait("2026-11-22", settings=settings, timeout_s=1, echo=print)
    assert waited == ["ctr_cross"]
    assert (failed["failed_dag"], failed["dag_run_state"]) == ("ctr_cross", "failed")
