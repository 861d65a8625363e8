"""Suite-wide settings: every test gets its own state folder unless it asks for the stack's.

`make test` runs the suite in two pytest-xdist workers (``-n 2 --dist loadgroup``). The tests
that need the machine's cores to themselves (``EXCLUSIVE``: the private stacks of ``tests/e2e``
and ``tests/faults``, the multi-process DeepSpeed runs) run one after another in one worker, in
collection order; every other test runs in the other worker, beside them. Without xdist the
suite runs in one process, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cascade.config import Settings, load_settings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


EXCLUSIVE = (
    "tests/e2e/",
    "tests/faults/",
    "tests/models/test_asr_train.py::test_two_process_",
    "tests/models/test_multimodal_pipeline.py::",
    "tests/models/test_multimodal_train.py::test_two_process_",
    "tests/models/test_preranking_cascade.py::test_killed_two_process_",
    "tests/models/test_preranking_fscd_pipeline.py::test_train_step_",
    "tests/models/test_preranking_train.py::test_two_process_",
)
"""Node-id prefixes of the tests that need both cores to themselves: the private stacks and the
multi-process DeepSpeed runs (a rank that waits for a descheduled peer stalls the collective)."""


def xdist_group_of(nodeid: str) -> str:
    """``exclusive`` for stack and multi-process tests, ``shared`` for every other test."""
    return "exclusive" if nodeid.startswith(EXCLUSIVE) else "shared"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Two work units under ``--dist loadgroup``: the exclusive tests in one worker (in
    collection order), the shared ones in the other. xdist's own ``xdist_group`` mark is not
    used: its node-id suffix is lost on pytest 9."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return TwoGroups(config, log)


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
