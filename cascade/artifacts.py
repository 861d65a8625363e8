"""What comes out of the registry is data: artifact digests recorded at registration and checked
before anything is read.

A registered version carries the sha256 of each of its files in the model-version tag
:data:`DIGESTS_TAG` (JSON: relative path -> hex digest), written by the registration step from the
registry's own copy. A loader downloads the version, calls :func:`verify` and only then reads the
files it needs, through its own code (state dicts with ``torch.load(weights_only=True)``, JSON
configs): nothing is unpickled, and a file changed after registration, added or missing is
refused with :class:`TamperedArtifact` naming it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

DIGESTS_TAG = "cascade.sha256"
"""Model-version tag: JSON object of relative path -> sha256 of the version's files."""
CHUNK = 1 << 20


class TamperedArtifact(RuntimeError):
    """A registered artifact does not match the digests recorded when it was registered."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def folder_digests(folder: Path, *, prefix: str = "") -> dict[str, str]:
    """sha256 of every file under ``folder``, keyed by ``prefix`` + its path relative to it."""
    folder = Path(folder)
    return {
        prefix + path.relative_to(folder).as_posix(): sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def digests_tag(digests: Mapping[str, str]) -> str:
    """The tag value of :data:`DIGESTS_TAG` (MLflow tags are strings)."""
    return json.dumps(dict(sorted(digests.items())), separators=(",", ":"))


def recorded_digests(tags: Mapping[str, str], what: str) -> dict[str, str]:
    """The digests a version's tags record; :class:`TamperedArtifact` when there are none (a
    version registered without them cannot be checked, so it is not loaded)."""
    raw = tags.get(DIGESTS_TAG)
    if not raw:
        raise TamperedArtifact(
            f"{what} records no artifact digests (tag {DIGESTS_TAG}); it was not registered by "
            "the pipeline's registration step, so it is not loaded. Re-register it"
        )
    try:
        digests = json.loads(raw)
    except json.JSONDecodeError:
        raise TamperedArtifact(f"{what}: tag {DIGESTS_TAG} is not JSON") from None
    if not isinstance(digests, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in digests.items()
    ):
        raise TamperedArtifact(f"{what}: tag {DIGESTS_TAG} is not a path -> sha256 map")
    return digests


def verify(
    folder: Path, expected: Mapping[str, str], what: str, *, needed: Iterable[str] = ()
) -> None:
    """Raise :class:`TamperedArtifact` unless every file of ``expected`` is under ``folder``
    with that sha256, no other file is there, and every path in ``needed`` is recorded."""
    folder = Path(folder)
    unrecorded = [name for name in needed if name not in expected]
    if unrecorded:
        raise TamperedArtifact(f"{what}: {unrecorded} carry no recorded digest; not loaded")
    found = folder_digests(folder)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    changed = sorted(name for name in expected if name in found and found[name] != expected[name])
    if missing or extra or changed:
        raise TamperedArtifact(
            f"{what} differs from what was registered: changed {changed}, missing {missing}, "
            f"added {extra}; not loaded"
        )
