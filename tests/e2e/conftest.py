"""The real local stack for end-to-end tests: its own state folder and free ports, started once
per session and stopped at the end, so a developer's running stack is never touched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cascade.config import Settings

DS = "2026-11-22"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import private_stack
    from models.preranking.cascade_train import CHECKPOINT_EVERY_ENV

    env = {
        # The asr DAG trains its seconds-long debug flavor here.
        "CASCADE_ASR_CONFIG": "debug",
        # Pre-ranker phases checkpoint at steps 50 and 100 of the ~126 the partition gives
        # each, so the fault test's kill lands well inside the phase it checkpointed.
        CHECKPOINT_EVERY_ENV: "50",
    }
    with private_stack(tmp_path_factory.mktemp("cascade-home"), env=env) as settings:
        yield settings


@pytest.fixture(scope="session")
def triggered(stack: Settings) -> dict[str, Any]:
    """Both pipelines' Kafka events, published together: the two DAG runs overlap, as they
    would in production, and the session waits for the slower one rather than for both in turn."""
    from cascade.demo import trigger

    return {
        "ctr_preranking": trigger(DS, settings=stack),
        "asr": trigger(DS, settings=stack, dag_id="asr", dataset="speech"),
    }


@pytest.fixture(scope="session")
def pipeline_run(stack: Settings, triggered: dict[str, Any]) -> dict:
    """One asset-triggered ``ctr_preranking`` run started by a Kafka event."""
    from cascade.demo import wait_for_triggered

    return wait_for_triggered(triggered["ctr_preranking"], settings=stack, timeout_s=1800)


@pytest.fixture(scope="session")
def asr_run(stack: Settings, triggered: dict[str, Any]) -> dict:
    """One asset-triggered ``asr`` run started by a Kafka event (dataset ``speech``)."""
    from cascade.demo import wait_for_triggered

    return wait_for_triggered(
        triggered["asr"],
        settings=stack,
        timeout_s=1800,
        result_tasks=("corpus", "train", "compile", "register", "deploy"),
    )
