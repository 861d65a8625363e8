"""DeepSpeed checkpoints of an unfinished run, resuming from them, finished phases, and the
fingerprint that says whose checkpoints a run folder holds.

A DeepSpeed checkpoint is pickles: ``engine.load_checkpoint`` unpickles its files (DeepSpeed's
own ``torch.load`` with ``weights_only=False``), so whoever can write the run folder (the lake,
a shared volume) could run code in the next attempt of the training. The run folder is
therefore not trusted on its own: when a checkpoint is written, rank 0 records the content
digest of its files (sha256 of every file, :func:`checkpoint_digest`) as a tag of the
training's MLflow run (:data:`CHECKPOINT_TAG`), which only the training writes; a resume loads
a checkpoint only when its files still have that digest. A checkpoint that does not match (or
that the run never recorded: written by an older release, or outside an MLflow run) is
refused in one line, removed, and the phase starts fresh from step 0: retraining costs time,
loading it could cost the host. The fingerprint of config and data (:func:`keep_only_run`)
only says whose checkpoints a folder holds; it is no trust check."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cascade.training.launch import collective_device

CHECKPOINTS = "checkpoints"
"""Folder under a run folder with the DeepSpeed checkpoints of an unfinished run."""
CHECKPOINT_TAG = "cascade.checkpoint."
"""Prefix of the MLflow run tags recording each checkpoint folder's latest checkpoint: the tag
``cascade.checkpoint.<folder name>`` holds ``{"tag": "step<N>", "sha256": ...}``."""

log = logging.getLogger(__name__)


class CheckpointRefused(RuntimeError):
    """A checkpoint whose files are not the ones the run recorded when it wrote them."""


def checkpoint_digest(folder: Path) -> str:
    """The sha256 of a checkpoint: every file under ``folder`` (one DeepSpeed tag), by its
    path relative to ``folder`` and the sha256 of its content, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        content = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                content.update(block)
        digest.update(f"{path.relative_to(folder).as_posix()}\0{content.hexdigest()}\n".encode())
    return digest.hexdigest()


def _tag_key(ckpt_dir: Path) -> str:
    return f"{CHECKPOINT_TAG}{ckpt_dir.name}"


def record_checkpoint(ckpt_dir: Path, tag: str) -> bool:
    """Record checkpoint ``tag`` of ``ckpt_dir`` and its digest in the active MLflow run
    (rank 0); False when there is no active run (the checkpoint will not be resumed)."""
    import mlflow

    if mlflow.active_run() is None:
        log.warning("no active MLflow run: checkpoint %s/%s is not recorded and will not be "
                    "resumed", ckpt_dir, tag)  # fmt: skip
        return False
    digest = checkpoint_digest(ckpt_dir / tag)
    mlflow.set_tag(_tag_key(ckpt_dir), json.dumps({"tag": tag, "sha256": digest}))
    return True


def recorded_checkpoint(ckpt_dir: Path) -> dict[str, str] | None:
    """What the active MLflow run recorded for ``ckpt_dir`` (``tag``, ``sha256``), or None."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        return None
    value = mlflow.get_run(run.info.run_id).data.tags.get(_tag_key(ckpt_dir))
    if not value:
        return None
    recorded = json.loads(value)
    return {"tag": str(recorded["tag"]), "sha256": str(recorded["sha256"])}


def verified_checkpoint(ckpt_dir: Path) -> str:
    """The tag of ``ckpt_dir``'s checkpoint if its files have the digest the run recorded;
    CheckpointRefused in one line otherwise."""
    recorded = recorded_checkpoint(ckpt_dir)
    if recorded is None:
        raise CheckpointRefused(
            f"checkpoint {ckpt_dir}: the training's MLflow run recorded no digest of it, so "
            "it is not loaded (its files are pickles); the phase starts fresh"
        )
    folder = ckpt_dir / recorded["tag"]
    if not folder.is_dir() or checkpoint_digest(folder) != recorded["sha256"]:
        raise CheckpointRefused(
            f"checkpoint {folder}: its files are not the ones the training's MLflow run "
            f"recorded (sha256 {recorded['sha256'][:16]}...), so it is not loaded (its files "
            "are pickles); the phase starts fresh"
        )
    return recorded["tag"]


def fingerprint(parts: list[Any], *, sort_keys: bool = False) -> str:
    """A short digest of ``parts`` (JSON): what checkpoints must match to be resumed."""
    blob = json.dumps(parts, sort_keys=sort_keys, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def data_fingerprint(config: dict[str, Any], data: Path, ds: str) -> str:
    """The fingerprint of a run of ``config`` on the file ``data`` for partition ``ds``: a
    checkpoint left by a run on other data or with another config is never resumed."""
    stat = data.stat()
    return fingerprint([config, str(data.resolve()), stat.st_size, stat.st_mtime_ns, ds])


def consolidated_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor] | None:
    """Full weights on rank 0 (None elsewhere). Under ZeRO-3 every rank must call this."""
    if zero_stage == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    if dist.get_rank() != 0:
        return None
    return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}


def save_latest_checkpoint(engine: Any, ckpt_dir: Path, step: int) -> None:
    """Save a DeepSpeed checkpoint tagged ``step{step}``, record its digest in the active
    MLflow run (rank 0, :func:`record_checkpoint`) and drop older ones (only the latest is
    needed to resume). Every rank must call it."""
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", client_state={"step": step})
    dist.barrier()
    if dist.get_rank() == 0:
        record_checkpoint(ckpt_dir, f"step{step}")
        for old in ckpt_dir.glob("step*"):
            if old.name != f"step{step}":
                shutil.rmtree(old, ignore_errors=True)


def agreed_on_every_rank(answer: bool, question: str) -> bool:
    """``answer``, checked to be the same on every rank (a collective inside a process group:
    every rank must call it). Ranks that disagree (a node that does not see the run folder
    another one wrote) raise a RuntimeError naming ``question`` and the ranks and nodes that
    answered no, instead of some ranks resuming while others start over and the collectives
    hang."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return answer
    node = int(os.environ.get("GROUP_RANK", "0"))
    device = collective_device()  # NCCL gathers GPU tensors only
    answers = [
        torch.zeros(2, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())
    ]
    dist.all_gather(answers, torch.tensor([int(answer), node], dtype=torch.int64, device=device))
    found = [(bool(yes), int(node)) for yes, node in (t.tolist() for t in answers)]
    if len({yes for yes, _ in found}) == 1:
        return answer
    no = ", ".join(f"rank {r} (node {n})" for r, (yes, n) in enumerate(found) if not yes)
    raise RuntimeError(
        f"ranks disagree on {question}: no for {no}, yes for the others; checkpoints and "
        "finished phases must be on storage every node reads (a shared run folder)"
    )


def exists_on_every_rank(path: Path) -> bool:
    """Whether ``path`` exists, the same answer on every rank (:func:`agreed_on_every_rank`)."""
    return agreed_on_every_rank(path.exists(), f"whether {path} exists")


def resume_step(engine: Any, ckpt_dir: Path) -> int:
    """Load the latest checkpoint in ``ckpt_dir`` into ``engine`` and return its step; 0 (and
    nothing loaded) when there is none, or when rank 0 finds that its files are not the ones
    the run recorded (:func:`verified_checkpoint`: logged in one line, the folder removed).
    Every rank must call it; every rank must see the same checkpoints
    (:func:`exists_on_every_rank`); rank 0 holds the training's MLflow run."""
    if not exists_on_every_rank(ckpt_dir / "latest"):
        return 0
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    step, refusal = 0, ""
    if rank == 0:
        try:
            step = _tag_step(verified_checkpoint(ckpt_dir))
        except CheckpointRefused as exc:
            refusal = str(exc)
    # Every rank loads the tag rank 0 verified, never the one the folder's ``latest`` names.
    step = _from_rank_zero(-1 if refusal else step)
    if step < 0:
        if rank == 0:
            log.error("%s", refusal)
            print(f"[cascade] {refusal}", flush=True)
            shutil.rmtree(ckpt_dir, ignore_errors=True)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return 0
    _, client_state = engine.load_checkpoint(str(ckpt_dir), tag=f"step{step}")
    return int(client_state["step"])


def _tag_step(tag: str) -> int:
    """N of a checkpoint tag ``step<N>`` (CheckpointRefused for any other tag)."""
    number = tag.removeprefix("step")
    if not number.isdigit():
        raise CheckpointRefused(f"checkpoint tag {tag!r} is not one the training writes")
    return int(number)


def _from_rank_zero(value: int) -> int:
    """Rank 0's ``value``, broadcast to every rank of the process group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    shared = torch.tensor([value], dtype=torch.int64, device=collective_device())
    dist.broadcast(shared, src=0)
    return int(shared.item())


def save_finished_state(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write a finished phase's weights through a temporary file: a crash never leaves a
    half-written "finished" phase."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def keep_only_run(out: Path, run_fingerprint: str, stale: tuple[str, ...]) -> bool:
    """Make ``out`` a folder of the run ``run_fingerprint``: when ``out/fingerprint.txt`` names
    another run (or none), remove ``stale`` (checkpoints, finished phases, run marker) first.
    Returns whether anything was removed."""
    marker = out / "fingerprint.txt"
    removed = False
    if not marker.exists() or marker.read_text() != run_fingerprint:
        for name in stale:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed = True
            elif path.exists():
                path.unlink(missing_ok=True)
                removed = True
    out.mkdir(parents=True, exist_ok=True)
    marker.write_text(run_fingerprint)
    return removed
