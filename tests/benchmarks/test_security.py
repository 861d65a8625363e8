"""``cascade bench security --quick``: the server fuzzed and flooded, events fuzzed, tampered
registry versions of every model kind and the state folder's secrets, each counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.registry import BENCHMARKS, run_benchmark

pytestmark = pytest.mark.slow


def test_quick_security_benchmark_finds_no_hole(tmp_path: Path) -> None:
    assert BENCHMARKS["security"] == "benchmarks.security:run"
    out = tmp_path / "security.json"
    result = run_benchmark("security", out, quick=True)
    assert json.loads(out.read_text())["benchmark"] == "security"
    # The zero keys are zero...
    for key in ("fuzz_5xx", "events_stalling_a_run", "tampered_artifacts_loaded"):
        assert result[key] == 0, (key, result)
    assert result["world_readable_secrets"] == 0, result["secrets"]
    assert result["unsigned_versions_loaded"] == 0, result["releases"]
    assert result["registered_files_changed_by_rerun"] == 0, result["releases"]["rerun"]
    # Least privilege on the real MLflow auth server: only the promotion gate writes the
    # registry (and it can), and no secret is on a command line while a Spark step runs.
    privilege = result["privilege"]
    assert result["services_with_registry_write"] == 0, privilege["by_service"]
    assert privilege["promotion_gate_can_promote"], privilege["promotion_gate_writes"]
    assert privilege["services_tried"] >= 9
    assert result["secrets_on_command_lines"] == 0, privilege["secrets_seen_on_command_lines"]
    assert privilege["spark_step"].get("spark_job_rows_summed") == 499500, privilege["spark_step"]
    assert result["releases"]["rerun"]["registered_versions_checked"] >= 2
    assert result["releases"]["rerun"]["rerun_candidate_is_new"]
    assert result["releases"]["asr"]["served_before"] is not None
    # Every slot held by a body sent a byte at a time: freed at the deadline, others served.
    deadline = result["releases"]["body_deadline_s"]
    assert 0 < result["slow_body_slots_held_s"] <= deadline + 2, result["releases"]["slow_body"]
    assert result["requests_served_during_slow_body_attack"] > 0
    # ...over real work: every route fuzzed, events of every outcome, every model kind.
    assert result["fuzz_requests"] > 50
    # The fuzzer's well-formed share reaches scoring, counted in the infer histogram.
    assert result["fuzz_infer_2xx"] > 0, result["server"]["fuzz_statuses"]
    assert result["server"]["fuzz_valid_requests"] > 0
    assert result["server"]["fuzz_operations"] >= 5
    assert not result["server"]["fuzz_operations_without_requests"]
    assert result["server"]["oversize_statuses"] == [413, 415, 415, 413]
    assert result["server"]["good_request_after_status"] == 200
    assert 0 <= result["oversize_rss_growth_mb"] < 20
    assert result["events_fuzzed"] >= 120
    routed = result["events"]["events_routed"]
    assert routed["dead-letter"] > 0 and routed.get("fire", 0) + routed.get("skip", 0) > 0
    assert all(
        c["action"] == "dead-letter" and c["reason"]
        for c in result["events"]["bad_classes"].values()
    )
    # Valid events through the running broker and trigger: every partition got its run, none
    # failed, the bad ones and the unbuildable one were dead-lettered.
    broker = result["broker_events"]
    assert result["events_through_broker"] >= 30, broker
    assert result["runs_failed_by_valid_events"] == 0, broker
    assert result["partitions_never_built"] == 0, broker
    assert broker["valid_partitions"] == 3 and broker["valid_events_without_work"] == 0
    assert broker["unbuildable_events_dead_lettered"] == 1, broker
    assert broker["dead_lettered"] > 0, broker
    assert result["tampered_versions_tried"] == 9
    assert set(result["tampered_versions"]) == {"preranking", "asr", "multimodal"}
    assert result["server_kept_its_version"] and result["server_logged_refusals"] >= 1
    assert result["secrets"]["state_files_scanned"] > 10
    assert result["commit"] and result["machine"]["cpus"] >= 1
