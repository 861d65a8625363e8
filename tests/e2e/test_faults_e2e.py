"""Fault tests on the whole stack after the end-to-end run: the model server killed in the middle
of a model swap, and the training task killed in the middle of training. Each checks that
nothing was lost or done twice.

    .venv/bin/pytest -m faults tests/e2e/test_faults_e2e.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from cascade.artifacts import DIGESTS_TAG
from cascade.config import Settings
from cascade.lake import Lake
from cascade.signing import release_version
from models.preranking import REGISTERED_MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.slow]

DAG_ID = "ctr_preranking"
DS = "2026-11-22"


def _wait_for_line(path: Path, pattern: str, *, timeout_s: float, after: int = 0) -> re.Match:
    """The first match of ``pattern`` in ``path`` past byte ``after``; polls every 20 ms."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            with path.open(errors="replace") as handle:
                handle.seek(after)
                match = regex.search(handle.read())
            if match:
                return match
        time.sleep(0.02)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else "(no file)"
    raise TimeoutError(f"no {pattern!r} in {path} after {timeout_s:.0f} s; tail:\n{tail}")


class Client(threading.Thread):
    """Sends requests one after another until stopped; a request that fails for the server
    being down is retried with the same request id until it is answered."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.stop = threading.Event()
        self.sent: list[str] = []
        self.answers: list[tuple[str, str, float]] = []  # (request id, model version, sent at)
        self.retries = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from serving.preranking_client import score

        try:
            while not self.stop.is_set():
                request_id = uuid.uuid4().hex
                self.sent.append(request_id)
                sent_at = time.time()
                deadline = time.monotonic() + 180
                while True:
                    try:
                        answer = score(
                            1, [1, 50, 100], settings=self.settings, request_id=request_id
                        )
                        break
                    except (requests.RequestException, RuntimeError):
                        # Down, restarting or not ready (503) yet: the client's retry policy.
                        if time.monotonic() > deadline:
                            raise
                        self.retries += 1
                        time.sleep(0.2)
                self.answers.append((answer["id"], str(answer["model_version"]), sent_at))
                time.sleep(0.05)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_serving_killed_during_a_model_swap_comes_back_on_the_new_champion(
    stack: Settings, pipeline_run: dict
) -> None:
    import psutil
    from mlflow import MlflowClient

    from infra.services import log_file, port_open
    from infra.stack import _running_pgid, start_service
    from serving.preranking_client import served_version

    registry = MlflowClient(tracking_uri=stack.tracking_uri, registry_uri=stack.tracking_uri)
    name = REGISTERED_MODEL
    old = registry.get_model_version_by_alias(name, "champion")
    # A new version of the same trained model: the swap is real, the scores comparable.
    new = registry.create_model_version(
        name,
        source=old.source,
        run_id=old.run_id,
        # The same files as the old version: the digests its registration recorded hold.
        tags={"test_auc": "0.9", DIGESTS_TAG: old.tags[DIGESTS_TAG]},
    )
    # The servers load only signed versions: released as an operator would, before it moves.
    release_version(stack, name, str(new.version), reason="a swap under test")
    client = Client(stack)
    client.start()
    log_path = log_file(stack, "serving")
    offset = log_path.stat().st_size
    registry.set_registered_model_alias(name, "champion", new.version)
    _wait_for_line(
        log_path, rf"loading preranking version {new.version}\b", timeout_s=60, after=offset
    )
    pgid = _running_pgid(stack, "serving")
    assert pgid is not None
    # Mid-swap, the new version being loaded: the whole server goes, as when its container
    # is killed (its group and any descendant that left the group).
    descendants = psutil.Process(pgid).children(recursive=True)
    os.killpg(pgid, signal.SIGKILL)
    for proc in descendants:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    killed_at = time.time()
    swapped_before_kill = re.search(
        rf"serving preranking version {new.version}\b",
        log_path.read_text(errors="replace")[offset:],
    )
    # SIGKILL is asynchronous: the listening socket closes when the process is torn down.
    port_deadline = time.monotonic() + 30
    while port_open(stack.host, stack.ports.serving):
        holders = [
            (c.pid, c.status)
            for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == stack.ports.serving and c.status == "LISTEN"
        ]
        assert time.monotonic() < port_deadline, f"port still held after the kill by {holders}"
        time.sleep(0.1)
    start_service(stack, "serving")
    deadline = time.monotonic() + 240
    while served_version(stack) != str(new.version):
        assert time.monotonic() < deadline, "the restarted server never served the new champion"
        time.sleep(1)
    time.sleep(1)
    client.stop.set()
    client.join(timeout=200)

    assert client.error is None, client.error
    answered = [request_id for request_id, _, _ in client.answers]
    # Every request was answered exactly once (ids are echoed back), none lost.
    assert answered == client.sent and len(set(answered)) == len(answered)
    assert client.retries > 0  # it did see the outage
    versions = [version for _, version, _ in client.answers]
    assert set(versions) <= {str(old.version), str(new.version)}
    # Once the new version answered, the old one never answered again: no flip-flop.
    first_new = versions.index(str(new.version))
    assert all(v == str(new.version) for v in versions[first_new:])
    # Sent after the kill, so only the restarted server can have answered. (When a request was
    # answered is no test: an answer the old server sent just before the kill can reach this
    # thread just after it.)
    after_restart = [v for _, v, sent_at in client.answers if sent_at > killed_at]
    assert after_restart and set(after_restart) == {str(new.version)}
    print(f"swap finished before the kill: {bool(swapped_before_kill)}; retries {client.retries}")


def test_training_task_killed_mid_run_retries_from_its_checkpoint(
    stack: Settings, pipeline_run: dict
) -> None:
    import mlflow

    from cascade.airflow_client import AirflowClient
    from models.preranking.cascade_train import STALE_ON_NEW_DATA
    from models.preranking.config_registry import get_cascade_config
    from models.preranking.fscd_phases import phases
    from models.preranking.fscd_run import EXPERIMENT

    first = pipeline_run["train"]
    run_id = pipeline_run["dag_run_id"]
    lake = Lake(stack.lake_root)
    reports = lake.reports("train", DS)
    data = lake.training_set("preranking", DS) / "data.parquet"
    names = [phase.name for phase in phases(get_cascade_config(first["config"]))]
    # Killed in the first FSCD selection: the teacher and the two-tower baseline are finished
    # by then, so the retry both reuses finished phases and resumes a gated one mid-way.
    target = next(name for name in names if name.startswith("select_"))
    done_before, rest = names[: names.index(target)], names[names.index(target) :]

    # The pipeline's run finished every phase; without its phases, checkpoints, MLflow run
    # marker and result, the cleared task must train all of them again, in a new MLflow run.
    assert (reports / "phases" / names[-1] / "model.pt").is_file()
    for name in (*STALE_ON_NEW_DATA, "result.json"):
        path = reports / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    log_path = reports / "train.log"
    log_path.rename(log_path.with_name("train.log.first"))  # only the new tries' lines count
    airflow = AirflowClient(stack)
    before = {ti["task_id"]: ti for ti in airflow.task_instances(DAG_ID, run_id)}
    airflow.clear_task(DAG_ID, run_id, "train")

    # Wait for the new try's rank 0 to checkpoint the target phase, then kill it.
    started = _wait_for_line(log_path, r"\[cascade\] config=.* pid=(\d+)", timeout_s=600)
    _wait_for_line(
        log_path, rf"\[cascade\] {re.escape(target)}: checkpoint at step \d+", timeout_s=900
    )
    os.kill(int(started.group(1)), signal.SIGKILL)

    run = airflow.wait_for_run(DAG_ID, match=lambda r: r["dag_run_id"] == run_id, timeout_s=900)
    assert run["state"] == "success", run
    train = {ti["task_id"]: ti for ti in airflow.task_instances(DAG_ID, run_id)}["train"]
    assert train["state"] == "success"
    # try 1: the pipeline run; try 2: killed; try 3: Airflow's retry, which resumed.
    assert train["try_number"] == before["train"]["try_number"] + 2, train
    log = log_path.read_text(errors="replace")
    starts = [m.start() for m in re.finditer(r"\[cascade\] config=", log)]
    assert len(starts) == 2, log[-3000:]
    killed, retry = log[: starts[1]], log[starts[1] :]
    # The killed try trained from scratch: every earlier phase trained, nothing resumed, and
    # it died inside the target phase after a checkpoint.
    assert all(f"[cascade] {name}: done after" in killed for name in done_before), killed[-3000:]
    assert "resumed at step" not in killed and f"[cascade] {target}: done" not in killed
    steps = re.findall(rf"\[cascade\] {re.escape(target)}: checkpoint at step (\d+)", killed)
    assert steps, killed[-3000:]
    # The retry loaded the finished phases, resumed the target at its last checkpoint and
    # trained the rest.
    assert f"[cascade] {target}: resumed at step {steps[-1]} from" in retry, retry[-3000:]
    assert not any(f"[cascade] {name}: done" in retry for name in done_before), retry[-3000:]
    assert all(f"[cascade] {name}: done after" in retry for name in rest), retry[-3000:]

    result = json.loads((reports / "result.json").read_text())
    assert result["ds"] == DS and result["run_id"] != first["run_id"]
    # The resumed run ends exactly where the uninterrupted one did.
    assert result["test_auc"] == pytest.approx(first["test_auc"], abs=1e-6)
    assert (result["chosen"], result["fscd_fields"]) == (first["chosen"], first["fscd_fields"])
    client = mlflow.MlflowClient(tracking_uri=stack.tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"params.data = '{data}'")
    # One run per training of this partition (the pipeline's and the one the retry finished):
    # the killed try was continued, not duplicated, and nothing is left running.
    assert sorted(r.info.run_id for r in runs) == sorted([first["run_id"], result["run_id"]])
    assert {r.info.status for r in runs} == {"FINISHED"}
    # What the killed try logged is in that run: the teacher trained only before the kill,
    # and the target's loss curve spans both sides of the checkpoint it resumed from.
    assert client.get_metric_history(result["run_id"], "loss.teacher")
    logged = [m.step for m in client.get_metric_history(result["run_id"], f"loss.{target}")]
    assert logged and min(logged) < int(steps[-1]) < max(logged), logged
