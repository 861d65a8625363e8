"""The least-privilege benchmark's own instruments, without a stack: the command-line scan sees
a secret that a process carries in its arguments, and the secrets are read from the state
folder's secret files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
        privilege.scan_command_lines(secrets, seen)
    finally:
        leaky.kill()
        leaky.wait()
    assert [pids for pids in seen.values() if pids] == [[leaky.pid]]
