"""Signed releases and immutable versions under attack, for ``cascade bench security``.

Someone who can write the registry (tags, aliases, stored files) but does not hold the
platform's release key tries to get the servers to load a version the platform did not sign:

- ``retagged``: a new version of the champion's own files, with the champion's digests and
  its signature copied onto it;
- ``swapped package``: a version the platform signed whose stored folder then gets a compiled
  package (``.pt2``, native code) and a passed ``gate.json``, its digest tag rewritten;
- ``flipped gate``: a signed version with a failed compile verdict whose stored ``gate.json`` is
  rewritten to passed (and its digest tag with it);
- ``never signed``: a challenger registered with matching digests and no signature,

each pointed at the running pre-ranking server as champion and as rollback target (the
previous-champion tag the rollback follows), at the shadow alias the server's shadow loads, and
the same kinds at the ASR server's champion follower. ``unsigned_versions_loaded`` counts the
versions a server ended up serving (or, for the shadow, holding) and the compiled packages it
loaded. ``registered_files_changed_by_rerun`` re-runs what a compile step writes into a run
(its package and report, again) and a registration of the same files, then compares every
registered version's stored files with the digests it was signed with.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade.config import Settings
from models.preranking import REGISTERED_MODEL

ATTACKS = ("retagged", "swapped package", "flipped gate", "never signed")
ROLES = ("champion", "rollback target", "shadow")


def _client(settings: Settings) -> Any:
    from cascade.registry import registry_client_of

    return registry_client_of(settings)


def stored_folder(settings: Settings, name: str, version: str) -> Path:
    uri = _client(settings).get_model_version_download_uri(name, version)
    folder = Path(uri.removeprefix("file://"))
    if not folder.is_dir():
        raise RuntimeError(f"{name} v{version} is not stored in a local folder ({uri})")
    return folder


def _copy_version(settings: Settings, name: str, version: str, *, tags: bool = True) -> str:
    """A new version of ``name`` over ``version``'s source and run, with its digests tag."""
    from cascade.artifacts import DIGESTS_TAG

    client = _client(settings)
    old = client.get_model_version(name, version)
    kept = {DIGESTS_TAG: old.tags[DIGESTS_TAG]} if tags else {}
    new = client.create_model_version(name, source=old.source, run_id=old.run_id, tags=kept)
    return str(new.version)


def _own_folder(settings: Settings, name: str, version: str, tmp: Path) -> str:
    """A new version of ``name`` holding a copy of ``version``'s files in a run of its own
    (so that changing them changes no other version), with their digests recorded."""
    from cascade.artifacts import DIGESTS_TAG, digests_tag, folder_digests
    from cascade.registry import download_source

    client = _client(settings)
    files = download_source(
        settings, client.get_model_version_download_uri(name, version), tmp / f"copy-{version}"
    )
    experiment = client.get_experiment_by_name("security-releases")
    run = client.create_run(
        experiment.experiment_id if experiment else client.create_experiment("security-releases")
    )
    client.log_artifacts(run.info.run_id, str(files), artifact_path="model")
    client.set_terminated(run.info.run_id)
    new = client.create_model_version(
        name,
        source=f"{run.info.artifact_uri}/model",
        run_id=run.info.run_id,
        tags={DIGESTS_TAG: digests_tag(folder_digests(files))},
    )
    return str(new.version)


def retag(settings: Settings, name: str, version: str) -> None:
    from cascade.artifacts import DIGESTS_TAG, digests_tag, folder_digests

    folder = stored_folder(settings, name, version)
    _client(settings).set_model_version_tag(
        name, version, DIGESTS_TAG, digests_tag(folder_digests(folder))
    )


def attack_versions(
    settings: Settings, name: str, signed: str, tmp: Path, *, package: str, gate: str
) -> dict[str, str]:
    """The four attack versions of ``name`` built from the signed version ``signed``: attack ->
    version. ``package``/``gate``: where a version's compiled package and gate report sit in
    its folder."""
    from cascade.signing import RELEASE_TAG, load_signing_key, sign_version

    client = _client(settings)
    key = load_signing_key(settings.home)
    versions: dict[str, str] = {}

    retagged = _copy_version(settings, name, signed)
    envelope = client.get_model_version(name, signed).tags[RELEASE_TAG]
    client.set_model_version_tag(name, retagged, RELEASE_TAG, envelope)
    versions["retagged"] = retagged

    # Signed by the platform (as `cascade release` does), then changed in the store.
    swapped = _own_folder(settings, name, signed, tmp)
    sign_version(client, key, name, swapped, compile_gate={"passed": True, "reasons": []},
                 decision={"promoted": True, "by": "benchmark"})  # fmt: skip
    folder = stored_folder(settings, name, swapped)
    (folder / package).parent.mkdir(parents=True, exist_ok=True)
    (folder / package).write_bytes(b"\x7fELF a shared library the gates never saw")
    (folder / gate).write_text(json.dumps({"passed": True, "reasons": []}))
    retag(settings, name, swapped)
    versions["swapped package"] = swapped

    flipped = _own_folder(settings, name, signed, tmp)
    sign_version(client, key, name, flipped, compile_gate={"passed": False, "reasons": ["parity"]},
                 decision={"promoted": True, "by": "benchmark"})  # fmt: skip
    gate_path = stored_folder(settings, name, flipped) / gate
    gate_path.parent.mkdir(parents=True, exist_ok=True)
    gate_path.write_text(json.dumps({"passed": True, "reasons": []}))
    retag(settings, name, flipped)
    versions["flipped gate"] = flipped

    versions["never signed"] = _own_folder(settings, name, signed, tmp)
    return versions


def point_preranker(
    settings: Settings,
    served: Callable[[], str | None],
    champion: str,
    versions: dict[str, str],
    *,
    polls_s: float,
) -> dict[str, Any]:
    """Each attack version as the running pre-ranker's champion, then as the rollback target of
    a rollback (the champion's previous-champion tag), the champion put back in between."""
    from cascade.deployments import rollback
    from cascade.registry import PREVIOUS_CHAMPION_TAG

    client = _client(settings)
    name = REGISTERED_MODEL
    outcomes: dict[str, Any] = {}
    for attack, version in versions.items():
        client.set_registered_model_alias(name, "champion", version)
        time.sleep(polls_s)
        as_champion = served()
        client.set_registered_model_alias(name, "champion", champion)
        time.sleep(polls_s)
        client.set_model_version_tag(name, champion, PREVIOUS_CHAMPION_TAG, version)
        moved = rollback(
            reason=f"benchmark: {attack}",
            settings=settings,
            publish=False,
            model=name,
            expected=champion,
        )
        time.sleep(polls_s)
        as_rollback = served()
        client.set_registered_model_alias(name, "champion", champion)
        time.sleep(polls_s)
        outcomes[attack] = {
            "version": version,
            "loaded_as_champion": as_champion == version,
            "rollback_moved": bool(moved.get("moved")),
            "loaded_as_rollback_target": as_rollback == version,
        }
    outcomes["served_after"] = served()
    return outcomes


def shadow_preranker(settings: Settings, versions: dict[str, str]) -> dict[str, Any]:
    """Each attack version behind the shadow alias, loaded as the server's shadow loads it
    (:meth:`serving.preranking.PreRankingModel.load_alias`, in process, with the registry's
    own loader); records whether a version came back and whether native code was loaded."""
    from serving import served_version
    from serving.preranking import PreRankingModel, ServingConfig
    from serving.preranking_backends import registry_backends

    client = _client(settings)
    native: list[str] = []
    loader = served_version.load_package

    def counted(path: Path) -> Any:
        native.append(str(path))
        return loader(path)

    served_version.load_package = counted  # type: ignore[assignment]
    try:
        model = PreRankingModel(
            settings=settings,
            config=ServingConfig(poll_s=60),
            backends=registry_backends(version_source=lambda s, run: None),
        )
        model.observer = None
        outcomes: dict[str, Any] = {}
        for attack, version in versions.items():
            client.set_registered_model_alias(REGISTERED_MODEL, "shadow", version)
            loaded = model.load_alias("shadow", version)
            outcomes[attack] = {
                "version": version,
                "loaded_as_shadow": loaded is not None,
                "package_offered": getattr(loaded, "compiled", None) is not None,
                "refusal": model.refused_versions.get(version, "")[:160],
            }
        client.delete_registered_model_alias(REGISTERED_MODEL, "shadow")
    finally:
        served_version.load_package = loader  # type: ignore[assignment]
    outcomes["native_loads"] = len(native)
    return outcomes


def asr_follower(settings: Settings, tmp: Path, signed: str) -> dict[str, Any]:
    """The attack versions of ``asr`` (from its signed version ``signed``) behind the champion
    alias the ASR server's follower polls; the compiled package loader is counted."""
    from serving import asr
    from serving.champion import ChampionFollower

    versions = attack_versions(
        settings, "asr", signed, tmp, package="asr_int8.pt2", gate="compile_gate.json"
    )
    native: list[str] = []
    loader = asr.load_compiled

    def counted(path: Path, config: Any) -> Any:
        native.append(str(path))
        return loader(path, config)

    asr.load_compiled = counted  # type: ignore[assignment]
    client = _client(settings)
    try:
        client.set_registered_model_alias("asr", "champion", signed)
        server = asr.AsrModel(None, prefer_compiled=True)
        follower = ChampionFollower(settings, "asr", server.swap, cache=tmp / "asr-releases")
        follower.refresh()
        outcomes: dict[str, Any] = {"served_before": server.served_version}
        for attack, version in versions.items():
            client.set_registered_model_alias("asr", "champion", version)
            follower.refresh()
            outcomes[attack] = {"version": version, "loaded": server.served_version == version}
            client.set_registered_model_alias("asr", "champion", signed)
            follower.refresh()
    finally:
        asr.load_compiled = loader  # type: ignore[assignment]
    outcomes["native_loads"] = len(native)
    return outcomes


def unsigned_loaded(preranker: dict[str, Any], shadow: dict[str, Any], asr: dict[str, Any]) -> int:
    """Versions a server served or held that the platform did not sign as they are, plus the
    compiled packages loaded from them."""
    count = 0
    for attack in ATTACKS:
        case = preranker.get(attack, {})
        count += int(bool(case.get("loaded_as_champion")))
        count += int(bool(case.get("loaded_as_rollback_target")))
        count += int(bool(shadow.get(attack, {}).get("loaded_as_shadow")))
        count += int(bool(shadow.get(attack, {}).get("package_offered")))
        count += int(bool(asr.get(attack, {}).get("loaded")))
    return count + shadow.get("native_loads", 0)


def rerun_changes(settings: Settings, tmp: Path, ds: str) -> dict[str, Any]:
    """The pre-ranker's compile step re-run for ``ds`` as far as the registry sees it (a new
    package and gate report written into the champion's run, where the step logs them) and its
    register step re-run (the real one); then each version the platform signed has its stored
    files compared with the signed digests: how many differ."""
    from cascade.artifacts import folder_digests
    from cascade.lake import Lake
    from cascade.signing import open_envelope, trusted_keys
    from models.preranking.inference import COMPILED_DIR, registration_files
    from models.preranking.registration import register_and_promote

    client = _client(settings)
    name = REGISTERED_MODEL
    trained = json.loads(
        (Lake(settings.lake_root).reports("train", ds) / "result.json").read_text()
    )
    run_id = str(trained["run_id"])
    working = tmp / "rerun"
    working.mkdir()
    (working / "preranking.pt2").write_bytes(b"a package built again")
    (working / "gate.json").write_text(json.dumps({"passed": True, "reasons": [], "rerun": True}))
    for path in working.iterdir():
        client.log_artifact(run_id, str(path), COMPILED_DIR)
    from cascade.pipeline_registry import get_pipeline

    rule = get_pipeline("ctr_preranking").promotion()
    assert rule is not None
    # The re-run's package was logged by hand, not by the compile step: no lake report.
    promotion = dataclasses.replace(rule, requires_compile_gate=False)
    decision = register_and_promote(ds, promotion=promotion, settings=settings)
    candidate, _ = registration_files(settings, trained["model_uri"], run_id)
    registered = client.get_model_version(name, str(decision["version"]))
    keys = trusted_keys(settings.home)
    checked = changed = 0
    for model in ("asr", name):
        for found in client.search_model_versions(f"name='{model}'"):
            try:
                release = open_envelope(
                    found.tags.get("cascade.release") or "", keys, f"{model} v{found.version}"
                )
            except Exception:
                continue  # never signed: nothing to compare with
            if release.decision.get("by") == "benchmark":
                continue  # the attack versions, changed on purpose
            checked += 1
            stored = stored_folder(settings, model, str(found.version))
            changed += int(folder_digests(stored) != dict(release.files))
    return {
        "registered_files_changed_by_rerun": changed,
        "registered_versions_checked": checked,
        "rerun_registered_again": str(decision["version"]) != str(registered.version),
        "rerun_candidate_is_new": candidate != registered.source,
    }


def slow_body_attack(
    port: int, token: str, good: Callable[[], bool], *, connections: int, duration_s: float
) -> dict[str, Any]:
    """``connections`` clients (the server's whole concurrency bound) each send a request's
    headers and one byte of its body, then nothing; meanwhile ``good`` (one well-formed request,
    True when answered 200) is sent again and again for ``duration_s``. Returns how long the
    server held the slowest of those slots (until its 408 or its close) and how many good
    requests it served while under attack."""
    import socket
    import threading

    infer = "/v2/models/preranking/infer"
    head = (
        f"POST {infer} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"
    ).encode()
    held: list[float] = []
    answers: list[str] = []

    def attacker() -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=duration_s + 30)
        started = time.monotonic()
        try:
            sock.sendall(head)
            first = sock.recv(64)
            answers.append(first.split(b"\r\n", 1)[0].decode("latin-1") or "closed")
        except OSError as exc:
            answers.append(type(exc).__name__)
        finally:
            held.append(time.monotonic() - started)
            sock.close()

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # every slot taken
    served = tried = 0
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        tried += 1
        served += int(good())
        time.sleep(0.05)
    for thread in threads:
        thread.join(timeout=60)
    statuses: dict[str, int] = {}
    for answer in answers:
        statuses[answer] = statuses.get(answer, 0) + 1
    return {
        "slow_body_slots_held_s": round(max(held), 2) if held else None,
        "requests_served_during_slow_body_attack": served,
        "slow_body_connections": connections,
        "slow_body_good_requests_sent": tried,
        "slow_body_answers": statuses,
        "slow_body_attack_s": duration_s,
    }
