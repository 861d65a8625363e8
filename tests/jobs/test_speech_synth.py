"""The utterance generator (espeak-ng, flite, festival): deterministic specs and audio, clear
errors."""

from __future__ import annotations

import dataclasses
import wave
from pathlib import Path

import pytest

from jobs import speech_synth
from jobs.speech_synth import (
    ENGLISH,
    FESTIVAL_VOICES,
    FLITE_VOICES,
    MANDARIN,
    all_voices,
    parse_stream_wav,
    synthesize,
    utterance_spec,
    write_wav,
)


def test_specs_are_a_function_of_seed_and_index_only() -> None:
    specs = [utterance_spec(i, seed=3) for i in range(200)]
    assert specs == [utterance_spec(i, seed=3) for i in range(200)]
    assert utterance_spec(150, seed=3) == specs[150]  # without generating the first 150
    assert utterance_spec(0, seed=4) != specs[0]
    assert len({s.utterance_id for s in specs}) == 200
    languages = {s.language for s in specs}
    assert languages & set(MANDARIN) and languages & set(ENGLISH)
    assert len({s.voice for s in specs}) > 50  # many speakers, for speaker-disjoint splits
    assert all(120 <= s.speed_wpm <= 200 and 25 <= s.pitch <= 75 for s in specs)
    assert {s.voice for s in specs} <= set(all_voices())
    with pytest.raises(ValueError, match=">= 0"):
        utterance_spec(-1)


def test_synthesis_is_deterministic_and_follows_voice_and_speed(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        utterance_spec(0), text="open the kitchen door", language="en-us", variant="m3"
    )
    pcm, rate = synthesize(spec)
    assert rate == 22050 and len(pcm) > rate  # more than half a second of 16-bit samples
    assert synthesize(spec) == (pcm, rate)
    other_voice, _ = synthesize(dataclasses.replace(spec, variant="f2"))
    assert other_voice != pcm
    slow, _ = synthesize(dataclasses.replace(spec, speed_wpm=120))
    fast, _ = synthesize(dataclasses.replace(spec, speed_wpm=200))
    assert len(slow) > 1.3 * len(fast)
    mandarin, _ = synthesize(dataclasses.replace(spec, text="你好谢谢", language="cmn"))
    assert len(mandarin) > rate

    path = write_wav(tmp_path / "u.wav", pcm, rate)
    with wave.open(str(path)) as read:
        assert (read.getframerate(), read.getnchannels(), read.getsampwidth()) == (rate, 1, 2)
        assert read.readframes(read.getnframes()) == pcm


def test_bad_streams_and_a_missing_espeak_say_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="RIFF"):
        parse_stream_wav(b"ID3" + bytes(60))
    monkeypatch.setattr(speech_synth.shutil, "which", lambda _name: None)
    with pytest.raises(FileNotFoundError, match="infra/install.sh"):
        synthesize(utterance_spec(0))


def test_flite_and_festival_voices_join_espeak_ng_for_english() -> None:
    specs = [utterance_spec(i, seed=3) for i in range(400)]
    engines = {s.engine: sum(x.engine == s.engine for x in specs) for s in specs}
    assert set(engines) == {"espeak-ng", "flite", "festival"}
    assert engines["espeak-ng"] > engines["flite"] > engines["festival"] > 0
    others = [s for s in specs if s.engine != "espeak-ng"]
    assert all(s.language == "en-us" and s.voice == f"{s.engine}:{s.variant}" for s in others)
    assert all(s.engine == "espeak-ng" for s in specs if s.language in MANDARIN)
    assert {s.variant for s in others if s.engine == "flite"} <= set(FLITE_VOICES)
    assert {s.variant for s in others if s.engine == "festival"} <= set(FESTIVAL_VOICES)
    assert {s.voice for s in specs} <= set(all_voices())

    flite = dataclasses.replace(others[0], engine="flite", variant="slt", text="open the door")
    pcm, rate = synthesize(flite)
    assert rate == 16000 and len(pcm) > rate and synthesize(flite) == (pcm, rate)
    slow, _ = synthesize(dataclasses.replace(flite, speed_wpm=120))
    fast, _ = synthesize(dataclasses.replace(flite, speed_wpm=200))
    assert len(slow) > 1.3 * len(fast)
    assert synthesize(dataclasses.replace(flite, variant="awb"))[0] != pcm
    festival = dataclasses.replace(flite, engine="festival", variant="kal_diphone")
    spoken, festival_rate = synthesize(festival)
    assert festival_rate == 16000 and len(spoken) > festival_rate
    with pytest.raises(RuntimeError, match="festival failed"):
        synthesize(dataclasses.replace(festival, variant="nobody_diphone"))
    with pytest.raises(ValueError, match="unknown speech synthesizer"):
        synthesize(dataclasses.replace(flite, engine="sam"))
