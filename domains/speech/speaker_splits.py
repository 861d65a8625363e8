"""Splits of recorded people's utterances by sentence and by speaker, never the same sentence in
train and test.

Two questions need two splits:

- **held-out sentences of seen speakers** (:func:`held_out_sentences`): each distinct sentence
  (the transcript after :func:`~domains.speech.audio_features.normalize_transcript`) goes to
  train or test by a stable hash, with every utterance of it, whoever speaks it; a test
  utterance whose speaker has nothing in train is dropped, so every test speaker was heard in
  training (speaker-dependent);
- **held-out speakers** (:func:`held_out_speakers`, :func:`leave_one_speaker_out`): the test
  speakers' utterances are the test split; the other speakers' utterances train, except those
  saying a sentence the test split holds, which are dropped (speaker- and text-independent).

The functions are pure: utterances in, utterance ids out, each dropped one with its reason.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from domains.speech.audio_features import normalize_transcript


@dataclass(frozen=True)
class SplitUtterance:
    utterance_id: str
    speaker: str
    text: str
    language: str


@dataclass(frozen=True)
class Split:
    train: tuple[str, ...]
    test: tuple[str, ...]
    dropped: dict[str, str] = field(default_factory=dict)
    """Utterance id -> why it is in neither split."""


def sentence_key(text: str) -> str:
    """What makes two transcripts the same sentence: their normalized text."""
    return normalize_transcript(text)


def _bucket(key: str, seed: str) -> float:
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32


def held_out_sentences(
    utterances: Iterable[SplitUtterance], *, test_share: float = 0.2, seed: str = ""
) -> Split:
    """Train and test by sentence (see the module docstring); ``test_share`` of the distinct
    sentences, about, are held out."""
    if not 0 < test_share < 1:
        raise ValueError(f"test_share must be in (0, 1), got {test_share}")
    items = list(utterances)
    side = {
        u.utterance_id: "test" if _bucket(sentence_key(u.text), seed) < test_share else "train"
        for u in items
    }
    trained = {u.speaker for u in items if side[u.utterance_id] == "train"}
    dropped = {
        u.utterance_id: f"speaker {u.speaker} has no training utterance"
        for u in items
        if side[u.utterance_id] == "test" and u.speaker not in trained
    }
    return Split(
        train=tuple(u.utterance_id for u in items if side[u.utterance_id] == "train"),
        test=tuple(
            u.utterance_id
            for u in items
            if side[u.utterance_id] == "test" and u.utterance_id not in dropped
        ),
        dropped=dropped,
    )


def held_out_speakers(utterances: Iterable[SplitUtterance], test_speakers: Iterable[str]) -> Split:
    """The test speakers' utterances as test, the others' as train less the sentences in test."""
    items = list(utterances)
    held = set(test_speakers)
    unknown = held - {u.speaker for u in items}
    if unknown:
        raise ValueError(
            f"no utterance of test speakers {sorted(unknown)}: name speakers the data has"
        )
    test = [u for u in items if u.speaker in held]
    test_sentences = {sentence_key(u.text) for u in test}
    train, dropped = [], {}
    for u in items:
        if u.speaker in held:
            continue
        if sentence_key(u.text) in test_sentences:
            dropped[u.utterance_id] = "sentence in the test split"
        else:
            train.append(u.utterance_id)
    return Split(tuple(train), tuple(u.utterance_id for u in test), dropped)


def leave_one_speaker_out(
    utterances: Iterable[SplitUtterance],
) -> dict[str, dict[str, Split]]:
    """``{language: {held-out speaker: split}}`` within each language that has two speakers or
    more (a language with one speaker has no held-out-speaker split)."""
    by_language: dict[str, list[SplitUtterance]] = defaultdict(list)
    for u in utterances:
        by_language[u.language].append(u)
    folds: dict[str, dict[str, Split]] = {}
    for language, items in sorted(by_language.items()):
        speakers = sorted({u.speaker for u in items})
        if len(speakers) >= 2:
            folds[language] = {s: held_out_speakers(items, [s]) for s in speakers}
    return folds


def held_out_speaker_choice(
    utterances: Iterable[SplitUtterance], *, share: float = 0.2
) -> dict[str, tuple[str, ...]]:
    """``{language: speakers}`` to hold out, in each language with two speakers or more: the
    speakers with the fewest utterances, fewest first, while together they hold at most ``share``
    of the language's utterances; always one at least, never the one with the most (a minor
    role before a lead, and a lead only where there is nothing smaller)."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for u in utterances:
        counts[u.language][u.speaker] += 1
    chosen: dict[str, tuple[str, ...]] = {}
    for language, per_speaker in sorted(counts.items()):
        if len(per_speaker) < 2:
            continue
        ordered = sorted(per_speaker, key=lambda s: (per_speaker[s], s))[:-1]
        total, held, taken = sum(per_speaker.values()), [ordered[0]], per_speaker[ordered[0]]
        for speaker in ordered[1:]:
            if taken + per_speaker[speaker] > share * total:
                break
            held.append(speaker)
            taken += per_speaker[speaker]
        chosen[language] = tuple(sorted(held))
    return chosen


@dataclass(frozen=True)
class SeenUnseenSplit:
    """Both questions on one set of utterances, for one model to answer: ``train``,
    ``test_seen`` (held-out sentences of speakers in ``train``) and ``test_unseen`` (the
    ``held_out`` speakers' utterances); no sentence of either test set is in ``train``."""

    train: tuple[str, ...]
    test_seen: tuple[str, ...]
    test_unseen: tuple[str, ...]
    held_out: dict[str, tuple[str, ...]]
    """Language -> its held-out speakers (:func:`held_out_speaker_choice`)."""
    dropped: dict[str, str] = field(default_factory=dict)


def seen_and_unseen(
    utterances: Iterable[SplitUtterance],
    *,
    test_share: float = 0.2,
    unseen_share: float = 0.2,
    seed: str = "",
) -> SeenUnseenSplit:
    """Held-out speakers first (:func:`held_out_speaker_choice` with ``unseen_share``, split by
    :func:`held_out_speakers`), then held-out sentences (:func:`held_out_sentences` with
    ``test_share``) of the speakers left."""
    items = list(utterances)
    held = held_out_speaker_choice(items, share=unseen_share)
    speakers = [s for names in held.values() for s in names]
    by_speaker = (
        held_out_speakers(items, speakers)
        if speakers
        else Split(tuple(u.utterance_id for u in items), ())
    )
    kept = set(by_speaker.train)
    by_sentence = held_out_sentences(
        [u for u in items if u.utterance_id in kept], test_share=test_share, seed=seed
    )
    return SeenUnseenSplit(
        train=by_sentence.train,
        test_seen=by_sentence.test,
        test_unseen=by_speaker.test,
        held_out=held,
        dropped={**by_speaker.dropped, **by_sentence.dropped},
    )
