"""`cascade bench compilers --quick` runs end to end and reports what it measured; the peers
(Inductor default and tuned, ONNX Runtime fp32 and int8, eager int8) run on a tiny module."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.compile_peers import RECOMPILE_LIMIT, build_peers
from benchmarks.compiled_inference import (
    agree_with_eager,
    peer_report,
    served_shapes,
    speedups,
    timed_entry,
)
from benchmarks.provenance import non_finite
from benchmarks.registry import BENCHMARKS, OPTIONS, run_benchmark


def test_compilers_benchmark_quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    assert BENCHMARKS["compilers"] == "benchmarks.compiled_inference:run"
    result = run_benchmark("compilers", tmp_path / "out.json", quick=True)
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["benchmark"] == "compilers" and written["quick"] is True
    assert set(written["sizes"]) == {"1x100", "1x1000"}
    assert all(entry["eager_ms"] > 0 for entry in written["sizes"].values())
    assert result["shapes_tried"] >= 20
    assert result["passes"]["share_broadcast_computation"]["fired"] > 0
    # The exact passes keep the ranking; RSQ int8 is measured, not assumed.
    assert abs(result["passes_graph_auc_delta"]) < 1e-3
    assert math.isfinite(result["rsq_int8_auc_delta"])
    assert 0.5 < result["eager_auc"] <= 1.0


@pytest.mark.slow
def test_fscd_table_compares_the_deployed_network_and_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.compiled_fscd import fscd_compile_table, train_pipeline_fscd

    # One training process (this test runs beside the stacks, not in the exclusive worker) and
    # one epoch per phase: the table is what is under test, not the network's accuracy.
    monkeypatch.setenv("CASCADE_TRAIN_PROCESSES", "1")
    # Enough steps (~45) for scores that rank, too few to prune a field: no cost budget (the
    # table compares packages, not the choice).
    trained = train_pipeline_fscd(
        tmp_path, config="pipeline", rows=12_000, epochs=3, cost_budget=1.0
    )
    assert trained.provenance["train_processes"] == 1
    table = fscd_compile_table(
        tmp_path,
        sizes=(50,),
        shapes=(1, 3, 17, 200),
        config="pipeline",  # the deployed network's width: wide enough for bf16 GEMMs
        rows=12_000,
        trained=trained,
        variants=("eager_rows", "eager", "cascade", "cascade_rowwise", "cascade_bf16"),
        rounds=1,
        repeats=2,
        fast_build=True,
    )
    entry = table["sizes"]["1x50"]
    assert entry["eager_ms"] > 0 and entry["cascade_ms"] > 0 and entry["eager_rows_ms"] > 0
    assert entry["speedup_vs_eager"] == pytest.approx(entry["eager_ms"] / entry["cascade_ms"])
    # Exact compilation: the ranking does not move; one package serves every candidate count.
    assert (
        abs(table["auc_delta"]["cascade"]) < 1e-6 and abs(table["auc_delta"]["eager_rows"]) < 1e-6
    )
    # The row-wise request's package scores alike (the request path collapses what it
    # computes per candidate) and is timed beside it.
    assert abs(table["auc_delta"]["cascade_rowwise"]) < 1e-6
    assert entry["speedup_vs_cascade_rowwise"] == pytest.approx(
        entry["cascade_rowwise_ms"] / entry["cascade_ms"]
    )
    assert table["recompiles"]["cascade"]["shapes_served"] == 4
    assert table["recompiles"]["cascade"]["recompiles"] == 0
    # The network is the pipeline's train step's, by config name, with its rows' digest.
    provenance = table["model_provenance"]
    assert provenance["config"] == "pipeline" and provenance["training_rows"] == 12_000
    assert provenance["training_rows_digest"].startswith("sha256:")
    assert table["model_digest"].startswith("sha256:") and table["fields"] == provenance["fields"]
    # The bf16 package moves the ranking by rounding only, and says which layers it converted.
    assert abs(table["auc_delta"]["cascade_bf16"]) < 0.01
    assert entry["bf16_speedup_vs_eager"] == pytest.approx(
        entry["eager_ms"] / entry["cascade_bf16_ms"]
    )
    assert table["bf16_gemm"]["bf16_layers"] >= 1
    assert table["shapes_tried"] == 4 and table["requests"] > 10
    assert 0.5 < table["eager_auc"] <= 1.0
    assert table["passes"]["share_broadcast_computation"]["fired"] >= 0


def test_headline_table_puts_the_deployed_network_on_top() -> None:
    from benchmarks.compiled_inference import headline_table

    sizes = {
        "1x1000": {"eager_ms": 0.3, "cascade_ms": 0.1, "speedup_vs_eager": 3.0},
        "1x10000": {"eager_ms": 3.0, "cascade_ms": 0.75, "speedup_vs_eager": 4.0},
    }
    fscd = {
        "sizes": sizes,
        "auc_delta": {"cascade": 0.0, "cascade_bf16": 2e-5},
        "recompiles": {"cascade": {"compiles": 1, "recompiles": 0, "shapes_served": 21}},
        "shapes_tried": 21,
        "compile_s": {"cascade": 6.0},
        "passes": {"fuse_memory_bound_chains": {"fired": 1}},
    }
    mlp = {"threads": 1, "eager_ms": 2.0, "sizes": {}}
    table = headline_table(fscd, mlp=mlp)
    # The keys come from the largest size of the deployed network, not the MLP's.
    assert table["network"] == "fscd" and table["eager_ms"] == 3.0
    assert table["speedup_vs_eager"] == 4.0 and table["cascade_ms"] == 0.75
    assert table["auc_delta"] == 0.0 and table["bf16_auc_delta"] == 2e-5
    assert table["auc_deltas"] == fscd["auc_delta"] and table["mlp"] is mlp
    for key in ("recompiles", "shapes_tried", "compile_s", "passes", "sizes"):
        assert table[key] == fscd[key]


class TinyRequest(torch.nn.Module):
    """One user's features and N candidates' in, N logits out: a request module in miniature."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = torch.nn.Linear(8, 32)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, user: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(candidates + user))).squeeze(-1)


def tiny_inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(n)
    return torch.randn(1, 8, generator=generator), torch.randn(n, 8, generator=generator)


def tiny_peers(
    module: torch.nn.Module, work: Path, names: tuple[str, ...], **options: Any
) -> dict[str, Any]:
    """:func:`build_peers` of the tiny request module (dynamic candidate count)."""
    from torch.export import Dim

    return build_peers(
        module,
        tiny_inputs(16),
        work,
        names=names,
        shapes=[tiny_inputs(n) for n in (1, 50)],
        dynamic_shapes=(None, {0: Dim("n", min=1, max=4096)}),
        input_names=("user", "candidates"),
        **options,
    )


def test_every_peer_runs_agrees_with_eager_and_is_timed(tmp_path: Path) -> None:
    from torch.export import Dim

    module = TinyRequest().eval()
    shapes = [tiny_inputs(n) for n in (1, 2, 3, 50)]
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        peers = build_peers(
            module,
            tiny_inputs(16),
            tmp_path,
            names=("inductor", "inductor_tuned", "onnxruntime", "onnxruntime_int8", "eager_int8"),
            shapes=shapes,
            dynamic_shapes=(None, {0: Dim("n", min=1, max=4096)}),
            input_names=("user", "candidates"),
        )
        fns: dict[str, Callable[..., Any]] = {"eager": module}
        fns.update({name: peer.fn for name, peer in peers.items()})
        entries = {}
        for n in (16, 200):
            inputs = tiny_inputs(n)
            with torch.no_grad():
                reference = module(*inputs)
                # fp32 peers agree with eager (this raises otherwise); int8 ones come close.
                agree_with_eager(fns, reference, inputs, what=f"1x{n}")
                for name in ("onnxruntime_int8", "eager_int8"):
                    got = torch.as_tensor(fns[name](*inputs)).reshape(-1)
                    assert torch.allclose(got, reference, atol=0.1), name
            entries[n] = timed_entry(fns, inputs, rounds=2, repeats=2, headline="eager")
    for entry in entries.values():
        for name in fns:
            assert entry[f"{name}_ms"] > 0 and len(entry[f"{name}_ms_runs"]) == 2
        for peer in ("inductor", "inductor_tuned", "onnxruntime"):
            assert entry[f"speedup_vs_{peer}"] == pytest.approx(
                entry[f"{peer}_ms"] / entry["eager_ms"]
            )
    assert not non_finite(entries)
    # Recompiles are Dynamo's graph count over the shapes, measured per variant.
    for name in ("inductor", "inductor_tuned"):
        counts = peers[name].recompiles
        assert counts is not None and counts["shapes"] == 4 and counts["compiles"] >= 1
        assert counts["recompiles"] == counts["compiles"] - 1
    report = peer_report(peers)
    assert report["inductor_tuned_options"]["options"] == {"freezing": True, "cpp_wrapper": True}
    # Both quantizers really made int8 operators.
    assert report["onnxruntime_int8_quantization"]["int8_nodes"] >= 2
    assert report["eager_int8_quantization"]["int8_layers"] == 2


def test_speedups_divide_fp32_peers_by_the_fp32_package_and_int8_by_int8() -> None:
    ms = {
        "eager": 8.0,
        "inductor": 4.0,
        "inductor_tuned": 3.0,
        "onnxruntime": 6.0,
        "cascade": 2.0,
        "cascade_int8": 1.0,
        "onnxruntime_int8": 5.0,
        "eager_int8": 7.0,
    }
    ratios = speedups(ms)
    assert ratios["speedup_vs_eager"] == 4.0 and ratios["speedup_vs_inductor"] == 2.0
    assert ratios["speedup_vs_inductor_tuned"] == 1.5 and ratios["speedup_vs_onnxruntime"] == 3.0
    assert ratios["int8_speedup_vs_onnxruntime_int8"] == 5.0
    assert ratios["int8_speedup_vs_eager_int8"] == 7.0
    assert "speedup_vs_onnxruntime_int8" not in ratios and "speedup_vs_cascade" not in ratios
    # The headline: each package against the fastest peer of its precision.
    assert ratios["best_fp32_peer"] == "inductor_tuned"
    assert ratios["speedup_vs_best_fp32_peer"] == 1.5
    assert ratios["best_int8_peer"] == "onnxruntime_int8"
    assert ratios["speedup_vs_best_int8_peer"] == 5.0
    faster = speedups(ms | {"onnxruntime_static_int8": 0.8, "inductor_pt2e_int8": 0.9})
    assert faster["best_int8_peer"] == "onnxruntime_static_int8"
    assert faster["speedup_vs_best_int8_peer"] == pytest.approx(0.8)  # below 1: the peer wins
    assert faster["int8_speedup_vs_inductor_pt2e_int8"] == pytest.approx(0.9)
    no_int8 = speedups({"eager": 8.0, "cascade": 2.0})
    assert "best_int8_peer" not in no_int8 and no_int8["best_fp32_peer"] == "eager"


def test_the_int8_headline_comes_from_the_network_with_an_int8_package() -> None:
    from benchmarks.compiled_inference import headline_table

    fscd = {"sizes": {"1x10": {"cascade_ms": 1.0, "best_fp32_peer": "onnxruntime"}}}
    fscd |= {"auc_delta": {}}
    mlp = {"speedup_vs_best_int8_peer": 1.2, "best_int8_peer": "inductor_pt2e_int8"}
    mlp |= {"peers_failed": {"onnxruntime_static_int8": "ImportError: x"}}
    table = headline_table(fscd, mlp=mlp)
    assert table["best_fp32_peer"] == "onnxruntime"
    assert (table["best_int8_peer"], table["speedup_vs_best_int8_peer"]) == (
        "inductor_pt2e_int8",
        1.2,
    )
    assert table["int8_network"].startswith("mlp")
    assert table["peers_failed"] == {"onnxruntime_static_int8": "ImportError: x"}


@pytest.mark.slow  # an export, a calibration and an Inductor compile of a tiny module
def test_static_int8_peers_calibrate_and_come_close_or_say_why_they_did_not_build(
    tmp_path: Path,
) -> None:
    module = TinyRequest().eval()
    failed: dict[str, str] = {}
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        peers = tiny_peers(
            module,
            tmp_path,
            ("onnxruntime_static_int8", "inductor_pt2e_int8"),
            calibration_inputs=[tiny_inputs(n) for n in range(32, 40)],
            failed=failed,
        )
        inputs = tiny_inputs(200)
        with torch.no_grad():
            reference = module(*inputs)
            for name, peer in peers.items():
                got = torch.as_tensor(peer.fn(*inputs)).reshape(-1)
                # Static ranges, 7-bit activations on CPUs without VNNI: close, and the same order.
                assert (got - reference).abs().max() < 0.3, name
                assert torch.corrcoef(torch.stack([got, reference]))[0, 1] > 0.9, name
            # Column-major inputs recompile outside the warmed graphs: under its scope a peer
            # still scores them (PT2E's int8 prepacking lowers only with freezing set).
            columns = tuple(t.t().contiguous().t() if t.dim() == 2 else t for t in inputs)
            for name, peer in peers.items():
                with peer.scope():
                    got = torch.as_tensor(peer.fn(*columns)).reshape(-1)
                assert torch.allclose(got, torch.as_tensor(peer.fn(*inputs)).reshape(-1)), name
    # Every static peer either built (and really quantized) or says why it did not.
    assert set(peers) | set(failed) == {"onnxruntime_static_int8", "inductor_pt2e_int8"}
    report = peer_report(peers)
    if "onnxruntime_static_int8" in peers:
        quantization = report["onnxruntime_static_int8_quantization"]
        assert quantization["per_channel"] and quantization["int8_nodes"] >= 2
    if "inductor_pt2e_int8" in peers:
        assert report["inductor_pt2e_int8_quantization"]["int8_nodes"] >= 2
    else:
        assert "torchao" in failed["inductor_pt2e_int8"]


def test_recompiles_count_the_packages_loaded_to_serve_every_shape() -> None:
    loads: list[int] = []

    def static_package() -> Callable[[torch.Tensor], torch.Tensor]:
        """A package for one candidate count: the first it sees."""
        fixed: list[int] = []

        def run(x: torch.Tensor) -> torch.Tensor:
            fixed.append(fixed[0] if fixed else len(x))
            if len(x) != fixed[0]:
                raise RuntimeError(f"compiled for {fixed[0]} rows, got {len(x)}")
            return x

        loads.append(1)
        return run

    shapes = [(torch.zeros(n),) for n in (1, 2, 2, 5)]
    _, counts = served_shapes(static_package, shapes)
    assert counts == {"compiles": 3, "recompiles": 2, "shapes_served": 3, "shapes": 4}
    assert len(loads) == 3
    _, counts = served_shapes(lambda: lambda x: x, shapes)
    assert counts == {"compiles": 1, "recompiles": 0, "shapes_served": 3, "shapes": 4}

    def refuses(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no shape")

    with pytest.raises(RuntimeError, match="no shape"):
        served_shapes(lambda: refuses, shapes)


def test_compile_asr_takes_a_model_dir_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.compiled_inference import asr_model_source

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    assert OPTIONS["compilers"]["model-dir"] == "CASCADE_BENCH_ASR_MODEL"
    missing = tmp_path / "no-model"
    with pytest.raises(ValueError, match=r"--model-dir .*no-model: no asr_model.pt"):
        run_benchmark(
            "compile",
            tmp_path / "out.json",
            quick=True,
            options={"model": "asr", "model-dir": str(missing)},
        )
    model = tmp_path / "model"
    model.mkdir()
    (model / "asr_model.pt").write_bytes(b"")
    monkeypatch.setenv("CASCADE_BENCH_ASR_MODEL", str(model))
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)
    assert asr_model_source() == f"--model-dir {model}"
    # Neither a model nor espeak-ng to make a corpus and train one: say what to give.
    monkeypatch.delenv("CASCADE_BENCH_ASR_MODEL")
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="espeak-ng is not installed.*--model-dir DIR"):
        asr_model_source()


@pytest.mark.slow  # three Inductor compiles of a tiny module
def test_tuned_inductor_is_the_fastest_of_its_candidates_on_the_trial(tmp_path: Path) -> None:
    from benchmarks.compile_peers import TUNED_CANDIDATES

    module = TinyRequest().eval()
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        peers = tiny_peers(
            module, tmp_path, ("inductor", "inductor_tuned"), trial_inputs=tiny_inputs(500)
        )
        inputs = tiny_inputs(200)
        with torch.no_grad():
            agree_with_eager(
                {"inductor_tuned": peers["inductor_tuned"].fn},
                module(*inputs),
                inputs,
                what="1x200",
            )
    info = peer_report(peers)["inductor_tuned_options"]
    # Inductor's defaults are a candidate (the default peer reused), so tuned is never slower.
    assert set(info["trial_ms"]) | set(info["failed"]) == set(TUNED_CANDIDATES)
    assert info["chose"] == min(info["trial_ms"], key=info["trial_ms"].__getitem__)
    assert info["options"] == TUNED_CANDIDATES[info["chose"]]
