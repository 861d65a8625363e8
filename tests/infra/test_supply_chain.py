"""The broker's native binary comes only from the wheel with the pinned sha256, is the file that
wheel installed, and npm runs no package's install scripts."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re

from cascade.config import REPO_ROOT

INSTALL = (REPO_ROOT / "infra" / "install.sh").read_text()


def test_the_broker_wheel_is_installed_by_hash() -> None:
    pinned = (REPO_ROOT / "infra" / "broker-requirements.txt").read_text()
    assert re.search(r"^noida-db==[\d.]+ \\\n\s+--hash=sha256:[0-9a-f]{64}$", pinned, re.M)
    assert "--require-hashes -r infra/broker-requirements.txt" in INSTALL
    # Installed before the lock and the project, which hold the same pin.
    assert INSTALL.index("broker-requirements.txt") < INSTALL.index('-r "$LOCK"')
    version = re.search(r"noida-db==([\d.]+)", pinned)
    assert version is not None
    assert importlib.metadata.version("noida-db") == version.group(1)


def test_the_installed_broker_files_are_the_wheels() -> None:
    dist = importlib.metadata.distribution("noida-db")
    # The package's own files (the binary among them); pip rewrites some of its metadata.
    files = [f for f in dist.files or [] if f.hash and ".dist-info/" not in f.as_posix()]
    assert any(f.locate().stat().st_size > 1 << 20 for f in files), "no broker binary recorded"
    for record in files:
        assert record.hash is not None and record.hash.mode == "sha256"
        digest = hashlib.sha256(record.locate().read_bytes()).digest()
        assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == record.hash.value, record


def test_npm_runs_no_install_scripts() -> None:
    installs = [line for line in INSTALL.splitlines() if "npm install" in line]
    assert installs and all("--ignore-scripts" in line for line in installs)
