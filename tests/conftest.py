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


@pytest.fixture(scope="session")
def compiled_asr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny quantized ASR model with its fp32 and int8 packages and ONNX file (built once:
    AOTInductor's C++ build is the slow part of the compiler and serving tests)."""
    from tests.asr_models import build_compiled_asr

    return build_compiled_asr(tmp_path_factory.mktemp("asr-compiled"))
