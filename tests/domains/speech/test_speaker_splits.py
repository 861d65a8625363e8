"""Splits by sentence and by speaker: no sentence on both sides, every test speaker seen in
training for held-out sentences, none for held-out speakers."""

from __future__ import annotations

import pytest

from domains.speech.speaker_splits import (
    SplitUtterance,
    held_out_sentences,
    held_out_speaker_choice,
    held_out_speakers,
    leave_one_speaker_out,
    seen_and_unseen,
    sentence_key,
)

SENTENCES = [f"Sentence number {n}, please." for n in range(40)]


def corpus() -> list[SplitUtterance]:
    items = []
    for speaker in ("small", "big"):
        for n, text in enumerate(SENTENCES):
            # the two leads say the same sentences, written differently
            written = text.upper() if speaker == "big" else text
            items.append(SplitUtterance(f"{speaker}-{n}", speaker, written, "cs"))
    items.append(SplitUtterance("parrot-0", "parrot", "Only the parrot says this.", "cs"))
    items.append(SplitUtterance("allison-0", "allison", SENTENCES[0], "en"))
    return items


def _keys(items: list[SplitUtterance], ids: tuple[str, ...]) -> set[str]:
    chosen = set(ids)
    return {sentence_key(u.text) for u in items if u.utterance_id in chosen}


def test_held_out_sentences_never_share_a_sentence_and_test_only_seen_speakers() -> None:
    items = corpus()
    split = held_out_sentences(items, test_share=0.3, seed="s")
    assert split.test and split.train
    assert not _keys(items, split.train) & _keys(items, split.test)
    speaker = {u.utterance_id: u.speaker for u in items}
    trained = {speaker[i] for i in split.train}
    assert {speaker[i] for i in split.test} <= trained
    # everything is somewhere, once
    placed = [*split.train, *split.test, *split.dropped]
    assert sorted(placed) == sorted(u.utterance_id for u in items)
    # a speaker whose only sentence went to test is dropped, not tested unseen
    for uid, reason in split.dropped.items():
        assert speaker[uid] not in trained and reason.startswith("speaker ")
    # stable, and the seed changes it
    assert held_out_sentences(items, test_share=0.3, seed="s") == split
    assert held_out_sentences(items, test_share=0.3, seed="t").test != split.test
    with pytest.raises(ValueError, match="test_share"):
        held_out_sentences(items, test_share=1.0)


def test_held_out_speakers_drop_training_utterances_of_test_sentences() -> None:
    items = corpus()
    split = held_out_speakers(items, ["big"])
    assert set(split.test) == {f"big-{n}" for n in range(40)}
    # the small fish says the same sentences: all dropped from train
    assert set(split.dropped) == {f"small-{n}" for n in range(40)} | {"allison-0"}
    assert set(split.train) == {"parrot-0"}
    assert not _keys(items, split.train) & _keys(items, split.test)
    with pytest.raises(ValueError, match="no utterance of test speakers"):
        held_out_speakers(items, ["nobody"])


def test_leave_one_speaker_out_per_language_with_two_speakers_or_more() -> None:
    folds = leave_one_speaker_out(corpus())
    assert set(folds) == {"cs"}  # English has one speaker
    assert set(folds["cs"]) == {"small", "big", "parrot"}
    parrot = folds["cs"]["parrot"]
    assert parrot.test == ("parrot-0",) and len(parrot.train) == 80 and not parrot.dropped


def test_held_out_speakers_are_the_smallest_roles_never_the_largest() -> None:
    items = corpus() + [
        SplitUtterance(f"mouse-{n}", "mouse", f"Squeak {n}.", "cs") for n in range(3)
    ]
    chosen = held_out_speaker_choice(items, share=0.2)
    # parrot (1) and mouse (3) fit in a fifth of Czech's 84 utterances; a lead does not.
    assert chosen == {"cs": ("mouse", "parrot")}
    # Two speakers and a tiny share: the smaller one still, the larger never.
    pair = [u for u in items if u.speaker in ("small", "parrot")]
    assert held_out_speaker_choice(pair, share=0.01) == {"cs": ("parrot",)}
    with pytest.raises(ValueError, match="share must be in"):
        held_out_speaker_choice(items, share=1.0)


def test_one_split_answers_seen_and_unseen_speakers_without_shared_sentences() -> None:
    items = corpus()
    split = seen_and_unseen(items, test_share=0.3, unseen_share=0.2, seed="s")
    speaker = {u.utterance_id: u.speaker for u in items}
    assert split.held_out == {"cs": ("parrot",)}  # English has one speaker: none held out
    assert {speaker[i] for i in split.test_unseen} == {"parrot"}
    trained = {speaker[i] for i in split.train}
    assert split.test_seen and {speaker[i] for i in split.test_seen} <= trained
    assert "parrot" not in trained
    for test in (split.test_seen, split.test_unseen):
        assert not _keys(items, split.train) & _keys(items, test)
    every = set(split.train) | set(split.test_seen) | set(split.test_unseen) | set(split.dropped)
    assert every == {u.utterance_id for u in items}
