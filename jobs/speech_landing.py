"""Speech importers: a corpus in a standard layout in, the landing batch that the speech corpus
job (:mod:`jobs.audio_corpus`) reads out.

    from jobs.speech_landing import SPEECH_FORMATS
    counts = SPEECH_FORMATS["kaldi"](Path("data/train"), dest, ds="2026-11-29")

Each importer is ``(source, dest, *, ds, ...) -> counts`` and writes into the empty folder
``dest``:

- ``wav/UTTERANCE.wav``: 16-bit PCM, mono, at the model's rate (:data:`SAMPLE_RATE` of the speech
  features; ``rate=`` changes it), whatever the source's format, rate and channel count;
- ``transcripts.jsonl``: one object per utterance with ``utterance_id``, ``text`` (as the source
  wrote it: the corpus job normalizes), ``language`` (from the source, else the ``language=``
  argument, else null), ``voice`` (the source's speaker id, kept as is: the corpus job splits
  speaker-disjoint on it) and ``source`` (the format's name);
- ``quarantine.jsonl``: every utterance or line that was refused, with its reason
  (:class:`jobs.quarantine.LandingQuarantine`).

It returns ``{"utterances", "speakers", "quarantined", "seconds"}`` (landed audio, rounded).

Formats (:data:`SPEECH_FORMATS`):

- ``kaldi`` (:func:`land_kaldi`): a Kaldi data directory. ``wav.scp`` (``RECORDING PATH``, plain
  file paths; a piped command ``... |`` is refused, the importer runs no commands), ``text``
  (``UTTERANCE TRANSCRIPT``), ``utt2spk`` (``UTTERANCE SPEAKER``) and optionally ``segments``
  (``UTTERANCE RECORDING START END`` in seconds, ``END`` -1 for the end of the recording).
  Relative paths in ``wav.scp`` are looked up from the data directory, then its parent and its
  grandparent (Kaldi recipes write them relative to the recipe folder, ``egs/X/s5``).
- ``librispeech`` (:func:`land_librispeech`): ``SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt``
  (``UTTERANCE TRANSCRIPT`` per line) beside ``UTTERANCE.flac``, anywhere under ``source``;
  the speaker is the utterance id's first field; the language ``en`` unless told.
- ``common_voice`` (:func:`land_common_voice`): a Common Voice TSV (``validated.tsv``, else
  ``train.tsv`` in the folder ``source``, or the TSV file itself) with ``client_id`` (the
  speaker), ``path`` (the clip under ``clips/`` beside the TSV), ``sentence`` and, in recent
  releases, ``locale``.
- ``jsonl`` (:func:`land_speech_jsonl`): the layout the pipeline lands itself, ``wav/`` beside
  ``transcripts.jsonl`` (``utterance_id``, ``text``, ``language``, ``voice`` or ``speaker``, and
  optionally ``audio``, a path relative to the manifest's folder).

Audio is decoded with soundfile (libsndfile: WAV, FLAC, Ogg Vorbis and Opus, MP3 and more) at
any sample rate and channel count, averaged to mono and resampled with the speech features' own
:func:`~domains.speech.audio_features.resample`. A RIFF file's header is checked first with
:func:`~domains.speech.audio_features.read_wav_header`, so a WAV cut short is called truncated
here as the corpus job and the server call it. Quarantined, each with its reason (``AREA: KIND:
detail``, :mod:`jobs.quarantine`): audio missing, empty (no bytes or no samples), unreadable
(not audio libsndfile knows, a broken header), truncated (fewer frames than the header or stream
declares), samples that are not finite; a transcript or speaker missing; a segment outside its
recording; an utterance id that is not a file name or that repeats; a line that does not parse.
A batch where nothing is left raises one ValueError naming the source and the fix, and writes
nothing.

Why not Lhotse's recipes (PyPI ``lhotse`` 1.33.0 installs beside this environment's torch without
changing it): they do not fit an importer that quarantines per item. ``prepare_librispeech`` and
``prepare_commonvoice`` find data only under the official part and locale folder names, skip a
missing clip with a log line and stop the whole preparation on one undecodable file;
``load_kaldi_data_dir`` needs one sampling rate for every recording, makes supervisions only when
``segments`` exists and would run piped commands. ``import lhotse`` also imports torch (about 18
s cold on the project's 2-core machine) to read text files. What this module needs from them is
the text formats, a few lines each; the decoding is soundfile's either way.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from domains.speech.audio_features import SAMPLE_RATE, WavError, read_wav_header, resample
from jobs.landing_checks import check_landing, file_name_problem, json_records, text_lines
from jobs.quarantine import LandingQuarantine
from jobs.speech_synth import write_wav

TRANSCRIPTS_FILE = "transcripts.jsonl"
WAV_FOLDER = "wav"
AUDIO_SUFFIXES = (".flac", ".wav", ".ogg", ".opus", ".mp3")
"""Audio files an importer looks for beside a transcript when the layout names no extension
(the first that exists wins; LibriSpeech's own is FLAC)."""


class AudioError(ValueError):
    """Audio that cannot be landed: ``kind`` (``empty``, ``unreadable``, ``truncated``,
    ``truncated header``, ``invalid samples``) and what exactly."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class Utterance:
    """One utterance as a reader found it; the checks happen when it is landed."""

    utterance_id: str
    audio: Path
    text: str | None
    speaker: str | None
    language: str | None
    start: float = 0.0
    """Seconds into the recording (Kaldi ``segments``)."""
    end: float | None = None
    """Seconds into the recording; None for its end."""


def decode_audio(path: Path) -> tuple[np.ndarray, int]:
    """``(float32 samples [frames, channels], rate)`` of an audio file; AudioError otherwise."""
    import soundfile

    size = path.stat().st_size
    if size == 0:
        raise AudioError("empty", "the file holds no bytes")
    with path.open("rb") as handle:
        head = handle.read(12)
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        try:
            read_wav_header(path.read_bytes())
        except WavError as exc:
            # Float and compressed WAVs are left to libsndfile; a cut or broken file is not.
            if exc.kind != "unsupported":
                raise AudioError(exc.kind, exc.detail) from None
    try:
        with soundfile.SoundFile(path) as audio:
            declared, rate = audio.frames, audio.samplerate
            samples = audio.read(dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, EOFError) as exc:
        raise AudioError("unreadable", str(exc) or type(exc).__name__) from None
    if len(samples) == 0:
        raise AudioError("empty", "no samples")
    if len(samples) < declared:
        raise AudioError(
            "truncated",
            f"decoded {len(samples)} of the {declared} frames the file declares "
            f"({len(samples) / rate:.3f} of {declared / rate:.3f} s)",
        )
    if not np.isfinite(samples).all():
        raise AudioError("invalid samples", "NaN or infinite values")
    return samples, rate


def land_utterances(
    utterances: Iterable[Utterance],
    quarantine: LandingQuarantine,
    *,
    source: Path,
    dest: Path,
    format_name: str,
    rate: int,
    fix: str,
) -> dict[str, int]:
    """Check, decode, convert and write ``utterances`` into ``dest``; the counts.

    ``quarantine`` holds what the reader already refused; ``fix`` ends the error of a batch with
    nothing left. Recordings are decoded once for consecutive utterances (Kaldi segments)."""
    records: list[dict[str, str | None]] = []
    speakers: set[str] = set()
    seen: set[str] = set()
    frames_written = 0
    decoded: tuple[Path, tuple[np.ndarray, int] | AudioError] | None = None
    for utterance in utterances:
        uid = utterance.utterance_id
        problem = file_name_problem(uid)
        if problem:
            quarantine.add(repr(uid), f"utterance id: not a file name ({problem})")
            continue
        if uid in seen:
            quarantine.add(uid, "utterance id: duplicate (an earlier utterance has it)")
            continue
        seen.add(uid)
        text, speaker = (utterance.text or "").strip(), (utterance.speaker or "").strip()
        if not text:
            quarantine.add(uid, "transcript missing")
            continue
        if not speaker:
            quarantine.add(uid, "speaker missing (needed for speaker-disjoint splits)")
            continue
        if not utterance.audio.is_file():
            quarantine.add(uid, f"audio missing ({utterance.audio} does not exist)")
            continue
        if decoded is None or decoded[0] != utterance.audio:
            try:
                decoded = (utterance.audio, decode_audio(utterance.audio))
            except AudioError as exc:
                decoded = (utterance.audio, exc)
        result = decoded[1]
        if isinstance(result, AudioError):
            quarantine.add(uid, f"audio: {result} ({utterance.audio.name})")
            continue
        samples, source_rate = result
        first = round(utterance.start * source_rate)
        last = len(samples) if utterance.end is None else round(utterance.end * source_rate)
        if not 0 <= first < last <= len(samples):
            quarantine.add(
                uid,
                f"segment: out of range ({utterance.start:g}-"
                f"{'end' if utterance.end is None else f'{utterance.end:g}'} s of a "
                f"{len(samples) / source_rate:.3f} s recording)",
            )
            continue
        mono = samples[first:last].mean(axis=1)
        audio = resample(mono, source_rate, rate) if source_rate != rate else mono
        pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype("<i2")
        write_wav(dest / WAV_FOLDER / f"{uid}.wav", pcm.tobytes(), rate)
        frames_written += len(pcm)
        speakers.add(speaker)
        records.append(
            {
                "utterance_id": uid,
                "text": text,
                "language": utterance.language or None,
                "voice": speaker,
                "source": format_name,
            }
        )
    if not records:
        raise quarantine.nothing_landed(source, "utterances", fix)
    lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (dest / TRANSCRIPTS_FILE).write_text("".join(lines), encoding="utf-8")
    quarantine.write(dest)
    return {
        "utterances": len(records),
        "speakers": len(speakers),
        "quarantined": len(quarantine),
        "seconds": round(frames_written / rate),
    }


def audio_beside(folder: Path, stem: str) -> Path:
    """``folder/STEM.EXT`` for the first of :data:`AUDIO_SUFFIXES` that exists (else FLAC's)."""
    for suffix in AUDIO_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return folder / f"{stem}{AUDIO_SUFFIXES[0]}"


# --- Kaldi data directory -------------------------------------------------------------------


def read_kaldi_table(
    path: Path, quarantine: LandingQuarantine, *, value_required: bool = True
) -> dict[str, str]:
    """``KEY VALUE...`` lines as ``{key: value}``; a repeated key or (when ``value_required``) a
    line with no value is quarantined, the first occurrence kept."""
    table: dict[str, str] = {}
    for number, line in enumerate(text_lines(path), 1):
        if not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        where = f"{path.name} line {number}"
        if key in table:
            quarantine.add(key, f"kaldi: duplicate key ({where})")
        elif value_required and not value.strip():
            quarantine.add(key, f"kaldi: bad line ({where} has a key and no value)")
        else:
            table[key] = value.strip()
    return table


def kaldi_audio_path(data_dir: Path, entry: str) -> Path:
    path = Path(entry)
    if path.is_absolute():
        return path
    for base in (data_dir, data_dir.parent, data_dir.parent.parent):
        if (base / path).is_file():
            return base / path
    return data_dir / path


def land_kaldi(
    source: Path,
    dest: Path,
    *,
    ds: str,
    language: str | None = None,
    rate: int = SAMPLE_RATE,
) -> Mapping[str, int]:
    """Land a Kaldi data directory (``wav.scp``, ``text``, ``utt2spk``, optional ``segments``);
    ``language`` is every utterance's language (Kaldi stores none)."""
    check_landing(dest, ds)
    for name, content in (
        ("wav.scp", "RECORDING PATH per line"),
        ("text", "UTTERANCE TRANSCRIPT per line"),
        ("utt2spk", "UTTERANCE SPEAKER per line: speakers keep the corpus splits disjoint"),
    ):
        if not (source / name).is_file():
            raise ValueError(
                f"{source}: no {name} in this Kaldi data directory: add it ({content})"
            )
    quarantine = LandingQuarantine()
    recordings = read_kaldi_table(source / "wav.scp", quarantine)
    for recording, entry in recordings.items():
        if entry.endswith("|") or entry.startswith("|"):
            raise ValueError(
                f"{source / 'wav.scp'}: recording {recording} is a piped command ({entry!r}), "
                "not a file: the importer runs no commands; write the audio to files and list "
                "their paths"
            )
    texts = read_kaldi_table(source / "text", quarantine, value_required=False)
    speakers = read_kaldi_table(source / "utt2spk", quarantine)
    utterances: list[Utterance] = []
    if (source / "segments").is_file():
        segments = read_kaldi_table(source / "segments", quarantine)
        for uid, value in segments.items():
            fields = value.split()
            try:
                recording, start, end = fields[0], float(fields[1]), float(fields[2])
            except (IndexError, ValueError):
                quarantine.add(uid, f"kaldi: bad line (segments: {value!r} is not REC START END)")
                continue
            if recording not in recordings:
                quarantine.add(uid, f"audio missing (recording {recording} is not in wav.scp)")
                continue
            audio = kaldi_audio_path(source, recordings[recording])
            utterances.append(
                Utterance(
                    uid,
                    audio,
                    texts.get(uid),
                    speakers.get(uid),
                    language,
                    start=start,
                    end=None if end < 0 else end,
                )
            )
    else:
        segments = {}
        for uid, entry in recordings.items():
            audio = kaldi_audio_path(source, entry)
            utterances.append(Utterance(uid, audio, texts.get(uid), speakers.get(uid), language))
    listed = segments or recordings
    for uid in texts:
        if uid not in listed:
            where = "segments" if segments else "wav.scp"
            quarantine.add(uid, f"audio missing (utterance {uid} is not in {where})")
    return land_utterances(
        utterances,
        quarantine,
        source=source,
        dest=dest,
        format_name="kaldi",
        rate=rate,
        fix="fix the audio files wav.scp lists and the text and utt2spk entries, then land again",
    )


# --- LibriSpeech ----------------------------------------------------------------------------


def land_librispeech(
    source: Path,
    dest: Path,
    *,
    ds: str,
    language: str | None = "en",
    rate: int = SAMPLE_RATE,
) -> Mapping[str, int]:
    """Land the LibriSpeech layout: every ``*.trans.txt`` under ``source`` with the FLAC files
    beside it; audio files beside a transcript file that it has no line for are quarantined."""
    check_landing(dest, ds)
    transcript_files = sorted(source.rglob("*.trans.txt"))
    if not transcript_files:
        raise ValueError(
            f"{source}: no *.trans.txt under it: point at a LibriSpeech folder "
            "(SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt beside the FLAC files)"
        )
    quarantine = LandingQuarantine()
    utterances: list[Utterance] = []
    for transcript_file in transcript_files:
        chapter = transcript_file.parent
        described: set[str] = set()
        for number, line in enumerate(text_lines(transcript_file), 1):
            if not line.strip():
                continue
            uid, _, text = line.strip().partition(" ")
            described.add(uid)
            speaker = uid.split("-")[0] if "-" in uid else None
            if speaker is None:
                where = f"{transcript_file.name} line {number}"
                quarantine.add(uid, f"librispeech: bad id ({where}: not SPEAKER-CHAPTER-N)")
                continue
            utterances.append(Utterance(uid, audio_beside(chapter, uid), text, speaker, language))
        for audio in sorted(chapter.iterdir()):
            if audio.suffix.lower() in AUDIO_SUFFIXES and audio.stem not in described:
                quarantine.add(audio.stem, f"transcript missing (not in {transcript_file.name})")
    return land_utterances(
        utterances,
        quarantine,
        source=source,
        dest=dest,
        format_name="librispeech",
        rate=rate,
        fix="fix the FLAC files and the *.trans.txt lines, then land again",
    )


# --- Common Voice ---------------------------------------------------------------------------

COMMON_VOICE_TSVS = ("validated.tsv", "train.tsv")
COMMON_VOICE_COLUMNS = ("client_id", "path", "sentence")


def common_voice_tsv(source: Path) -> Path:
    if source.is_file():
        return source
    for name in COMMON_VOICE_TSVS:
        if (source / name).is_file():
            return source / name
    found = sorted(p.name for p in source.glob("*.tsv")) if source.is_dir() else []
    raise ValueError(
        f"{source}: no {' or '.join(COMMON_VOICE_TSVS)} here (TSVs found: {found or 'none'}): "
        "pass the Common Voice TSV file itself"
    )


def land_common_voice(
    source: Path,
    dest: Path,
    *,
    ds: str,
    language: str | None = None,
    rate: int = SAMPLE_RATE,
) -> Mapping[str, int]:
    """Land a Common Voice TSV and its ``clips/``; the language is a row's ``locale``, else
    ``language``."""
    check_landing(dest, ds)
    tsv = common_voice_tsv(source)
    clips = tsv.parent / "clips"
    quarantine = LandingQuarantine()
    utterances: list[Utterance] = []
    # No quoting: Common Voice sentences hold unbalanced quotes, and its TSVs quote nothing.
    rows = csv.DictReader(text_lines(tsv), delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = [c for c in COMMON_VOICE_COLUMNS if c not in (rows.fieldnames or [])]
    if missing:
        raise ValueError(
            f"{tsv}: columns {missing} missing (header: {rows.fieldnames}): land a Common "
            f"Voice TSV with {list(COMMON_VOICE_COLUMNS)}"
        )
    for row in rows:
        clip = (row.get("path") or "").strip()
        where = f"{tsv.name} line {rows.line_num}"
        if None in row or None in row.values():
            quarantine.add(where, "common voice: bad line (not as many fields as the header)")
            continue
        if not clip:
            quarantine.add(where, "common voice: bad line (no path)")
            continue
        utterances.append(
            Utterance(
                Path(clip).stem,
                clips / clip,
                row["sentence"],
                row["client_id"],
                (row.get("locale") or "").strip() or language,
            )
        )
    return land_utterances(
        utterances,
        quarantine,
        source=source,
        dest=dest,
        format_name="common_voice",
        rate=rate,
        fix="fix the clips and the TSV rows, then land again",
    )


# --- the JSON lines manifest ----------------------------------------------------------------


def land_speech_jsonl(
    source: Path,
    dest: Path,
    *,
    ds: str,
    language: str | None = None,
    rate: int = SAMPLE_RATE,
) -> Mapping[str, int]:
    """Land ``wav/`` + ``transcripts.jsonl`` (``source`` is the folder or the manifest file);
    audio in ``wav/`` that no line names is quarantined as transcript missing."""
    check_landing(dest, ds)
    manifest = source if source.is_file() else source / TRANSCRIPTS_FILE
    if not manifest.is_file():
        raise ValueError(
            f"{source}: no {TRANSCRIPTS_FILE}: point at the folder holding it and wav/ "
            "(one JSON object per line: utterance_id, text, language, voice)"
        )
    folder = manifest.parent
    quarantine = LandingQuarantine()
    utterances: list[Utterance] = []
    for where, record in json_records(manifest, quarantine, "manifest"):
        if not isinstance(record.get("utterance_id"), str):
            quarantine.add(where, "manifest: bad line (no utterance_id string)")
            continue
        uid = record["utterance_id"]
        named = record.get("audio")
        audio = folder / named if isinstance(named, str) else folder / WAV_FOLDER / f"{uid}.wav"
        text, speaker = record.get("text"), record.get("voice") or record.get("speaker")
        tag = record.get("language")
        utterances.append(
            Utterance(
                uid,
                audio,
                text if isinstance(text, str) else None,
                speaker if isinstance(speaker, str) else None,
                tag if isinstance(tag, str) and tag else language,
            )
        )
    named_files = {u.audio.resolve() for u in utterances}
    wav_folder = folder / WAV_FOLDER
    if wav_folder.is_dir():
        for audio in sorted(wav_folder.iterdir()):
            if audio.is_file() and audio.resolve() not in named_files:
                quarantine.add(audio.stem, f"transcript missing (no line names {audio.name})")
    return land_utterances(
        utterances,
        quarantine,
        source=source,
        dest=dest,
        format_name="jsonl",
        rate=rate,
        fix="fix the audio files and the manifest lines, then land again",
    )


SpeechImporter = Callable[..., Mapping[str, int]]
SPEECH_FORMATS: dict[str, SpeechImporter] = {
    "kaldi": land_kaldi,
    "librispeech": land_librispeech,
    "common_voice": land_common_voice,
    "jsonl": land_speech_jsonl,
}
"""The speech importers by format name."""
