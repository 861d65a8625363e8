"""The least-privilege benchmark's own instruments, without a stack: the command-line scan sees
a secret that a process carries in its arguments, and the secrets are read from the state
folder's secret files."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import security_privilege as privilege
from cascade.config import Settings
from cascade.tracking_auth import (
    ensure_tracking_credentials,
    role_credentials,
    tracking_credentials,
)


def test_the_scan_finds_a_secret_on_a_command_line(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "state")
    ensure_tracking_credentials(settings)
    secrets = privilege.stack_secrets(settings)
    admin, promoter = tracking_credentials(settings), role_credentials(settings, "promoter")
    assert admin and promoter
    assert admin[1] in secrets.values() and promoter[1] in secrets.values()
    seen: dict[str, list[int]] = {}
    assert privilege.scan_command_lines(secrets, seen) > 0
    assert not any(seen.values())
    leaky = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(30)", promoter[1]]
    )
    try:
        # Popen returns once the child's exec has closed its descriptors, which the kernel does
        # a moment before it sets the new command line up: wait for the line, then scan.
        deadline = time.monotonic() + 10
        while promoter[1] not in privilege.command_lines().get(leaky.pid, ""):
            assert time.monotonic() < deadline, "the child's command line never showed up"
            time.sleep(0.01)
        privilege.scan_command_lines(secrets, seen)
    finally:
        leaky.kill()
        leaky.wait()
    assert [pids for pids in seen.values() if pids] == [[leaky.pid]]


def test_the_default_workers_credentials_are_their_environments_and_what_they_read(
    tmp_path: Path,
) -> None:
    """Each Celery worker of the cluster profile is counted with every credential a task there
    holds: its environment's (the writer's) and each credential file it reads. Confined, a
    default worker reads none; the promotion worker reads the promoter's and the key only."""
    from cascade.signing import ensure_signing_key
    from infra import airflow_cluster

    settings = Settings(home=tmp_path / "state")
    ensure_tracking_credentials(settings)
    ensure_signing_key(settings.home)
    writer, promoter = role_credentials(settings, "writer"), role_credentials(settings, "promoter")
    assert writer and promoter
    workers = privilege._worker_credentials(settings)
    assert set(workers) == set(airflow_cluster.worker_names())

    gate = workers.pop(airflow_cluster.PROMOTION_WORKER)
    if not gate["confined"]:
        pytest.skip("Linux refuses the namespaces the workers' confinement needs here")
    # The writer in its environment and the promoter from its file; not the admin.
    assert held_of(gate) == {writer, promoter} and gate["reads_signing_key"]
    for name, worker in workers.items():
        assert held_of(worker) == {writer}, name
        assert worker["files_read"] == [] and not worker["reads_signing_key"]


def held_of(worker: dict[str, Any]) -> set[tuple[str, str]]:
    return {(c[privilege.USERNAME_VAR], c[privilege.PASSWORD_VAR]) for c in worker["credentials"]}
