"""Signed releases: a server loads a registered version only when the platform signed it.

A digest stored beside a version's files only detects change: whoever can write the registry can
write the digest too. So the promotion gate (:mod:`cascade.promotion`), and an operator's
``cascade release``, sign each version's release statement with the platform's Ed25519 key,
which no service with registry access holds; the model servers hold only the public half and
check the signature before they download, hash or load anything of the version.

The statement is an in-toto Statement v1 (its ``subject``: every file of the version with its
sha256, the digests the gates tested) whose predicate names the model, the version number, its
training run and registry source, the compile gate's verdict and the promotion decision. It is
signed as a DSSE envelope (the signing format of in-toto and Sigstore bundles: the signature
covers ``PAE(payloadType, payload)``) and stored as the model-version tag :data:`RELEASE_TAG`.
A statement copied onto another version, a source swapped behind it, a file changed, a key that
is not trusted: each is refused (:class:`UnsignedRelease`) with one line naming the version.

Keys live in the state folder's ``signing/`` (:func:`ensure_signing_key`, run by ``cascade up``
and by the first signing): ``release.key`` (the private half, PKCS#8 PEM, 0600) and
``release.pub`` (the trusted public keys, one ``ed25519 BASE64 KEYID`` line each; several during
a rotation). Where each half lives in each profile: ``docs/operations/signing.md``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cascade.artifacts import TamperedArtifact, recorded_digests
from cascade.state import secure_state_folder, write_secret

RELEASE_TAG = "cascade.release"
"""Model-version tag: the DSSE envelope (JSON) of the version's signed release statement."""
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://cascade.local/release/v1"
SIGNING_DIR = "signing"
PRIVATE_KEY_FILE = "release.key"
PUBLIC_KEYS_FILE = "release.pub"
CHAMPION_ROLE = "champion"
"""The role that also needs the signed decision to have promoted the version."""
ANY_ROLE = "any"
"""A load by version number (evaluation, comparison): any version the platform signed."""


class UnsignedRelease(TamperedArtifact):
    """A version without a valid platform signature, or one the signature does not cover."""


def private_key_path(home: Path) -> Path:
    return Path(home) / SIGNING_DIR / PRIVATE_KEY_FILE


def public_keys_path(home: Path) -> Path:
    return Path(home) / SIGNING_DIR / PUBLIC_KEYS_FILE


def key_id(public: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the sha256 of the raw public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_line(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"ed25519 {base64.b64encode(raw).decode()} {key_id(public)}"


def new_signing_key(home: Path) -> str:
    """Write a new key pair: the private half replaces ``release.key`` (0600), the public half
    is appended to ``release.pub`` (the old public keys stay trusted until removed: rotation).
    Returns the new key's id."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    secure_state_folder(Path(home))
    folder = secure_state_folder(Path(home) / SIGNING_DIR)
    write_secret(private_key_path(home), pem)
    public = public_keys_path(home)
    kept = public.read_text() if public.exists() else ""
    line = public_key_line(key.public_key())
    public.write_text(kept + ("" if not kept or kept.endswith("\n") else "\n") + line + "\n")
    public.chmod(0o644)
    folder.chmod(0o700)
    return key_id(key.public_key())


def ensure_signing_key(home: Path) -> Path:
    """The private key's path, created with its public half on first use."""
    path = private_key_path(home)
    if not path.exists():
        new_signing_key(home)
    return path


def load_signing_key(home: Path, *, create: bool = False) -> Ed25519PrivateKey:
    """The platform's private key; refused when another user could read it."""
    where = (
        "only the promotion gate's host holds it (`cascade up` creates it there; in the cluster "
        "profile only the worker of the 'promotion' queue, where the register steps run)"
    )
    try:
        path = ensure_signing_key(home) if create else private_key_path(home)
    except OSError as exc:
        raise FileNotFoundError(
            f"no release signing key at {private_key_path(home)}, and none can be made here "
            f"({exc.strerror}); {where}"
        ) from exc
    if not path.exists():
        raise FileNotFoundError(f"no release signing key at {path}; {where}")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise PermissionError(
            f"the release signing key {path} is readable by others; chmod 600 it (and rotate "
            "the key: docs/operations/signing.md)"
        )
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def trusted_keys(home: Path) -> dict[str, Ed25519PublicKey]:
    """``{key id: public key}`` of ``release.pub`` (empty when there is none)."""
    path = public_keys_path(home)
    keys: dict[str, Ed25519PublicKey] = {}
    if not path.exists():
        return keys
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        try:
            if parts[0] != "ed25519" or len(parts) < 2:
                raise ValueError("not 'ed25519 BASE64 [KEYID]'")
            public = Ed25519PublicKey.from_public_bytes(base64.b64decode(parts[1], validate=True))
        except ValueError as exc:
            raise ValueError(f"{path} line {number}: {exc}") from None
        keys[key_id(public)] = public
    return keys


@dataclass(frozen=True, kw_only=True)
class Release:
    """What the platform vouches for when it signs one registered version."""

    model: str
    version: str
    run_id: str
    source: str
    """The registry location the version's files are downloaded from."""
    files: Mapping[str, str]
    """Relative path -> sha256 of every file of the version (those the gates tested)."""
    compile_gate: Mapping[str, Any] | None = None
    """The compile gate's verdict (``passed``, ``reasons``); None where there is no compile step."""
    decision: Mapping[str, Any] = field(default_factory=dict)
    """The promotion decision: ``promoted``, ``reasons``, ``previous_champion``, ``by``."""

    @property
    def compiled_passed(self) -> bool:
        """Whether the signed compile verdict lets a server load the version's native package."""
        return bool(self.compile_gate) and self.compile_gate.get("passed") is True  # type: ignore[union-attr]

    def statement(self) -> dict[str, Any]:
        return {
            "_type": STATEMENT_TYPE,
            "subject": [
                {"name": name, "digest": {"sha256": digest}}
                for name, digest in sorted(self.files.items())
            ],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "model": self.model,
                "version": self.version,
                "run_id": self.run_id,
                "source": self.source,
                "compile_gate": None if self.compile_gate is None else dict(self.compile_gate),
                "decision": dict(self.decision),
            },
        }

    @classmethod
    def from_statement(cls, statement: Mapping[str, Any]) -> Release:
        if statement.get("_type") != STATEMENT_TYPE or (
            statement.get("predicateType") != PREDICATE_TYPE
        ):
            raise ValueError("not a Cascade release statement")
        predicate = statement["predicate"]
        files = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
        return cls(
            model=str(predicate["model"]),
            version=str(predicate["version"]),
            run_id=str(predicate["run_id"]),
            source=str(predicate["source"]),
            files=files,
            compile_gate=predicate.get("compile_gate"),
            decision=predicate.get("decision") or {},
        )


def _pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def sign_release(key: Ed25519PrivateKey, release: Release) -> str:
    """The DSSE envelope (JSON) of ``release``'s statement, signed with ``key``."""
    payload = json.dumps(release.statement(), sort_keys=True, separators=(",", ":")).encode()
    signature = key.sign(_pae(PAYLOAD_TYPE, payload))
    return json.dumps(
        {
            "payloadType": PAYLOAD_TYPE,
            "payload": base64.b64encode(payload).decode(),
            "signatures": [
                {"keyid": key_id(key.public_key()), "sig": base64.b64encode(signature).decode()}
            ],
        },
        separators=(",", ":"),
    )


def open_envelope(envelope: str, keys: Mapping[str, Ed25519PublicKey], what: str) -> Release:
    """The release ``envelope`` vouches for, when one of its signatures is by a trusted key."""
    if not keys:
        raise UnsignedRelease(
            f"{what}: no trusted release key (signing/{PUBLIC_KEYS_FILE} of the state folder); "
            "not loaded. `cascade up` creates it; a server elsewhere mounts the public key there"
        )
    try:
        parsed = json.loads(envelope)
        payload = base64.b64decode(parsed["payload"], validate=True)
        signatures = [
            (s.get("keyid"), base64.b64decode(s["sig"], validate=True))
            for s in parsed["signatures"]
        ]
        if parsed["payloadType"] != PAYLOAD_TYPE:
            raise ValueError(f"payload type {parsed['payloadType']!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise UnsignedRelease(f"{what}: unreadable release signature ({exc}); not loaded") from None
    for keyid, signature in signatures:
        public = keys.get(keyid)
        if public is None:
            continue
        try:
            public.verify(signature, _pae(PAYLOAD_TYPE, payload))
        except InvalidSignature:
            continue
        try:
            return Release.from_statement(json.loads(payload))
        except (ValueError, KeyError, TypeError) as exc:
            raise UnsignedRelease(f"{what}: signed statement unreadable ({exc})") from None
    raise UnsignedRelease(
        f"{what}: its release signature does not verify with a trusted key "
        f"({', '.join(sorted(keys))}); not loaded. Sign it with `cascade release`"
    )


def verified_release(
    version: Any, keys: Mapping[str, Ed25519PublicKey], *, role: str = CHAMPION_ROLE
) -> Release:
    """The signed release of MLflow ``ModelVersion`` ``version``, checked before any of its files
    is downloaded: signed by a trusted key, for this model, version number, run and source, and
    (``role`` champion) promoted. Raises :class:`UnsignedRelease` otherwise."""
    name, number = str(version.name), str(version.version)
    what = f"{name} v{number}"
    envelope = (version.tags or {}).get(RELEASE_TAG)
    if not envelope:
        raise UnsignedRelease(
            f"{what} carries no platform signature (tag {RELEASE_TAG}); not loaded. Only "
            "versions the promotion gate (or `cascade release`) signed are served"
        )
    release = open_envelope(envelope, keys, what)
    bound = {
        "model": (release.model, name),
        "version": (release.version, number),
        "run_id": (release.run_id, str(version.run_id or "")),
        "source": (release.source, str(version.source or "")),
    }
    wrong = [
        f"{k} {signed!r} != {actual!r}" for k, (signed, actual) in bound.items() if signed != actual
    ]
    if wrong:
        raise UnsignedRelease(
            f"{what}: its signature was made for another version ({'; '.join(wrong)}); not loaded"
        )
    if role == CHAMPION_ROLE and release.decision.get("promoted") is not True:
        raise UnsignedRelease(
            f"{what}: the signed decision did not promote it "
            f"({'; '.join(release.decision.get('reasons') or ['no reason recorded'])}); not "
            "served as champion"
        )
    return release


def sign_version(
    client: Any,
    key: Ed25519PrivateKey,
    name: str,
    version: str,
    *,
    compile_gate: Mapping[str, Any] | None,
    decision: Mapping[str, Any],
) -> Release:
    """Sign version ``version`` of ``name`` as registered now (its recorded digests, run and
    source) with the gate's verdict and ``decision``, and store the envelope on it."""
    registered = client.get_model_version(name, str(version))
    release = Release(
        model=name,
        version=str(version),
        run_id=str(registered.run_id or ""),
        source=str(registered.source or ""),
        files=recorded_digests(registered.tags, f"{name} v{version}"),
        compile_gate=None if compile_gate is None else gate_verdict(compile_gate),
        decision=dict(decision),
    )
    client.set_model_version_tag(name, str(version), RELEASE_TAG, sign_release(key, release))
    return release


def gate_verdict(report: Mapping[str, Any]) -> dict[str, Any]:
    """What a release keeps of a compile gate's report: its verdict and the files it tested."""
    kept = {"passed": report.get("passed") is True, "reasons": list(report.get("reasons") or [])}
    if report.get("tested"):
        kept["tested"] = dict(report["tested"])
    return kept


def check_tested(files: Mapping[str, str], tested: Mapping[str, str], what: str) -> None:
    """Refuse to register ``what`` when a file the compile gate tested (``{path: sha256}``,
    paths as the version records them) is not, byte for byte, the one about to be registered."""
    differ = sorted(name for name, digest in tested.items() if files.get(name) != digest)
    if differ:
        raise TamperedArtifact(
            f"{what}: {differ} in the registry are not the files the compile gate tested; not "
            "registered. Run the compile step again, then register"
        )


def retire_key(home: Path, keyid: str) -> int:
    """Drop public key ``keyid`` from ``release.pub`` (the end of a rotation: what only it
    signed is refused from then on); returns how many keys stay trusted."""
    path = public_keys_path(home)
    keys = trusted_keys(home)
    if keyid not in keys:
        raise ValueError(f"no trusted key {keyid} in {path}; trusted: {sorted(keys)}")
    if len(keys) == 1:
        raise ValueError(
            f"{keyid} is the only trusted key in {path}; make its successor first "
            "(`cascade release --new-key`) and sign the served versions with it"
        )
    kept = [line for line in path.read_text().splitlines() if _line_key(line) != keyid]
    path.write_text("\n".join(kept) + "\n")
    return len(trusted_keys(home))


def _line_key(line: str) -> str | None:
    parts = line.split()
    if len(parts) < 2 or parts[0] != "ed25519":
        return None
    return key_id(Ed25519PublicKey.from_public_bytes(base64.b64decode(parts[1])))


def release_version(settings: Any, name: str, version: str, *, reason: str) -> Release:
    """An operator's release of version ``version`` of ``name`` (``cascade release``): its files
    in the store are checked against the digests its registration recorded, then signed with the
    platform key. A version that already carries a release verifying with a trusted key keeps
    its compile verdict and decision (re-signing after a key rotation); otherwise the verdict is
    the one its registration's decision recorded, and the decision is the operator's."""
    import tempfile

    from cascade.registry import DECISION_TAG, download_verified, registry_client_of

    client = registry_client_of(settings)
    registered = client.get_model_version(name, str(version))
    what = f"{name} v{version}"
    with tempfile.TemporaryDirectory(prefix="cascade-release-") as tmp:
        download_verified(settings, name, str(version), Path(tmp))
    key = load_signing_key(settings.home)
    try:
        envelope = registered.tags.get(RELEASE_TAG) or ""
        signed = open_envelope(envelope, trusted_keys(settings.home), what)
        gate, decision = signed.compile_gate, dict(signed.decision)
    except UnsignedRelease:
        recorded = json.loads(registered.tags.get(DECISION_TAG) or "{}")
        gate = recorded.get("compile_gate")
        decision = {"promoted": True, "reasons": [], "by": "operator", "reason": reason}
    return sign_version(client, key, name, str(version), compile_gate=gate, decision=decision)
