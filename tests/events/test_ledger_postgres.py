"""The event ledger of the cluster profile on a real PostgreSQL (the stack's own service, in a
private state folder): the same claims as the SQLite ledger, exactly once across processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cascade.config import Settings
from cascade.data_services import postgres_password_file, postgres_url
from cascade.event_ledger import (
    ClaimLedger,
    EventLedger,
    PostgresEventLedger,
    record_work,
    work_recorded_at,
    work_records,
)
from cascade.events import TOPIC_DATA_LANDED, make_event

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """One private PostgreSQL for the module (cluster profile, free ports)."""
    from infra.stack import private_stack

    home = tmp_path_factory.mktemp("ledger-pg-home")
    with private_stack(home, services=("postgres",), env={"CASCADE_PROFILE": "cluster"}) as s:
        yield s


def landed() -> dict[str, Any]:
    event = make_event(TOPIC_DATA_LANDED, {"dataset": "impressions", "partition": "2026-11-22"})
    return json.loads(event.model_dump_json())


def test_the_cluster_profile_claims_in_postgres_with_the_sqlite_ledgers_rules(
    cluster: Settings,
) -> None:
    ledger = ClaimLedger.for_settings(cluster)
    assert isinstance(ledger, PostgresEventLedger)
    password = postgres_password_file(cluster).read_text().strip()
    assert password not in repr(ledger)
    assert stat.S_IMODE(postgres_password_file(cluster).stat().st_mode) == 0o600
    dag = "rules"
    a, b, c = landed(), landed(), landed()
    first = ledger.claim(dag_id=dag, run_id="r1", events=[a, b, a])
    assert [e["id"] for e in first.new] == [a["id"], b["id"]]
    retry = ledger.claim(dag_id=dag, run_id="r1", events=[a, b])
    assert retry.new == [] and len(retry.reclaimed) == 2 and retry.has_work
    redelivered = ledger.claim(dag_id=dag, run_id="r2", events=[b, c])
    assert [e["id"] for e in redelivered.new] == [c["id"]]
    assert redelivered.taken == {b["id"]: "r1"}
    assert not ledger.claim(dag_id=dag, run_id="r3", events=[a]).has_work
    assert ledger.claim(dag_id="other", run_id="x", events=[a]).has_work
    assert ledger.owners(dag) == {a["id"]: "r1", b["id"]: "r1", c["id"]: "r2"}
    assert set(ledger.claimed_at(dag)) == {a["id"], b["id"], c["id"]}
    assert all(at.tzinfo is not None for at in ledger.claimed_at(dag).values())
    assert ledger.release(dag_id=dag, run_id="r1") == 2
    again = ledger.claim(dag_id=dag, run_id="r4", events=[a, b, c])
    assert {e["id"] for e in again.new} == {a["id"], b["id"]} and again.taken == {c["id"]: "r2"}
    # Nothing of it went to the local profile's SQLite file.
    assert not (cluster.home / "events" / "ledger.sqlite").exists()
    assert isinstance(ClaimLedger.for_settings(Settings(home=cluster.home)), EventLedger)


CLAIMER = """
import json, sys, time
from pathlib import Path
from cascade.event_ledger import ClaimLedger

events = json.loads(Path(sys.argv[1]).read_text())
if sys.argv[3] == "reverse":
    events.reverse()
go = Path(sys.argv[4])
ledger = ClaimLedger.for_settings()  # imported, connected: ready
Path(f"{go}.{sys.argv[2]}").touch()
while not go.exists():
    time.sleep(0.005)
mine = []
# Overlapping chunks, in opposite orders in the two processes: every event is contended.
for start in range(0, len(events), 40):
    claim = ledger.claim(dag_id="race", run_id=sys.argv[2], events=events[start:start + 80])
    mine += [e["id"] for e in claim.new]
print(json.dumps(mine))
"""


def test_two_processes_claiming_the_same_events_at_once_claim_each_exactly_once(
    cluster: Settings, tmp_path: Path
) -> None:
    events = [landed() for _ in range(400)]
    source = tmp_path / "events.json"
    source.write_text(json.dumps(events))
    go = tmp_path / "go"
    env = {
        **os.environ,
        "CASCADE_HOME": str(cluster.home),
        "CASCADE_PROFILE": "cluster",
        "CASCADE_POSTGRES_PORT": str(cluster.ports.postgres),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    claimers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(source), run_id, order, str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id, order in (("run-a", "forward"), ("run-b", "reverse"))
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{run}").exists() for run in ("run-a", "run-b")):
        assert time.monotonic() < deadline and all(p.poll() is None for p in claimers)
        time.sleep(0.01)
    go.touch()  # both start claiming at once
    claimed: dict[str, list[str]] = {}
    for run_id, proc in zip(("run-a", "run-b"), claimers, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        claimed[run_id] = json.loads(out)
    everything = claimed["run-a"] + claimed["run-b"]
    assert sorted(everything) == sorted(e["id"] for e in events)  # none lost, none twice
    assert claimed["run-a"] and claimed["run-b"], "both claimers must have won some events"
    owners = PostgresEventLedger(postgres_url(cluster)).owners("race")
    assert {i: owners[i] for i in claimed["run-a"]} == dict.fromkeys(claimed["run-a"], "run-a")
    assert {i: owners[i] for i in claimed["run-b"]} == dict.fromkeys(claimed["run-b"], "run-b")


def test_work_records_of_the_cluster_profile_are_rows_every_worker_reads(
    cluster: Settings,
) -> None:
    first = record_work("acct", "run-1", ["e1", "e2"], settings=cluster)
    assert "event_work" in first
    record_work("acct", "run-2", ["e3"], settings=cluster)
    before = work_recorded_at("acct", settings=cluster)
    record_work("acct", "run-1", ["e1", "e2", "e4"], settings=cluster)  # a retry replaces
    assert work_records("acct", settings=cluster) == {"run-1": ["e1", "e2", "e4"], "run-2": ["e3"]}
    after = work_recorded_at("acct", settings=cluster)
    assert after["run-1"] > before["run-1"] and after["run-2"] == before["run-2"]
    assert not (cluster.home / "events" / "work").exists()  # nothing on this host's disk
    # The local profile keeps its files in the state folder.
    local = Settings(home=cluster.home / "local")
    assert record_work("acct", "r", ["x"], settings=local).endswith(".json")
    assert work_records("acct", settings=local) == {"r": ["x"]}
    assert set(work_recorded_at("acct", settings=local)) == {"r"}


def test_the_cluster_ledger_keeps_released_events_for_retries_and_dead_letters(
    cluster: Settings,
) -> None:
    """Released events keep their bodies and a count in PostgreSQL, as in the SQLite ledger,
    so a later run retries them whatever their age; dead-lettered ones are never claimed."""
    from cascade.event_ledger import DEAD_LETTERED

    ledger = ClaimLedger.for_settings(cluster)
    dag = "retries"
    a, b, c = landed(), landed(), landed()
    ledger.claim(dag_id=dag, run_id="r1", events=[a, b])
    assert [e["id"] for e in ledger.run_events(dag, "r1")] == sorted([a["id"], b["id"]])
    assert ledger.release(dag_id=dag, run_id="r1") == 2
    waiting = ledger.released(dag)
    assert set(waiting) == {a["id"], b["id"]} and waiting[a["id"]].event == a
    assert waiting[a["id"]].releases == 1 and waiting[a["id"]].last_run_id == "r1"
    ledger.claim(dag_id=dag, run_id="r2", events=[a])
    assert set(ledger.released(dag)) == {b["id"]}  # a is claimed again: not waiting
    ledger.release(dag_id=dag, run_id="r2")
    assert ledger.released(dag)[a["id"]].releases == 2
    assert ledger.dead_letter(dag, [c, a]) == [c["id"], a["id"]]
    assert ledger.dead_letter(dag, [c]) == []  # marked once
    assert set(ledger.released(dag)) == {b["id"]}  # a dead-lettered one waits no more
    assert ledger.owners(dag)[c["id"]] == DEAD_LETTERED
    assert not ledger.claim(dag_id=dag, run_id="r3", events=[c]).has_work


def test_the_cluster_ledger_keeps_upstream_partitions_as_the_sqlite_one_does(
    cluster: Settings, tmp_path: Path
) -> None:
    """Upstream partitions a run saw wait in PostgreSQL for their own runs; one a run owns
    stays its own; a dead-lettered or released one waits again with a fresh count."""
    from cascade.event_ledger import DEAD_LETTERED

    def upstream(ds: str) -> dict[str, Any]:
        return {**landed(), "id": f"after:{ds}"}

    for ledger in (ClaimLedger.for_settings(cluster), EventLedger(tmp_path / "ledger.sqlite")):
        dag = "kept"
        a, b, c = upstream("2026-11-20"), upstream("2026-11-21"), upstream("2026-11-22")
        ledger.claim(dag_id=dag, run_id="r1", events=[a])
        assert ledger.keep(dag_id=dag, run_id="r1", events=[a, b, b]) == [b["id"]]
        waiting = ledger.released(dag)
        assert set(waiting) == {b["id"]} and waiting[b["id"]] == (b, 0, "r1")
        ledger.claim(dag_id=dag, run_id="r2", events=[b])
        ledger.release(dag_id=dag, run_id="r2")
        assert ledger.released(dag)[b["id"]].releases == 1
        ledger.dead_letter(dag, [c])
        assert ledger.owners(dag)[c["id"]] == DEAD_LETTERED
        assert sorted(ledger.keep(dag_id=dag, run_id="r3", events=[a, b, c])) == [
            b["id"],
            c["id"],
        ]
        waiting = ledger.released(dag)
        assert {i: w.releases for i, w in waiting.items()} == {b["id"]: 0, c["id"]: 0}
        assert ledger.owners(dag) == {a["id"]: "r1"}, type(ledger).__name__


def test_alias_moves_of_movers_on_different_homes_take_one_lock_in_the_ledger_database(
    cluster: Settings, tmp_path: Path
) -> None:
    """Two rollbacks with different state folders (two hosts) and one ledger database read the
    same champion and move it at once: one moves it, the other is told in one line that it
    moved first; no lock file was taken on either host."""
    import threading

    from cascade.alias_lock import TABLE, AliasLockTimeout, held_in_database, lock_path
    from cascade.config import load_settings
    from cascade.deployments import rollback
    from tests.cascade.test_alias_moves import MODEL, _champion, _registry

    uri = _registry(tmp_path, versions=3)
    url = postgres_url(cluster)
    homes = [tmp_path / "host-a", tmp_path / "host-b"]
    movers = [
        load_settings({"CASCADE_HOME": str(home), "CASCADE_PROFILE": "cluster",
                       "CASCADE_POSTGRES_URL": url, "CASCADE_MLFLOW_URI": uri})
        for home in homes
    ]  # fmt: skip
    read = _champion(uri)
    barrier = threading.Barrier(2)
    results: list[dict[str, Any]] = []

    def move(settings: Settings) -> None:
        barrier.wait(timeout=30)
        results.append(
            rollback(model=MODEL, reason="race", publish=False, expected=read, settings=settings)
        )

    threads = [threading.Thread(target=move, args=(s,)) for s in movers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(r["moved"] for r in results) == [False, True]
    loser = next(r for r in results if not r["moved"])
    assert "\n" not in loser["skipped"] and "no longer v3" in loser["skipped"]
    assert _champion(uri) == "2"  # one step back, not two
    assert not any(lock_path(uri, home).exists() for home in homes)
    assert not (tmp_path / "mlflow.db.aliases.lock").exists()
    with held_in_database(url, uri, timeout_s=5) as moves:
        assert moves == 2  # both movers held the database's row, one after the other
        # Held here: a mover on a third host waits, then gives up in one line.
        with pytest.raises(AliasLockTimeout, match=f"row .* of {TABLE}"):
            with held_in_database(url, uri, timeout_s=0.3):
                pass
    with held_in_database(url, uri, timeout_s=5) as moves:
        assert moves == 3  # the block above ended without error: it counted
