"""Suite-wide settings: every test gets its own state folder unless it asks for the stack's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cascade.config import Settings, load_settings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings of a private state folder and MLflow store (a test module may override it)."""
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return load_settings()
