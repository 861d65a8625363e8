"""The ASR benchmark's parts: sizes, the replicated landing, interleaved RTF, the model source
and training config, and a ``--quick`` smoke run (debug config, 40 utterances, one training
process, no compile)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import registry as bench
from benchmarks.asr_model import obtain_model, spoken_duration, training_config_name
from benchmarks.asr_path import REPEAT_SUFFIX, bench_sizes, real_time_factors, replicate_landing
from benchmarks.provenance import non_finite
from cascade.config import load_settings


def test_sizes_default_to_10k_and_100k_and_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CASCADE_BENCH_ASR_SIZES", raising=False)
    assert bench_sizes(quick=False) == (10_000, 100_000)
    monkeypatch.setenv("CASCADE_BENCH_ASR_SIZES", "500,50")
    assert bench_sizes(quick=False) == (50, 500)
    monkeypatch.setenv("CASCADE_BENCH_ASR_SIZES", "0")
    with pytest.raises(ValueError, match="CASCADE_BENCH_ASR_SIZES must be >= 1"):
        bench_sizes(quick=False)
    assert bench.BENCHMARKS["asr"] == "benchmarks.asr_path:run"
    assert bench.OPTIONS["asr"]["sizes"] == "CASCADE_BENCH_ASR_SIZES"


def test_replicated_landing_has_the_size_with_fresh_ids(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "wav").mkdir(parents=True)
    rows = []
    for name in ("a", "b"):
        (source / "wav" / f"{name}.wav").write_bytes(name.encode())
        rows.append(json.dumps({"utterance_id": name, "text": name, "voice": "v"}))
    (source / "transcripts.jsonl").write_text("\n".join(rows) + "\n")
    assert replicate_landing(source, tmp_path / "five", 5) == 5
    ids = [
        json.loads(line)["utterance_id"]
        for line in (tmp_path / "five" / "transcripts.jsonl").read_text().splitlines()
    ]
    assert ids[:2] == ["a", "b"] and len(set(ids)) == 5
    assert all(re.search(REPEAT_SUFFIX, i) for i in ids[2:])
    assert (tmp_path / "five" / "wav" / f"{ids[4]}.wav").read_bytes() == b"a"


def test_real_time_factor_is_compute_over_audio_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from compilers import timing as clocks

    # A clock that moves only when a variant computes: the figures do not depend on the load.
    clock = [0.0]
    monkeypatch.setattr(clocks, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def slow(seconds: float) -> None:
        clock[0] += seconds * 0.01

    timings = real_time_factors(
        {"slow": slow, "fast": lambda _: None},
        [(1.0, 1.0), (2.0, 2.0)],
        rounds=3,
        repeats=1,
    )
    assert timings["slow"]["rtf"] == pytest.approx(0.01)
    for timing in timings.values():  # the figure is the median round: within its runs
        assert len(timing["rtf_runs"]) == 3
        assert timing["rtf"] == sorted(timing["rtf_runs"])[1]
    assert timings["fast"]["rtf"] == 0
    assert set(timings["slow"]["per_length"]) == {"1s", "2s"}


def test_a_given_model_folder_or_training_output_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CASCADE_BENCH_ASR_MODEL", str(tmp_path))
    assert obtain_model(None, tmp_path, tmp_path)[:2] == (tmp_path, tmp_path)  # type: ignore[arg-type]
    # A training's output folder: its fp32 model and its quantization-aware int8 one.
    for kind in ("fp32", "int8"):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "asr_model.pt").write_bytes(b"")
    (tmp_path / "result.json").write_text(json.dumps({"config": "synthetic", "run_id": "r1"}))
    fp32, int8, provenance = obtain_model(None, tmp_path, tmp_path)  # type: ignore[arg-type]
    assert (fp32, int8) == (tmp_path / "fp32", tmp_path / "int8")
    # What the training wrote beside the given model travels with it.
    assert provenance["source"] == "given" and provenance["training"]["config"] == "synthetic"
    assert provenance["training"]["result"] == str(tmp_path / "result.json")


def test_training_config_is_fast_with_quick_people_else_and_unknown_names_fail_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from models.asr.config_registry import CONFIGS

    monkeypatch.delenv("CASCADE_BENCH_ASR_CONFIG", raising=False)
    assert training_config_name(quick=False) == "people"
    if "fast" in CONFIGS:
        assert training_config_name(quick=True) == "fast"
    else:  # until the config exists, --quick says so rather than training something else
        with pytest.raises(ValueError, match=r"unknown ASR training config 'fast' \(the default"):
            training_config_name(quick=True)
    monkeypatch.setenv("CASCADE_BENCH_ASR_CONFIG", "debug")
    assert training_config_name(quick=True) == training_config_name(quick=False) == "debug"
    monkeypatch.setenv("CASCADE_BENCH_ASR_CONFIG", "nope")
    with pytest.raises(ValueError, match="'nope' \\(CASCADE_BENCH_ASR_CONFIG\\).*debug"):
        training_config_name(quick=True)
    monkeypatch.setenv("CASCADE_BENCH_ASR_SKIP", "compile,people")
    assert load_settings().bench.asr_skip == ("compile", "people")
    assert [spoken_duration(s) for s in (42, 750, 2.7 * 3600)] == ["42 s", "12.5 min", "2.7 h"]
    monkeypatch.setenv("CASCADE_BENCH_ASR_SKIP", "training")
    with pytest.raises(ValueError, match="CASCADE_BENCH_ASR_SKIP"):
        load_settings()


def test_error_rates_decode_each_language_and_no_people_is_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np
    import pandas as pd

    from benchmarks.asr_path import cer_by_language, error_rates, people_corpus
    from tests.asr_models import tiny_artifact

    artifact = tiny_artifact(quantized=False)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "transcript": ["good day", "你好", "hi"],
            "language": ["en-us", "cmn", "en"],
            "x": [(rng.standard_normal((60, 40)) * 2 - 4).astype(np.float32) for _ in range(3)],
        }
    )
    rates = error_rates(artifact.model, artifact.alphabet, frame)
    assert rates["utterances"] == 3 and rates["foreign_tokens"] == 0
    assert rates["foreign_tokens_unrestricted"] > 0  # the untrained output layer mixes scripts
    by_language = cer_by_language(rates)
    assert set(by_language) == {"english", "mandarin"}
    assert all(0 < v for v in by_language.values())
    monkeypatch.setattr("jobs.speech_human.STAMPS_ROOT", tmp_path / "no-stamps")
    corpus, reason = people_corpus(None, tmp_path)
    assert corpus is None and reason is not None and "no people corpus" in reason


def test_compile_keys_divide_fp32_peers_by_the_fp32_package_and_int8_by_int8() -> None:
    from benchmarks.asr_path import compile_bench_keys

    def timed(ms: float) -> dict[str, Any]:
        return {"per_length": {"20s": {"ms": ms, "ms_runs": [ms, ms]}}}

    timings = {
        "eager": timed(40.0),
        "inductor": timed(30.0),
        "inductor_tuned": timed(25.0),
        "onnxruntime": timed(20.0),
        "fp32_artifact": timed(10.0),
        "int8": timed(5.0),
        "onnxruntime_int8": timed(15.0),
        "eager_int8": timed(35.0),
    }
    keys = compile_bench_keys(timings)
    # cascade is the fp32 package: the headline ratios are fp32 against fp32.
    assert keys["cascade_ms"] == keys["cascade_fp32_ms"] == 10.0 and keys["cascade_int8_ms"] == 5.0
    assert keys["speedup_vs_eager"] == 4.0 and keys["speedup_vs_inductor"] == 3.0
    assert keys["speedup_vs_inductor_tuned"] == 2.5 and keys["speedup_vs_onnxruntime"] == 2.0
    # int8 against int8.
    assert keys["int8_speedup_vs_onnxruntime_int8"] == 3.0
    assert keys["int8_speedup_vs_eager_int8"] == 7.0
    assert keys["onnxruntime_int8_ms_runs"] == [15.0, 15.0]


def test_asr_int8_peers_serve_every_length_close_to_eager(
    tmp_path: Path, compiled_asr_dir: Path
) -> None:
    """ONNX Runtime's quantization of the ONNX file ``compile_asr`` wrote (the session's tiny
    model, built once for the compiler and serving tests) and PyTorch's eager int8."""
    import torch

    from benchmarks.asr_path import asr_peers
    from models.asr.artifact import load_artifact
    from models.asr.compiled import MIN_FRAMES, ONNX_FILE

    artifact = load_artifact(compiled_asr_dir)
    # A copy (the file and its external weights): the quantized file is written beside it.
    for source in compiled_asr_dir.glob(f"{ONNX_FILE}*"):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    onnx_file = tmp_path / ONNX_FILE
    shapes = [(torch.randn(1, frames, artifact.n_mels) - 6,) for frames in (MIN_FRAMES, 90, 400)]
    peers, report = asr_peers(
        artifact.model,
        artifact.n_mels,
        onnx_file,
        tmp_path,
        shapes=shapes,
        threads=1,
        trial=False,
        names=("onnxruntime_int8", "eager_int8"),
    )
    assert set(peers) == {"onnxruntime_int8", "eager_int8"}
    assert report["onnxruntime_int8_quantization"]["int8_nodes"] > 0
    assert report["eager_int8_quantization"]["int8_layers"] > 0
    with torch.no_grad():
        for (x,) in shapes:
            reference = artifact.model(x)
            for name, forward in peers.items():
                got = torch.as_tensor(forward(x))
                assert got.shape == reference.shape, name
                # int8: close to the float model, not equal to it.
                assert (got - reference).abs().mean() < 0.1 * reference.abs().mean(), name


SMOKE_KEYS = (
    "sizes", "utterances_per_s", "model", "model_digest", "model_provenance", "train_s",
    "train_estimate_s", "train_config", "training_corpus", "compile_s", "recompiles",
    "shapes_tried", "cer_fp32", "wer_fp32", "cer_int8", "wer_int8", "cer_delta",
    "test_utterances", "cer_people_fp32", "people_reason", "cer_by_language", "foreign_tokens",
    "rtf", "rtf_eager", "rtf_int8", "rtf_onnxruntime", "rtf_inductor", "eager_ms", "cascade_ms",
    "speedup_vs_eager", "speedup_vs_inductor", "speedup_vs_onnxruntime", "skipped", "git_commit",
    "input_digest", "machine", "repeats", "spread", "cer_seen_speakers",
    "cer_unseen_speakers_by_language", "human_train_minutes_by_language", "pocketsphinx_cer_en",
    "cer_en", "rtf_pocketsphinx_en", "rtf_en_end_to_end", "rtf_int8_end_to_end",
    "cer_by_language_detected", "cer_by_language_oracle", "language_id_accuracy",
    "cer_fp32_detected", "language_id_accuracy_by_draw", "language_id_accuracy_by_part",
)  # fmt: skip
RECORDING_PACKAGES = {
    "asterisk_en": "/usr/share/asterisk/sounds/en_US_f_Allison",
    "fillets_cs": "/usr/share/games/fillets-ng/sound/airplane/cs",
    "fillets_nl": "/usr/share/games/fillets-ng/sound/airplane/nl",
}
RECORDINGS_INSTALLED = all(Path(p).exists() for p in RECORDING_PACKAGES.values())


def test_quick_run_trains_with_provenance_and_writes_finite_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cascade bench asr --quick`` end to end, shrunk: 40 utterances and 12 clips of each
    recorded-speech source, the debug config in one training process, no
    AOTInductor/ONNX/Inductor builds or Tux Paint corpus (named in ``skipped``); no stack (an
    MLflow address where nothing listens)."""
    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CASCADE_MLFLOW_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("CASCADE_TRAIN_PROCESSES", "1")
    monkeypatch.setenv("CASCADE_BENCH_ASR_CONFIG", "debug")
    monkeypatch.setenv("CASCADE_BENCH_ASR_SIZES", "40")
    monkeypatch.setenv("CASCADE_BENCH_ASR_CLIPS", "12")
    monkeypatch.setenv("CASCADE_BENCH_ASR_SKIP", "compile,people")
    monkeypatch.setenv("CASCADE_BENCH_REPEATS", "1")  # one variant (eager): nothing to rotate
    monkeypatch.delenv("CASCADE_BENCH_ASR_MODEL", raising=False)
    out = tmp_path / "asr.json"
    bench.run_benchmark("asr", out, quick=True)
    result = json.loads(out.read_text())
    assert not set(SMOKE_KEYS) - set(result), set(SMOKE_KEYS) - set(result)
    assert non_finite(result) == []
    assert set(result["skipped"]) == {"compile", "people"}
    assert result["cer_int8"] is None and result["speedup_vs_inductor"] is None
    assert result["people_reason"].startswith("skipped")
    assert result["utterances_per_s"] > 0 and result["rtf_eager"] > 0
    assert 0 <= result["cer_fp32"] and result["test_utterances"] > 0
    # The trained model carries its languages' n-grams: the headline is theirs, greedy beside.
    assert result["decoding"] == "n-gram beam search" and 0 <= result["cer_fp32_greedy"]
    provenance = result["model_provenance"]
    assert provenance["source"] == "trained" and provenance["config"] == "debug"
    assert provenance["train_s"] > 0 and result["train_estimate_s"] > 0
    corpus = result["training_corpus"]
    # The synthetic utterances and the recordings' training part.
    added = (corpus["recordings"] or {}).get("train_utterances", 0)
    assert corpus["utterances"] == 40 + added and sum(corpus["splits"].values()) == 40 + added
    assert corpus["digest"] == provenance["corpus_digest"] and corpus["digest"].startswith("sha256")
    assert result["model_digest"].startswith("sha256:")
    assert result["rounds"] == 1 and result["spread"]["rtf_eager"]["n"] == 1
    # The English peer: PocketSphinx and the model on the same clips, WAV bytes in.
    assert result["en_utterances"] > 0 and result["en_model_variant"].startswith("eager")
    assert 0 < result["pocketsphinx_cer_en"] and 0 <= result["cer_en"]
    assert result["rtf_pocketsphinx_en"] > 0 and result["rtf_en_end_to_end"] > 0
    # Language without an oracle: detected on every test utterance, CER beside the label's.
    assert 0 <= result["language_id_accuracy"] <= 1 and result["language_id_utterances"] > 0
    assert set(result["cer_by_language_detected"]) == set(result["cer_by_language_oracle"])
    assert "english" in result["language_id"]["languages"]
    # The model training wrote carries its identifier, which decodes; one fit a draw seed
    # beside it.
    assert result["language_id"]["source"] == "model"
    by_draw = result["language_id_accuracy_by_draw"]
    assert len(by_draw) == len(result["language_id"]["draw_seeds"]) > 1
    assert all(0 <= accuracy <= 1 for accuracy in by_draw)
    by_part = result["language_id_accuracy_by_part"]
    assert set(by_part) <= set(result["language_id"]["parts"]) and "synthetic" in by_part
    if not RECORDINGS_INSTALLED:
        if not any(Path(p).exists() for p in RECORDING_PACKAGES.values()):
            assert result["recordings_reason"].startswith("no recordings")
        return
    recordings = result["recordings"]
    assert set(recordings["sources"]) == {"asterisk_en", "fillets_cs", "fillets_nl"}
    assert all(counts["utterances"] == 12 for counts in recordings["sources"].values())
    # The recordings' training part is in the training corpus, and the debug config uses it.
    assert result["human_trained"] is True
    assert corpus["recordings"]["train_utterances"] == recordings["parts"]["train"] > 0
    minutes = result["human_train_minutes_by_language"]
    assert set(minutes) == {"english", "cs", "dutch"} and all(m > 0 for m in minutes.values())
    assert result["cer_seen_speakers"] is not None and result["seen_speakers_utterances"] > 0
    unseen = result["cer_unseen_speakers_by_language"]
    assert unseen["english"]["cer"] is None and "one speaker" in unseen["english"]["reason"]
    assert unseen["cs"]["train_minutes"] == minutes["cs"] and unseen["cs"]["train_speakers"] >= 1
    assert "recordings_test_seen" in result["en_by_source"]
    assert "cs" in result["language_id"]["languages"] and "cs" in result["cer_by_language_detected"]
