"""Recorded people from Debian packages: tiny copies of the Asterisk prompts' and Fish Fillets'
layouts land with their speakers, languages and cleaned text; dropped lines are counted with
their reasons; the installed packages land when present."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from domains.speech.audio_features import normalize_transcript
from jobs.speech_packages import (
    ASTERISK_SOUNDS,
    ASTERISK_TEXT,
    FILLETS_ROOT,
    clean_text,
    evenly_spaced,
    land_asterisk_en,
    land_fillets,
    lua_calls,
    package_source_importer,
)
from tests.jobs.test_speech_landing import DS, landed, quarantined
from tests.pipelines.standard_layouts import write_audio


@pytest.mark.parametrize(
    ("raw", "keypad", "spoken", "normalized"),
    [
        ("Dial 1 if you wish.  Dial 2, now!", False, "Dial 1 if you wish. Dial 2, now!",
         "dial 1 if you wish dial 2 now"),
        ("press * to pause or # to exit", True, None, "press star to pause or pound to exit"),
        ("dot [.]", True, "dot", "dot"),
        ('IAX (note: does not say "2")', False, "IAX", "iax"),
        ("Thank you. (simple tone sound plays)", False, "Thank you.", "thank you"),
        ("Call-Forward on No Answer.", False, None, "call forward on no answer"),
        ("Když… v adresáři C:\\WINDOWS", False, None, "když v adresáři c windows"),
        ("Krrrutý kapitán Silverrrr...", False, None, "krrrutý kapitán silverrrr"),
    ],
)  # fmt: skip
def test_spoken_text_keeps_words_and_digits_and_drops_markup(
    raw: str, keypad: bool, spoken: str | None, normalized: str
) -> None:
    cleaned = clean_text(raw, keypad=keypad)
    assert cleaned.reason is None and cleaned.text is not None
    if spoken is not None:
        assert cleaned.text == spoken
    assert normalize_transcript(cleaned.text) == normalized


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("[ascending tones]", "transcript: non-speech"),
        ("<beep ascending>", "transcript: non-speech"),
        ("(10 seconds of silence)", "transcript: non-speech"),
        ("...!", "transcript: non-speech"),
        ("A%1.", "transcript: placeholder"),
        ("Konkrétně %1 hodin!", "transcript: placeholder"),
        ("", "transcript missing"),
        (None, "transcript missing"),
    ],
)
def test_lines_without_speech_are_dropped_with_a_reason(raw: str | None, reason: str) -> None:
    cleaned = clean_text(raw, keypad=True)
    assert cleaned.text is None and cleaned.reason is not None
    assert cleaned.reason.startswith(reason)


def test_lua_calls_read_escapes_and_skip_comments() -> None:
    source = (
        '-- dialogId("old", "font_big", "commented out")\n'
        'dialogId("a-m-x", "font_small", "wait -- what?")\n'
        'dialogStr(\n"C:\\\\WIN \\"q\\" -- not a comment") -- a comment\n'
        "dialogStr(someVariable)\n"
    )
    assert lua_calls(source) == [
        ("dialogId", ["a-m-x", "font_small", "wait -- what?"]),
        ("dialogStr", ['C:\\WIN "q" -- not a comment']),
        ("dialogStr", None),
    ]


def _asterisk(root: Path) -> Path:
    text = (
        "; Core Asterisk Sounds in English\n\n"
        "auth-thankyou: Thank you.\n"
        "beep: [this is a simple beep tone]\n"
        "digits/1: one\n"
        "dictate/forhelp: press * for help, or # to exit\n"
        "silence/1: (1 second of silence)\n"
        "pls-try-call-later: Please try your call later.\n"
        "no colon on this line\n"
    )
    (root / ASTERISK_TEXT).parent.mkdir(parents=True)
    (root / ASTERISK_TEXT).write_bytes(gzip.compress(text.encode()))
    sounds = root / ASTERISK_SOUNDS
    for key, seconds in (("auth-thankyou", 1.0), ("beep", 0.5), ("digits/1", 0.6)):
        write_audio(sounds / f"{key}.wav", seconds, 8_000)
    write_audio(sounds / "dictate/forhelp.wav", 2.0, 8_000)
    write_audio(sounds / "silence/1.wav", 1.0, 8_000)
    return root


def test_asterisk_prompts_land_with_one_speaker_and_cleaned_text(tmp_path: Path) -> None:
    root, dest = _asterisk(tmp_path / "share"), tmp_path / "out"
    dest.mkdir()
    counts = land_asterisk_en(dest, ds=DS, root=root)
    assert counts == {
        "utterances": 3,
        "speakers": 1,
        "quarantined": 4,
        "seconds": 4,
        "non_speech": 2,
    }
    records = landed(dest)
    assert {uid: r["text"] for uid, r in records.items()} == {
        "asterisk-en-auth-thankyou": "Thank you.",
        "asterisk-en-digits-1": "one",
        "asterisk-en-dictate-forhelp": "press star for help, or pound to exit",
    }
    assert {(r["voice"], r["language"], r["source"]) for r in records.values()} == {
        ("human-asterisk-en-allison", "en", "asterisk_en")
    }
    assert quarantined(dest) == {
        "asterisk-en-beep": "transcript: non-speech ('[this is a simple beep tone]')",
        "asterisk-en-silence-1": "transcript: non-speech (silence/1 is in a silence folder)",
        "asterisk-en-pls-try-call-later": "audio missing "
        f"({root / ASTERISK_SOUNDS / 'pls-try-call-later.wav'} does not exist)",
        "line 9": "asterisk: bad line (not ID: TEXT)",
    }


def _fillets(root: Path) -> Path:
    scripts = {
        "airplane/dialogs_cs.lua": (
            'dialogId("let-m-oko", "font_small", "This is not a glass eye.")\n'
            'dialogStr("To není skleněné oko.")\n\n'
            'dialogId("let-v-vrak2", "font_big", "This is the wreck of Poseidon 737.")\n'
            'dialogStr(\n"To je vrak Poseidon 737.")\n'
            'dialogId("let-x-both", "font_both", "Hello!")\n'
            'dialogStr("Halóóó!")\n'
            'dialogId("let-v-nahrano", "font_big", "Not recorded.")\n'
            'dialogStr("Nenahráno.")\n'
        ),
        "gods/dialogs_cs.lua": (
            'dialogId("b1-a", "font_yellow", "A%1.")\ndialogStr("A%1.")\n'
            'dialogId("b1-1", "", "")\ndialogStr("")\n'
            'dialogId("bu-x-hlas", "font_yellow", "Hit.")\ndialogStr("Zásah.")\n'
        ),
        "share/black_dialogs_cs.lua": (
            'dialogId("smrt-m-0", "font_small", "Oh no.")\ndialogStr("Ach ne.")\n'
        ),
    }
    for name, content in scripts.items():
        (root / "script" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "script" / name).write_text(content, encoding="utf-8")
    for clip in (
        "airplane/cs/let-m-oko",
        "airplane/cs/let-v-vrak2",
        "airplane/cs/let-x-both",
        "gods/cs/b1-a",
        "gods/cs/b1-1",
        "gods/cs/bu-x-hlas",
        "blackjokes/cs/smrt-m-0",
        "blackjokes/cs/unknown",
    ):
        write_audio(root / "sound" / f"{clip}.ogg", 1.0, 22_050)
    return root


def test_fillets_dialogue_lands_with_roles_and_counts_what_it_drops(tmp_path: Path) -> None:
    root, dest = _fillets(tmp_path / "fillets-ng"), tmp_path / "out"
    dest.mkdir()
    counts = package_source_importer("fillets_cs")(root, dest, ds=DS)
    assert counts == {
        "utterances": 4,
        "speakers": 3,
        "quarantined": 5,
        "seconds": 4,
        "non_speech": 1,
    }
    records = landed(dest)
    assert {uid: (r["voice"], r["text"]) for uid, r in records.items()} == {
        "fillets-cs-airplane-let-m-oko": ("human-fillets-cs-small", "To není skleněné oko."),
        "fillets-cs-airplane-let-v-vrak2": ("human-fillets-cs-big", "To je vrak Poseidon 737."),
        "fillets-cs-gods-bu-x-hlas": ("human-fillets-cs-yellow", "Zásah."),
        # the clip lies in another level's folder than the shared script naming it
        "fillets-cs-blackjokes-smrt-m-0": ("human-fillets-cs-small", "Ach ne."),
    }  # fmt: skip
    assert {r["language"] for r in records.values()} == {"cs"}
    reasons = quarantined(dest)
    assert reasons["fillets-cs-airplane-let-x-both"] == "speaker: several at once (font_both)"
    assert reasons["fillets-cs-gods-b1-a"].startswith("transcript: placeholder")
    assert reasons["fillets-cs-gods-b1-1"] == "transcript missing"
    assert reasons["fillets-cs-blackjokes-unknown"].startswith("transcript missing (no dialogId")
    assert reasons["fillets-cs-airplane-let-v-nahrano"].startswith("audio missing")
    # A limit lands clips spread over the levels and roles, not the first level's alone.
    limited = tmp_path / "limited"
    limited.mkdir()
    assert land_fillets(limited, ds=DS, root=root, limit=2)["utterances"] == 2
    assert sorted(landed(limited)) == [
        "fillets-cs-airplane-let-m-oko",
        "fillets-cs-blackjokes-smrt-m-0",
    ]


def test_dutch_dialogue_lands_from_the_same_scripts_folder_as_its_own_source(
    tmp_path: Path,
) -> None:
    """Beside the Czech copy, a Dutch script and clip: ``fillets_nl`` reads only the Dutch
    ones, with Dutch speakers and language; ``fillets_cs`` still reads only the Czech ones."""
    root = _fillets(tmp_path / "fillets-ng")
    (root / "script" / "airplane" / "dialogs_nl.lua").write_text(
        'dialogId("let-m-oko", "font_small", "This is not a glass eye.")\n'
        'dialogStr("Dit is geen glazen oog.")\n'
        'dialogId("let-v-vrak2", "font_big", "This is the wreck of Poseidon 737.")\n'
        'dialogStr("Dat is het wrak van de Poseidon 737.")\n',
        encoding="utf-8",
    )
    write_audio(root / "sound" / "airplane" / "nl" / "let-m-oko.ogg", 1.0, 22_050)
    dutch, czech = tmp_path / "nl", tmp_path / "cs"
    dutch.mkdir()
    czech.mkdir()
    counts = package_source_importer("fillets_nl")(root, dutch, ds=DS)
    assert (counts["utterances"], counts["speakers"], counts["quarantined"]) == (1, 1, 1)
    records = landed(dutch)
    assert {uid: (r["voice"], r["language"], r["text"]) for uid, r in records.items()} == {
        "fillets-nl-airplane-let-m-oko": ("human-fillets-nl-small", "nl", "Dit is geen glazen oog.")
    }
    assert quarantined(dutch)["fillets-nl-airplane-let-v-vrak2"].startswith("audio missing")
    assert package_source_importer("fillets_cs")(root, czech, ds=DS)["utterances"] == 4
    assert {r["language"] for r in landed(czech).values()} == {"cs"}


def test_evenly_spaced_spreads_a_limit_over_the_items() -> None:
    items = list(range(10))
    assert evenly_spaced(items, 3) == [0, 3, 6]  # type: ignore[arg-type]
    assert evenly_spaced(items, None) == evenly_spaced(items, 20) == items  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be >= 1"):
        evenly_spaced(items, 0)  # type: ignore[arg-type]


def test_a_missing_package_is_named_with_its_fix(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(
        FileNotFoundError, match=r"install the Debian package asterisk-core-sounds-en \(`make venv`"
    ):
        land_asterisk_en(dest, ds=DS, root=tmp_path)
    (tmp_path / "script").mkdir()
    with pytest.raises(FileNotFoundError, match="apt-get install fillets-ng-data-cs"):
        land_fillets(dest, ds=DS, root=tmp_path)
    with pytest.raises(FileNotFoundError, match="apt-get install fillets-ng-data-nl"):
        land_fillets(dest, ds=DS, root=tmp_path, language="nl")
    with pytest.raises(ValueError, match="one of asterisk_en, fillets_cs, fillets_nl"):
        package_source_importer("hedgewars")


@pytest.mark.parametrize("language", ["cs", "nl"])
def test_the_installed_dialogue_has_two_lead_voices_and_minor_roles(language: str) -> None:
    from jobs.speech_packages import fillets_lines

    if not (FILLETS_ROOT / "sound/airplane" / language).is_dir():
        pytest.skip(
            f"fillets-ng-data-{language} is not installed: run `make venv` (infra/install.sh "
            "installs it)"
        )
    lines, problems = fillets_lines(FILLETS_ROOT, language)
    assert problems == [] and len(lines) > 1500
    fonts = {line.font for line in lines}
    assert {"font_small", "font_big"} <= fonts and len(fonts) > 10
    clips = sorted((FILLETS_ROOT / "sound").glob(f"*/{language}/*.ogg"))
    ids = {line.dialog_id for line in lines}
    # nearly every clip has its line in some script
    assert sum(clip.stem in ids for clip in clips) / len(clips) > 0.95


@pytest.mark.skipif(
    not Path("/usr/share", ASTERISK_SOUNDS).is_dir(),
    reason="asterisk-core-sounds-en-wav is not installed: run `make venv` (infra/install.sh)",
)
def test_the_installed_english_prompts_land(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    counts = land_asterisk_en(dest, ds=DS)
    assert counts["utterances"] > 500 and counts["speakers"] == 1
    assert 10 <= counts["non_speech"] <= counts["quarantined"] < 30
    texts = [json.loads(line)["text"] for line in (dest / "transcripts.jsonl").open()]
    assert not any(c in text for text in texts for c in "[]()<>*#")


def test_cascade_land_reads_a_copy_of_the_packages_as_the_named_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cascade import cli
    from cascade.lake import Lake
    from cascade.landing import landing_dir, landing_record

    monkeypatch.setenv("CASCADE_HOME", str(tmp_path / "home"))
    copy = _fillets(tmp_path / "fillets-ng")
    args = ["land", "speech", str(copy), "--source", "fillets_cs", "--ds", DS, "--no-publish"]
    assert cli.main(args) == 0
    folder = landing_dir(Lake(tmp_path / "home" / "lake"), "speech", DS)
    record = landing_record(folder)
    assert record is not None and record["source"] == "fillets_cs"
    assert record["counts"]["utterances"] == 4 and record["counts"]["non_speech"] == 1
    assert len(landed(folder)) == 4
    wrong = ["land", "speech", str(copy), "--source", "hedgewars", "--ds", "2026-11-30"]
    assert cli.main([*wrong, "--no-publish"]) == cli.EXIT_USAGE
    assert "one of asterisk_en, fillets_cs, fillets_nl" in capsys.readouterr().err
