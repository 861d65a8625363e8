"""Compare-and-set for registry aliases: one lock around read, check and move.

MLflow's registry has no conditional alias update: ``set_registered_model_alias`` moves the
alias whatever it points at. Two processes that each read ``champion``, decide, and move it
(two serving workers rolling back on the same errors, a promotion and a rollback) can both
act on a champion that one of them already replaced. Every alias move of the project (the
promotion gate, ``cascade rollback``, the automatic rollback) therefore re-reads the alias
while holding this lock and moves it only if it still points at the version the decision
was made against.

The lock is an exclusive ``flock`` on a file every process of the registry finds at the same
place: beside the database for a ``sqlite:`` registry, else under the state folder
(``CASCADE_HOME/locks``), which every process of the local stack shares. In the cluster
profile the processes that move aliases (Airflow tasks, serving pods) share no folder, so
there the lock only orders the moves made from one host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SQLITE_PREFIX = "sqlite:///"
LOCK_TIMEOUT_S = 60.0


class AliasLockTimeout(TimeoutError):
    """Another process held the alias lock for longer than the timeout."""


def lock_path(registry_uri: str, home: Path) -> Path:
    """Where the alias lock of the registry at ``registry_uri`` lives."""
    if registry_uri.startswith(SQLITE_PREFIX) and len(registry_uri) > len(SQLITE_PREFIX):
        database = Path(registry_uri[len(SQLITE_PREFIX) :].split("?", 1)[0])
        return database.with_name(f"{database.name}.aliases.lock")
    digest = hashlib.sha256(registry_uri.encode()).hexdigest()[:16]
    return home / "locks" / f"aliases-{digest}.lock"


def registry_uri_of(client: Any) -> str | None:
    """The registry URI of an ``MlflowClient`` (None for a stand-in without one)."""
    uri = getattr(client, "_registry_uri", None)
    return uri if isinstance(uri, str) and uri else None


@contextlib.contextmanager
def held(path: Path, *, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600); AliasLockTimeout after
    ``timeout_s``. Released when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise AliasLockTimeout(
                        f"the registry alias lock {path} was held by another process for "
                        f"{timeout_s:.0f}s; retry, or find the process that holds it "
                        f"(fuser {path})"
                    ) from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def alias_lock(
    client: Any, *, home: Path | None = None, timeout_s: float = LOCK_TIMEOUT_S
) -> contextlib.AbstractContextManager[None]:
    """The lock every alias move of ``client``'s registry holds (see the module docstring).

    A stand-in client without a registry URI (an in-memory registry of a test) gets no lock:
    nothing outside the process can see its aliases."""
    uri = registry_uri_of(client)
    if uri is None:
        return contextlib.nullcontext()
    if home is None:
        from cascade.config import load_settings

        home = load_settings().home
    return held(lock_path(uri, home), timeout_s=timeout_s)
