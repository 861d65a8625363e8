"""Every benchmark JSON's provenance: machine, commit, digests, repeats and spreads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import registry
from benchmarks.provenance import (
    code_digest,
    files_digest,
    non_finite,
    rotated,
    spreads,
    weights_digest,
)
from compilers.timing import interleaved_runs_ms


def timed_benchmark(out: Path, quick: bool) -> dict[str, Any]:
    return {
        "quick": quick,
        "sizes": [{"impressions": 10, "job_s": 2.0, "job_s_runs": [3.0, 1.0, 2.0]}],
        "cascade_ms": 4.0,
        "cascade_ms_runs": [4.0, 5.0, 3.5, 4.5, 4.0],
        "model_digest": "sha256:given",
    }


def test_every_result_carries_provenance_and_keeps_its_own_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry.BENCHMARKS, "ctr", f"{__name__}:timed_benchmark")
    monkeypatch.delenv("CASCADE_BENCH_CTR_REPEATS", raising=False)
    out = tmp_path / "ctr.json"
    result = registry.run_benchmark("ctr", out, quick=True, options={"impressions": "10"})
    assert json.loads(out.read_text()) == json.loads(json.dumps(result, default=str))
    machine = result["machine"]
    assert machine["cpus"] >= 1 and machine["usable_cpus"] >= 1 and "cpu_model" in machine
    assert "cuda_device" in machine and "gpus" in machine
    assert len(result["git_commit"]) == 40 and isinstance(result["git_dirty"], bool)
    assert result["input_digest"].startswith("sha256:")
    assert result["inputs"]["parameters"] == {"quick": True, "CASCADE_BENCH_CTR_SIZES": "10"}
    assert result["inputs"]["generators"] == list(registry.GENERATORS["ctr"])
    assert result["model_digest"] == "sha256:given"  # the benchmark's own value is kept
    assert result["repeats"] == 5
    assert result["spread"]["sizes.0.job_s"] == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    assert result["spread"]["cascade_ms"]["median"] == 4.0
    assert result["sizes"][0]["job_s"] == 2.0 and result["cascade_ms"] == 4.0  # kept as is
    load = result["machine_load"]  # how busy the machine was while it ran
    assert load["samples"] >= 2 and load["usable_cpus"] == machine["usable_cpus"]
    assert 0 <= load["load_average_mean"] <= load["load_average_max"]

    # Other parameters, other inputs: the digest follows them.
    again = registry.run_benchmark("ctr", out, quick=True, options={"impressions": "20"})
    assert again["input_digest"] != result["input_digest"]


def corpus_benchmark(out: Path, quick: bool) -> dict[str, Any]:
    corpus = out.parent / "corpus"
    return {"input_files_digest": files_digest([corpus]), "figure": 1.0}


def test_input_digest_covers_the_bytes_of_files_a_benchmark_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry.BENCHMARKS, "multimodal", f"{__name__}:corpus_benchmark")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "pairs.parquet").write_bytes(b"one")
    out = tmp_path / "multimodal.json"
    first = registry.run_benchmark("multimodal", out, quick=True)["input_digest"]
    assert first == registry.run_benchmark("multimodal", out, quick=True)["input_digest"]
    (corpus / "pairs.parquet").write_bytes(b"two")  # same path and parameters, other bytes
    assert registry.run_benchmark("multimodal", out, quick=True)["input_digest"] != first


def test_code_digest_follows_the_generator_code_and_parameters() -> None:
    one = code_digest(["jobs.impression_log"], {"n": 1})
    assert one == code_digest(["jobs.impression_log"], {"n": 1})
    assert one != code_digest(["jobs.impression_log"], {"n": 2})
    assert one != code_digest(["jobs.multimodal_sources"], {"n": 1})
    with pytest.raises(ValueError, match="no Python source"):
        code_digest(["no.such.module_anywhere"], {})


def test_files_and_weights_digests_change_with_content(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "a.pt").write_bytes(b"one")
    before = files_digest([folder])
    (folder / "a.pt").write_bytes(b"two")
    assert files_digest([folder]) != before
    with pytest.raises(FileNotFoundError, match="does not exist"):
        files_digest([tmp_path / "missing"])
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    digest = weights_digest(net)
    assert digest == weights_digest(net)
    with torch.no_grad():
        net.weight[0, 0] += 1
    assert weights_digest(net) != digest
    assert weights_digest(net.to(torch.bfloat16)).startswith("sha256:")


def test_rotation_puts_every_variant_first_in_turn() -> None:
    names = ["a", "b", "c"]
    assert [rotated(names, r)[0] for r in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert sorted(rotated(names, 4)) == names and rotated([], 3) == []

    calls: list[str] = []
    runs = interleaved_runs_ms(
        {name: (lambda name=name: calls.append(name)) for name in names}, rounds=3, repeats=1
    )
    assert {k: len(v) for k, v in runs.items()} == {"a": 1 * 3, "b": 3, "c": 3}
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(3)]  # after one warm-up call each
    assert [r[0] for r in rounds] == ["a", "b", "c"]


def test_spreads_and_non_finite_figures() -> None:
    found = spreads({"x_runs": [1, 2], "nested": {"y_runs": [5.0]}, "flag_runs": [True]})
    assert set(found) == {"x", "nested.y"} and found["nested.y"]["n"] == 1
    assert non_finite({"a": 1.0, "b": [0.0, math.nan], "c": {"d": math.inf}}) == ["b.1", "c.d"]


def test_the_load_sampler_reads_the_load_average_until_it_is_stopped() -> None:
    import time

    from benchmarks.provenance import LoadSampler

    with LoadSampler(every_s=0.05) as load:
        deadline = time.monotonic() + 60
        while len(load.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(load.samples) >= 3  # it keeps sampling while the benchmark runs
    summary = load.summary()
    assert summary["samples"] == len(load.samples) >= 4  # and once more at the end
    assert summary["load_average_max"] >= summary["load_average_mean"] >= 0
    assert summary["load_average_end"] == round(load.samples[-1], 2)
