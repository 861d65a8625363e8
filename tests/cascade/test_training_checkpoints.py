"""A resume loads a DeepSpeed checkpoint (pickles) only when its files have the digest the
training's MLflow run recorded when it wrote them; anything else starts the phase fresh.

The engine here is a stand-in with DeepSpeed's checkpoint layout (a tag folder per save and a
``latest`` file naming it): what is under test is the trust check around DeepSpeed's load. The
two-process trainer tests (tests/models) resume real DeepSpeed engines through the same code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from cascade.training.checkpoints import (
    CHECKPOINT_TAG,
    checkpoint_digest,
    resume_step,
    save_latest_checkpoint,
)


class CheckpointingEngine:
    """DeepSpeed's checkpoint calls on a tiny module: ``save_checkpoint`` writes the tag's
    state file and ``latest``; ``load_checkpoint`` loads the tag it is given (else
    ``latest``'s) and records which."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(3, 2)
        self.loaded: list[str] = []

    def save_checkpoint(self, folder: str, tag: str, client_state: dict[str, Any]) -> None:
        target = Path(folder) / tag
        target.mkdir(parents=True, exist_ok=True)
        torch.save({"module": self.module.state_dict(), **client_state}, target / "model.pt")
        (Path(folder) / "latest").write_text(tag)

    def load_checkpoint(self, folder: str, tag: str | None = None) -> tuple[str, dict[str, Any]]:
        tag = tag or (Path(folder) / "latest").read_text()
        state = torch.load(Path(folder) / tag / "model.pt", weights_only=True)
        self.module.load_state_dict(state.pop("module"))
        self.loaded.append(tag)
        return folder, state


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One private MLflow store for the module (creating one costs seconds)."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


@pytest.fixture
def training_run(tracking: None) -> Iterator[Any]:
    """A one-process group and an active MLflow run."""
    import mlflow

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with mlflow.start_run() as run:
            yield run
    finally:
        dist.destroy_process_group()


def test_a_checkpoint_resumes_only_with_the_files_its_run_recorded(
    tmp_path: Path, training_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import mlflow

    ckpt_dir = tmp_path / "run" / "checkpoints" / "fp32"
    engine = CheckpointingEngine()
    save_latest_checkpoint(engine, ckpt_dir, 3)
    save_latest_checkpoint(engine, ckpt_dir, 6)
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["latest", "step6"]
    tags = mlflow.get_run(training_run.info.run_id).data.tags
    assert checkpoint_digest(ckpt_dir / "step6") in tags[f"{CHECKPOINT_TAG}fp32"]

    # Untouched: resumed, with the saved weights.
    fresh = CheckpointingEngine()
    assert resume_step(fresh, ckpt_dir) == 6 and fresh.loaded == ["step6"]
    torch.testing.assert_close(fresh.module.state_dict(), engine.module.state_dict())

    # A checkpoint planted beside it and named by ``latest``: the recorded one is loaded.
    planted = CheckpointingEngine()
    planted.save_checkpoint(str(ckpt_dir), "step9", {"step": 9})
    again = CheckpointingEngine()
    assert resume_step(again, ckpt_dir) == 6 and again.loaded == ["step6"]

    # One byte of the recorded checkpoint changed: refused in one line, removed, fresh start.
    state = ckpt_dir / "step6" / "model.pt"
    state.write_bytes(state.read_bytes() + b"\0")
    refused = CheckpointingEngine()
    capsys.readouterr()
    assert resume_step(refused, ckpt_dir) == 0 and refused.loaded == []
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "step6: its files are not the ones the training's MLflow run recorded" in line
    assert "the phase starts fresh" in line and not ckpt_dir.exists()


def test_a_checkpoint_its_run_never_recorded_is_not_loaded(
    tmp_path: Path, training_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written outside the run (an older release, another writer of the run folder)."""
    ckpt_dir = tmp_path / "checkpoints"
    CheckpointingEngine().save_checkpoint(str(ckpt_dir), "step4", {"step": 4})
    engine = CheckpointingEngine()
    assert resume_step(engine, ckpt_dir) == 0 and engine.loaded == []
    assert "recorded no digest of it" in capsys.readouterr().out
    assert not ckpt_dir.exists()
    assert resume_step(engine, ckpt_dir) == 0  # nothing left: a plain fresh start
