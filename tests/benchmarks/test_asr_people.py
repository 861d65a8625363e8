"""People's recordings in the ASR benchmark: English scoring spells numbers, the training corpus
gains the recordings' training part without touching the synthetic corpus, the speaker figures
say what each language had, and the English peer scores both systems on the same clips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.asr_people import (
    EnglishClip,
    Recordings,
    cardinal,
    english_peer,
    english_scoring,
    recordings_figures,
    seen_speakers_median,
    with_recordings,
)
from benchmarks.goals import goals_met


def test_english_scoring_spells_numbers_as_the_voice_says_them() -> None:
    assert cardinal(0) == "zero" and cardinal(40) == "forty"
    assert cardinal(1234) == "one thousand two hundred thirty four"
    assert cardinal(2_000_017) == "two million seventeen"
    assert english_scoring("Press 1, or dial 500!") == "press one or dial five hundred"
    assert english_scoring("Agent 007") == "agent zero zero seven"  # leading zero: digit by digit
    assert english_scoring("  ") == ""


def _frame() -> pd.DataFrame:
    rows = []
    for n in range(6):
        part = "train" if n < 3 else ("test_seen" if n < 5 else "test_unseen")
        voice = "human-fillets-cs-parrot" if part == "test_unseen" else "human-fillets-cs-small"
        rows.append(("cs", voice, part, 30.0, f"cs-{n}"))
    rows.append(("en", "human-asterisk-en-allison", "train", 60.0, "en-0"))
    rows.append(("en", "human-asterisk-en-allison", "test_seen", 6.0, "en-1"))
    return pd.DataFrame(
        {
            "utterance_id": [r[4] for r in rows],
            "transcript": [f"text {r[4]}" for r in rows],
            "language": [r[0] for r in rows],
            "voice": [r[1] for r in rows],
            "part": [r[2] for r in rows],
            "seconds": [r[3] for r in rows],
            "num_frames": [10] * len(rows),
            "features": [np.zeros((10, 4), np.float16).tobytes()] * len(rows),
        }
    )


def _recordings(tmp_path: Path) -> Recordings:
    report = {"held_out_speakers": {"cs": ["human-fillets-cs-parrot"]}}
    return Recordings(tmp_path / "landing", tmp_path / "corpus-recordings", _frame(), report)


def test_the_training_corpus_gains_the_training_part_and_the_synthetic_one_is_untouched(
    tmp_path: Path,
) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "shards" / "split=train").mkdir(parents=True)
    pd.DataFrame({"utterance_id": ["s-0"]}).to_parquet(corpus / "shards/split=train/a.parquet")
    summary = {"utterances": 1, "splits": {"train": 1, "dev": 0, "test": 0}}
    (corpus / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "work").mkdir()
    out = with_recordings(corpus, _recordings(tmp_path), tmp_path / "work")
    written = json.loads((out / "summary.json").read_text())
    assert written["utterances"] == 5 and written["splits"]["train"] == 5
    assert written["recordings"]["train_utterances"] == 4
    added = pd.read_parquet(out / "shards/split=train/recordings.parquet")
    assert sorted(added["utterance_id"]) == ["cs-0", "cs-1", "cs-2", "en-0"]
    assert "part" not in added.columns
    assert json.loads((corpus / "summary.json").read_text()) == summary  # the original is kept
    assert not (corpus / "shards/split=train/recordings.parquet").exists()


def _rates(refs: list[str], hyps: list[str], languages: list[str]) -> dict[str, object]:
    from models.asr.metrics import cer

    return {
        "cer": cer(refs, hyps),
        "utterances": len(refs),
        "references": refs,
        "hypotheses": hyps,
        "languages": languages,
    }


def test_speaker_figures_name_what_each_language_trained_on(tmp_path: Path) -> None:
    rates = {
        "test_seen": _rates(["ab", "cd", "ef"], ["ab", "cx", "ef"], ["cs", "cs", "en"]),
        "test_unseen": _rates(["abcd"], ["abxx"], ["cs"]),
        "test_seen_int8": None,
    }
    figures = recordings_figures(_recordings(tmp_path), rates, trained_on_people=False)  # type: ignore[arg-type]
    assert figures["cer_seen_speakers"] == pytest.approx(1 / 6)
    assert figures["cer_seen_speakers_by_language"] == {"cs": 0.25, "english": 0.0}
    assert figures["human_train_minutes_by_language"] == {"cs": 1.5, "english": 1.0}
    unseen = figures["cer_unseen_speakers_by_language"]
    assert unseen["cs"]["cer"] == 0.5 and unseen["cs"]["train_speakers"] == 1
    assert unseen["cs"]["test_speakers"] == ["human-fillets-cs-parrot"]
    assert unseen["english"]["cer"] is None and unseen["english"]["reason"].startswith("one")
    assert (
        figures["human_trained"] is False
        and "train_people=False" in figures["human_trained_reason"]
    )
    assert figures["cer_seen_speakers_int8"] is None


def _wav(tmp_path: Path, seconds: float) -> bytes:
    from jobs.speech_synth import write_wav

    rate = 16_000
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    return write_wav(tmp_path / f"tone-{seconds}.wav", pcm.tobytes(), rate).read_bytes()


def test_the_peer_and_the_model_are_scored_on_the_same_clips(tmp_path: Path) -> None:
    pytest.importorskip("pocketsphinx", reason="pocketsphinx is not installed: `make venv`")
    clips = [
        EnglishClip("synthetic", _wav(tmp_path, 1.0), "press 1 please", 1.0),
        EnglishClip("recordings", _wav(tmp_path, 0.5), "thank you", 0.5),
    ]
    answers = {clip.wav: clip.reference for clip in clips}
    # A model that hears every clip right scores 0; PocketSphinx hears no words in a tone.
    result = english_peer(clips, lambda wav: answers[wav], "oracle")
    assert result["cer_en"] == 0 and result["cer_en_over_pocketsphinx"] == 0
    assert result["pocketsphinx_cer_en"] > 0.5
    assert result["en_utterances"] == 2 and result["en_audio_s"] == 1.5
    assert set(result["en_by_source"]) == {"synthetic", "recordings"}
    assert result["en_examples"][0]["reference"] == "press one please"
    assert result["rtf_pocketsphinx_en"] > 0 and result["rtf_en_end_to_end"] >= 0
    empty = english_peer([], lambda wav: "", "oracle")
    assert empty["pocketsphinx_cer_en"] is None and "no English" in empty["pocketsphinx_reason"]


def test_the_seen_speaker_goal_counts_only_languages_with_an_hour_of_training() -> None:
    figures = {
        "cer_seen_speakers_by_language": {"cs": 0.2, "nl": 0.5, "english": 0.9},
        "human_train_minutes_by_language": {"cs": 95.0, "nl": 61.0, "english": 20.0},
    }
    median = seen_speakers_median(figures)
    assert median["cer_seen_speakers_goal_languages"] == ["cs", "nl"]
    assert median["cer_seen_speakers_median"] == pytest.approx(0.35)
    short = seen_speakers_median({**figures, "human_train_minutes_by_language": {"cs": 2.0}})
    assert short["cer_seen_speakers_median"] is None
    assert "no language had 60 minutes" in short["cer_seen_speakers_median_reason"]
    # Each goal is tested on its figure; a figure the run lacks leaves its key null, and a key
    # the benchmark already set (the RTF goal) is kept.
    result = {
        **median,
        "cer_en_over_pocketsphinx": 1.6,
        "cer_fp32_detected": 0.05,
        "cer_delta": 0.4,
        "goal_rtf_int8_le_0_05": True,
    }
    keys = goals_met("asr", result, skip=result)
    assert keys == {
        "cer_seen_speakers_goal_met": False,
        "cer_en_goal_met": False,
        "cer_synthetic_goal_met": True,
        "cer_delta_goal_met": True,
        "language_id_goal_met": None,
    }
