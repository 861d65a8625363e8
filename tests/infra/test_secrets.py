"""The state folder is the owner's alone (0700), secret files are 0600, and no summary, status
line or log of the project holds the Airflow or the MLflow password."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.security import open_umask
from cascade.airflow_client import airflow_password, airflow_password_file, ensure_airflow_password
from cascade.config import PORT_NAMES, Settings, load_settings
from cascade.state import secure_state_folder, write_secret
from cascade.tracking_auth import (
    credentials_file,
    ensure_tracking_credentials,
    tracking_credentials,
)
from infra import services, stack


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    # A state folder that does not exist yet, below a world-readable parent.
    parent = tmp_path / "shared"
    parent.mkdir(mode=0o755)
    parent.chmod(0o755)
    monkeypatch.setenv("CASCADE_HOME", str(parent / "state"))
    for name, port in zip(PORT_NAMES, stack.free_ports(len(PORT_NAMES)), strict=True):
        monkeypatch.setenv(f"CASCADE_{name.upper()}_PORT", str(port))
    return load_settings()


def test_the_state_folder_is_created_0700_and_an_open_one_is_narrowed(tmp_path: Path) -> None:
    with open_umask():
        fresh = secure_state_folder(tmp_path / "a" / "state")
        assert mode(fresh) == 0o700
        opened = tmp_path / "open"
        opened.mkdir(mode=0o777)
        assert mode(opened) == 0o777
        secure_state_folder(opened)
        assert mode(opened) == 0o700


def test_secret_files_are_0600_from_the_first_byte_and_when_replaced(tmp_path: Path) -> None:
    path = tmp_path / "token"
    with open_umask():
        path.write_text("old")
        path.chmod(0o644)
        write_secret(path, "new")
        assert path.read_text() == "new" and mode(path) == 0o600
        write_secret(tmp_path / "fresh" / "credential", "x")
        assert (
            mode(tmp_path / "fresh") == 0o700 and mode(tmp_path / "fresh" / "credential") == 0o600
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "token"]  # no temp files left


def test_the_airflow_password_is_written_0600_before_airflow_starts(settings: Settings) -> None:
    with open_umask():
        path = ensure_airflow_password(settings)
    assert path == airflow_password_file(settings)
    assert mode(settings.home) == 0o700 and mode(path) == 0o600
    password = airflow_password(settings)
    assert password and len(password) >= 20
    assert ensure_airflow_password(settings) == path and airflow_password(settings) == password
    assert stack.world_readable_secrets(settings) == []
    # A password file others could read (as Airflow itself writes it) is narrowed, and the
    # password that may have been read is replaced.
    path.chmod(0o644)
    assert stack.world_readable_secrets(settings) == [path]
    ensure_airflow_password(settings)
    assert mode(path) == 0o600 and airflow_password(settings) not in (None, password)
    assert stack.world_readable_secrets(settings) == []
    env = services.airflow_env(settings)
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(path)


def test_airflow_neither_prints_nor_rewrites_a_password_it_finds(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    path = ensure_airflow_password(settings)
    password = airflow_password(settings)
    assert password
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(path))
    with open_umask():
        SimpleAuthManager().init()
    out = capsys.readouterr()
    assert password not in out.out + out.err and "Password for user" not in out.out + out.err
    assert SimpleAuthManager.get_passwords() == {"admin": password}
    assert mode(path) == 0o600
    # Without the file, Airflow generates a password, prints it, and leaves it world-readable:
    # what this test guards against.
    unguarded = settings.home / "unguarded.json"
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(unguarded))
    with open_umask():
        SimpleAuthManager().init()
    assert "Password for user 'admin'" in capsys.readouterr().out
    assert mode(unguarded) & 0o044


WRITING_SERVICE = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("written by a service")
print("service up", flush=True)
time.sleep(300)
"""


def test_services_write_owner_only_files_and_logs(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = settings.home / "service-file"
    real = services.service_specs(settings)["broker"]
    fake = services.ServiceSpec(
        name="broker",
        port=real.port,
        command=[sys.executable, "-c", WRITING_SERVICE, str(written)],
        env=dict(os.environ),
        url="test://writing",
        healthy=lambda: written.exists(),
        start_timeout_s=30,
    )
    monkeypatch.setattr(stack, "service_specs", lambda _settings: {"broker": fake})
    try:
        with open_umask():
            started = stack.start_service(settings, "broker", echo=lambda _: None)
        deadline = time.monotonic() + 10
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mode(settings.home) == 0o700
        assert mode(written) == 0o600, "services run with umask 077"
        assert mode(started.log) == 0o600
        assert mode(settings.logs_dir) == 0o700
    finally:
        stack.stop_service(settings, "broker", grace_s=4, echo=lambda _: None)


def test_the_demo_summary_and_its_output_name_the_password_file_not_the_password(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra import demo

    ensure_airflow_password(settings)
    password = airflow_password(settings)
    assert password
    ensure_tracking_credentials(settings)
    mlflow_credentials = tracking_credentials(settings)
    assert mlflow_credentials
    outcome: dict[str, Any] = {
        "event_id": "e1",
        "dag_run_id": "r1",
        "dag_run_state": "failed",
        "run_type": "asset_triggered",
        "event_to_finish_s": 1.0,
        "train": None,
        "register": None,
        "deploy": None,
    }
    monkeypatch.setattr(stack, "up", lambda settings, echo=print: [])
    monkeypatch.setattr(demo, "trigger_and_wait", lambda ds, **kwargs: outcome)
    monkeypatch.setattr(demo, "land_demo_data", lambda ds, **kwargs: None)
    lines: list[str] = []
    summary = demo.run_demo(ds="2026-11-22", echo=lines.append)
    written = (settings.home / "demo" / "summary.json").read_text()
    assert password not in written and password not in "\n".join(lines)
    assert password not in json.dumps(summary)
    assert json.loads(written)["airflow_password_file"] == str(airflow_password_file(settings))
    assert any(str(airflow_password_file(settings)) in line for line in lines)
    mlflow_password = mlflow_credentials[1]
    assert mlflow_password not in written and mlflow_password not in "\n".join(lines)
    assert json.loads(written)["mlflow_credentials_file"] == str(credentials_file(settings))
    assert any(str(credentials_file(settings)) in line for line in lines)


def test_status_names_the_password_file_not_the_password(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra import commands

    ensure_airflow_password(settings)
    password = airflow_password(settings)
    assert password
    ensure_tracking_credentials(settings)
    mlflow_credentials = tracking_credentials(settings)
    assert mlflow_credentials
    monkeypatch.setattr(stack, "status", lambda settings=None: [])
    commands._print_status(settings)
    out = capsys.readouterr().out
    assert password not in out and str(airflow_password_file(settings)) in out
    assert mlflow_credentials[1] not in out and str(credentials_file(settings)) in out
