"""DeepSpeed checkpoints of an unfinished run, resuming from them, finished phases, and the
fingerprint that says whose checkpoints a run folder holds."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cascade.training.launch import collective_device

CHECKPOINTS = "checkpoints"
"""Folder under a run folder with the DeepSpeed checkpoints of an unfinished run."""


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
    """Save a DeepSpeed checkpoint tagged ``step{step}`` and drop older ones (only the latest is
    needed to resume). Every rank must call it."""
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", client_state={"step": step})
    dist.barrier()
    if dist.get_rank() == 0:
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
    nothing loaded) when there is none. Every rank must call it; every rank must see the same
    checkpoints (:func:`exists_on_every_rank`)."""
    if not exists_on_every_rank(ckpt_dir / "latest"):
        return 0
    _, client_state = engine.load_checkpoint(str(ckpt_dir))
    return int(client_state["step"])


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
