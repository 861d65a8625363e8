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


def test_the_docs_tell_users_cascade_subcommands_not_python_m() -> None:
    """Every user action is a ``cascade`` subcommand; ``python -m`` is for internals only."""
    readme = (REPO_ROOT / "README.md").read_text().splitlines()
    lines = [
        f"README.md:{n}: {line.strip()}" for n, line in enumerate(readme, 1) if "python -m" in line
    ]
    assert not lines, "write the cascade subcommand instead:\n" + "\n".join(lines)
