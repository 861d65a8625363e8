"""Follow a registered model's champion alias: a background poller that swaps versions in.

Used by the ASR server (the pre-ranking server has its own, which also refreshes features).
Each tick asks the registry which version ``NAME@champion`` is; a different one than served is
downloaded and handed to ``swap``. A registry outage keeps the served version and is logged
once per distinct error.

Downloads: each server process downloads into a folder of its own,
``CACHE/worker-PID/vVERSION`` (the workers of one server never write into, or delete, a folder
another one serves from), and a version's folder is complete only when its marker
:data:`COMPLETE_MARKER` is there: written last, it lists every file with its size and sha256.
A folder without the marker (a download killed half way), or whose files no longer match it,
is never served: it is deleted and downloaded again. Folders of processes that no longer run
are removed when a follower starts.

Trust: a version is downloaded only when the platform signed its release (the digests of its
files, the compile gate's verdict, the promotion decision: :mod:`cascade.signing`; for the
``champion`` alias, a decision that promoted it), and handed to ``swap`` only when every file
matches the signed digests (nothing changed, missing or added since). A version that does not
is refused before any of its files is read: the refusal is logged once (``refusing ... v3 ...;
still serving v2``), the folder deleted, and the served version stays until the alias moves to
another version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade.artifacts import TamperedArtifact
from cascade.config import Settings

log = logging.getLogger(__name__)


def champion_version(settings: Settings, model_name: str, alias: str = "champion") -> str | None:
    """The version ``model_name@alias`` points at, None while there is none."""
    from cascade.registry import registry_client, version_by_alias

    version = version_by_alias(registry_client(settings), model_name, alias)
    return None if version is None else str(version.version)


COMPLETE_MARKER = ".cascade-complete.json"
"""Written last into a downloaded version's folder: ``{"model", "version", "files": {relative
path: {"bytes", "sha256"}}}``. No marker, no complete download."""
WORKER_PREFIX = "worker-"


def worker_cache(cache: Path, pid: int | None = None) -> Path:
    """This process's own download folder under ``cache``."""
    return cache / f"{WORKER_PREFIX}{os.getpid() if pid is None else pid}"


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _files(folder: Path) -> dict[str, Path]:
    return {
        path.relative_to(folder).as_posix(): path
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != COMPLETE_MARKER
    }


def write_marker(folder: Path, **about: Any) -> dict[str, Any]:
    """Mark ``folder`` complete: the digest list of its files, written under a temporary name,
    flushed and renamed (a crash leaves no marker, or a whole one)."""
    files = {
        name: {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        for name, path in _files(folder).items()
    }
    marker = {**about, "files": files}
    tmp = folder / f"{COMPLETE_MARKER}.tmp"
    with tmp.open("w") as out:
        json.dump(marker, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(folder / COMPLETE_MARKER)
    return marker


def incomplete_reason(folder: Path) -> str | None:
    """Why ``folder`` is not a complete download (None: it is): no marker, an unreadable one,
    a file missing, added, or changed since the marker was written."""
    marker_path = folder / COMPLETE_MARKER
    if not marker_path.is_file():
        return f"no {COMPLETE_MARKER} (the download did not finish)"
    try:
        listed = json.loads(marker_path.read_text())["files"]
        assert isinstance(listed, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"unreadable {COMPLETE_MARKER}"
    present = _files(folder)
    if set(present) != set(listed):
        missing = sorted(set(listed) - set(present))
        extra = sorted(set(present) - set(listed))
        return f"files differ from the marker (missing {missing[:3]}, unlisted {extra[:3]})"
    for name, path in present.items():
        entry = listed[name]
        if not isinstance(entry, dict):
            return f"unreadable {COMPLETE_MARKER} entry for {name}"
        if path.stat().st_size != entry.get("bytes") or _sha256(path) != entry.get("sha256"):
            return f"{name} does not match its digest in the marker"
    return None


def _marked_digests(folder: Path) -> dict[str, str]:
    listed = json.loads((folder / COMPLETE_MARKER).read_text())["files"]
    return {name: entry["sha256"] for name, entry in listed.items()}


def download_version(
    settings: Settings, model_name: str, version: str, cache: Path, *, role: str = "champion"
) -> Path:
    """The files of ``model_name`` version ``version`` in this process's
    ``cache/worker-PID/v{version}``: reused when its marker vouches for it and lists the digests
    the platform signed for the version, else (no marker, files that do not match it) deleted
    and downloaded again, checked against those digests, then marked complete.

    Raises :class:`~cascade.artifacts.TamperedArtifact`, leaving no folder behind, when the
    version carries no valid platform signature for ``role`` (checked before anything is
    downloaded: :func:`cascade.signing.verified_release`) or its files do not match it."""
    from cascade.registry import download_verified, registry_client_of
    from cascade.signing import trusted_keys, verified_release

    registered = registry_client_of(settings).get_model_version(model_name, str(version))
    release = verified_release(registered, trusted_keys(settings.home), role=role)
    expected = dict(release.files)
    target = worker_cache(cache) / f"v{version}"
    if target.exists():
        reason = incomplete_reason(target)
        if reason is None and _marked_digests(target) == expected:
            return target
        reason = reason or "its files are not the ones the registration recorded"
        log.warning("%s v%s in %s is incomplete: %s; downloading it again", model_name,
                    version, target, reason)  # fmt: skip
        shutil.rmtree(target)
    staging = target.parent / f".{target.name}.download"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, mode=0o700)
    try:
        downloaded = download_verified(
            settings, model_name, str(version), staging, expected=expected
        )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    downloaded.rename(target)  # the version's folder itself, whatever its stored name
    shutil.rmtree(staging, ignore_errors=True)
    target.chmod(0o700)
    write_marker(target, model=model_name, version=str(version))
    return target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_dead_workers(cache: Path) -> list[Path]:
    """Delete the download folders of processes that no longer run; returns them."""
    removed = []
    for folder in cache.glob(f"{WORKER_PREFIX}*"):
        pid = folder.name[len(WORKER_PREFIX) :]
        if folder.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class ChampionFollower:
    """Polls ``NAME@alias`` every ``poll_s`` seconds and calls ``swap(folder, version)`` when it
    changes; ``refresh()`` does one tick synchronously (start-up, tests)."""

    def __init__(
        self,
        settings: Settings,
        model_name: str,
        swap: Callable[[Path, str], None],
        *,
        cache: Path,
        poll_s: float = 2.0,
        alias: str = "champion",
    ) -> None:
        self.settings, self.model_name, self.swap = settings, model_name, swap
        self.cache, self.poll_s, self.alias = cache, poll_s, alias
        self.served: str | None = None
        self.refused: str | None = None
        """The version last refused (its files are not what its registration recorded): not
        downloaded again until the alias has moved to another version."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        for folder in remove_dead_workers(cache):
            log.info("removed %s (its server process no longer runs)", folder)

    def refresh(self) -> bool:
        with self._lock:
            wanted = champion_version(self.settings, self.model_name, self.alias)
            if wanted is None or wanted == self.served or wanted == self.refused:
                return False
            self.refused = None
            log.info("loading %s version %s (serving %s)", self.model_name, wanted, self.served)
            try:
                folder = download_version(
                    self.settings, self.model_name, wanted, self.cache, role=self.alias
                )
            except TamperedArtifact as exc:
                self.refused = wanted
                serving = "no version yet" if self.served is None else f"v{self.served}"
                log.error("refusing %s v%s: %s; still serving %s", self.model_name, wanted,
                          exc, serving)  # fmt: skip
                return False
            self.swap(folder, wanted)
            previous, self.served = self.served, wanted
            log.info("serving %s version %s (was %s)", self.model_name, wanted, previous)
            self._remove_versions(keep={wanted, previous})
            return True

    def _remove_versions(self, keep: set[str | None]) -> None:
        """Delete this process's downloads of versions other than ``keep`` (the served one
        and the one it replaced, which a request in flight may still use)."""
        names = {f"v{version}" for version in keep if version is not None}
        for folder in worker_cache(self.cache).glob("v*"):
            if folder.is_dir() and folder.name not in names:
                shutil.rmtree(folder, ignore_errors=True)

    def start(self) -> None:
        if self._thread and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"{self.model_name}-champion", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                self.refresh()
                last_error = ""
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != last_error:
                    log.exception("%s champion refresh failed; serving %s", self.model_name,
                                  self.served)  # fmt: skip
                last_error = error
            self._stop.wait(self.poll_s)
