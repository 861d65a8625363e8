"""The real local stack for end-to-end tests: its own state folder and free ports, started once
per session and stopped at the end, so a developer's running stack is never touched."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from cascade.config import Settings, load_settings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from infra.stack import down, up

    home = tmp_path_factory.mktemp("cascade-home")
    env = {"CASCADE_HOME": str(home)}
    for name in ("broker", "airflow", "mlflow", "serving"):
        env[f"CASCADE_{name.upper()}_PORT"] = str(_free_port())
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings = load_settings()
    try:
        up(settings)
        yield settings
    finally:
        try:
            down(settings)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture(scope="session")
def pipeline_run(stack: Settings) -> dict:
    """One asset-triggered ``ctr_preranking`` run started by a Kafka event."""
    from cascade.demo import trigger_and_wait

    return trigger_and_wait("2026-11-22", settings=stack, timeout_s=1800)
