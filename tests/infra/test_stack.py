"""The stack manager against the real broker: idempotent start, clear port errors, clean stop."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from cascade.assets import TOPICS
from cascade.broker import describe
from cascade.config import PORT_NAMES, load_settings
from infra import services, stack


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    for name, port in zip(PORT_NAMES, stack.free_ports(len(PORT_NAMES)), strict=True):
        monkeypatch.setenv(f"CASCADE_{name.upper()}_PORT", str(port))
    return load_settings()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_broker_starts_once_reports_status_and_stops_without_leftovers(settings) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    try:
        (first,) = stack.up(settings, ("broker",), echo=lines.append)
        assert first.healthy and first.pid
        assert any("created topics" in line for line in lines)
        (second,) = stack.up(settings, ("broker",), echo=lines.append)
        assert second.pid == first.pid, "a second start must reuse the running broker"
        assert any("already running" in line for line in lines)
        states = {s.name: s for s in stack.status(settings)}
        assert states["broker"].healthy and not states["mlflow"].up
        assert states["broker"].log.exists()
        # Apache Kafka itself, one KRaft node that is its own controller.
        found = describe(settings)
        assert found["brokers"] == [1] and found["controller_id"] == 1
        assert set(TOPICS) <= set(found["topics"])
        cluster_id = found["cluster_id"]
        server_log = settings.logs_dir / "broker.server.log"
        assert "Kafka Server started" in server_log.read_text()
        # A restart reuses the formatted storage: the same cluster, the topics kept.
        stack.down(settings, ("broker",), echo=lines.append)
        (third,) = stack.up(settings, ("broker",), echo=lines.append)
        again = describe(settings)
        assert again["cluster_id"] == cluster_id and set(TOPICS) <= set(again["topics"])
        assert any(line == "broker: topics present" for line in lines)
    finally:
        stopped = stack.down(settings, ("broker",), echo=lines.append)
    assert stopped == ["broker"]
    assert not group_alive(first.pid) and not group_alive(third.pid)
    assert not stack.state(settings, "broker").up
    assert stack.down(settings, ("broker",)) == []
    # SIGTERM is Kafka's controlled shutdown.
    assert "shut down completed" in server_log.read_text()


def test_port_taken_by_someone_else_gives_a_clear_error(settings) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.ports.broker))
        squatter.listen(1)
        with pytest.raises(services.StackError, match=r"already taken.*CASCADE_BROKER_PORT"):
            stack.start_service(settings, "broker", echo=lambda _: None)
    assert not stack.state(settings, "broker").up


def test_services_bind_loopback_and_airflow_gets_the_kafka_connection(settings) -> None:  # type: ignore[no-untyped-def]
    specs = services.service_specs(settings)
    assert set(specs) == set(services.SERVICES)
    assert specs["broker"].command[-2:] == ["run", "broker"]
    from infra import kafka_broker

    (node,) = kafka_broker.nodes(settings)
    props = dict(
        line.split("=", 1) for line in kafka_broker.server_properties(settings, node).splitlines()
    )
    assert props["listeners"] == (
        f"PLAINTEXT://127.0.0.1:{settings.ports.broker},"
        f"CONTROLLER://127.0.0.1:{settings.ports.broker_controller}"
    )
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{settings.ports.broker_controller}"
    env = services.airflow_env(settings)
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert str(settings.bootstrap_servers) in env["AIRFLOW_CONN_CASCADE_KAFKA"]
    assert env["CASCADE_HOME"] == str(settings.home)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"].endswith("dags")


ESCAPING_SERVICE = """
import subprocess, sys, time
# Like torch.distributed.run under an Airflow task: a worker in a session of its own.
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
)
print(child.pid, flush=True)
time.sleep(300)
"""


def test_stop_also_ends_descendants_that_left_the_process_group(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import sys

    import psutil

    real = services.service_specs(settings)["broker"]
    fake = services.ServiceSpec(
        name="broker",
        port=real.port,
        command=[sys.executable, "-c", ESCAPING_SERVICE],
        env=dict(os.environ),
        url="test://escaping",
        healthy=lambda: True,
        start_timeout_s=10,
    )
    monkeypatch.setattr(stack, "service_specs", lambda _settings: {"broker": fake})
    stack.start_service(settings, "broker", echo=lambda _: None)
    main = stack.state(settings, "broker").pid
    assert main is not None
    deadline = time.monotonic() + 20
    children: list[psutil.Process] = []
    # Until the child has called setsid it is still in the group: wait for both.
    while time.monotonic() < deadline:
        children = psutil.Process(main).children()
        if children and all(os.getpgid(c.pid) != main for c in children):
            break
        time.sleep(0.05)
    (child,) = children
    assert os.getpgid(child.pid) != main, "the child must have left the group for this test"
    lines: list[str] = []
    assert stack.stop_service(settings, "broker", grace_s=4, echo=lines.append)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert "outside its group" in lines[-1]


def test_a_killed_service_left_as_a_zombie_counts_as_stopped() -> None:
    import signal
    import subprocess

    from infra.stack import _group_alive

    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    assert _group_alive(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)  # exited, not yet reaped by us: a zombie
    assert not _group_alive(proc.pid)


class PoolApi:
    """Airflow's pools endpoints over a dict; bodies are checked by Airflow's own models."""

    def __init__(self) -> None:
        self.pools: dict[str, dict] = {}
        self.calls: list[str] = []

    def get(self, path: str) -> dict:
        import requests

        self.calls.append(f"GET {path}")
        name = path.removeprefix("/pools/")
        if name not in self.pools:
            response = requests.Response()
            response.status_code = 404
            raise requests.HTTPError("404 Not Found", response=response)
        return self.pools[name]

    def post(self, path: str, body: dict) -> dict:
        from airflow.api_fastapi.core_api.datamodels.pools import PoolBody

        self.calls.append(f"POST {path}")
        pool = PoolBody.model_validate(body)
        self.pools[pool.pool] = {"name": pool.pool, "slots": pool.slots}
        return self.pools[pool.pool]

    def patch(self, path: str, body: dict) -> dict:
        from airflow.api_fastapi.core_api.datamodels.pools import PoolPatchBody

        self.calls.append(f"PATCH {path}")
        name, _, mask = path.removeprefix("/pools/").partition("?update_mask=")
        patch = PoolPatchBody.model_validate(body)
        assert mask == "slots" and patch.slots is not None
        self.pools[name]["slots"] = patch.slots
        return self.pools[name]


def test_the_stack_makes_the_heavy_pool_with_the_configured_slots(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from cascade.pipeline_spec import HEAVY_POOL

    api = PoolApi()
    # Default: the parallelism, so the pool never holds back what Airflow would run.
    assert "created pool cascade_heavy with 2 slots" in stack.ensure_heavy_pool(settings, api)
    assert api.pools[HEAVY_POOL]["slots"] == settings.airflow_parallelism == 2
    assert "has 2 slots" in stack.ensure_heavy_pool(settings, api)  # started again: kept
    monkeypatch.setenv("CASCADE_AIRFLOW_HEAVY_SLOTS", "1")
    assert "now has 1 slots (was 2)" in stack.ensure_heavy_pool(load_settings(), api)
    assert api.pools[HEAVY_POOL]["slots"] == 1
    assert [c.split()[0] for c in api.calls] == ["GET", "POST", "GET", "GET", "PATCH"]
