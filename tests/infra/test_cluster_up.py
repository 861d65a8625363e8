"""``cascade up``, cluster profile, remote hosts: it starts nothing and checks each service."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from cascade.cli import main
from cascade.config import PORT_NAMES, load_settings
from cascade.ports import free_ports
from infra import cluster, stack


@pytest.fixture
def cluster_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path))
    monkeypatch.setenv("CASCADE_PROFILE", "cluster")
    ports = free_ports(len(PORT_NAMES) + 3)
    for name, port in zip(PORT_NAMES, ports, strict=False):
        monkeypatch.setenv(f"CASCADE_{name.upper()}_PORT", str(port))
    kafka, mlflow, redis = ports[-3:]
    monkeypatch.setenv("CASCADE_KAFKA_BOOTSTRAP", f"127.0.0.1:{kafka}")
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"http://127.0.0.1:{mlflow}")
    monkeypatch.setenv("CASCADE_REDIS", f"127.0.0.1:{redis},password=secret")
    # The one remote host: a name that cannot resolve, so nothing leaves the machine.
    monkeypatch.setenv("CASCADE_SPARK_MASTER", "k8s://https://kubernetes.invalid:6443")
    return {"kafka": kafka, "mlflow": mlflow, "redis": redis}


def test_up_refuses_to_start_and_reports_unreachable_services(
    cluster_env: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings()
    assert cluster.remote(settings)
    with socket.socket() as mlflow:  # one service answers, the others do not
        mlflow.bind(("127.0.0.1", cluster_env["mlflow"]))
        mlflow.listen(1)
        code = main(["up"])
    out, err = capsys.readouterr()
    assert code == 3
    assert len(err.strip().splitlines()) == 1, err
    assert "3 of 4 cluster services unreachable" in err
    assert (
        f"kafka[0] 127.0.0.1:{cluster_env['kafka']}" in err
        and "spark kubernetes.invalid:6443" in err
    )
    assert f"redis 127.0.0.1:{cluster_env['redis']}" in err and "mlflow" not in err
    assert "secret" not in out + err
    assert "mlflow" in out and "reachable" in out
    assert not any(s.up for s in stack.status(settings)), "nothing may be started"
    assert not (settings.home / "run").exists() or not any((settings.home / "run").iterdir())


def test_check_passes_when_every_service_answers(
    cluster_env: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_SPARK_MASTER", "local[2]")
    lines: list[str] = []
    with contextlib.ExitStack() as stack_:
        for port in cluster_env.values():
            sock = stack_.enter_context(socket.socket())
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        listed = cluster.check(load_settings(), echo=lines.append, timeout_s=0.5)
    assert [e.name for e in listed] == ["kafka[0]", "mlflow", "redis"]
    assert sum("reachable" in line for line in lines) == 3


def test_loopback_cluster_and_local_profile_are_not_remote(
    cluster_env: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_SPARK_MASTER", "spark://localhost:7077")
    assert not cluster.remote(load_settings())
    monkeypatch.setenv("CASCADE_SPARK_MASTER", "k8s://https://kubernetes.invalid")
    monkeypatch.setenv("CASCADE_PROFILE", "local")
    assert not cluster.remote(load_settings())


def test_endpoints_parse_every_configured_form() -> None:
    assert cluster.is_loopback("127.0.0.2") and cluster.is_loopback("::1")
    assert not cluster.is_loopback("kafka.cascade.svc") and not cluster.is_loopback("10.0.0.1")
    assert cluster._url_endpoint("r", "postgresql+psycopg2://u:p@db.example:6543/x").port == 6543
    assert cluster._url_endpoint("m", "https://mlflow.example").port == 443
    assert cluster._host_port("k", "kafka.example", 9092).port == 9092
    with pytest.raises(ValueError, match="HOST:PORT"):
        cluster._host_port("k", "kafka.example:port", 9092)


def test_profile_option_picks_the_cluster_profile(
    cluster_env: dict[str, int], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CASCADE_PROFILE")
    assert not cluster.remote(load_settings())  # the local profile would start the stack
    assert main(["up", "--profile", "cluster"]) == 3  # the cluster profile checks the hosts
    assert "cluster services unreachable" in capsys.readouterr().err
    assert not any(s.up for s in stack.status(load_settings()))
