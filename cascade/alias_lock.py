"""Compare-and-set for registry aliases: one lock around read, check and move.

MLflow's registry has no conditional alias update: ``set_registered_model_alias`` moves the
alias whatever it points at. Two processes that each read ``champion``, decide, and move it
(two serving workers rolling back on the same errors, a promotion and a rollback) can both
act on a champion that one of them already replaced. Every alias move of the project (the
promotion gate, ``cascade rollback``, the automatic rollback) therefore re-reads the alias
while holding this lock and moves it only if it still points at the version the decision
was made against.

Where the lock lives depends on who can move aliases:

- ``cluster`` profile: the processes that move aliases (Airflow tasks on any worker, serving
  pods, an operator's laptop) share no folder, so the lock is a row of the ledger database
  (PostgreSQL, :func:`cascade.data_services.postgres_url`), the one store all of them reach:
  the mover holds ``SELECT ... FOR UPDATE`` on the row of its registry for the read, check and
  move, and commits after. A second mover on any host waits for the commit, then re-reads
  the alias the first one moved. A mover that dies mid-move loses its connection and with it
  the row lock.
- ``local`` profile: an exclusive ``flock`` on a file every process of the registry finds at
  the same place: beside the database for a ``sqlite:`` registry (whatever each process's
  state folder), else under the state folder (``CASCADE_HOME/locks``), which the processes
  of the local stack share; they all run on one host.
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cascade.config import Settings

SQLITE_PREFIX = "sqlite:///"
LOCK_TIMEOUT_S = 60.0
TABLE = "alias_moves"
"""The ledger database's table of alias locks: one row per registry, its count of moves."""
_SCHEMA_LOCK = 0x6361736361646532
"""Advisory lock key serializing the ``CREATE TABLE`` of movers starting at once."""


class AliasLockTimeout(TimeoutError):
    """Another process held the alias lock for longer than the timeout."""


def lock_path(registry_uri: str, home: Path) -> Path:
    """Where the alias lock of the registry at ``registry_uri`` lives (``local`` profile)."""
    if registry_uri.startswith(SQLITE_PREFIX) and len(registry_uri) > len(SQLITE_PREFIX):
        database = Path(registry_uri[len(SQLITE_PREFIX) :].split("?", 1)[0])
        return database.with_name(f"{database.name}.aliases.lock")
    digest = hashlib.sha256(registry_uri.encode()).hexdigest()[:16]
    return home / "locks" / f"aliases-{digest}.lock"


def registry_uri_of(client: Any) -> str | None:
    """The registry URI of an ``MlflowClient`` (None for a stand-in without one)."""
    uri = getattr(client, "_registry_uri", None)
    return uri if isinstance(uri, str) and uri else None


def _timed_out(where: str, timeout_s: float, fix: str) -> AliasLockTimeout:
    return AliasLockTimeout(
        f"the registry alias lock {where} was held by another process for {timeout_s:.0f}s; "
        f"retry, or find the process that holds it ({fix})"
    )


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
                    raise _timed_out(str(path), timeout_s, f"fuser {path}") from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def registry_key(registry_uri: str) -> str:
    """The row of ``registry_uri`` in :data:`TABLE`: the URI without credentials (a
    ``user:password@`` part never reaches the table)."""
    scheme, sep, rest = registry_uri.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


@contextlib.contextmanager
def held_in_database(
    url: str, registry: str, *, timeout_s: float = LOCK_TIMEOUT_S
) -> Iterator[int]:
    """Hold the row of ``registry`` in the PostgreSQL database at ``url`` (``SELECT ... FOR
    UPDATE``) for the block, across hosts; yields how many moves the row counted before. The
    count goes up by one when the block ends without error; AliasLockTimeout after
    ``timeout_s``; ConnectionError in one line when the database does not answer."""
    import psycopg2
    import psycopg2.errors

    key = registry_key(registry)
    try:
        conn = psycopg2.connect(url, connect_timeout=10)
    except psycopg2.OperationalError as exc:
        # The driver's message names host and port, not the password.
        raise ConnectionError(f"alias lock database unreachable: {exc}".strip()) from None
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (registry TEXT PRIMARY KEY,"
                " moves BIGINT NOT NULL DEFAULT 0, moved_at TIMESTAMPTZ)"
            )
            cur.execute(
                f"INSERT INTO {TABLE} (registry) VALUES (%s) ON CONFLICT DO NOTHING", (key,)
            )
        with conn, conn.cursor() as cur:
            cur.execute("SELECT set_config('lock_timeout', %s, true)", (f"{timeout_s * 1000:.0f}",))
            try:
                cur.execute(f"SELECT moves FROM {TABLE} WHERE registry = %s FOR UPDATE", (key,))
            except psycopg2.errors.LockNotAvailable:
                raise _timed_out(
                    f"(row {key!r} of {TABLE})", timeout_s, "pg_locks on that table"
                ) from None
            (moves,) = cur.fetchone()
            yield int(moves)
            # Written only now, just before the commit: a mover starting meanwhile inserts
            # (ON CONFLICT) against a row nobody has changed and goes on to wait in SELECT.
            cur.execute(
                f"UPDATE {TABLE} SET moves = moves + 1, moved_at = now() WHERE registry = %s",
                (key,),
            )
    finally:
        conn.close()


def alias_lock(
    client: Any,
    *,
    home: Path | None = None,
    settings: Settings | None = None,
    timeout_s: float = LOCK_TIMEOUT_S,
) -> contextlib.AbstractContextManager[Any]:
    """The lock every alias move of ``client``'s registry holds (see the module docstring):
    a row of the ledger database in the ``cluster`` profile, a file lock in the ``local`` one
    (``home``: the state folder, default the settings').

    A stand-in client without a registry URI (an in-memory registry of a test) gets no lock:
    nothing outside the process can see its aliases."""
    uri = registry_uri_of(client)
    if uri is None:
        return contextlib.nullcontext()
    if settings is None:
        from cascade.config import load_settings

        settings = load_settings()
    if settings.profile == "cluster":
        from cascade.data_services import postgres_url

        return held_in_database(postgres_url(settings), uri, timeout_s=timeout_s)
    return held(lock_path(uri, home or settings.home), timeout_s=timeout_s)
