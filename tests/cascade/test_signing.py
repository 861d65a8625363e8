"""Signed releases: a statement signed with the platform's key verifies with its public half
only, for the version it names, and not once anything it covers changed."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from cascade.artifacts import DIGESTS_TAG, TamperedArtifact, digests_tag
from cascade.signing import (
    RELEASE_TAG,
    Release,
    UnsignedRelease,
    check_tested,
    ensure_signing_key,
    load_signing_key,
    new_signing_key,
    private_key_path,
    public_keys_path,
    sign_release,
    trusted_keys,
    verified_release,
)

FILES = {"model/state_dict.pt": "a" * 64, "compiled/preranking.pt2": "b" * 64}


def release(**changed: object) -> Release:
    fields: dict = dict(
        model="preranking",
        version="3",
        run_id="r1",
        source="models:/m-1",
        files=FILES,
        compile_gate={"passed": True, "reasons": []},
        decision={"promoted": True, "reasons": []},
    )
    return Release(**{**fields, **changed})


def registered(envelope: str | None, **changed: str) -> SimpleNamespace:
    """What verification reads of an MLflow ``ModelVersion``."""
    about = {"name": "preranking", "version": "3", "run_id": "r1", "source": "models:/m-1"}
    tags = {DIGESTS_TAG: digests_tag(FILES)}
    if envelope is not None:
        tags[RELEASE_TAG] = envelope
    return SimpleNamespace(**{**about, **changed}, tags=tags)


def test_the_key_pair_is_created_once_private_half_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = ensure_signing_key(home)
    assert path == private_key_path(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    first = path.read_bytes()
    ensure_signing_key(home)
    assert path.read_bytes() == first and len(trusted_keys(home)) == 1
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="readable by others"):
        load_signing_key(home)


def test_a_signed_release_verifies_and_names_its_files_gate_and_decision(tmp_path: Path) -> None:
    key = load_signing_key(tmp_path, create=True)
    envelope = sign_release(key, release())
    got = verified_release(registered(envelope), trusted_keys(tmp_path))
    assert dict(got.files) == FILES and got.compiled_passed and got.decision["promoted"]
    # DSSE: the payload is the in-toto statement, its subjects the files.
    statement = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert {s["name"] for s in statement["subject"]} == set(FILES)


def test_a_tampered_statement_does_not_verify(tmp_path: Path) -> None:
    key = load_signing_key(tmp_path, create=True)
    envelope = json.loads(sign_release(key, release()))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "c" * 64  # a swapped .pt2's digest
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(UnsignedRelease, match="does not verify with a trusted key"):
        verified_release(registered(json.dumps(envelope)), trusted_keys(tmp_path))


def test_a_signature_by_another_key_does_not_verify(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ensure_signing_key(ours)
    envelope = sign_release(load_signing_key(theirs, create=True), release())
    with pytest.raises(UnsignedRelease, match="does not verify with a trusted key"):
        verified_release(registered(envelope), trusted_keys(ours))
    with pytest.raises(UnsignedRelease, match="no trusted release key"):
        verified_release(registered(envelope), trusted_keys(tmp_path / "nobody"))


def test_a_missing_signature_is_refused(tmp_path: Path) -> None:
    ensure_signing_key(tmp_path)
    with pytest.raises(UnsignedRelease, match="carries no platform signature"):
        verified_release(registered(None), trusted_keys(tmp_path))
    with pytest.raises(UnsignedRelease, match="unreadable release signature"):
        verified_release(registered("{not json"), trusted_keys(tmp_path))


@pytest.mark.parametrize(
    ("changed", "named"),
    [({"version": "4"}, "version"), ({"run_id": "r2"}, "run_id"), ({"source": "s3://x"}, "source")],
)
def test_a_signature_copied_onto_another_version_is_refused(
    tmp_path: Path, changed: dict[str, str], named: str
) -> None:
    envelope = sign_release(load_signing_key(tmp_path, create=True), release())
    with pytest.raises(UnsignedRelease, match=f"made for another version.*{named}"):
        verified_release(registered(envelope, **changed), trusted_keys(tmp_path))


def test_a_version_the_decision_did_not_promote_is_no_champion(tmp_path: Path) -> None:
    key = load_signing_key(tmp_path, create=True)
    refused = release(decision={"promoted": False, "reasons": ["worse than champion"]})
    version = registered(sign_release(key, refused))
    with pytest.raises(UnsignedRelease, match="did not promote it.*worse than champion"):
        verified_release(version, trusted_keys(tmp_path))
    assert verified_release(version, trusted_keys(tmp_path), role="challenger").version == "3"
    assert not release(compile_gate={"passed": False, "reasons": ["parity"]}).compiled_passed


def test_rotation_keeps_old_signatures_valid_until_the_old_key_is_removed(tmp_path: Path) -> None:
    old = load_signing_key(tmp_path, create=True)
    envelope = sign_release(old, release())
    new_id = new_signing_key(tmp_path)
    assert len(trusted_keys(tmp_path)) == 2
    verified_release(registered(envelope), trusted_keys(tmp_path))
    # Drop the old public key: what it signed is refused, what the new one signs is served.
    lines = public_keys_path(tmp_path).read_text().splitlines()
    public_keys_path(tmp_path).write_text("\n".join(ln for ln in lines if new_id in ln) + "\n")
    with pytest.raises(UnsignedRelease):
        verified_release(registered(envelope), trusted_keys(tmp_path))
    renewed = sign_release(load_signing_key(tmp_path), release())
    verified_release(registered(renewed), trusted_keys(tmp_path))


def test_registration_refuses_files_that_are_not_the_ones_the_gate_tested() -> None:
    check_tested(FILES, {"compiled/preranking.pt2": "b" * 64}, "run r1")
    with pytest.raises(TamperedArtifact, match=r"\['compiled/preranking.pt2'\].*not the files"):
        check_tested(FILES, {"compiled/preranking.pt2": "d" * 64}, "run r1")
