from __future__ import annotations

import pytest

from models.asr.metrics import align, cer, character_errors, wer


def test_edit_operations_are_counted_and_named() -> None:
    counts = align(list("kitten"), list("sitting"))
    assert (counts.substitutions, counts.deletions, counts.insertions) == (2, 0, 1)
    assert counts.confusions[("k", "s")] == 1 and counts.confusions[("", "g")] == 1
    assert align(list("abc"), list("ac")).deletions == 1


def test_rates_over_a_corpus() -> None:
    assert cer(["abcd", "ef"], ["abcd", "ef"]) == 0.0
    assert cer(["abcd", "ef"], ["abxd", ""]) == pytest.approx(3 / 6)
    assert wer(["the cat sat", "hi"], ["the bat sat", "hi there"]) == pytest.approx(2 / 4)
    top = character_errors(["aaa", "ab"], ["bbb", "bb"]).top_confusions(1)
    assert top == [{"reference": "a", "hypothesis": "b", "count": 4}]
    with pytest.raises(ValueError):
        cer(["a"], ["a", "b"])
