"""Alias moves are compare-and-set: two processes that read the same champion and then both
act (two rollbacks, a rollback and a promotion) against one real MLflow store move it once."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cascade.alias_lock import AliasLockTimeout, held, lock_path
from cascade.deployments import ROLLED_BACK_TAG
from cascade.registry import CHAMPION, PREVIOUS_CHAMPION_TAG

MODEL = "preranking"


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _registry(tmp_path: Path, versions: int) -> str:
    """A sqlite registry with ``versions`` versions, each promoted over the one before."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = _client(uri)
    client.create_registered_model(MODEL)
    for number in range(1, versions + 1):
        version = client.create_model_version(MODEL, source=f"{tmp_path}/artifacts/{number}")
        previous = "" if number == 1 else str(number - 1)
        client.set_model_version_tag(MODEL, version.version, PREVIOUS_CHAMPION_TAG, previous)
        client.set_registered_model_alias(MODEL, CHAMPION, version.version)
    return uri


def _champion(uri: str) -> str:
    return str(_client(uri).get_model_version_by_alias(MODEL, CHAMPION).version)


def _env(uri: str, home: Path) -> None:
    os.environ["CASCADE_MLFLOW_URI"] = uri
    os.environ["CASCADE_HOME"] = str(home)


def _roll_back(uri: str, home: str, barrier: Any, results: Any) -> None:
    """A worker that read the champion, waits for the other one, then rolls back."""
    _env(uri, Path(home))
    from cascade.config import load_settings
    from cascade.deployments import rollback

    read = _champion(uri)
    barrier.wait(timeout=60)
    results.put(
        rollback(model=MODEL, reason="test", publish=False, expected=read, settings=load_settings())
    )


def _promote(uri: str, home: str, barrier: Any, results: Any) -> None:
    """The promotion gate deciding on version 4: it reads the champion, scores (here: waits for
    the rollback's process), then moves the alias only if the champion is still the one read."""
    _env(uri, Path(home))
    from cascade.pipeline_spec import Promotion
    from cascade.promotion import Scores, decide

    client = _client(uri)
    version = client.get_model_version(MODEL, "4")

    def score(champion: Any) -> Scores:
        barrier.wait(timeout=60)
        return Scores(challenger=0.9, champion=0.5, rows="the same rows")

    decision = decide(
        client,
        MODEL,
        version,
        promotion=Promotion(metric="auc", higher_is_better=True),
        score=score,
        compile_gate=None,
    )
    results.put({"moved": decision.promoted, "reasons": decision.reasons})


def _run(targets: list[Any], uri: str, home: Path) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(targets)), context.Queue()
    processes = [
        context.Process(target=target, args=(uri, str(home), barrier, results))
        for target in targets
    ]
    for process in processes:
        process.start()
    try:
        found = [results.get(timeout=120) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=60)
    assert all(process.exitcode == 0 for process in processes)
    return found


@pytest.mark.slow
def test_two_rollbacks_at_once_move_the_champion_once(tmp_path: Path) -> None:
    uri = _registry(tmp_path, versions=3)
    results = _run([_roll_back, _roll_back], uri, tmp_path / "home")
    moved = [r for r in results if r["moved"]]
    skipped = [r for r in results if not r["moved"]]
    assert len(moved) == 1 and len(skipped) == 1
    assert (moved[0]["from_version"], moved[0]["to_version"]) == ("3", "2")
    assert skipped[0]["champion_version"] == "2" and "no longer v3" in skipped[0]["skipped"]
    assert _champion(uri) == "2"  # one step back, not two
    client = _client(uri)
    assert ROLLED_BACK_TAG in client.get_model_version(MODEL, "3").tags
    assert ROLLED_BACK_TAG not in client.get_model_version(MODEL, "2").tags
    assert lock_path(uri, tmp_path / "home").exists()  # beside the sqlite registry


@pytest.mark.slow
def test_a_rollback_and_a_promotion_at_once_move_the_champion_once(tmp_path: Path) -> None:
    uri = _registry(tmp_path, versions=3)
    client = _client(uri)
    client.create_model_version(MODEL, source=f"{tmp_path}/artifacts/4")  # the challenger
    results = _run([_roll_back, _promote], uri, tmp_path / "home")
    assert sorted(r["moved"] for r in results) == [False, True]
    champion = _champion(uri)
    rolled_back = next(r for r in results if "from_version" in r or "skipped" in r)
    if rolled_back["moved"]:  # the rollback went first: the promotion saw v2, not v3
        assert champion == "2"
        promotion = next(r for r in results if "reasons" in r)
        assert "the champion changed from v3 to v2" in promotion["reasons"][0]
    else:  # the promotion went first: the rollback found v4
        assert champion == "4" and "no longer v3" in rolled_back["skipped"]


def test_the_lock_is_exclusive_across_holders_and_times_out(tmp_path: Path) -> None:
    path = lock_path("http://127.0.0.1:5000", tmp_path)
    assert path.parent == tmp_path / "locks"
    assert lock_path("sqlite:////data/mlflow.db", tmp_path) == Path("/data/mlflow.db.aliases.lock")
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with held(path):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(10)
        started = time.monotonic()
        with pytest.raises(AliasLockTimeout, match="held by another process"):
            with held(path, timeout_s=0.2):
                pass
        assert time.monotonic() - started >= 0.2
    finally:
        release.set()
        holder.join()
    with held(path, timeout_s=1):  # free again
        pass
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_the_database_lock_row_of_a_registry_never_holds_its_credentials() -> None:
    from cascade.alias_lock import registry_key

    assert registry_key("http://mover:s3cret@mlflow:5000/x") == "http://mlflow:5000/x"
    assert registry_key("sqlite:////data/mlflow.db") == "sqlite:////data/mlflow.db"
    assert registry_key("postgresql://u:p@db/mlflow?a=b@c") == "postgresql://db/mlflow?a=b@c"
