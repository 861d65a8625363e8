"""People's recordings in ``cascade bench asr`` (:mod:`benchmarks.asr_path`).

- :func:`land_recordings`: the named speech sources read from Debian packages
  (:data:`RECORDING_SOURCES`, :mod:`jobs.speech_packages`) landed together and built into one
  corpus by the corpus job, then split by speaker and by sentence
  (:func:`domains.speech.speaker_splits.seen_and_unseen`): a training part, held-out sentences
  of the speakers in it (``test_seen``) and the held-out speakers (``test_unseen``: the
  smallest roles of each language with two speakers or more);
- :func:`with_recordings`: the benchmark's training corpus, the synthetic corpus plus that
  training part (linked, not copied);
- :func:`recordings_figures`: ``cer_seen_speakers``, ``cer_unseen_speakers_by_language`` (with
  the training minutes and speakers each language had) and ``human_train_minutes_by_language``;
- :func:`english_peer`: CMU PocketSphinx (the en-us model its wheel bundles) and the project's
  model on the same English test clips, WAV bytes in, text out: ``pocketsphinx_cer_en``,
  ``cer_en`` and each one's real-time factor. Both are scored after the same
  :func:`english_scoring` (the corpus normalization, then numbers spelled out as English
  words: the references keep digits as written and PocketSphinx's dictionary spells them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

RECORDING_SOURCES = ("asterisk_en", "fillets_cs", "fillets_nl")
"""The named speech sources of recorded people that ``bench asr`` lands."""
QUICK_CLIPS = 16
"""Clips per source with ``--quick`` (``CASCADE_BENCH_ASR_CLIPS`` overrides; unset without
``--quick``: every clip)."""
LANDING_DS = "2026-11-29"
"""The partition date the landing check asks for; nothing here is keyed on it."""
SPLIT_SEED = "bench-asr"
TEST_SHARE = 0.2
"""Share of each seen speaker's distinct sentences held out."""
UNSEEN_SHARE = 0.2
"""Most of a language's utterances its held-out speakers may hold."""
PARTS = ("train", "test_seen", "test_unseen")
SPEAKER_NOTE = (
    "one model, no fold per speaker: each language's smallest roles are held out "
    "(at most a fifth of its clips, never its largest voice); with one or two lead voices a "
    "language, this is the data's limit, not a goal"
)


@dataclass
class Recordings:
    """The recordings' corpus rows with their ``part`` (one of :data:`PARTS` or ``dropped``)."""

    landing: Path
    corpus: Path
    frame: pd.DataFrame
    report: dict[str, Any]

    def part(self, name: str, n_mels: int) -> pd.DataFrame:
        """The rows of part ``name`` with float32 features in column ``x``."""
        from domains.speech.audio_features import features_of

        rows = self.frame[self.frame["part"] == name]
        return rows.assign(x=[features_of(row, n_mels) for _, row in rows.iterrows()])


def recording_clips(quick: bool) -> int | None:
    """Clips per source: ``CASCADE_BENCH_ASR_CLIPS``, else :data:`QUICK_CLIPS` with ``--quick``,
    else all (None)."""
    from cascade.config import load_settings

    given = load_settings().bench.asr_clips
    return given if given is not None else (QUICK_CLIPS if quick else None)


def _split_rows(frame: pd.DataFrame) -> tuple[pd.Series, dict[str, Any]]:
    """Each row's part, and what the split held out."""
    from domains.speech.audio_features import language_group
    from domains.speech.speaker_splits import SplitUtterance, seen_and_unseen

    items = [
        SplitUtterance(uid, voice, text, language_group(language))
        for uid, voice, text, language in zip(
            frame["utterance_id"], frame["voice"], frame["transcript"], frame["language"],
            strict=True,
        )
    ]  # fmt: skip
    split = seen_and_unseen(
        items, test_share=TEST_SHARE, unseen_share=UNSEEN_SHARE, seed=SPLIT_SEED
    )
    part = {uid: "train" for uid in split.train}
    part.update({uid: "test_seen" for uid in split.test_seen})
    part.update({uid: "test_unseen" for uid in split.test_unseen})
    reasons: dict[str, int] = {}
    for reason in split.dropped.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    held = {language: list(speakers) for language, speakers in split.held_out.items()}
    return frame["utterance_id"].map(part).fillna("dropped"), {
        "held_out_speakers": held,
        "dropped_by_reason": reasons,
    }


def land_recordings(
    spark: Any, work: Path, clips: int | None
) -> tuple[Recordings | None, str | None]:
    """Land :data:`RECORDING_SOURCES` (``clips`` each, None: all), build their corpus and split
    it; ``(None, why not)`` when no source's packages are installed."""
    from jobs.audio_corpus import build_corpus
    from jobs.speech_packages import PACKAGE_SOURCES

    landing = work / "landing-recordings"
    (landing / "wav").mkdir(parents=True)
    lines: list[str] = []
    landed: dict[str, dict[str, int]] = {}
    missing: dict[str, str] = {}
    for name in RECORDING_SOURCES:
        dest = work / f"landing-{name}"
        dest.mkdir()
        try:
            landed[name] = dict(PACKAGE_SOURCES[name](dest, ds=LANDING_DS, limit=clips))
        except FileNotFoundError as exc:
            missing[name] = str(exc)
            continue
        for line in (dest / "transcripts.jsonl").read_text(encoding="utf-8").splitlines():
            uid = json.loads(line)["utterance_id"]
            os.link(dest / "wav" / f"{uid}.wav", landing / "wav" / f"{uid}.wav")
            lines.append(line)
    if not lines:
        return None, "no recordings: " + "; ".join(f"{k}: {v}" for k, v in missing.items())
    (landing / "transcripts.jsonl").write_text("".join(f"{line}\n" for line in lines), "utf-8")
    corpus = work / "corpus-recordings"
    summary = build_corpus(spark, landing, corpus)
    shards = sorted((corpus / "shards").glob("split=*"))
    if not summary["utterances"] or not shards:
        return None, f"no recordings: the corpus job kept none ({summary['quarantine_reasons']})"
    frame = pd.concat([pd.read_parquet(folder) for folder in shards], ignore_index=True)
    frame = frame.sort_values("utterance_id", kind="stable").reset_index(drop=True)
    parts, split_report = _split_rows(frame)
    frame = frame.assign(part=parts)
    report = {
        "sources": landed,
        "missing": missing,
        "clips_per_source": clips,
        "utterances": len(frame),
        "quarantined": summary["quarantined"],
        "quarantine_reasons": summary["quarantine_reasons"],
        "parts": {p: int((frame["part"] == p).sum()) for p in (*PARTS, "dropped")},
        **split_report,
        "split": {"test_share": TEST_SHARE, "unseen_share": UNSEEN_SHARE, "seed": SPLIT_SEED},
    }
    return Recordings(landing, corpus, frame, report), None


def with_recordings(corpus: Path, recordings: Recordings, work: Path) -> Path:
    """A copy of ``corpus`` (hard links) whose training split also holds the recordings'
    training part; its ``summary.json`` counts them (``recordings``)."""
    out = work / "corpus-train"
    shutil.copytree(corpus, out, copy_function=os.link)
    train = recordings.frame[recordings.frame["part"] == "train"].drop(columns=["part"])
    if len(train):
        folder = out / "shards" / "split=train"
        folder.mkdir(parents=True, exist_ok=True)
        train.to_parquet(folder / "recordings.parquet", index=False)
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary_file.unlink()  # a link to the synthetic corpus's file: write a new one
    summary["utterances"] = summary.get("utterances", 0) + len(train)
    summary.setdefault("splits", {})["train"] = summary["splits"].get("train", 0) + len(train)
    summary["recordings"] = {"train_utterances": len(train), "corpus": str(recordings.corpus)}
    summary_file.write_text(json.dumps(summary, indent=2))
    return out


def _by_language(rates: dict[str, Any], key: str = "hypotheses") -> dict[str, dict[str, Any]]:
    from domains.speech.audio_features import language_group
    from models.asr.metrics import cer

    pairs: dict[str, tuple[list[str], list[str]]] = {}
    for ref, hyp, language in zip(rates["references"], rates[key], rates["languages"], strict=True):
        refs, hyps = pairs.setdefault(language_group(language), ([], []))
        refs.append(ref)
        hyps.append(hyp)
    return {
        group: {"cer": cer(refs, hyps), "utterances": len(refs)}
        for group, (refs, hyps) in sorted(pairs.items())
    }


def recordings_figures(
    recordings: Recordings,
    rates: dict[str, dict[str, Any] | None],
    *,
    trained_on_people: bool | None,
) -> dict[str, Any]:
    """The result's keys from the fp32 (``rates["test_seen"]``, ``rates["test_unseen"]``) and
    int8 (``rates["test_seen_int8"]``) error rates of :func:`benchmarks.asr_path.error_rates`.
    ``trained_on_people``: whether the training config trains on people (None: a given model,
    whose training data is unknown here)."""
    from domains.speech.audio_features import language_group

    frame = recordings.frame.assign(
        group=[language_group(lang) for lang in recordings.frame["language"]]
    )
    train = frame[frame["part"] == "train"]
    minutes = {g: float(rows["seconds"].sum()) / 60 for g, rows in train.groupby("group")}
    speakers = {g: int(rows["voice"].nunique()) for g, rows in train.groupby("group")}
    seen, unseen = rates.get("test_seen"), rates.get("test_unseen")
    held = recordings.report["held_out_speakers"]
    per_language: dict[str, Any] = {}
    unseen_rates = _by_language(unseen) if unseen else {}
    for group in sorted(frame["group"].unique()):
        entry: dict[str, Any] = {
            "train_minutes": minutes.get(group, 0.0),
            "train_speakers": speakers.get(group, 0),
        }
        if group in unseen_rates:
            entry.update(unseen_rates[group], test_speakers=held.get(group, []))
        else:
            entry["cer"] = None
            entry["reason"] = (
                "one speaker: nobody to hold out"
                if group not in held
                else "no held-out utterance long enough to decode"
            )
        per_language[group] = entry
    int8 = rates.get("test_seen_int8")
    result: dict[str, Any] = {
        "cer_seen_speakers": seen["cer"] if seen and seen["utterances"] else None,
        "cer_seen_speakers_int8": int8["cer"] if int8 and int8["utterances"] else None,
        "cer_seen_speakers_by_language": {
            g: v["cer"] for g, v in (_by_language(seen) if seen else {}).items()
        },
        "cer_seen_speakers_greedy_by_language": {
            g: v["cer"]
            for g, v in (
                _by_language(seen, "greedy_hypotheses")
                if seen and "greedy_hypotheses" in seen
                else {}
            ).items()
        },
        "seen_speakers_decoding": seen.get("decoding") if seen else None,
        "seen_speakers_utterances": seen["utterances"] if seen else 0,
        "cer_unseen_speakers_by_language": per_language,
        "unseen_speakers_note": SPEAKER_NOTE,
        "human_train_minutes_by_language": minutes,
        "human_train_speakers_by_language": speakers,
        "human_trained": trained_on_people,
        "recordings": recordings.report,
    }
    if trained_on_people is False:
        result["human_trained_reason"] = (
            "the training config trains on synthetic voices only (train_people=False): the "
            "seen speakers' training part was in its corpus and left out"
        )
    elif trained_on_people is None:
        result["human_trained_reason"] = (
            "a given model (--model): seen speakers are seen only if it trained on this split"
        )
    return result


SEEN_MINUTES_FOR_GOAL = 60.0
"""Training minutes a language needs for its seen-speaker CER to count towards the goal."""


def seen_speakers_median(figures: dict[str, Any]) -> dict[str, Any]:
    """``cer_seen_speakers_median``: the median of ``cer_seen_speakers_by_language`` over the
    languages with at least :data:`SEEN_MINUTES_FOR_GOAL` minutes of recorded speech in
    training (``cer_seen_speakers_goal_languages`` names them); null, with
    ``cer_seen_speakers_median_reason``, when no language has that much."""
    by_language = figures.get("cer_seen_speakers_by_language") or {}
    minutes = figures.get("human_train_minutes_by_language") or {}
    counted = sorted(
        g
        for g, rate in by_language.items()
        if rate is not None and minutes.get(g, 0.0) >= SEEN_MINUTES_FOR_GOAL
    )
    result: dict[str, Any] = {
        "cer_seen_speakers_goal_languages": counted,
        "cer_seen_speakers_median": (
            float(np.median([by_language[g] for g in counted])) if counted else None
        ),
    }
    if not counted:
        trained = {g: round(m, 1) for g, m in sorted(minutes.items())}
        result["cer_seen_speakers_median_reason"] = (
            f"no language had {SEEN_MINUTES_FOR_GOAL:g} minutes of recorded speech in training "
            f"(minutes: {trained or 'none'})"
        )
    return result


# --- the English peer -----------------------------------------------------------------------

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))


def cardinal(number: int) -> str:
    """``number`` (>= 0) in English words: 1234 -> ``one thousand two hundred thirty four``."""
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
    for size, name in _SCALES:
        if number >= size:
            high, rest = divmod(number, size)
            return f"{cardinal(high)} {name}" + (f" {cardinal(rest)}" if rest else "")
    raise AssertionError(number)


def _spell(match: re.Match[str]) -> str:
    digits = match.group(0)
    if (digits.startswith("0") and len(digits) > 1) or len(digits) > 12:
        return " " + " ".join(_ONES[int(d)] for d in digits) + " "  # read digit by digit
    return f" {cardinal(int(digits))} "


def english_scoring(text: str) -> str:
    """What both systems' English transcripts and their references are scored as: the corpus
    normalization, then each run of digits as English words."""
    from domains.speech.audio_features import normalize_transcript

    return " ".join(re.sub(r"\d+", _spell, normalize_transcript(text)).split())


@dataclass(frozen=True)
class EnglishClip:
    source: str
    wav: bytes
    reference: str
    seconds: float


def english_clips(
    parts: Sequence[tuple[str, pd.DataFrame, Path]], min_frames: int
) -> list[EnglishClip]:
    """The English utterances of each ``(source, frame, landing)`` with at least ``min_frames``
    feature frames (what the model can decode), their WAV files from the landing."""
    from domains.speech.audio_features import language_group

    clips = []
    for source, frame, landing in parts:
        for _, row in frame.iterrows():
            if language_group(row["language"]) != "english" or len(row["x"]) < min_frames:
                continue
            wav = (landing / "wav" / f"{row['utterance_id']}.wav").read_bytes()
            clips.append(EnglishClip(source, wav, row["transcript"], float(row["seconds"])))
    return clips


def pocketsphinx_transcriber() -> Callable[[bytes], str]:
    """WAV bytes -> PocketSphinx's text (the wheel's en-us acoustic model, language model and
    dictionary, at 16 kHz); ImportError when the wheel is missing."""
    from pocketsphinx import Decoder

    from domains.speech.audio_features import SAMPLE_RATE, decode_wav, resample

    decoder = Decoder(loglevel="FATAL", samprate=SAMPLE_RATE)

    def transcribe(wav: bytes) -> str:
        samples, rate = decode_wav(wav)
        audio = resample(samples, rate) if rate != SAMPLE_RATE else samples
        pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype("<i2")
        decoder.start_utt()
        decoder.process_raw(pcm.tobytes(), full_utt=True)
        decoder.end_utt()
        hypothesis = decoder.hyp()
        return hypothesis.hypstr if hypothesis is not None else ""

    return transcribe


def english_peer(
    clips: Sequence[EnglishClip], model: Callable[[bytes], str], model_variant: str
) -> dict[str, Any]:
    """PocketSphinx and ``model`` (WAV bytes -> text) on ``clips``, each clip by both in turn
    (which goes first alternates): CER/WER, per source, and real-time factors (seconds of
    transcription over seconds of audio, WAV decoding included for both)."""
    from models.asr.metrics import cer, wer

    empty: dict[str, Any] = {
        "pocketsphinx_cer_en": None,
        "cer_en": None,
        "rtf_pocketsphinx_en": None,
        "rtf_en_end_to_end": None,
        "en_utterances": len(clips),
        "en_model_variant": model_variant,
    }
    if not clips:
        return empty | {"pocketsphinx_reason": "no English test clip long enough to decode"}
    try:
        sphinx = pocketsphinx_transcriber()
    except ImportError as exc:
        return empty | {
            "pocketsphinx_reason": f"pocketsphinx is not installed ({exc}): `make venv`"
        }
    systems = {"pocketsphinx": sphinx, "model": model}
    texts: dict[str, list[str]] = {name: [] for name in systems}
    seconds: dict[str, float] = dict.fromkeys(systems, 0.0)
    for index, clip in enumerate(clips):
        order = list(systems) if index % 2 == 0 else list(reversed(systems))
        for name in order:
            began = time.perf_counter()
            texts[name].append(systems[name](clip.wav))
            seconds[name] += time.perf_counter() - began
    refs = [english_scoring(c.reference) for c in clips]
    hyps = {name: [english_scoring(t) for t in texts[name]] for name in systems}
    audio_s = sum(c.seconds for c in clips)
    by_source: dict[str, Any] = {}
    for source in sorted({c.source for c in clips}):
        picked = [i for i, c in enumerate(clips) if c.source == source]
        by_source[source] = {"utterances": len(picked)} | {
            f"{name}_cer": cer([refs[i] for i in picked], [hyps[name][i] for i in picked])
            for name in systems
        }
    sphinx_cer, model_cer = cer(refs, hyps["pocketsphinx"]), cer(refs, hyps["model"])
    return empty | {
        "pocketsphinx_cer_en": sphinx_cer,
        "pocketsphinx_wer_en": wer(refs, hyps["pocketsphinx"]),
        "cer_en": model_cer,
        "wer_en": wer(refs, hyps["model"]),
        "cer_en_over_pocketsphinx": model_cer / sphinx_cer if sphinx_cer else None,
        "rtf_pocketsphinx_en": seconds["pocketsphinx"] / audio_s,
        "rtf_en_end_to_end": seconds["model"] / audio_s,
        "en_audio_s": audio_s,
        "en_by_source": by_source,
        "en_scoring": "normalized transcripts, digits spelled as English cardinals, on both sides",
        "en_examples": [
            {"reference": r, "pocketsphinx": p, "model": m}
            for r, p, m in zip(refs, hyps["pocketsphinx"], hyps["model"], strict=True)
        ][:10],
    }


def people_figures(
    artifact: Any,
    quantized: Any,
    variants: dict[str, Callable[..., Any]],
    rates_of: Callable[[pd.DataFrame], tuple[dict[str, Any], dict[str, Any] | None]],
    recordings: Recordings | None,
    recordings_reason: str | None,
    trained_on_people: bool | None,
    english_parts: list[tuple[str, pd.DataFrame, Path]],
) -> dict[str, Any]:
    """The recordings' seen and unseen speaker figures (:mod:`benchmarks.asr_people`) and the
    English peer on the English test clips: the synthetic test split's, Tux Paint's and the
    recordings' held-out ones (whose frames are appended to ``english_parts``)."""
    from domains.speech.audio_features import decode_wav, log_mel, resample
    from models.asr.compiled import MIN_FRAMES
    from models.asr.inference import transcribe

    figures: dict[str, Any] = {
        "cer_seen_speakers": None,
        "cer_unseen_speakers_by_language": None,
        "human_train_minutes_by_language": None,
        "recordings_reason": recordings_reason,
    }
    if recordings is not None:
        rates: dict[str, dict[str, Any] | None] = {}
        for part in ("test_seen", "test_unseen"):
            frame = recordings.part(part, artifact.n_mels)
            rates[part], int8_rates = rates_of(frame)
            rates[f"{part}_int8"] = int8_rates
            english_parts.append((f"recordings_{part}", frame, recordings.landing))
        figures.update(recordings_figures(recordings, rates, trained_on_people=trained_on_people))
    # The deployed model when there is one (the int8 package), else the eager fp32 model.
    int8_forward: Any = variants.get("int8")
    forward, used = (
        (int8_forward, quantized) if int8_forward is not None else (artifact.model, artifact)
    )
    language = "english" if "english" in used.alphabet.languages else None

    def model_text(wav: bytes) -> str:
        samples, rate = decode_wav(wav)
        features = log_mel(resample(samples, rate), used.n_mels)
        return transcribe(
            forward,
            used.alphabet,
            features,
            language=language,
            language_models=used.language_models,
        ).text

    variant = "int8 package" if int8_forward is not None else "eager fp32 (no compile)"
    import torch

    with torch.inference_mode():
        figures.update(english_peer(english_clips(english_parts, MIN_FRAMES), model_text, variant))
    return figures
