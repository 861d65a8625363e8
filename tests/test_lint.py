"""The tree stays ruff-clean (lint and format), as `make lint` checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cascade.config import REPO_ROOT

RUFF = str(Path(sys.executable).parent / "ruff")


def test_ruff_check_passes() -> None:
    result = subprocess.run([RUFF, "check", "."], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = subprocess.run(
        [RUFF, "format", "--check", "."], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
