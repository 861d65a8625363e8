"""The state folder on disk is the owner's alone: the folder is 0700, secret files are 0600.

The state folder (``Settings.home``) holds the Airflow admin password, Airflow's signing keys
(``airflow.cfg``), the registry's and the lake's files and every service log. Another user on
the host must read none of it, whatever the umask. :func:`secure_state_folder` creates the
folder owner-only (and narrows one that is not), :func:`write_secret` writes a file that is
0600 from its first byte, and :func:`exposed_secrets` lists what others could read.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

FOLDER_MODE = 0o700
SECRET_MODE = 0o600
SERVICE_UMASK = 0o077
"""The umask the stack's services run under: every file they create is the owner's only."""


def secure_state_folder(home: Path) -> Path:
    """Create ``home`` (and missing parents) 0700, or narrow an existing one to 0700."""
    home.mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & 0o077:
        log.warning("state folder %s was mode %o; narrowing it to %o", home, mode, FOLDER_MODE)
        home.chmod(FOLDER_MODE)
    return home


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600 (never readable by others, not even while
    being written), replacing the file atomically."""
    if not path.parent.exists():
        secure_state_folder(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, SECRET_MODE)
    try:
        os.fchmod(fd, SECRET_MODE)  # O_CREAT's mode is masked by the umask; this is not
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1
            handle.write(text)
        os.replace(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
    return path


def narrow_secret(path: Path) -> bool:
    """Make an existing secret file 0600; True if it was readable by others before."""
    if not path.exists():
        return False
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(SECRET_MODE)
        return True
    return False


def exposed_secrets(home: Path, secrets: Iterable[Path]) -> list[Path]:
    """The paths another user could read: ``home`` if it is open to group or others, and each
    existing secret file readable or writable by group or others."""
    exposed: list[Path] = []
    if home.exists() and stat.S_IMODE(home.stat().st_mode) & 0o077:
        exposed.append(home)
    for path in secrets:
        if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            exposed.append(path)
    return exposed
