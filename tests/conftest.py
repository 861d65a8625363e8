"""Suite-wide settings: every test gets its own state folder unless it asks for the stack's.

`make test` runs the suite in two pytest-xdist workers (``-n 2 --dist loadgroup``). The tests
that need the machine's cores to themselves (``EXCLUSIVE``: the private stacks of ``tests/e2e``
and ``tests/faults``, the multi-process DeepSpeed runs) are one work unit, handed out first and
run one after another in one worker, in collection order. Every other test runs beside them in
the other worker, a unit at a time (a module, or the modules that share an expensive session
fixture, :data:`SHARED_UNITS`); whichever worker is free takes the next unit, so the worker that
finishes the exclusive unit helps with what is left. Without xdist the suite runs in one
process, as before.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cascade.config import Settings, load_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# py4j logs each gateway connection it closes; at interpreter exit pytest's capture streams are
# already closed, and those lines become pages of logging tracebacks that bury the summary.
logging.getLogger("py4j").setLevel(logging.WARNING)


EXCLUSIVE = (
    "tests/e2e/",
    "tests/cluster/",
    "tests/faults/",
    "tests/models/test_asr_train.py::test_two_process_",
    "tests/models/test_multimodal_pipeline.py::",
    "tests/models/test_multimodal_train.py::test_two_process_",
    "tests/models/test_preranking_cascade.py::test_killed_two_process_",
    "tests/models/test_preranking_fscd_pipeline.py::test_train_step_",
)
"""Node-id prefixes of the tests that need both cores to themselves: the private stacks and the
multi-process DeepSpeed runs (a rank that waits for a descheduled peer stalls the collective)."""


SHARED_UNITS: dict[str, str] = {
    "tests/jobs/": "tests/jobs/",  # one local Spark session for the package (its conftest) ...
    # ... which these borrow when they run after it (jobs.spark_sessions.active_or_new): a
    # Spark session of their own costs each about a minute of JVM start and warm-up.
    "tests/benchmarks/test_ctr_cross_duckdb.py": "tests/jobs/",
    "tests/benchmarks/test_ctr_cross_stats.py": "tests/jobs/",
    "tests/benchmarks/test_preranking_models.py": "tests/jobs/",  # the engine-built set
    "tests/pipelines/test_land_and_run_": "tests/jobs/",  # the pipelines' Spark steps
    "tests/serving/": "serving+asr",  # the champion server, and the compiled ASR model ...
    "tests/compilers/test_asr.py": "serving+asr",  # ... that these share (tests/conftest.py)
    "tests/benchmarks/test_asr_path.py": "serving+asr",
}
"""Node-id prefixes whose tests stay in one work unit: they share a session fixture that is
expensive to build twice (a worker builds its own copy of each). Within a unit, tests run in
the order of their prefixes here, then in collection order: the Spark session's owners first."""


def xdist_group_of(nodeid: str) -> str:
    """``exclusive`` for stack and multi-process tests, ``shared`` for every other test."""
    return "exclusive" if nodeid.startswith(EXCLUSIVE) else "shared"


def work_unit_of(nodeid: str) -> str:
    """The unit a worker takes at once: ``exclusive``, a :data:`SHARED_UNITS` name, else the
    test's module."""
    if xdist_group_of(nodeid) == "exclusive":
        return "exclusive"
    for prefix, unit in SHARED_UNITS.items():
        if nodeid.startswith(prefix):
            return unit
    return nodeid.split("::", 1)[0]


def ordered_units(nodeids: list[str]) -> dict[str, dict[str, bool]]:
    """Work units in the order they are handed out: the exclusive unit first (it is the
    longest), then the others in collection order; each unit's tests in the order of their
    :data:`SHARED_UNITS` prefix, then in collection order."""
    prefixes = list(SHARED_UNITS)

    def rank(nodeid: str) -> int:
        return next((i for i, p in enumerate(prefixes) if nodeid.startswith(p)), len(prefixes))

    members: dict[str, list[str]] = {"exclusive": []}
    for nodeid in nodeids:
        members.setdefault(work_unit_of(nodeid), []).append(nodeid)
    if not members["exclusive"]:
        del members["exclusive"]
    # Within a unit: by SHARED_UNITS prefix (sorted is stable: collection order within one).
    return {unit: dict.fromkeys(sorted(ids, key=rank), False) for unit, ids in members.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadgroup``: the exclusive unit to one worker first, then modules (and
    :data:`SHARED_UNITS`) to whichever worker is free. xdist's own ``xdist_group`` mark is not
    used: its node-id suffix is lost on pytest 9."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ExclusiveFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

        def schedule(self) -> None:
            if self.collection is not None or not self._check_nodes_have_same_collection():
                return super().schedule()
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return None
            self.workqueue.update(ordered_units(self.collection))
            for node in self.nodes:
                if self.workqueue:
                    self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            return None

    return ExclusiveFirst(config, log)


@pytest.fixture(autouse=True)
def mlflow_experiment_reset() -> Iterator[None]:
    """After each test: no MLflow run left active and no experiment chosen for the process.

    ``mlflow.set_experiment`` keeps the experiment's id for the whole process (and in
    ``MLFLOW_EXPERIMENT_ID``); a later test's ``mlflow.start_run()`` against a fresh store would
    then ask that store for an experiment it never had (``No Experiment with id=1 exists``),
    depending on which tests a worker happened to run before it."""
    yield
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is None:  # MLflow never imported: nothing to reset
        return
    while fluent.active_run() is not None:
        fluent.end_run()
    fluent._active_experiment_id = None
    os.environ.pop("MLFLOW_EXPERIMENT_ID", None)


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


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[1] session in UTC writing microsecond timestamps, as the job configures its own; the
    jobs' tests and the land-and-run tests of tests/pipelines share it (their steps borrow it)."""
    from jobs.spark_sessions import UTC_MICROS, build_session

    session = build_session(
        "cascade-tests-jobs",
        master="local[1]",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            **UTC_MICROS,
        },
        local_ip="127.0.0.1",
        python_workers=True,
        log_level="ERROR",
    )
    yield session
    session.stop()
