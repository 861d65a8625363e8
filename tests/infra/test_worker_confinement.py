"""Only the promotion worker holds the promoter's credential: the cluster profile's default
Celery workers consume the default queue only, hold the writer's credential in their
environment, and cannot read the promoter's (nor the admin's, nor the release signing key) from
the state folder they share with it. Checked on the workers' commands and environments, and by
a process started the way each worker is; no stack is started."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cascade.config import Settings, load_settings
from cascade.data_services import ensure_postgres_role_passwords, ensure_redis_password
from cascade.pipeline_spec import DEFAULT_QUEUE, PROMOTION_QUEUE
from cascade.signing import ensure_signing_key, private_key_path, public_keys_path
from cascade.tracking_auth import (
    PASSWORD_VAR,
    PROMOTER,
    USERNAME_VAR,
    WRITER,
    credentials_file,
    ensure_tracking_credentials,
    role_credentials,
    role_file,
)
from infra import airflow_cluster, services, worker_confinement


@pytest.fixture
def cluster(tmp_path: Path) -> Settings:
    """Cluster-profile settings whose state folder holds every credential file a started stack
    has (MLflow's admin and roles, the signing key, PostgreSQL's and Redis' passwords)."""
    settings = replace(load_settings({}), home=tmp_path / "state", profile="cluster")
    ensure_tracking_credentials(settings)
    ensure_signing_key(settings.home)
    ensure_postgres_role_passwords(settings)
    ensure_redis_password(settings)
    return settings


def test_each_worker_consumes_one_queue_in_its_own_view_of_the_state_folder(
    cluster: Settings,
) -> None:
    commands = airflow_cluster.worker_commands(cluster)
    assert set(commands) == set(airflow_cluster.worker_names())
    queues = {name: cmd[cmd.index("--queues") + 1] for name, cmd in commands.items()}
    assert queues == {
        "cascade-worker-1": DEFAULT_QUEUE,
        "cascade-worker-2": DEFAULT_QUEUE,
        airflow_cluster.PROMOTION_WORKER: PROMOTION_QUEUE,
    }
    mlflow, signing = str(cluster.home / "mlflow"), str(cluster.home / "signing")
    for name, command in commands.items():
        assert command[1:3] == ["-m", worker_confinement.__name__], name
        hides = {command[i + 1] for i, arg in enumerate(command) if arg == "--hide"}
        keeps = [command[i + 1] for i, arg in enumerate(command) if arg == "--keep"]
        if name == airflow_cluster.PROMOTION_WORKER:
            assert hides == {mlflow} and keeps == [str(role_file(cluster, PROMOTER))]
        else:
            assert hides == {mlflow, signing} and keeps == [str(public_keys_path(cluster.home))]
        # The worker's own command after the launcher's options.
        assert command[command.index("--") + 1 :][1:3] == ["celery", "worker"]
    # Where Linux refuses the namespaces, the same workers start unconfined.
    bare = airflow_cluster.worker_commands(cluster, confine=False)
    assert all(command[1:3] == ["celery", "worker"] for command in bare.values())


def test_the_workers_environments_hold_the_writer_and_never_the_promoter(
    cluster: Settings,
) -> None:
    """Every Airflow process (the scheduler and every worker, so every task) runs in Airflow's
    environment: the writer's credential and no other; the promoter's is in no service's."""
    writer, promoter = role_credentials(cluster, WRITER), role_credentials(cluster, PROMOTER)
    assert writer is not None and promoter is not None
    env = services.airflow_env(cluster)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert (env[USERNAME_VAR], env[PASSWORD_VAR]) == writer
    for name, spec in services.service_specs(cluster).items():
        assert not any(promoter[1] in value for value in spec.env.values()), name


def test_a_task_on_a_default_worker_cannot_read_the_promoters_credential(
    cluster: Settings,
) -> None:
    refused = airflow_cluster.confinement_works(cluster)
    if refused is not None:
        pytest.skip(f"Linux refuses the namespaces the confinement needs here: {refused}")
    secrets = {str(path) for path in airflow_cluster.registry_secret_files(cluster)}
    assert {str(role_file(cluster, PROMOTER)), str(credentials_file(cluster))} <= secrets
    assert str(private_key_path(cluster.home)) in secrets
    # The promotion worker's tasks read the promoter's file (the gate's credential) and the key,
    # not the admin's nor the other roles'.
    promotion = airflow_cluster.readable_by_worker_tasks(cluster, airflow_cluster.PROMOTION_WORKER)
    assert set(promotion) == {
        str(role_file(cluster, PROMOTER)),
        str(private_key_path(cluster.home)),
    }
    assert (
        json.loads(promotion[str(role_file(cluster, PROMOTER))])["password"]
        == (role_credentials(cluster, PROMOTER) or ("", ""))[1]
    )
    for name in airflow_cluster.worker_names():
        # Unconfined (where Linux refuses namespaces) each would read every one.
        assert set(airflow_cluster.readable_by_worker_tasks(cluster, name, confine=False)) == (
            secrets
        )
        if name != airflow_cluster.PROMOTION_WORKER:
            assert airflow_cluster.readable_by_worker_tasks(cluster, name) == {}, name


def test_a_confined_task_keeps_the_public_key_and_the_state_folder_but_cannot_unmount(
    cluster: Settings, tmp_path: Path
) -> None:
    import subprocess
    import sys

    refused = airflow_cluster.confinement_works(cluster)
    if refused is not None:
        pytest.skip(f"Linux refuses the namespaces the confinement needs here: {refused}")
    hide, keep = airflow_cluster.worker_view(cluster, "cascade-worker-1")
    written = cluster.home / "lake" / "written-by-task.txt"
    probe = f"""
import ctypes, json, os
from pathlib import Path
libc = ctypes.CDLL("libc.so.6", use_errno=True)
unmounted = [libc.umount2(str(path).encode(), 2) == 0 for path in {[str(p) for p in hide]!r}]
Path({str(written)!r}).parent.mkdir(parents=True, exist_ok=True)
Path({str(written)!r}).write_text("partition")
try:
    Path({str(hide[0])!r}, "planted.json").write_text("{{}}")
    planted = "written"
except OSError as exc:
    planted = exc.strerror
from cascade.signing import load_signing_key
try:
    load_signing_key(Path({str(cluster.home)!r}), create=True)
    key = "loaded"
except FileNotFoundError as exc:
    key = str(exc)
print(json.dumps({{
    "planted": planted,
    "key": key,
    "public": Path({str(public_keys_path(cluster.home))!r}).read_text(),
    "unmounted": unmounted,
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}}))
"""
    command = worker_confinement.confined_command(hide, keep, [sys.executable, "-c", probe])
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert seen["public"] == public_keys_path(cluster.home).read_text()
    assert seen["unmounted"] == [False, False]
    # The hidden folders take nothing: a register step sent to this worker fails at its key.
    assert seen["planted"] == "Read-only file system"
    assert "none can be made here (Read-only file system)" in seen["key"]
    assert "'promotion' queue" in seen["key"]
    # The namespace's init and the task: no process of the host, so no /proc/PID/root to go
    # through.
    assert seen["pids"] == [1, 2]
    assert written.read_text() == "partition"  # the rest of the state folder is the host's


def test_a_supervisor_stops_a_confined_worker_by_the_launchers_pid(cluster: Settings) -> None:
    """SIGTERM to the launcher reaches the command (a worker's warm shutdown), whose status
    the launcher exits with."""
    import signal
    import subprocess
    import sys

    refused = airflow_cluster.confinement_works(cluster)
    if refused is not None:
        pytest.skip(f"Linux refuses the namespaces the confinement needs here: {refused}")
    hide, keep = airflow_cluster.worker_view(cluster, "cascade-worker-1")
    worker = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    command = worker_confinement.confined_command(hide, keep, [sys.executable, "-c", worker])
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "ready\n"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=20) == 7
    finally:
        launcher.kill()
        launcher.wait()


def test_the_gate_on_the_promotion_worker_acts_as_the_promoter_and_signs(
    cluster: Settings,
) -> None:
    """In the promotion worker's view the gate's own code finds what it needs: the promoter's
    credential (``acting_as``) and the signing key; the admin's credential it does not."""
    import subprocess
    import sys

    refused = airflow_cluster.confinement_works(cluster)
    if refused is not None:
        pytest.skip(f"Linux refuses the namespaces the confinement needs here: {refused}")
    probe = f"""
import json, os
from dataclasses import replace
from pathlib import Path
from cascade.config import load_settings
from cascade.signing import key_id, load_signing_key
from cascade.tracking_auth import PROMOTER, USERNAME_VAR, acting_as, tracking_credentials
settings = replace(load_settings({{}}), home=Path({str(cluster.home)!r}))
with acting_as(settings, PROMOTER) as found:
    user = os.environ.get(USERNAME_VAR)
print(json.dumps({{
    "found": found,
    "user": user,
    "key": key_id(load_signing_key(settings.home).public_key()),
    "admin": tracking_credentials(settings) is not None,
}}))
"""
    view = airflow_cluster.worker_view(cluster, airflow_cluster.PROMOTION_WORKER)
    command = worker_confinement.confined_command(*view, [sys.executable, "-c", probe])
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    expected_key = load_signing_key_id(cluster)
    assert seen == {"found": True, "user": "cascade-promoter", "key": expected_key, "admin": False}


def load_signing_key_id(settings: Settings) -> str:
    from cascade.signing import key_id, load_signing_key

    return key_id(load_signing_key(settings.home).public_key())
