"""Follow a registered model's champion alias: a background poller that swaps versions in.

Used by the ASR server (the pre-ranking server has its own, which also refreshes features).
Each tick asks the registry which version ``NAME@champion`` is; a different one than served is
downloaded (``models:/NAME/VERSION`` into a per-version folder, written under a temporary name
and renamed, so a killed download is never mistaken for a finished one) and handed to ``swap``.
A registry outage keeps the served version and is logged once per distinct error.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from cascade.config import Settings

log = logging.getLogger(__name__)


def champion_version(settings: Settings, model_name: str, alias: str = "champion") -> str | None:
    """The version ``model_name@alias`` points at, None while there is none."""
    from cascade.registry import registry_client, version_by_alias

    version = version_by_alias(registry_client(settings), model_name, alias)
    return None if version is None else str(version.version)


def download_version(settings: Settings, model_name: str, version: str, cache: Path) -> Path:
    """The files of ``model_name`` version ``version`` in ``cache/v{version}`` (downloaded once)."""
    import mlflow

    target = cache / f"v{version}"
    if target.is_dir():
        return target
    partial = cache / f".v{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    mlflow.artifacts.download_artifacts(
        f"models:/{model_name}/{version}",
        dst_path=str(partial),
        tracking_uri=settings.tracking_uri,
    )
    partial.rename(target)
    return target


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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def refresh(self) -> bool:
        with self._lock:
            wanted = champion_version(self.settings, self.model_name, self.alias)
            if wanted is None or wanted == self.served:
                return False
            log.info("loading %s version %s (serving %s)", self.model_name, wanted, self.served)
            folder = download_version(self.settings, self.model_name, wanted, self.cache)
            self.swap(folder, wanted)
            previous, self.served = self.served, wanted
            log.info("serving %s version %s (was %s)", self.model_name, wanted, previous)
            return True

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
