"""The datasets a training run read, recorded on its MLflow run (``mlflow.log_input``).

Each input is a lake path (a file or a folder) named for the MLflow UI's "Datasets" column,
with a digest so two runs on the same data can be told from two runs on different data: the
sha256 of the files' contents, or, past :data:`CONTENT_DIGEST_LIMIT` bytes, of their names, sizes
and modification times (``digest_of`` says which).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from pathlib import Path

CONTENT_DIGEST_LIMIT = 512 * 1024 * 1024
"""Inputs up to this many bytes are digested by content; larger ones by listing."""


def dataset_digest(path: Path) -> tuple[str, str]:
    """(sha256 hex, ``content`` or ``listing``) of a file or a folder's files."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    root = path.parent if path.is_file() else path
    total = sum(p.stat().st_size for p in files)
    by_content = total <= CONTENT_DIGEST_LIMIT
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.relative_to(root)}\0{stat.st_size}\0".encode())
        if by_content:
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        else:
            digest.update(f"{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest(), "content" if by_content else "listing"


def log_inputs(inputs: Mapping[str, Path | str], context: str = "training") -> list[str]:
    """Record each existing input on the active MLflow run; returns the names logged."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    logged = []
    for name, raw in inputs.items():
        path = Path(raw)
        if not path.exists():
            continue
        digest, kind = dataset_digest(path)
        with warnings.catch_warnings():  # a local path matches two equal source kinds
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(str(path.resolve()))
        dataset = MetaDataset(source=source, name=name, digest=digest[:36])
        mlflow.log_input(dataset, context=context, tags={"digest_of": kind, "sha256": digest})
        logged.append(name)
    return logged
