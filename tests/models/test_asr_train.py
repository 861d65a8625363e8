"""ASR training: configs, corpus batches, and a real 2-process DeepSpeed run (fp32 then RSQ QAT)
that learns, writes both model files and its MLflow run, and resumes after a kill."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from cascade.config import Settings
from cascade.training.crash_points import CRASH_ENV
from domains.speech.audio_features import NORMALIZATION, CorpusConfig
from jobs.audio_corpus import process_one
from jobs.speech_synth import synthesize, utterance_spec, write_wav
from models.asr.artifact import load_artifact
from models.asr.config_registry import CONFIGS, AsrTrainConfig, get_config
from models.asr.corpus import SILENCE, Utterances, collate, epoch_batches, load_split
from models.asr.evaluate import error_report, int8_model
from models.asr.model import Alphabet
from models.asr.train import (
    RUN_MARKER,
    people_repeats,
    train_asr,
    trained_split,
    with_people_share,
)


def test_configs_are_complete_typed_and_validated() -> None:
    assert set(CONFIGS) == {"debug", "fast", "synthetic", "people"}
    debug, fast, real = get_config("debug"), get_config("fast"), get_config("synthetic")
    # The output layer is sized by training, from the alphabet fitted to its corpus.
    sized = debug.sized_for(Alphabet("abc ", normalization=NORMALIZATION))
    assert sized.model.vocab_size == 5 and sized.model.hidden == debug.model.hidden
    # fast sits between: more than debug's few steps, less compute than synthetic's.
    work = {
        c.name: c.fp32_steps * c.batch_size * c.model.hidden * c.model.blocks
        for c in (debug, fast, real)
    }
    assert work["debug"] < work["fast"] < work["synthetic"] / 2
    for config in (fast, real):
        assert AsrTrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert "augmentation.noise" in real.flat_params()
    assert real.flat_params()["model.blocks"] == "6" and real.levels == 127
    # The config for people: normalized per utterance, trained on people and synthesizers.
    people = get_config("people")
    assert people.model.cmvn and people.train_people and people.augmentation.speed > 0
    assert people.people_share > 0.5 and people.fp32_steps > real.fp32_steps
    assert not (real.model.cmvn or fast.model.cmvn)
    assert AsrTrainConfig.from_dict(json.loads(json.dumps(people.to_dict()))) == people
    with pytest.raises(dataclasses.FrozenInstanceError):
        real.lr = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown ASR config 'huge'"):
        get_config("huge")
    with pytest.raises(ValueError, match="distill_weight"):
        dataclasses.replace(debug, distill_weight=1.5)
    with pytest.raises(ValueError, match="qat_steps must be >= 1"):
        dataclasses.replace(debug, qat_steps=0)


def make_corpus(root: Path, count: int = 40, test_every: int = 5) -> Path:
    """A corpus in the job's layout from ``count`` synthesized utterances, without Spark: every
    ``test_every``-th utterance goes to the test split, the rest to train."""
    config = CorpusConfig()
    wav = root / "wav"
    rows = []
    for index in range(count):
        spec = utterance_spec(index, seed=7)
        pcm, rate = synthesize(spec)
        content = write_wav(wav / f"{spec.utterance_id}.wav", pcm, rate).read_bytes()
        transcript = {"text": spec.text, "language": spec.language, "voice": spec.voice}
        row = process_one(spec.utterance_id, content, transcript, config)
        assert row["reason"] is None, row["reason"]
        row["split"] = "test" if index % test_every == test_every - 1 else "train"
        rows.append(row)
    corpus = root / "corpus"
    frame = pd.DataFrame(rows).drop(columns=["reason"])
    for split, part in frame.groupby("split"):
        folder = corpus / "shards" / f"split={split}"
        folder.mkdir(parents=True)
        part.drop(columns=["split"]).to_parquet(folder / "part-0.parquet")
    (corpus / "summary.json").write_text(json.dumps({"config": dataclasses.asdict(config)}))
    return corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("asr"))


def test_batches_are_bucketed_padded_with_silence_and_reproducible(corpus: Path) -> None:
    data = load_split(corpus, "train", None)
    assert len(data) == 32 and data.ids == sorted(data.ids)
    alphabet = data.alphabet
    assert alphabet is not None and data.unseen_report()["unseen_characters"] == 0
    lengths = data.lengths
    batches = epoch_batches(lengths, batch_size=4, pool_batches=4, seed=0, epoch=3)
    assert sorted(np.concatenate(batches).tolist()) == list(range(32))
    again = epoch_batches(lengths, batch_size=4, pool_batches=4, seed=0, epoch=3)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    other = epoch_batches(lengths, batch_size=4, pool_batches=4, seed=0, epoch=4)
    assert any(not np.array_equal(a, b) for a, b in zip(batches, other, strict=True))
    # Bucketing: within a pool the batches hold neighbours in length, so padding stays small.
    spread = np.mean([np.ptp(lengths[b]) for b in batches])
    assert spread < np.ptp(lengths) / 2
    batch = collate(data, batches[0])
    short = int(batch.lengths.argmin())
    assert batch.features.shape == (4, int(batch.lengths.max()), 40)
    assert torch.all(batch.features[short, int(batch.lengths[short]) :] == SILENCE)
    assert (
        alphabet.decode(batch.targets[: int(batch.target_lengths[0])].tolist())
        == (data.texts[int(batches[0][0])])
    )
    augmented = collate(data, batches[0], np.random.default_rng(0))
    assert not torch.equal(augmented.features, batch.features)
    assert torch.equal(augmented.lengths, batch.lengths)


def test_error_report_breaks_down_by_language() -> None:
    report = error_report(
        ["turn left", "你好", "play music"],
        ["turn lift", "你好", "play"],
        ["en-us", "cmn", "en-gb"],
    )
    assert report["cer"] == pytest.approx((1 + 0 + 6) / (9 + 2 + 10))
    assert report["per_language"]["mandarin"]["cer"] == 0.0
    assert report["per_language"]["english"]["utterances"] == 2
    assert report["wer"] == pytest.approx(2 / 5)
    assert {"reference": "e", "hypothesis": "i", "count": 1} in report["top_confusions"]
    assert report["characters"]["deletions"] == 6 and report["sentence_error_rate"] == 2 / 3


def _weights(path: str) -> dict[str, torch.Tensor]:
    return load_artifact(Path(path)).model.state_dict()


@pytest.mark.slow
def test_two_process_debug_run_learns_writes_both_models_and_resumes_after_a_kill(
    settings: Settings,
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    result = train_asr(settings, "debug", corpus, out, echo=True)
    logged = capsys.readouterr().out
    assert "world=2" in logged and "[asr] qat step=8/8" in logged

    fp32, int8 = (
        load_artifact(Path(result["fp32_artifact"])),
        load_artifact(Path(result["int8_artifact"])),
    )
    assert fp32.quantization is None and fp32.meta["config"] == "debug"
    record = int8.quantization
    assert record is not None and record["bits"] == 8
    assert set(record["activation_ranges"]) == {
        name
        for name, m in int8.model.named_modules()
        if isinstance(m, torch.nn.Linear | torch.nn.Conv1d)
    }
    assert all(v > 0 for v in record["activation_ranges"].values())
    # QAT moved the weights away from the fp32 ones, and the int8 model runs.
    assert any(
        not torch.equal(a, b)
        for a, b in zip(
            _weights(result["fp32_artifact"]).values(),
            _weights(result["int8_artifact"]).values(),
            strict=True,
        )
    )
    # The output layer is the alphabet fitted from the training transcripts, stored with both.
    trained_on = load_split(corpus, "train", None).texts
    assert int8.alphabet.fitted and int8.alphabet == fp32.alphabet
    assert set(int8.alphabet.characters) == set("".join(trained_on)) | {" "}
    assert int8_model(int8)(torch.randn(1, 30, 40)).shape[-1] == len(int8.alphabet)
    # Both carry the n-grams of the training transcripts, one per language of the alphabet,
    # and the language identifier fitted on the fp32 model's output over the training split.
    for artifact in (fp32, int8):
        assert artifact.language_models is not None
        assert set(artifact.language_models.models) == set(artifact.alphabet.languages)
        identifier = artifact.language_identifier
        assert identifier is not None and identifier.uses_model
        assert identifier.languages == sorted(artifact.alphabet.languages)
    assert result["alphabet"]["size"] == len(int8.alphabet)
    assert result["unseen_characters_test"] == sum(result["unseen"]["test"].values())
    assert 0.0 <= result["cer_fp32"] <= 1.0 and 0.0 <= result["cer_int8"] <= 1.0

    client = mlflow.tracking.MlflowClient(tracking_uri=settings.tracking_uri)
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["zero_stage"] == "1" and run.data.params["model.blocks"] == "2"
    assert run.data.metrics["cer_int8"] == pytest.approx(result["cer_int8"])
    losses = client.get_metric_history(result["run_id"], "loss.fp32")
    assert len(losses) == 4 and losses[-1].value < 0.8 * losses[0].value
    assert client.get_metric_history(result["run_id"], "kl.qat")
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert {"confusions.json", "evaluation.json", "fp32", "int8", "result.json"} <= artifacts
    assert not (out / "checkpoints").exists() and not (out / RUN_MARKER).exists()

    # Killed after fp32 step 8 (last checkpoint: 6), launched again: it resumes at step 6 in
    # the same MLflow run and ends with the same weights, ranges and metrics.
    again = tmp_path / "again"
    monkeypatch.setenv(CRASH_ENV, "fp32:8")
    with pytest.raises(RuntimeError, match="failed"):
        train_asr(settings, "debug", corpus, again)
    monkeypatch.delenv(CRASH_ENV)
    assert (again / "checkpoints" / "fp32" / "step6").is_dir()
    killed_run = json.loads((again / RUN_MARKER).read_text())["run_id"]
    resumed = train_asr(settings, "debug", corpus, again)
    assert "[asr] fp32: resumed at step 6" in capsys.readouterr().out
    assert resumed["run_id"] == killed_run != result["run_id"]
    for kind in ("fp32_artifact", "int8_artifact"):
        for (name, a), b in zip(
            _weights(result[kind]).items(), _weights(resumed[kind]).values(), strict=True
        ):
            assert torch.equal(a, b), name
    assert resumed["activation_ranges"] == result["activation_ranges"]
    assert (resumed["cer_fp32"], resumed["cer_int8"]) == (result["cer_fp32"], result["cer_int8"])
    assert client.get_run(killed_run).info.status == "FINISHED"


def test_evaluation_counts_characters_the_model_never_saw_and_keeps_their_utterances(
    tmp_path: Path,
) -> None:
    from models.asr.artifact import save_artifact
    from models.asr.evaluate import evaluate_artifacts, summary_lines
    from tests.asr_models import tiny_artifact

    # The tiny model knows English letters and 你好天气: Czech letters, digits and 北京 are new.
    model = save_artifact(tmp_path / "model", tiny_artifact(quantized=False))
    rows = [("kůň 42", "cs", "cs+m1"), ("你好北京", "cmn", "cmn+f2"), ("good day", "en", "en+m3")]
    corpus = labelled_corpus(tmp_path / "corpus", {"test": rows})

    result = evaluate_artifacts(model, None, corpus, split="test")
    assert result["utterances"] == 3  # nothing dropped
    assert result["unseen_characters"] == 6 and result["unseen_utterances"] == 2
    assert result["unseen"] == {"ů": 1, "ň": 1, "4": 1, "2": 1, "北": 1, "京": 1}
    assert result["fp32"]["unseen_characters"] == 6
    assert result["fp32"]["alphabet"]["fitted"]
    # Every reference character counts, the unseen ones as errors the model cannot avoid.
    assert result["fp32"]["greedy"]["characters"]["reference_length"] == sum(
        len(text) for text, _, _ in rows
    )
    assert any("never saw in training: 6 in 2 utterances" in line for line in summary_lines(result))


def test_launch_refuses_a_missing_corpus_and_a_bad_config(
    settings: Settings, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match="not a corpus"):
        train_asr(settings, "debug", tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(ValueError, match="unknown ASR config"):
        train_asr(settings, "huge", tmp_path, tmp_path / "out")


def labelled_corpus(root: Path, splits: dict[str, list[tuple[str, str, str]]]) -> Path:
    """A corpus in the job's layout with random features: ``split -> [(text, language, voice)]``
    (evaluation reads the features as they are; no audio needed)."""
    rng = np.random.default_rng(0)
    for split, rows in splits.items():
        folder = root / "shards" / f"split={split}"
        folder.mkdir(parents=True)
        frame = pd.DataFrame(
            [
                {
                    "utterance_id": f"{split}-{index:02d}",
                    "transcript": text,
                    "language": language,
                    "voice": voice,
                    "num_frames": 80,
                    "features": (rng.standard_normal((80, 40)) * 2 - 4)
                    .astype(np.float16)
                    .tobytes(),
                }
                for index, (text, language, voice) in enumerate(rows)
            ]
        )
        frame.to_parquet(folder / "part-0.parquet")
    (root / "summary.json").write_text(json.dumps({"config": dataclasses.asdict(CorpusConfig())}))
    return root


def test_evaluation_reports_per_source_and_language_and_takes_a_people_only_split(
    tmp_path: Path,
) -> None:
    from models.asr.artifact import save_artifact
    from models.asr.evaluate import evaluate_artifacts
    from models.asr.metrics import cer
    from tests.asr_models import tiny_artifact

    model = save_artifact(tmp_path / "model", tiny_artifact(quantized=True))
    people = [("hi there", "en", "human-tuxpaint-en"), ("天气", "cmn", "human-reader-cmn")]
    synthetic = [("good day", "en-us", "en-us+m1"), ("你好", "cmn", "cmn+f2")]
    corpus = labelled_corpus(tmp_path / "corpus", {"test": synthetic + people, "dev": people})

    mixed = evaluate_artifacts(model, model, corpus, split="test", beam=2)
    assert mixed["sources"] == {"synthetic": 2, "people": 2}
    assert mixed["headline_source"] == "synthetic"
    for kind in ("fp32", "int8"):
        report = mixed[kind]
        greedy = report["greedy"]
        assert set(greedy["per_source"]) == {"synthetic", "people"}
        assert set(greedy["per_language"]) == {"english", "mandarin"}
        assert greedy["per_language"]["mandarin"]["utterances"] == 2
        # The untrained model gets every utterance wrong: the examples are all of them.
        examples = report["examples"]
        assert len(examples) == 4
        for source in ("synthetic", "people"):
            picked = [e for e in examples if e["source"] == source]
            expected = cer([e["reference"] for e in picked], [e["hypothesis"] for e in picked])
            assert greedy["per_source"][source]["cer"] == pytest.approx(expected)
            assert mixed[f"cer_{source}_{kind}"] == pytest.approx(expected)
        assert mixed[f"cer_{kind}"] == mixed[f"cer_synthetic_{kind}"]
        # The beam's headline covers the same utterances as the greedy one: synthetic only.
        beamed = report["beam2"]["per_source"]["synthetic"]
        assert mixed[f"cer_{kind}_beam"] == beamed["cer"] != report["beam2"]["cer"]
        assert mixed[f"cer_human_{kind}"] == mixed[f"cer_people_{kind}"]
        assert set(mixed[f"cer_by_language_{kind}"]) == {"english", "mandarin"}
        # Decoded for each utterance's language: nothing foreign, though the output layer
        # alone emits both scripts.
        assert mixed[f"foreign_tokens_{kind}"] == 0 == report["beam2"]["foreign_tokens"]
        assert report["foreign_tokens_unrestricted"] > 0
        for e in examples:
            script = (
                set("你好天气 ") if e["language"] == "cmn" else set("abcdefghijklmnopqrstuvwxyz' ")
            )
            assert set(e["hypothesis"]) <= script

    only_people = evaluate_artifacts(model, None, corpus, split="dev")
    assert only_people["sources"] == {"people": 2} and only_people["headline_source"] == "all"
    assert only_people["cer_fp32"] == only_people["cer_people_fp32"] > 0
    assert "cer_synthetic_fp32" not in only_people and "int8" not in only_people

    unrestricted = evaluate_artifacts(model, None, corpus, split="dev", restrict=False)
    assert unrestricted["fp32"]["restricted_utterances"] == 0
    assert unrestricted["foreign_tokens_fp32"] > 0
    with pytest.raises(ValueError, match="split 'train' of .* has no utterances"):
        evaluate_artifacts(model, None, corpus, split="train")


def test_launch_without_a_tracking_server_fails_in_one_line_before_any_process(
    settings: Settings, tmp_path: Path
) -> None:
    from cascade.ports import free_port
    from cascade.training.resumable_run import TrackingUnavailable

    corpus = labelled_corpus(tmp_path / "corpus", {"train": [("hello", "en", "en-1")]})
    dead = dataclasses.replace(settings, mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}")
    out = tmp_path / "out"
    with pytest.raises(TrackingUnavailable, match="does not answer; start the local stack"):
        train_asr(dead, "debug", corpus, out)
    assert not (out / "train.log").exists()  # nothing was launched


def training_utterances(config: AsrTrainConfig, corpus: Path) -> Utterances:
    """What training draws its epochs from, as ``train`` composes it."""
    return with_people_share(trained_split(config, corpus), config.people_share)


def test_a_config_without_people_trains_on_synthetic_voices_only(tmp_path: Path) -> None:
    rows = [
        ("hello", "en", "espeak-ng:en-1"),
        ("bonjour", "fr", "human-tuxpaint-fr"),
        ("world", "en", "flite:slt"),
    ]
    corpus = labelled_corpus(tmp_path / "corpus", {"train": rows})
    both = training_utterances(get_config("synthetic"), corpus)
    assert both.voices == ["espeak-ng:en-1", "human-tuxpaint-fr", "flite:slt"]
    fast = get_config("fast")
    assert not fast.train_people
    synthetic_only = training_utterances(fast, corpus)
    assert synthetic_only.voices == ["espeak-ng:en-1", "flite:slt"]
    # Each fits its alphabet to what it trains on: without the French reader, no 'b', 'j'...
    assert both.alphabet is not None and {"b", "j", "n", "u"} <= set(both.alphabet.characters)
    assert synthetic_only.alphabet is not None
    assert synthetic_only.alphabet.characters == sorted(set("hello world"))
    assert synthetic_only.alphabet.languages == {"english": sorted(set("helloworld"))}
    people_only = labelled_corpus(tmp_path / "people", {"train": [rows[1]]})
    with pytest.raises(ValueError, match="no training utterances for config 'fast'"):
        training_utterances(fast, people_only)


def test_people_are_repeated_until_they_make_up_the_configured_share(tmp_path: Path) -> None:
    assert people_repeats(10, 90, 0.5) == 9 and people_repeats(10, 25, 0.5) == 3
    assert people_repeats(10, 90, 0.0) == people_repeats(60, 40, 0.5) == 1
    assert people_repeats(10, 0, 0.5) == people_repeats(0, 10, 0.5) == 1
    rows = [
        ("hello", "en", "espeak-ng:en-1"),
        ("bonjour", "fr", "human-tuxpaint-fr"),
        ("world", "en", "flite:slt"),
        ("salut", "fr", "espeak-ng:fr"),
    ]
    corpus = labelled_corpus(tmp_path / "corpus", {"train": rows})
    debug = get_config("debug")
    assert training_utterances(debug, corpus).voices == [voice for _, _, voice in rows]
    balanced = training_utterances(dataclasses.replace(debug, people_share=0.5), corpus)
    assert balanced.voices == [
        "espeak-ng:en-1",
        *["human-tuxpaint-fr"] * 3,
        "flite:slt",
        "espeak-ng:fr",
    ]
    # the repeats share the recording's features; each draw is augmented on its own
    assert balanced.features[1] is balanced.features[3]
    assert balanced.texts[1:4] == ["bonjour"] * 3
    with pytest.raises(ValueError, match=r"people_share must be in \[0, 1\)"):
        dataclasses.replace(debug, people_share=1.0)
