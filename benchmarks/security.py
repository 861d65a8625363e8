"""Benchmark ``security``: the trust boundaries of the stack, attacked and counted.

    cascade bench security --out bench-results/security.json
    cascade bench security --out /tmp/security.json --quick        # smoke, a few minutes

Everything runs in a private state folder (a temporary one, never a running stack's), created
under the most permissive umask a user could have, so only the stack's own modes protect it:

* **the model server** (``python -m serving.server``, started as the stack starts its
  ``serving`` service, :func:`infra.stack.start_service`) with the cluster profile's bearer token
  and a 1 MiB body limit, serving a pre-ranker (the FSCD network, ``debug`` config) trained
  on the cross-statistics engine's partitions of a synthetic log, registered in a SQLite MLflow
  and reading its fields from the SQLite online store (the setup of
  :mod:`benchmarks.serving_cross_features`). ``fuzz_requests``: requests schemathesis generated from
  the server's own OpenAPI document, schema-valid and schema-violating, for every operation in it
  (``fuzz_per_operation`` examples per operation and mode, within ``fuzz_budget_s``), plus as
  many well-formed infer requests (:mod:`benchmarks.security_fuzz`: shaped by that document, ids
  in the served ranges, within the server's limits); ``fuzz_5xx``: how many were answered 5xx
  (0); ``fuzz_infer_2xx``: infer requests answered 2xx, which reached scoring (> 0), with the
  per-operation histogram in ``fuzz_statuses``. ``oversize_rss_growth_mb``: the growth of the
  server's resident memory (its processes together) over chunked and Content-Length bodies far
  past the limit and chunked bodies of the wrong type, all on one keep-alive connection
  (``oversize_statuses``: 413 and 415), measured after one warm-up body of each kind;
* **events**: ``events_fuzzed`` messages hypothesis generated (bytes, text, any JSON, envelopes of
  every event type with hostile fields) routed as a watcher routes them; each one that fires is
  claimed by a run (:func:`cascade.event_claims.claim_run_events`, which checks it again) and the
  run's partition resolved; each one refused becomes a dead-letter record with its reason.
  ``events_stalling_a_run``: messages that raised, fired something a run cannot work on, or were
  refused without a readable dead-letter record (0). ``bad_classes``: the issue's bad events
  (an integer partition, a far-future date, ...) with the kind and reason each was dead-lettered
  with;
* **events through the broker** (:func:`benchmarks.security_events.broker_run`): on a private
  stack of the broker and Airflow, the fuzzed messages, the bad classes, valid probe events over
  a few days and one valid event naming a partition that cannot be built yet are published
  through the running broker to the running trigger (DAG ``event_probe``), and counted from the
  ledger: ``events_through_broker`` (published), ``runs_failed_by_valid_events`` (0),
  ``partitions_never_built`` (valid partitions no run did work for: 0), and in
  ``broker_events`` the dead letters by kind (the unbuildable one among them);
* **the registry**: for each model kind (pre-ranker, ASR, multimodal), versions registered with
  their digests (:func:`cascade.registry.source_digests`) whose stored files were then changed,
  replaced by a pickle that writes a file when unpickled (with the digests re-tagged to match, as
  someone who can write both the store and the tags would), or registered with no digests, each
  handed to that kind's loader: the pre-ranker's :func:`~models.preranking.inference.load_version`,
  the ASR server's champion follower, the multimodal register step's
  :func:`~cascade.registry.download_verified`. ``tampered_artifacts_loaded``: versions a loader
  accepted with files other than those registered, plus planted pickles that ran (0). The
  running model server is pointed at a tampered pre-ranker too: it keeps its version
  (``server_kept_its_version``);
* **secrets**: ``world_readable_secrets``: the state folder and secret files another user could
  read (:func:`infra.stack.world_readable_secrets`), plus every other file of the state folder
  (logs, summaries, databases) holding the Airflow admin password or the serving token, after
  the stack wrote the password (:func:`cascade.airflow_client.ensure_airflow_password`), Airflow's
  auth manager started on it, and the server ran with the token (0).

* **signed releases** (:mod:`benchmarks.security_releases`): ``unsigned_versions_loaded``:
  re-tagged versions, swapped packages and ``gate.json`` files, a challenger never signed,
  pointed at the running pre-ranker as champion and rollback target, at its shadow loader and
  at the ASR server's follower, that a server served or held, plus packages it loaded (0);
  ``registered_files_changed_by_rerun``: registered versions whose stored files differ from
  their signed digests after the compile and register steps wrote again (0);
  ``slow_body_slots_held_s`` (at most the guard's body deadline) and
  ``requests_served_during_slow_body_attack`` (> 0) with every slot held by a body that
  arrives one byte at a time.

* **least privilege** (:mod:`benchmarks.security_privilege`): ``services_with_registry_write``:
  services of both profiles (and a training launch, and the cluster profile's default Celery
  workers with every credential file their tasks can read) whose own MLflow credential could
  create a version, move or delete ``champion`` or tag a version on the stack's real auth
  server, the promotion gate and its worker excepted (0); ``secrets_on_command_lines``: the
  state folder's secrets seen in any process's command line while the tracking server, Spark's
  standalone daemons and a Spark step run (0).

``--quick`` uses a smaller log, fewer examples and smaller bodies. The events part is
:mod:`benchmarks.security_events`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import security_fuzz as fuzz_cases
from benchmarks import security_privilege as privilege
from benchmarks import security_releases as releases
from benchmarks.security_events import broker_run, fuzz_events
from benchmarks.security_server import (
    BODY_LIMIT,
    MB,
    fuzz_server,
    oversize_bodies,
    served_version,
)
from cascade.config import REPO_ROOT, Settings, load_settings, scoped_environ
from cascade.ports import free_port
from models.preranking import REGISTERED_MODEL
from serving.guard import BODY_DEADLINE_S

BROKER_KEYS = ("events_through_broker", "runs_failed_by_valid_events", "partitions_never_built")
QUICK_LOG_ROWS = 4_000
FULL_LOG_ROWS = 40_000


# --- helpers ------------------------------------------------------------------------------------


@contextlib.contextmanager
def open_umask() -> Iterator[None]:
    """The most permissive umask: only the stack's own modes protect what it writes."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


class Trace:
    """A pickle that writes ``marker`` when unpickled: the proof that something unpickled it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.marker), "unpickled"))


def planted_pickle(marker: Path) -> bytes:
    """A pickled :class:`Trace` of ``marker``, to plant where a loader might read it."""
    return pickle.dumps(Trace(str(marker)))


def _client(settings: Settings) -> Any:
    from cascade.registry import registry_client_of

    return registry_client_of(settings)


def _register_folder(settings: Settings, name: str, folder: Path, *, digests: bool = True) -> str:
    """``folder`` logged to a run of its own and registered as a new version of ``name`` with
    the digests a registration records (none with ``digests=False``); returns the version."""
    from cascade.artifacts import DIGESTS_TAG, digests_tag
    from cascade.registry import ensure_registered_model, source_digests

    client = _client(settings)
    experiment = client.get_experiment_by_name("security-bench")
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment("security-bench")
    )
    run = client.create_run(experiment_id)
    client.log_artifacts(run.info.run_id, str(folder), artifact_path="model")
    client.set_terminated(run.info.run_id)
    ensure_registered_model(client, name, "security benchmark")
    source = f"{run.info.artifact_uri}/model"
    tags = {DIGESTS_TAG: digests_tag(source_digests(settings, source))} if digests else {}
    return str(
        client.create_model_version(name, source=source, run_id=run.info.run_id, tags=tags).version
    )


# --- the model server ---------------------------------------------------------------------------


TAMPERINGS = ("changed file", "planted pickle", "no digests")


def _tamper(
    settings: Settings,
    name: str,
    folder: Path,
    target: str,
    how: str,
    marker: Path,
    change: Callable[[Path], None],
) -> str:
    """A version of ``name`` registered from ``folder``, then tampered with ``how``."""
    version = _register_folder(settings, name, folder, digests=how != "no digests")
    stored = releases.stored_folder(settings, name, version)
    if how == "changed file":
        change(stored / target)
    elif how == "planted pickle":
        (stored / target).write_bytes(planted_pickle(marker))
        releases.retag(settings, name, version)
    return version


def tampered_preranker(settings: Settings, workdir: Path, champion: str) -> dict[str, Any]:
    """The champion's files copied into tampered versions, each loaded as the server loads."""
    import torch

    from cascade.artifacts import TamperedArtifact
    from cascade.registry import download_source
    from models.preranking.inference import load_version

    name = REGISTERED_MODEL
    location = _client(settings).get_model_version_download_uri(name, champion)
    files = download_source(settings, location, workdir / "preranker")
    state = next(p.relative_to(files).as_posix() for p in files.rglob("*.pt"))

    def change(path: Path) -> None:
        weights = torch.load(path, weights_only=True)
        bumped = {k: v + 1 if v.is_floating_point() else v for k, v in weights.items()}
        torch.save(bumped, path)

    outcomes: dict[str, Any] = {}
    versions: dict[str, str] = {}
    for how in TAMPERINGS:
        marker = workdir / f"preranker-{how.replace(' ', '-')}.txt"
        # The pickle goes where a pickled pyfunc keeps its object; the others change weights.
        target = "python_model.pkl" if how == "planted pickle" else state
        version = _tamper(settings, name, files, target, how, marker, change)
        versions[how] = version
        try:
            load_version(settings, version)
            loaded = how != "planted pickle"  # with the pickle: loaded, from the state dict
        except TamperedArtifact as exc:
            loaded, outcomes[f"{how} refused"] = False, str(exc)[:160]
        outcomes[how] = {"version": version, "loaded": loaded, "unpickled": marker.exists()}
    outcomes["versions"] = versions
    return outcomes


def tampered_asr(settings: Settings, workdir: Path) -> dict[str, Any]:
    """Versions of ``asr`` (a small untrained model) followed by the ASR server's follower."""
    import torch

    from cascade.signing import release_version
    from models.asr.artifact import FILENAME, AsrArtifact, save_artifact
    from models.asr.model import Alphabet, ConvDFSMN, ConvDFSMNConfig
    from serving.asr import AsrModel
    from serving.champion import ChampionFollower

    alphabet = Alphabet("abcdefghijklmnopqrstuvwxyz' ")
    config = ConvDFSMNConfig(
        n_mels=40, vocab_size=len(alphabet), conv_channels=8, hidden=16, memory=8, blocks=1
    )
    folder = workdir / "asr"
    save_artifact(folder, AsrArtifact(model=ConvDFSMN(config).eval(), alphabet=alphabet, n_mels=40))

    def change(path: Path) -> None:
        payload = torch.load(path, weights_only=True)
        payload["state_dict"] = {k: v + 1 for k, v in payload["state_dict"].items()}
        torch.save(payload, path)

    good = _register_folder(settings, "asr", folder)
    # Released as an operator does (the servers load only signed versions); the tampered
    # versions below are never signed.
    release_version(settings, "asr", good, reason="security benchmark")
    client = _client(settings)
    client.set_registered_model_alias("asr", "champion", good)
    server = AsrModel(None, prefer_compiled=False)
    follower = ChampionFollower(settings, "asr", server.swap, cache=workdir / "asr-cache")
    follower.refresh()
    outcomes: dict[str, Any] = {"served_before": server.served_version}
    for how in TAMPERINGS:
        marker = workdir / f"asr-{how.replace(' ', '-')}.txt"
        version = _tamper(settings, "asr", folder, FILENAME, how, marker, change)
        client.set_registered_model_alias("asr", "champion", version)
        try:
            follower.refresh()
            refusal = None
        except Exception as exc:  # the follower's poll loop logs it and keeps serving
            refusal = f"{type(exc).__name__}: {str(exc)[:120]}"
        outcomes[how] = {
            "version": version,
            "load_error": refusal,
            "loaded": server.served_version == version,
            "unpickled": marker.exists(),
            "served_after": server.served_version,
        }
    return outcomes


def tampered_multimodal(settings: Settings, workdir: Path) -> dict[str, Any]:
    """Versions of ``multimodal`` (a stored model's files) downloaded as the register step
    downloads a champion to score it, then read as :mod:`models.multimodal.stored` reads."""
    import torch

    from cascade.artifacts import TamperedArtifact, folder_digests
    from cascade.registry import download_verified
    from models.multimodal.stored import (
        DIGESTS_FILE,
        MODEL_CONFIG_FILE,
        MODULE_STATES,
        check_digests,
    )

    folder = workdir / "multimodal"
    folder.mkdir()
    torch.save({"module": {"proj.weight": torch.zeros(4, 4)}}, folder / MODULE_STATES)
    (folder / MODEL_CONFIG_FILE).write_text("{}")
    (folder / DIGESTS_FILE).write_text(json.dumps(folder_digests(folder)))

    def change(path: Path) -> None:
        torch.save({"module": {"proj.weight": torch.ones(4, 4)}}, path)

    outcomes: dict[str, Any] = {}
    for how in TAMPERINGS:
        marker = workdir / f"multimodal-{how.replace(' ', '-')}.txt"
        version = _tamper(settings, "multimodal", folder, MODULE_STATES, how, marker, change)
        if how == "planted pickle":  # the attacker rewrites digests.json as well
            stored = releases.stored_folder(settings, "multimodal", version)
            listing = folder_digests(stored)
            listing.pop(DIGESTS_FILE)
            (stored / DIGESTS_FILE).write_text(json.dumps(listing))
            releases.retag(settings, "multimodal", version)
        scratch = workdir / f"multimodal-download-{version}"
        try:
            local = download_verified(settings, "multimodal", version, scratch)
        except TamperedArtifact as exc:
            outcomes[how] = {"version": version, "loaded": False, "reason": str(exc)[:160]}
            continue
        check_digests(local)
        try:
            torch.load(local / MODULE_STATES, map_location="cpu", weights_only=True)
            read = True
        except pickle.UnpicklingError:
            read = False
        outcomes[how] = {
            "version": version,
            "loaded": read and how != "planted pickle",
            "unpickled": marker.exists(),
        }
    return outcomes


def count_loaded(outcomes: dict[str, dict[str, Any]]) -> int:
    return sum(
        int(bool(case.get("loaded"))) + int(bool(case.get("unpickled")))
        for kind in outcomes.values()
        for how, case in kind.items()
        if how in TAMPERINGS
    )


# --- secrets ------------------------------------------------------------------------------------

TEXT_SUFFIXES = {".json", ".log", ".txt", ".yaml", ".yml", ".cfg", ".jsonl", ".out", ""}


def scan_secrets(settings: Settings, values: dict[str, str]) -> dict[str, Any]:
    """The state folder's permission bits, the secret files', and every other file holding
    one of ``values`` (logs and summaries above all; databases too, scanned as bytes)."""
    from infra.stack import secret_files, world_readable_secrets

    exposed = [str(p) for p in world_readable_secrets(settings)]
    secret_paths = {p.resolve() for p in secret_files(settings)}
    holding: list[str] = []
    scanned = 0
    for path in sorted(settings.home.rglob("*")):
        if not path.is_file() or path.resolve() in secret_paths or path.stat().st_size > 64 * MB:
            continue
        scanned += 1
        data = path.read_bytes()
        for name, value in values.items():
            if value.encode() in data:
                holding.append(f"{path.relative_to(settings.home)} holds the {name}")
    logs = (
        sorted(p.name for p in settings.logs_dir.glob("*.log"))
        if settings.logs_dir.exists()
        else []
    )
    return {
        "world_readable_secrets": len(exposed) + len(holding),
        "secrets_exposed_by_mode": exposed,
        "secrets_in_files": holding,
        "state_files_scanned": scanned,
        "state_folder_mode": oct(settings.home.stat().st_mode & 0o777),
        "logs_scanned": logs,
    }


def start_airflow_auth(settings: Settings) -> int:
    """Airflow's auth manager started on the stack's password file (as the Airflow service
    starts it), its output in the state folder's logs: it must neither print nor rewrite it."""
    from infra.services import airflow_env

    log_path = settings.logs_dir / "airflow-auth.log"
    settings.logs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    code = (
        "from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import "
        "SimpleAuthManager as M; M().init()"
    )
    with log_path.open("ab") as log:
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=airflow_env(settings),
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    return done.returncode


# --- the run ------------------------------------------------------------------------------------


def source_commit() -> dict[str, Any]:
    """The commit the benchmark ran from, and whether the tree had changes on top of it."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def run(out: Path, quick: bool) -> dict[str, Any]:
    from benchmarks import serving_cross_features as engine
    from benchmarks.serving_load import DEBUG_NETWORK, ITEMS, USERS, private_stack_env
    from cascade.airflow_client import airflow_password, ensure_airflow_password
    from cascade.artifacts import DIGESTS_TAG
    from infra.stack import start_service, state, stop_service
    from models.preranking.synthetic_data import synthetic_training_frame

    started = time.monotonic()
    token = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp, open_umask():
        workdir = Path(tmp)
        home = workdir / "state"
        port = free_port()
        env = {
            **private_stack_env(home, port),
            "CASCADE_SERVING_AUTH": "1",
            "CASCADE_SERVING_TOKEN": token,
            "CASCADE_SERVING_MAX_BODY_BYTES": str(BODY_LIMIT),
            "CASCADE_SERVING_POLL_S": "1",
            "CASCADE_SERVING_WORKERS": "1",
            "CASCADE_FEEDBACK": "0",
        }
        with scoped_environ(env):
            settings = load_settings()
            ensure_airflow_password(settings)  # the stack's secret-writing code, first
            password = airflow_password(settings) or ""
            airflow_rc = start_airflow_auth(settings)
            rows = QUICK_LOG_ROWS if quick else FULL_LOG_ROWS
            # Today's partition: the cross views' ttl would serve an older one as missing.
            ds = engine.today_ds()
            frame = synthetic_training_frame(rows, users=USERS, items=ITEMS, seed=7, end=ds)
            log = engine.engine_log(frame)
            engine.publish_engine_partitions(log, settings, ds, workdir)
            engine.write_engine_training_set(log, settings, ds)
            promoted = engine.train_cold_and_promote(settings, ds, DEBUG_NETWORK)
            promoted_digests = hashlib.sha256(
                _client(settings)
                .get_model_version(REGISTERED_MODEL, promoted["version"])
                .tags[DIGESTS_TAG]
                .encode()
            ).hexdigest()
            setup_s = time.monotonic() - started
            events = fuzz_events(workdir, examples=120 if quick else 3000)
            start_service(settings, "serving", echo=lambda _line: None)
            try:
                url = settings.serving_url
                deadline = time.monotonic() + 120
                while served_version(url, token) is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the model server never answered; see {state(settings, 'serving').log}"
                        )
                    time.sleep(0.5)
                pid = state(settings, "serving").pid
                assert pid is not None
                oversize = oversize_bodies(port, token, pid, body_mb=8 if quick else 50)
                fuzz = fuzz_server(
                    url,
                    token,
                    per_operation=10 if quick else 100,
                    budget_s=25 if quick else 300,
                    limits=fuzz_cases.served_limits(
                        frame,
                        max_candidates=settings.serving.max_candidates,
                        max_body_bytes=BODY_LIMIT,
                    ),
                )
                registry: dict[str, Any] = {
                    "preranking": tampered_preranker(settings, workdir, promoted["version"])
                }
                # The running server is pointed at the tampered versions: it keeps its own.
                client = _client(settings)
                for how in ("changed file", "no digests"):
                    client.set_registered_model_alias(
                        REGISTERED_MODEL,
                        "champion",
                        registry["preranking"][how]["version"],
                    )
                    time.sleep(3)  # three polls
                kept = served_version(url, token)
                slow = releases.slow_body_attack(
                    port,
                    token,
                    lambda: served_version(url, token) is not None,
                    connections=settings.serving.max_concurrent,
                    duration_s=BODY_DEADLINE_S + 4,
                )
                attacks = releases.attack_versions(
                    settings, REGISTERED_MODEL, promoted["version"], workdir,
                    package="compiled/preranking.pt2", gate="compiled/gate.json",
                )  # fmt: skip
                pointed = releases.point_preranker(
                    settings, lambda: served_version(url, token), promoted["version"], attacks,
                    polls_s=2.5,
                )  # fmt: skip
                shadow = releases.shadow_preranker(settings, attacks)
                registry["asr"] = tampered_asr(settings, workdir)
                asr_attacks = releases.asr_follower(
                    settings, workdir, registry["asr"]["served_before"]
                )
                registry["multimodal"] = tampered_multimodal(settings, workdir)
                rerun = releases.rerun_changes(settings, workdir, ds)
            finally:
                stop_service(settings, "serving", echo=lambda _line: None)
            server_log = state(settings, "serving").log.read_text(errors="replace")
            secrets_scan = scan_secrets(
                settings, {"Airflow admin password": password, "serving token": token}
            )
        # Least privilege, on a private stack of its own: the real MLflow auth server.
        privilege_result = privilege.run(workdir / "privilege")
        # Events through the running broker and trigger, on a private stack of their own.
        broker = broker_run(workdir / "events", quick=quick)
    return {
        "fuzz_requests": fuzz["fuzz_requests"],
        "fuzz_5xx": fuzz["fuzz_5xx"],
        "fuzz_infer_2xx": fuzz["fuzz_infer_2xx"],
        "oversize_rss_growth_mb": oversize["oversize_rss_growth_mb"],
        "events_fuzzed": events["events_fuzzed"],
        "events_stalling_a_run": events["events_stalling_a_run"],
        "events_through_broker": broker["events_through_broker"],
        "runs_failed_by_valid_events": broker["runs_failed_by_valid_events"],
        "partitions_never_built": broker["partitions_never_built"],
        "tampered_artifacts_loaded": count_loaded(registry),
        "world_readable_secrets": secrets_scan["world_readable_secrets"],
        "unsigned_versions_loaded": releases.unsigned_loaded(pointed, shadow, asr_attacks),
        "registered_files_changed_by_rerun": rerun["registered_files_changed_by_rerun"],
        "slow_body_slots_held_s": slow["slow_body_slots_held_s"],
        "requests_served_during_slow_body_attack": slow["requests_served_during_slow_body_attack"],
        "services_with_registry_write": privilege_result["services_with_registry_write"],
        "secrets_on_command_lines": privilege_result["secrets_on_command_lines"],
        "privilege": {
            k: v
            for k, v in privilege_result.items()
            if k not in ("services_with_registry_write", "secrets_on_command_lines")
        },
        "releases": {
            "preranking": pointed,
            "preranking_shadow": shadow,
            "asr": asr_attacks,
            "rerun": {k: v for k, v in rerun.items() if k != "registered_files_changed_by_rerun"},
            "slow_body": slow,
            "body_deadline_s": BODY_DEADLINE_S,
        },
        "quick": quick,
        "server": {
            **oversize,
            **{
                k: v
                for k, v in fuzz.items()
                if k not in ("fuzz_requests", "fuzz_5xx", "fuzz_infer_2xx")
            },
        },
        "server_kept_its_version": kept == promoted["version"],
        "server_version_served_after_tampering": kept,
        "server_logged_refusals": server_log.count("refusing preranking version"),
        "tampered_versions": registry,
        "tampered_versions_tried": sum(
            1 for kind in registry.values() for how in kind if how in TAMPERINGS
        ),
        "events": {
            k: v for k, v in events.items() if k not in ("events_fuzzed", "events_stalling_a_run")
        },
        "broker_events": {k: v for k, v in broker.items() if k not in BROKER_KEYS},
        "secrets": {k: v for k, v in secrets_scan.items() if k != "world_readable_secrets"},
        "airflow_auth_exit_code": airflow_rc,
        "setup": {
            "log_rows": rows,
            "model_version": promoted["version"],
            "model_test_auc": promoted["test_auc"],
            "registry": "mlflow sqlite",
            "online_store": "sqlite (local profile), bulk-loaded engine partitions",
            "model": "cold (the FSCD pre-ranker's network, debug config, trained in process)",
            "body_limit_bytes": BODY_LIMIT,
            "setup_s": round(setup_s, 1),
        },
        "total_s": round(time.monotonic() - started, 1),
        **source_commit(),
        "model_digest": promoted_digests,  # sha256 of the champion's recorded digests
        "repeats": 1,
        "generation": "hypothesis, derandomized: the same requests and events on every run",
    }
