"""A task that fails for good leaves an error line and a ``cascade.run.failed`` event on the
real broker; with the broker down the callback still returns (the notice is best effort)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from cascade.assets import TOPIC_RUN_FAILED
from cascade.config import Settings
from cascade.dag_factory import notify_failure
from cascade.events import parse_event


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import private_stack

    with private_stack(tmp_path_factory.mktemp("notice-home"), services=("broker",)) as settings:
        yield settings


def failed_context(partition: str | None) -> dict[str, object]:
    return {
        "ti": SimpleNamespace(dag_id="ctr_cross", task_id="stats", try_number=3),
        "dag_run": SimpleNamespace(run_id="manual__2026-11-22T02:00:00"),
        "exception": RuntimeError("no clean row in the 30-day window\nsecond line"),
        "params": {"ds": partition},
    }


def test_a_failed_task_publishes_a_run_failed_event(
    broker: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from cascade.broker import read_topic

    with caplog.at_level(logging.ERROR):
        notify_failure(failed_context("2026-11-22"))

    assert "FAILED ctr_cross.stats run manual__2026-11-22T02:00:00 (try 3)" in caplog.text
    ((_, _, value),) = read_topic(TOPIC_RUN_FAILED, settings=broker)
    event = parse_event(value)
    assert event.payload == {
        "pipeline": "ctr_cross",
        "run_id": "manual__2026-11-22T02:00:00",
        "task": "stats",
        "try_number": 3,
        "partition": "2026-11-22",
        "error": "RuntimeError: no clean row in the 30-day window",
    }


def test_with_the_broker_down_the_callback_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from cascade.ports import free_port

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_BROKER_PORT", str(free_port()))
    with caplog.at_level(logging.WARNING):
        notify_failure(failed_context(None))
    assert f"could not publish {TOPIC_RUN_FAILED}" in caplog.text
