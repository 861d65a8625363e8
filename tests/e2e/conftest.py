"""The real local stack for end-to-end tests: its own state folder and free ports, started once
per session and stopped at the end, so a developer's running stack is never touched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cascade.config import Settings


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import private_stack

    with private_stack(tmp_path_factory.mktemp("cascade-home")) as settings:
        yield settings


@pytest.fixture(scope="session")
def pipeline_run(stack: Settings) -> dict:
    """One asset-triggered ``ctr_preranking`` run started by a Kafka event."""
    from cascade.demo import trigger_and_wait

    return trigger_and_wait("2026-11-22", settings=stack, timeout_s=1800)
