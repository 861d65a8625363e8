"""Human speech from Tux Paint's stamp descriptions: clips of every language with their captions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from domains.speech.audio_features import CorpusConfig, decode_wav
from jobs.audio_corpus import split_of
from jobs.speech_human import caption, clips, english_caption, english_clips, land_human, voice_of


def _stamp(root: Path, folder: str, name: str, caption: str, langs: tuple[str, ...]) -> None:
    import soundfile

    where = root / folder
    where.mkdir(parents=True, exist_ok=True)
    (where / f"{name}.txt").write_text(caption, encoding="utf-8")
    tone = (0.2 * np.sin(np.arange(22050) * 0.05)).astype(np.float32)
    for lang in langs:
        suffix = "_desc.ogg" if lang == "en" else f"_desc_{lang}.ogg"
        soundfile.write(where / f"{name}{suffix}", tone, 22050, format="OGG", subtype="VORBIS")


def test_english_clips_are_landed_as_wav_with_their_captions(tmp_path: Path) -> None:
    root = tmp_path / "stamps"
    _stamp(root, "animals/birds", "crow", "A crow.\nfr.utf8=Un corbeau.\n", ("en", "fr"))
    _stamp(root, "food", "pear", "fr.utf8=Une poire.\n", ("en",))  # no English caption
    _stamp(root, "food", "plum", "A plum.\n", ("ru",))  # no English recording
    clips = english_clips(root)
    assert [(c.utterance_id, c.text) for c in clips] == [("tuxpaint-animals-birds-crow", "A crow.")]

    landing = tmp_path / "landing"
    assert land_human(landing, root) == 1
    record = json.loads((landing / "transcripts.jsonl").read_text())
    assert record["voice"].startswith("human-") and record["language"] == "en"
    samples, rate = decode_wav((landing / "wav" / f"{record['utterance_id']}.wav").read_bytes())
    assert rate == 22050 and len(samples) == 22050 and np.abs(samples).max() > 0.1
    # People's recordings are evaluation data whatever their voice name hashes to.
    assert split_of(record["voice"], CorpusConfig(test_share=0.0, dev_share=0.0)) == "test"
    assert english_caption(root / "missing.txt") is None
    with pytest.raises(FileNotFoundError, match="tuxpaint-stamps-default"):
        english_clips(tmp_path / "nowhere")


def test_the_installed_package_has_people_reading_in_many_languages() -> None:
    # infra/install.sh installs tuxpaint-stamps-default; its absence is a set-up failure.
    every = clips(languages=None)
    english = [c for c in every if c.language == "en"]
    assert len(english) >= 50
    assert all(c.audio.is_file() and c.text for c in english)
    # People read the descriptions in many languages: ~900 clips each in the big ones.
    per_language = {lang: sum(c.language == lang for c in every) for lang in {"fr", "ru", "ca"}}
    assert min(per_language.values()) >= 800, per_language
    assert len({c.language for c in every}) >= 10


def test_every_language_lands_with_its_caption_and_one_reader_per_language(
    tmp_path: Path,
) -> None:
    root = tmp_path / "stamps"
    _stamp(
        root,
        "animals",
        "crow",
        "A crow.\nfr.utf8=Un corbeau.\nru.utf8=Ворона.\n",
        ("en", "fr", "ru"),
    )
    _stamp(root, "food", "pear", "A pear.\nfr.utf8=Une poire.\n", ("fr", "ca"))  # no ca caption
    found = clips(root, None)
    assert [(c.utterance_id, c.language, c.voice, c.text) for c in found] == [
        ("tuxpaint-animals-crow", "en", "human-tuxpaint-en", "A crow."),
        ("tuxpaint-animals-crow-fr", "fr", "human-tuxpaint-fr", "Un corbeau."),
        ("tuxpaint-animals-crow-ru", "ru", "human-tuxpaint-ru", "Ворона."),
        ("tuxpaint-food-pear-fr", "fr", "human-tuxpaint-fr", "Une poire."),
    ]
    assert [c.utterance_id for c in clips(root)] == ["tuxpaint-animals-crow"]  # English by default
    assert caption(root / "food" / "pear.txt", "ca") is None

    landing = tmp_path / "landing"
    assert land_human(landing, root, ("fr", "ru")) == 3
    records = [
        json.loads(line) for line in (landing / "transcripts.jsonl").read_text().splitlines()
    ]
    assert {(r["language"], r["voice"]) for r in records} == {
        ("fr", "human-tuxpaint-fr"),
        ("ru", "human-tuxpaint-ru"),
    }
    # French and Russian readers train by default; English stays test-only.
    config = CorpusConfig()
    assert {split_of(r["voice"], config) for r in records} == {"train"}
    assert split_of(voice_of("en"), config) == "test"
