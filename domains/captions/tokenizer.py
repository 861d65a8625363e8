"""Character tokenizer with byte fallback for the image-text corpus, captions in any language.

Fitted from the corpus's training captions by the corpus job (:meth:`CaptionTokenizer.fit` /
:meth:`~CaptionTokenizer.from_counts`: nothing about a language is written down here), saved as
JSON (``tokenizer.json``) beside the corpus and beside every model trained on it; evaluation
and the registered model read captions with the model's own copy
(:func:`models.multimodal.stored.stored_tokenizer`), nothing downloaded. Ids: four specials,
then the 256 UTF-8 bytes, then the most frequent characters. A character not in the vocabulary
(one no training caption held often enough) is spelled as its UTF-8 bytes, so every string in
any script round-trips exactly; characters common enough in training (Chinese, Czech letters
with diacritics, ...) get one id each instead of two to four byte ids.
:meth:`CaptionTokenizer.unseen` counts the characters that fall back to bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = range(len(SPECIALS))
BYTE_OFFSET = len(SPECIALS)
FIRST_CHAR_ID = BYTE_OFFSET + 256


@dataclass(frozen=True)
class CaptionTokenizer:
    chars: tuple[str, ...]
    """Characters with their own id, id = ``FIRST_CHAR_ID + position``."""
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {c: FIRST_CHAR_ID + i for i, c in enumerate(self.chars)})

    @property
    def vocab_size(self) -> int:
        return FIRST_CHAR_ID + len(self.chars)

    @classmethod
    def fit(
        cls, captions: Iterable[str], *, max_chars: int = 4000, min_count: int = 2
    ) -> CaptionTokenizer:
        """The ``max_chars`` most frequent characters seen at least ``min_count`` times."""
        return cls.from_counts(
            Counter(c for caption in captions for c in caption),
            max_chars=max_chars,
            min_count=min_count,
        )

    @classmethod
    def from_counts(
        cls, counts: dict[str, int], *, max_chars: int = 4000, min_count: int = 2
    ) -> CaptionTokenizer:
        """From character counts (computed on Spark for a large corpus)."""
        ranked = sorted(
            (c for c, n in counts.items() if n >= min_count), key=lambda c: (-counts[c], c)
        )
        return cls(chars=tuple(ranked[:max_chars]))

    def unseen(self, text: str) -> int:
        """Characters of ``text`` without an id of their own (spelled as their bytes)."""
        return sum(c not in self._index for c in text)

    def encode(self, text: str) -> list[int]:
        """``[BOS, ids..., EOS]``."""
        ids = [BOS]
        for c in text:
            known = self._index.get(c)
            if known is not None:
                ids.append(known)
            else:
                ids.extend(BYTE_OFFSET + b for b in c.encode("utf-8"))
        ids.append(EOS)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        out: list[str] = []
        pending = bytearray()
        for i in ids:
            if BYTE_OFFSET <= i < FIRST_CHAR_ID:
                pending.append(i - BYTE_OFFSET)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if i >= FIRST_CHAR_ID:
                out.append(self.chars[i - FIRST_CHAR_ID])
            elif i == UNK:
                out.append("\ufffd")
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def save(self, path: Path) -> None:
        payload = {"kind": "char+byte", "specials": list(SPECIALS), "chars": list(self.chars)}
        path.write_text(json.dumps(payload, ensure_ascii=False, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> CaptionTokenizer:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if payload.get("kind") != "char+byte" or payload.get("specials") != list(SPECIALS):
            raise ValueError(f"{path} is not a caption tokenizer file")
        return cls(chars=tuple(payload["chars"]))
