"""A private broker + Airflow for the fault tests (free ports, tmp state folder), shared by this
package so Airflow starts once, and stopped after its last test (see ``tests/e2e/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cascade.config import Settings

WINDOW_S = 6.0
"""Coalescing window the fault stack runs with (CASCADE_COALESCE_WINDOW_S). Wider than the
longest pause seen between stored events of one burst on the loaded 2-core machine (2.3 s)."""


@pytest.fixture(scope="package")
def event_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from benchmarks.event_delivery import wait_for_probe_dag
    from infra.stack import private_stack

    env = {
        "CASCADE_COALESCE_WINDOW_S": str(WINDOW_S),
        "CASCADE_COALESCE_MAX_WAIT_S": "300",
        "CASCADE_AIRFLOW_SCHEDULES": "0",
    }
    with private_stack(
        tmp_path_factory.mktemp("faults-home"), services=("broker", "airflow"), env=env
    ) as settings:
        wait_for_probe_dag(settings)
        yield settings
