"""Recorded human speech from Debian packages, landed as named sources of the dataset ``speech``.

    cascade land speech --source asterisk_en --ds 2026-11-29
    cascade land speech --source fillets_cs --ds 2026-11-29
    cascade land speech --source fillets_nl --ds 2026-11-29
    cascade land speech /copy/of/fillets-ng --source fillets_cs --ds 2026-11-29

Each source reads the folders its packages install (``infra/install.sh`` installs them; a copy
in the same layout may be given as PATH) and lands through
:func:`jobs.speech_landing.land_utterances`, like every speech format: resampled to the model's
rate, quarantined per item with its reason, normalized later by the corpus job.

- ``asterisk_en``: ``asterisk-core-sounds-en`` (the text, ``core-sounds-en.txt.gz``: ``ID: TEXT``
  lines, ``;`` comments) and ``asterisk-core-sounds-en-wav`` (``en_US_f_Allison/ID.wav``,
  telephone-rate WAV; ``ID`` may name a subfolder, ``digits/1``). One professional voice.
- ``fillets_cs``: ``fillets-ng-data`` (the game's Lua scripts,
  ``script/LEVEL/*dialogs_cs.lua``: ``dialogId(ID, FONT, ENGLISH)`` then ``dialogStr(CZECH)``)
  and ``fillets-ng-data-cs`` (``sound/LEVEL/cs/ID.ogg``, Ogg Vorbis). The speaker is the role the
  font names: ``font_small`` the small fish (female lead), ``font_big`` the big fish (male lead),
  any other font a minor role. A few clips lie in a level folder other than their script's (the
  shared scripts): an id found in exactly one script is matched wherever its clip lies.
- ``fillets_nl``: the same game's Dutch dialogue, read the same way: the scripts'
  ``*dialogs_nl.lua`` and ``fillets-ng-data-nl`` (``sound/LEVEL/nl/ID.ogg``).

What a source's own text needs before the common normalization
(:func:`domains.speech.audio_features.normalize_transcript`) is :func:`clean_text`: stage
directions and annotations in brackets, parentheses or angle brackets are removed, the keypad
keys ``*`` and ``#`` of the telephone prompts become the words the voice says (``star``,
``pound``), a line with a run-time placeholder (``%1``) is dropped, and a line with no word
left is dropped as non-speech. Digits are kept as written, as the normalization keeps them.
Every dropped item is in ``quarantine.jsonl`` with its reason and counted.

Voices are ``human-...`` (:data:`~domains.speech.audio_features.HUMAN_VOICE_PREFIX`): people's
recordings, held out for evaluation unless a corpus config names them for training.
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from domains.speech.audio_features import HUMAN_VOICE_PREFIX, SAMPLE_RATE
from jobs.landing_checks import check_landing
from jobs.quarantine import LandingQuarantine
from jobs.speech_landing import Utterance, land_utterances

# --- text -----------------------------------------------------------------------------------

_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|<[^>]*>")
"""``[ascending tones]``, ``(10 seconds of silence)``, ``<beep ascending>``: not spoken."""
_PLACEHOLDER = re.compile(r"%\d")
KEYPAD_WORDS = {"*": "star", "#": "pound"}
"""What the telephone prompts' voice says for a keypad key written as a symbol."""


@dataclass(frozen=True)
class CleanText:
    text: str | None
    """The spoken text, or None when the item is dropped."""
    reason: str | None = None
    """Why it is dropped (a quarantine reason)."""


def clean_text(raw: str | None, *, keypad: bool = False) -> CleanText:
    """The spoken part of a corpus line (see the module docstring), or why there is none."""
    if raw is None or not raw.strip():
        return CleanText(None, "transcript missing")
    if _PLACEHOLDER.search(raw):
        return CleanText(None, f"transcript: placeholder (filled in at run time: {raw.strip()!r})")
    text = _ANNOTATION.sub(" ", raw)
    if keypad:
        for key, word in KEYPAD_WORDS.items():
            text = text.replace(key, f" {word} ")
    text = " ".join(text.split())
    if not any(c.isalnum() for c in text):
        return CleanText(None, f"transcript: non-speech ({raw.strip()!r})")
    return CleanText(text)


# --- packages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    name: str
    marker: str
    """A path (relative to the source's root) that exists when the package is installed."""


def require_installed(root: Path, packages: tuple[Package, ...]) -> None:
    """FileNotFoundError naming the first package whose files are missing under ``root``."""
    for package in packages:
        if not (root / package.marker).exists():
            raise FileNotFoundError(
                f"{root / package.marker} does not exist: install the Debian package "
                f"{package.name} (`make venv` does, or `apt-get install {package.name}`)"
            )


def evenly_spaced(items: list[Utterance], limit: int | None) -> list[Utterance]:
    """``limit`` of ``items`` spread evenly over them (every speaker and level has its turn, as
    a prefix would not give), in order; all of them when ``limit`` is None."""
    if limit is None or limit >= len(items):
        return items
    if limit < 1:
        raise ValueError(f"limit must be >= 1 clip, got {limit}")
    return [items[i * len(items) // limit] for i in range(limit)]


def _voice(*parts: str) -> str:
    return HUMAN_VOICE_PREFIX + "-".join(parts)


DROPPED_REASONS = ("transcript:non-speech", "transcript:placeholder")
"""Quarantine reasons of lines that are not speech to learn from (counted as ``non_speech``)."""


def _land(
    utterances: list[Utterance], quarantine: LandingQuarantine, source: Path, dest: Path, name: str
) -> dict[str, int]:
    by_reason = quarantine.by_reason()
    dropped = sum(by_reason.get(key, 0) for key in DROPPED_REASONS)
    counts = land_utterances(
        utterances,
        quarantine,
        source=source,
        dest=dest,
        format_name=name,
        rate=SAMPLE_RATE,
        fix=f"reinstall the packages of source {name} (`make venv`)",
    )
    return {**counts, "non_speech": dropped}


# --- asterisk -------------------------------------------------------------------------------

ASTERISK_ROOT = Path("/usr/share")
ASTERISK_TEXT = "doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
ASTERISK_SOUNDS = "asterisk/sounds/en_US_f_Allison"
ASTERISK_PACKAGES = (
    Package("asterisk-core-sounds-en", ASTERISK_TEXT),
    Package("asterisk-core-sounds-en-wav", ASTERISK_SOUNDS),
)
NON_SPEECH_FOLDERS = ("silence",)
"""Asterisk prompt folders that hold no speech."""


def asterisk_lines(text_file: Path) -> list[tuple[int, str, str]]:
    """``(line number, id, text)`` of ``core-sounds-LANG.txt`` (gzipped or not); comments
    (``;``) and blank lines skipped, a line without ``ID:`` kept with an empty id."""
    raw = text_file.read_bytes()
    if text_file.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{text_file}: not UTF-8 text ({exc.reason} at byte {exc.start}): reinstall the "
            "package that ships it"
        ) from None
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(";"):
            continue
        key, sep, text = line.partition(":")
        lines.append((number, key.strip() if sep else "", text.strip()))
    return lines


def land_asterisk_en(
    dest: Path,
    *,
    ds: str,
    root: Path = ASTERISK_ROOT,
    source: Path | None = None,
    limit: int | None = None,
) -> Mapping[str, int]:
    """Land the English Asterisk prompts (``root`` holds the packages' ``/usr/share`` tree);
    ``limit``: that many of them, :func:`evenly_spaced` (smoke runs)."""
    check_landing(dest, ds)
    require_installed(root, ASTERISK_PACKAGES)
    sounds = root / ASTERISK_SOUNDS
    speaker = sounds.name.rsplit("_", 1)[-1].lower()
    quarantine = LandingQuarantine()
    utterances: list[Utterance] = []
    for number, key, raw in asterisk_lines(root / ASTERISK_TEXT):
        if not key:
            quarantine.add(f"line {number}", "asterisk: bad line (not ID: TEXT)")
            continue
        uid = "asterisk-en-" + key.replace("/", "-")
        if key.split("/")[0] in NON_SPEECH_FOLDERS:
            quarantine.add(uid, f"transcript: non-speech ({key} is in a silence folder)")
            continue
        cleaned = clean_text(raw, keypad=True)
        if cleaned.text is None:
            quarantine.add(uid, cleaned.reason or "transcript missing")
            continue
        audio = sounds / f"{key}.wav"
        utterances.append(Utterance(uid, audio, cleaned.text, _voice("asterisk-en", speaker), "en"))
    utterances = evenly_spaced(utterances, limit)
    return _land(utterances, quarantine, source or root / ASTERISK_SOUNDS, dest, "asterisk_en")


# --- fillets --------------------------------------------------------------------------------

FILLETS_ROOT = Path("/usr/share/games/fillets-ng")
LEAD_ROLES = {"font_small": "small", "font_big": "big"}
"""The two lead voices by the font their lines are shown in; other fonts are minor roles."""
SEVERAL_SPEAKERS = ("font_both",)
"""Lines both fish say at once: no one speaker."""

_LUA_CALL = re.compile(r"\b(dialogId|dialogStr)\s*\(")
_LUA_STRING = re.compile(r"\s*(?:\"((?:[^\"\\\n]|\\.)*)\"|'((?:[^'\\\n]|\\.)*)')\s*([,)])", re.S)
_LUA_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "\n": "\n"}
_LUA_COMMENT = re.compile(
    r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|(?P<comment>--\[\[.*?\]\]|--[^\n]*)", re.S
)
"""A string literal (kept: ``--`` inside one is text) or a comment (removed)."""


def lua_unescape(literal: str) -> str:
    """A Lua string literal's value (``\\\\`` -> ``\\``, ``\\"`` -> ``"``, ``\\ddd``)."""

    def one(match: re.Match[str]) -> str:
        body = match.group(1)
        if body.isdigit():
            return chr(int(body))
        return _LUA_ESCAPES.get(body, body)

    return re.sub(r"\\(\d{1,3}|.)", one, literal, flags=re.S)


def lua_calls(source: str) -> list[tuple[str, list[str] | None]]:
    """``(function, arguments)`` of each ``dialogId``/``dialogStr`` call outside comments;
    arguments None when they are not all string literals."""
    code = _LUA_COMMENT.sub(lambda m: "" if m["comment"] else m[0], source)
    calls: list[tuple[str, list[str] | None]] = []
    for match in _LUA_CALL.finditer(code):
        position, args = match.end(), []
        while True:
            literal = _LUA_STRING.match(code, position)
            if literal is None:
                calls.append((match.group(1), None))
                break
            value = literal.group(1) if literal.group(1) is not None else literal.group(2)
            args.append(lua_unescape(value))
            position = literal.end()
            if literal.group(3) == ")":
                calls.append((match.group(1), args))
                break
    return calls


@dataclass(frozen=True)
class DialogLine:
    level: str
    dialog_id: str
    font: str
    text: str | None
    script: str


def fillets_lines(root: Path, language: str) -> tuple[list[DialogLine], list[tuple[str, str]]]:
    """Every ``dialogId`` with the ``dialogStr`` that follows it in the scripts of
    ``language``, and ``(item, reason)`` for each call that cannot be read."""
    found: list[DialogLine] = []
    problems: list[tuple[str, str]] = []
    for script in sorted((root / "script").glob(f"*/*dialogs_{language}.lua")):
        level, where = script.parent.name, f"{script.parent.name}/{script.name}"
        current: tuple[str, str] | None = None
        for function, args in lua_calls(script.read_text(encoding="utf-8", errors="replace")):
            if args is None or not args:
                problems.append((where, f"fillets: bad call ({function} without string arguments)"))
                current = None
            elif function == "dialogId":
                current = (args[0], args[1] if len(args) > 1 else "")
            elif current is None:
                problems.append((where, "fillets: bad call (dialogStr without a dialogId)"))
            else:
                found.append(DialogLine(level, current[0], current[1], args[0], where))
                current = None
    return found, problems


def land_fillets(
    dest: Path,
    *,
    ds: str,
    language: str = "cs",
    root: Path = FILLETS_ROOT,
    source: Path | None = None,
    limit: int | None = None,
) -> Mapping[str, int]:
    """Land the game's spoken dialogue in ``language`` (``root`` is the game's data folder);
    ``limit``: that many clips, :func:`evenly_spaced` (smoke runs)."""
    check_landing(dest, ds)
    require_installed(
        root,
        (
            Package("fillets-ng-data", "script"),
            Package(f"fillets-ng-data-{language}", f"sound/airplane/{language}"),
        ),
    )
    quarantine = LandingQuarantine()
    lines, problems = fillets_lines(root, language)
    for item, reason in problems:
        quarantine.add(item, reason)
    by_place = {(line.level, line.dialog_id): line for line in lines}
    by_id: dict[str, list[DialogLine]] = defaultdict(list)
    for line in lines:
        by_id[line.dialog_id].append(line)
    clips = sorted((root / "sound").glob(f"*/{language}/*.ogg"))
    used: set[tuple[str, str]] = set()
    utterances: list[Utterance] = []
    for clip in clips:
        level = clip.parent.parent.name
        uid = f"fillets-{language}-{level}-{clip.stem}"
        dialog = by_place.get((level, clip.stem))
        if dialog is None and len(by_id.get(clip.stem, ())) == 1:
            dialog = by_id[clip.stem][0]
        if dialog is None:
            quarantine.add(uid, f"transcript missing (no dialogId {clip.stem!r} in the scripts)")
            continue
        used.add((dialog.level, dialog.dialog_id))
        if dialog.font in SEVERAL_SPEAKERS:
            quarantine.add(uid, f"speaker: several at once ({dialog.font})")
            continue
        cleaned = clean_text(dialog.text)
        if cleaned.text is None:
            quarantine.add(uid, cleaned.reason or "transcript missing")
            continue
        role = LEAD_ROLES.get(dialog.font, dialog.font.removeprefix("font_") or "unnamed")
        voice = _voice("fillets", language, role)
        utterances.append(Utterance(uid, clip, cleaned.text, voice, language))
    for line in lines:
        if (line.level, line.dialog_id) not in used:
            uid = f"fillets-{language}-{line.level}-{line.dialog_id}"
            quarantine.add(uid, f"audio missing (no {language} clip for {line.script})")
    utterances = evenly_spaced(utterances, limit)
    return _land(utterances, quarantine, source or root, dest, f"fillets_{language}")


def land_fillets_cs(dest: Path, *, ds: str, limit: int | None = None) -> Mapping[str, int]:
    """The ``fillets_cs`` source: the installed Czech dialogue."""
    return land_fillets(dest, ds=ds, language="cs", limit=limit)


def land_fillets_nl(dest: Path, *, ds: str, limit: int | None = None) -> Mapping[str, int]:
    """The ``fillets_nl`` source: the installed Dutch dialogue."""
    return land_fillets(dest, ds=ds, language="nl", limit=limit)


FILLETS_LANGUAGES = {"fillets_cs": "cs", "fillets_nl": "nl"}
"""The Fish Fillets sources and the language each reads."""

PACKAGE_SOURCES: dict[str, Callable[..., Mapping[str, int]]] = {
    "asterisk_en": land_asterisk_en,
    "fillets_cs": land_fillets_cs,
    "fillets_nl": land_fillets_nl,
}
"""Source name -> its producer (``(dest, *, ds, limit=None) -> counts``, reading the installed
packages)."""


def package_source_importer(name: str) -> Callable[..., Mapping[str, int]]:
    """The importer of a copy of a source's package folder at a PATH: for ``asterisk_en`` the
    ``/usr/share`` tree, for ``fillets_cs`` and ``fillets_nl`` the game's data folder."""
    if name == "asterisk_en":
        return lambda path, dest, *, ds: land_asterisk_en(dest, ds=ds, root=path, source=path)
    if name in FILLETS_LANGUAGES:
        language = FILLETS_LANGUAGES[name]
        return lambda path, dest, *, ds: land_fillets(
            dest, ds=ds, language=language, root=path, source=path
        )
    raise ValueError(
        f"no speech source {name!r} reads a PATH; one of {', '.join(sorted(PACKAGE_SOURCES))}"
    )
