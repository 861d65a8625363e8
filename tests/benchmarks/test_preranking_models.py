"""``cascade bench preranking --quick``: the benchmark runs end to end and reports sane numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.registry import BENCHMARKS, run_benchmark
from models.preranking.fields import FieldEncoder


def test_quick_preranking_benchmark_writes_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert BENCHMARKS["preranking"] == "benchmarks.preranking_models:run"
    out = tmp_path / "preranking.json"
    result = run_benchmark("preranking", out, quick=True)
    assert json.loads(out.read_text())["benchmark"] == "preranking"
    assert result["config"] == "debug" and result["machine"]["cpus"] >= 1
    assert result["torch_samples_per_s"] > 0 and result["deepspeed_samples_per_s_1proc"] > 0
    assert result["ds_vs_torch_throughput"] == pytest.approx(
        result["deepspeed_samples_per_s_1proc"] / result["torch_samples_per_s"]
    )
    assert result["ds_vs_torch_cpu_time"] > 0
    assert result["throughput_setup"]["zero_stage"] == 0  # the debug config's stage
    assert 0 < result["score_1000_ms"] < 1_000
    assert result["score_1000_shared_speedup"] > 0
    # No cascade trained: the model is the scored network, and its provenance says so.
    provenance = result["model_provenance"]
    assert result["model_digest"] == provenance["scoring_model_digest"]
    assert result["model_digest"].startswith("sha256:") and provenance["config"] == "debug"
    assert provenance["source"].startswith("initialized")
    assert provenance["config_values"]["name"] == "debug" and provenance["rows"] > 0
    assert provenance["rows_digest"].startswith("sha256:")
    assert "cross_lift" not in result  # only with --config generated
    assert result["kept_trainings"]["dir"] is None  # no --keep: nothing kept
    # The measured cost beside the field-weight sum: one request timed on each model.
    assert result["latency_ratio_fscd_vs_teacher"] == pytest.approx(
        result["fscd_request_ms"] / result["teacher_request_ms"]
    )
    assert result["request_latency_setup"]["candidates"] == 1_000


def test_seeds_are_summarized_by_median_with_spread_and_goal_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks.preranking_models import HEADLINE, SEEDS_ENV, bench_seeds, summarize_seeds

    monkeypatch.setenv(SEEDS_ENV, "0, 2,5")
    assert bench_seeds() == [0, 2, 5]
    monkeypatch.setenv(SEEDS_ENV, "zero")
    with pytest.raises(ValueError, match=f"{SEEDS_ENV} must be an integer"):
        bench_seeds()

    def run(seed: int, fscd: float, two_tower: float, cost: float) -> dict[str, object]:
        base = {key: 0.5 for key in HEADLINE}
        return {
            **base,
            "seed": seed,
            "fscd_auc": fscd,
            "two_tower_auc": two_tower,
            "teacher_auc": 0.72,
            "auc_ratio": fscd / 0.72,
            "cost_ratio": cost,
            "fscd_fields": [f"f{seed}"],
            "config": "ml100k",
        }

    summary = summarize_seeds(
        [run(0, 0.714, 0.709, 0.35), run(1, 0.700, 0.705, 0.40), run(2, 0.710, 0.708, 0.55)]
    )
    assert summary["fscd_auc"] == pytest.approx(0.710)
    assert (summary["fscd_auc_min"], summary["fscd_auc_max"]) == (0.700, 0.714)
    assert summary["fscd_fields"] == ["f2"]  # the run with the median FSCD AUC
    assert summary["cost_ratio"] == pytest.approx(0.40) and summary["cost_ratio_max"] == 0.55
    assert summary["goals_held"] == {
        "auc_ratio_ge_0.98": 2,
        "cost_ratio_le_0.5": 2,
        "feature_cost_ratio_le_0.5": 2,
        "fscd_beats_two_tower": 2,
        "of": 3,
    }
    # The field-weight sum under its own name, the same figure as cost_ratio.
    assert (summary["feature_cost_ratio"], summary["feature_cost_ratio_max"]) == (0.40, 0.55)
    assert summary["fscd_margin_over_two_tower"] == pytest.approx([0.005, -0.005, 0.002])
    assert [row["seed"] for row in summary["per_seed"]] == [0, 1, 2] and "config" not in summary


def test_training_logs_to_a_private_store_when_the_stack_is_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks.preranking_models import tracking_settings
    from cascade.ports import free_port

    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"http://127.0.0.1:{free_port()}")
    settings = tracking_settings(tmp_path / "run")
    assert settings.tracking_uri == f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}"
    monkeypatch.setenv("CASCADE_MLFLOW_URI", f"sqlite:///{tmp_path / 'own.db'}")
    assert tracking_settings(tmp_path / "run").tracking_uri.endswith("own.db")


def test_trained_models_give_the_digest_and_each_seed_its_own(tmp_path: Path) -> None:
    from benchmarks.preranking_models import model_record, trained_models_digest

    runs = {}
    for seed in (0, 1):
        run_dir = tmp_path / f"seed{seed}"
        (run_dir / "phases" / "teacher").mkdir(parents=True)
        (run_dir / "phases" / "teacher" / "model.pt").write_bytes(b"weights %d" % seed)
        (run_dir / "fscd_model").mkdir()
        (run_dir / "fscd_model" / "model.pt").write_bytes(b"fscd")
        runs[seed] = trained_models_digest(run_dir)
    assert runs[0] != runs[1]
    with pytest.raises(FileNotFoundError, match="left none of"):
        trained_models_digest(tmp_path / "empty")

    result = {"per_seed": [{"seed": s, "model_digest": d} for s, d in runs.items()]}
    digest, provenance = model_record(
        result, "debug", rows_digest="sha256:rows", rows=10, scoring_digest="sha256:scoring"
    )
    assert provenance["source"] == "trained" and provenance["seeds"] == [0, 1]
    assert provenance["per_seed"] == {"0": runs[0], "1": runs[1]}
    assert provenance["rows_digest"] == "sha256:rows" and provenance["config"] == "debug"
    assert digest not in (runs[0], runs[1], "sha256:scoring")
    # One retrained seed changes the run's model digest.
    result["per_seed"][1]["model_digest"] = runs[0]
    assert (
        model_record(
            result, "debug", rows_digest="sha256:rows", rows=10, scoring_digest="sha256:scoring"
        )[0]
        != digest
    )


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.usefixtures("settings")  # a private state folder and MLflow store
def test_quick_cross_comparison_trains_with_and_without_the_engines_cross_fields(
    tmp_path: Path,
) -> None:
    from benchmarks.preranking_cross import QUICK, cross_comparison

    result = cross_comparison(tmp_path / "cross", [0], QUICK)

    for key in ("auc_with_cross", "auc_without_cross", "cross_lift"):
        assert math.isfinite(result[key]) and -1 < result[key] <= 1, key
    assert 0.5 < result["auc_with_cross"] and 0.5 < result["auc_without_cross"]
    assert result["cross_lift"] == pytest.approx(
        result["auc_with_cross"] - result["auc_without_cross"]
    )
    setup = result["cross_setup"]
    assert setup["seeds"] == [0] and setup["config"] == "debug_cross"
    assert setup["fields"] > setup["fields_without_cross"] >= 3
    assert setup["fields_by_kind"]["cross"] == setup["fields"] - setup["fields_without_cross"]
    fields = json.loads((tmp_path / "cross" / "training_set" / "fields.json").read_text())
    cross = {f["name"]: f for f in fields["fields"] if f["kind"] == "cross"}
    assert len(cross) == setup["fields_by_kind"]["cross"]
    assert all(f["key_cardinality"] >= 1 for f in cross.values())
    assert set(result["cross_fields_kept"]) <= set(cross)
    for key in (
        "learned_cross_rare_pair_spearman",
        "additive_rare_pair_spearman",
        "explicit_rare_pair_spearman",
        "blend_rare_pair_spearman",
    ):
        assert key in result and (result[key] is None or -1 <= result[key] <= 1)
    assert result["cross_lift_same_position"] == pytest.approx(
        result["auc_with_cross"] - result["auc_without_cross_same_position"]
    )
    assert result["cross_lift_servable"] == pytest.approx(
        result["auc_servable_cross"] - result["auc_without_cross"]
    )
    arms = setup["fields_by_arm"]
    assert arms["without_cross"] < arms["without_cross_same_position"] < arms["with_cross"]
    assert arms["without_cross"] < arms["servable_cross"] < arms["with_cross"]
    assert 0 < result["pipeline_config_auc_ratio"] and setup["planted"]
    assert isinstance(result["pipeline_config_goal_met"], bool)
    assert result["cross_rare_pairs"]["rare_pairs"] >= 0
    # The per-pair ablation (QUICK ablates user x genre only), on the first seed.
    ablation = result["cross_ablation"]
    assert ablation["seed"] == 0 and ablation["auc_with_cross"] == result["auc_with_cross"]
    assert set(result["cross_lift_by_pair"]) == {"user_cat"}
    assert result["cross_lift_by_pair"]["user_cat"] == pytest.approx(
        ablation["auc_with_cross"] - ablation["auc_without_pair"]["user_cat"]
    )
    # Its explicit statistics and its learned field go together.
    assert arms["with_cross"] - ablation["fields_by_arm"]["without_user_cat"] >= 2
    for key in ("input_digest", "rows_digest", "fields_digest", "model_digest"):
        assert result["cross_provenance"][key].startswith("sha256:"), key


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.usefixtures("settings")  # a private state folder
def test_movielens_goes_through_the_engine_with_only_the_pairs_it_can_key(tmp_path: Path) -> None:
    from benchmarks.preranking_cross import build_ml100k_training_set
    from models.preranking.fields import FieldSet

    built = build_ml100k_training_set(tmp_path / "ml100k", days=2)
    # ML-100k's last two days (1998-04-21, -22), each joined with the statistics before it.
    assert built["engine_days"] == ["1998-04-21", "1998-04-22"]
    assert built["rows"] == 656 and built["pairs"] == [
        "user", "item", "seg_cat", "user_cat", "seg_item"
    ]  # fmt: skip
    fields = FieldSet.load(Path(built["fields_file"]))
    cross = {spec.name for spec in fields if spec.kind == "cross"}
    assert cross and not any(name.startswith(("ctx_item", "item_pos")) for name in cross)
    # The learned cross fields of the pairs ML-100k has (user x genre, segment x item).
    assert {"user_cat_learned_ctr_30d", "seg_item_learned_ctr_30d"} <= cross


def test_every_goal_met_key_tests_the_stated_goal_of_a_figure_present() -> None:
    from benchmarks.preranking_models import GOALS, goals_met

    assert GOALS["auc_ratio"] == (">=", 0.98) and GOALS["feature_cost_ratio"] == ("<=", 0.5)
    got = goals_met(
        {
            "auc_ratio": 0.979,
            "feature_cost_ratio": 0.5,
            "pipeline_config_auc_ratio": 0.98,
            "cross_lift_same_position": 0.009,
            "latency_ratio_fscd_vs_teacher": True,  # not a figure: no key
        }
    )
    assert got == {
        "auc_ratio_goal_met": False,
        "feature_cost_ratio_goal_met": True,
        "pipeline_config_auc_ratio_goal_met": True,
        "cross_lift_same_position_goal_met": False,
    }


def test_request_latency_times_teacher_fscd_and_two_tower_on_one_request() -> None:
    from benchmarks.preranking_models import request_latency
    from models.preranking.config_registry import get_cascade_config
    from models.preranking.fscd_data import load_frame
    from models.preranking.training_set import time_split

    config = get_cascade_config("debug")
    frame = load_frame(config)
    encoder = FieldEncoder(bins=config.bins).fit(time_split(frame, 0.2)[0])
    kept = tuple(f.name for f in encoder.fields if f.kind != "cross")[:3]
    got = request_latency(kept, encoder, "debug", 64, rounds=1, repeats=1)

    for name in ("teacher", "fscd", "two_tower"):
        assert got[f"{name}_request_ms"] > 0 and got[f"{name}_request_flops"] > 0, name
    assert got["latency_ratio_fscd_vs_teacher"] == pytest.approx(
        got["fscd_request_ms"] / got["teacher_request_ms"]
    )
    # Three kept fields against every field: FSCD does fewer multiplies than the teacher.
    assert got["fscd_request_flops"] < got["teacher_request_flops"]
    assert got["request_latency_setup"]["candidates"] == 64
