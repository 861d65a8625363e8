"""Character and word error rates with the edit operations behind them (for confusion summaries)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class EditCounts:
    """Levenshtein alignment totals over a set of utterances."""

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    reference_length: int = 0
    confusions: Counter[tuple[str, str]] = field(default_factory=Counter)
    """``(reference, hypothesis)`` token pairs; ``""`` on one side is a deletion/insertion."""

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        return self.errors / max(self.reference_length, 1)

    def add(self, other: EditCounts) -> None:
        self.substitutions += other.substitutions
        self.deletions += other.deletions
        self.insertions += other.insertions
        self.reference_length += other.reference_length
        self.confusions.update(other.confusions)

    def top_confusions(self, k: int = 10) -> list[dict[str, object]]:
        return [
            {"reference": ref, "hypothesis": hyp, "count": count}
            for (ref, hyp), count in self.confusions.most_common(k)
        ]


def align(reference: Sequence[str], hypothesis: Sequence[str]) -> EditCounts:
    """Minimum edit alignment of two token sequences, with the operations counted."""
    n, m = len(reference), len(hypothesis)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            same = reference[i - 1] == hypothesis[j - 1]
            cost[i][j] = min(
                cost[i - 1][j - 1] + (0 if same else 1), cost[i - 1][j] + 1, cost[i][j - 1] + 1
            )
    counts = EditCounts(reference_length=n)
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            same = reference[i - 1] == hypothesis[j - 1]
            if cost[i][j] == cost[i - 1][j - 1] + (0 if same else 1):
                if not same:
                    counts.substitutions += 1
                    counts.confusions[(reference[i - 1], hypothesis[j - 1])] += 1
                i, j = i - 1, j - 1
                continue
        if i > 0 and cost[i][j] == cost[i - 1][j] + 1:
            counts.deletions += 1
            counts.confusions[(reference[i - 1], "")] += 1
            i -= 1
        else:
            counts.insertions += 1
            counts.confusions[("", hypothesis[j - 1])] += 1
            j -= 1
    return counts


def _total(pairs: Iterable[tuple[Sequence[str], Sequence[str]]]) -> EditCounts:
    total = EditCounts()
    for reference, hypothesis in pairs:
        total.add(align(reference, hypothesis))
    return total


def character_errors(references: Sequence[str], hypotheses: Sequence[str]) -> EditCounts:
    """Edits over characters; spaces count as characters (word boundaries matter)."""
    return _total(zip(references, hypotheses, strict=True))


def word_errors(references: Sequence[str], hypotheses: Sequence[str]) -> EditCounts:
    """Edits over whitespace-separated words (a Mandarin phrase without spaces is one word)."""
    return _total((r.split(), h.split()) for r, h in zip(references, hypotheses, strict=True))


def cer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    return character_errors(references, hypotheses).rate


def wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    return word_errors(references, hypotheses).rate
