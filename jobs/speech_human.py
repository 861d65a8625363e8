"""Real human speech that installs offline: the spoken descriptions of Tux Paint's stamps.

Debian's ``tuxpaint-stamps-default`` ships, beside each stamp image, a ``NAME.txt`` caption file
(English on its first line, then ``LANG.utf8=...`` translations) and recordings of people reading
the caption: ``NAME_desc.ogg`` in English, ``NAME_desc_LANG.ogg`` in other languages (~7,400
clips, ~3 hours: fr, ru, ro, ca, bg, es ~900 each, be ~700, el ~700, da ~300, a few dozen in
lt, nl, en and ml). The clips of the languages asked for become a landing batch (16-bit WAV at
the clip's rate + ``transcripts.jsonl``) that :func:`jobs.audio_corpus.build_corpus` treats like
any other.

Speakers: the clips carry no speaker tags (their Vorbis comments are empty but for the
Lithuanian ones), and the package's changelog credits one reader per language (e.g. Belarusian
Kseniya Buraya, Bulgarian Krasimir Petkov, Spanish Estefanía Ortiz, Greek Kiriaki Serafeim,
Danish Joe Dalton). So each language's clips are one voice, ``human-tuxpaint-LANG``
(:data:`domains.speech.audio_features.HUMAN_VOICE_PREFIX`), and the corpus splits people by whole
readers: :attr:`domains.speech.audio_features.CorpusConfig.people_train_voices` name the readers
whose clips train the model; every other person (by default English, Catalan and Belarusian: a
Latin-script language beside the trained French and Spanish, a Cyrillic one beside the trained
Russian and Bulgarian, and English, which the model otherwise hears only from synthesizers) stays
in the test split, speakers no training utterance used.

    cascade asr people --landing DIR                      # English (test-only)
    cascade asr people --landing DIR --languages all      # every language
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from domains.speech.audio_features import HUMAN_VOICE_PREFIX
from jobs.speech_synth import write_wav

STAMPS_ROOT = Path("/usr/share/tuxpaint/stamps")
"""Where the Debian package installs the stamps (``infra/install.sh`` installs it)."""
VOICE = f"{HUMAN_VOICE_PREFIX}tuxpaint-en"
"""The English reader's voice."""
_CLIP = re.compile(r"^(?P<stem>.+)_desc(?:_(?P<lang>[a-z]{2,3}))?\.ogg$")


@dataclass(frozen=True)
class HumanClip:
    utterance_id: str
    audio: Path
    text: str
    language: str = "en"
    """ISO 639 code of the clip (``en`` for ``NAME_desc.ogg``)."""

    @property
    def voice(self) -> str:
        return voice_of(self.language)


def voice_of(language: str) -> str:
    """The reader of a language's clips: one voice per language (see the module doc)."""
    return f"{HUMAN_VOICE_PREFIX}tuxpaint-{language}"


def english_caption(caption_file: Path) -> str | None:
    """The first line of a stamp's caption file, when it is not a ``LANG.utf8=`` line."""
    return caption(caption_file, "en")


def caption(caption_file: Path, language: str) -> str | None:
    """A stamp's caption in ``language``: the first line for ``en`` (unless it is a
    ``LANG.utf8=`` line), else the ``LANG.utf8=`` line's text; None when there is none."""
    try:
        lines = caption_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    if language == "en":
        first = lines[0].strip() if lines else ""
        return first if first and "=" not in first.split(" ")[0] else None
    prefix = f"{language}.utf8="
    for line in lines:
        if line.startswith(prefix):
            return line[len(prefix) :].strip() or None
    return None


def clips(root: Path = STAMPS_ROOT, languages: Iterable[str] | None = ("en",)) -> list[HumanClip]:
    """Every description recording in ``languages`` (None: all) that has its caption, in a
    stable order. Clips without a caption in their language are left out (the Lithuanian
    letter recordings have none)."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root} does not exist: install the Debian package tuxpaint-stamps-default "
            "(infra/install.sh does)"
        )
    wanted = None if languages is None else set(languages)
    found = []
    for audio in sorted(root.rglob("*_desc*.ogg")):
        match = _CLIP.match(audio.name)
        if match is None:
            continue
        stem, language = match["stem"], match["lang"] or "en"
        if wanted is not None and language not in wanted:
            continue
        text = caption(audio.with_name(f"{stem}.txt"), language)
        if not text:
            continue
        relative = audio.parent.relative_to(root).as_posix().replace("/", "-")
        suffix = "" if language == "en" else f"-{language}"
        found.append(HumanClip(f"tuxpaint-{relative}-{stem}{suffix}", audio, text, language))
    return found


def english_clips(root: Path = STAMPS_ROOT) -> list[HumanClip]:
    """Every English description recording with its caption, in a stable order."""
    return clips(root, ("en",))


def land_human(
    landing: Path, root: Path = STAMPS_ROOT, languages: Iterable[str] | None = ("en",)
) -> int:
    """Decode the clips of ``languages`` (None: all) to WAV in ``landing`` and append their
    transcripts (``language`` is the clip's code, ``voice`` its reader)."""
    import soundfile

    found = clips(root, languages)
    wav_dir = landing / "wav"
    wav_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for clip in found:
        samples, rate = soundfile.read(clip.audio, dtype="int16", always_2d=True)
        mono = samples.mean(axis=1).astype(np.int16)
        write_wav(wav_dir / f"{clip.utterance_id}.wav", mono.tobytes(), rate)
        record = {
            "utterance_id": clip.utterance_id,
            "text": clip.text,
            "language": clip.language,
            "voice": clip.voice,
            "source": str(clip.audio),
        }
        lines.append(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    landing.mkdir(parents=True, exist_ok=True)
    with (landing / "transcripts.jsonl").open("a", encoding="utf-8") as out:
        out.write("".join(lines))
    return len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landing", type=Path, required=True)
    parser.add_argument("--stamps", type=Path, default=STAMPS_ROOT)
    parser.add_argument(
        "--languages",
        default="en",
        help="comma-separated ISO codes of the clips to land, or 'all' (default: en)",
    )
    args = parser.parse_args(argv)
    languages = None if args.languages == "all" else args.languages.split(",")
    landed = land_human(args.landing, args.stamps, languages)
    print(f"[speech_human] landed {landed} clips in {args.landing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
