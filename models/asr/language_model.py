"""Character n-gram language models for CTC decoding, one per language the model knows.

An acoustic model trained on an hour of a language's speech spells what it hears; a character
n-gram of that language's training transcripts knows which spellings the language has. Decoding
with both is CTC prefix beam search where each character a prefix gains is scored by the
acoustic model and, weighted by ``alpha``, by the n-gram given the prefix's last
``order - 1`` characters, with a bonus of ``beta`` a character (the n-gram alone would favour
short transcripts), and the transcript's end scored by the n-gram's end symbol.

The n-gram is interpolated Witten-Bell: ``P(c | h) = (C(h c) + T(h) P(c | h')) / (C(h) + T(h))``
with ``T(h)`` the number of distinct characters seen after ``h``, ``h'`` the history one
character shorter, and a uniform distribution over the characters seen (plus the end symbol)
below the empty history. It needs only the counts, so what is stored is the counts.

On disk (:func:`dump_language_models`, beside the model file; the model file names it with its
digest, as it does its vocabulary) it is plain JSON, bounded on load: an order, the decoder's
weights, and per language a map from each n-gram string (of 1 to ``order`` characters, the
history padded with :data:`START`) to its count. Training fits them from its corpus; a model
stored before, or a corpus with more text, gets them with::

    cascade asr lm --model RUN_OR_MODEL_DIR --corpus CORPUS [--order N]
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.asr.model import BLANK, log_add
from models.asr.stored_json import parse_stored_json

START = "\x02"
"""Pads the history before a transcript's first character."""
END = "\x03"
"""The symbol after a transcript's last character."""
MAX_ORDER = 12
MAX_GRAMS = 4_000_000
"""Most n-gram entries a stored file may hold over all its languages (a bound on load)."""
MAX_FILE_BYTES = 256 * 1024 * 1024
FORMAT = "cascade-asr-char-ngram/1"
CACHE_ENTRIES = 200_000
"""Most ``(history, symbol)`` probabilities one n-gram keeps computed (a served model's n-grams
live as long as the server; the cache must not grow with its traffic)."""


@dataclass(frozen=True)
class DecoderWeights:
    """How the n-gram joins the acoustic model in beam search."""

    alpha: float = 0.5
    """Weight of the n-gram's log-probability of each character (and of the end)."""
    beta: float = 1.5
    """Bonus per emitted character, in log-probability."""
    beam: int = 16
    """Prefixes kept after each output frame."""
    token_floor: float = -12.0
    """Tokens of a frame below this log-probability are not tried (the blank always is)."""
    tokens_per_frame: int = 8
    """At most this many of a frame's most likely tokens are tried."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.alpha <= 10.0 and -10.0 <= self.beta <= 10.0):
            raise ValueError(f"alpha must be in [0, 10] and beta in [-10, 10], got {self}")
        if not (1 <= self.beam <= 256 and 1 <= self.tokens_per_frame <= 256):
            raise ValueError(f"beam and tokens_per_frame must be in [1, 256], got {self}")
        if not -100.0 <= self.token_floor <= 0.0:
            raise ValueError(f"token_floor must be in [-100, 0], got {self.token_floor}")


class CharNgram:
    """One language's interpolated Witten-Bell character n-gram (see the module docstring)."""

    def __init__(self, order: int, grams: Mapping[str, int]) -> None:
        if not 1 <= order <= MAX_ORDER:
            raise ValueError(f"order must be in [1, {MAX_ORDER}], got {order}")
        self.order = order
        self.grams = dict(grams)
        # Per history: total count and distinct following characters.
        totals: Counter[str] = Counter()
        types: Counter[str] = Counter()
        symbols: set[str] = set()
        for gram, count in self.grams.items():
            if not 1 <= len(gram) <= order or count < 1:
                raise ValueError(f"n-gram {gram!r} with count {count} is outside order {order}")
            totals[gram[:-1]] += count
            types[gram[:-1]] += 1
            if len(gram) == 1:
                symbols.add(gram)
        self._totals, self._types = totals, types
        self._uniform = 1.0 / (len(symbols | {END}) or 1)
        self._cache: dict[tuple[str, str], float] = {}

    @classmethod
    def fit(cls, texts: Iterable[str], order: int) -> CharNgram:
        grams: Counter[str] = Counter()
        for text in texts:
            padded = START * (order - 1) + text + END
            for end in range(order - 1, len(padded)):
                for k in range(order):
                    grams[padded[end - k : end + 1]] += 1
        return cls(order, grams)

    def history(self, text: str) -> str:
        """The history the next character of ``text`` is predicted from."""
        return (START * (self.order - 1) + text)[len(text) :] if self.order > 1 else ""

    def log_prob(self, history: str, symbol: str) -> float:
        """``log P(symbol | history)`` (``history`` as :meth:`history` makes it)."""
        key = (history, symbol)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        p = self._uniform
        for k in range(len(history) + 1):
            context = history[len(history) - k :]
            total = self._totals.get(context)
            if not total:
                break
            distinct = self._types[context]
            p = (self.grams.get(context + symbol, 0) + distinct * p) / (total + distinct)
        value = math.log(p)
        if len(self._cache) < CACHE_ENTRIES:
            self._cache[key] = value
        return value


@dataclass
class LanguageModels:
    """The n-grams of a model's languages (keyed as :attr:`Alphabet.languages` is) and the
    decoder weights chosen for them."""

    order: int
    models: dict[str, CharNgram]
    weights: DecoderWeights = field(default_factory=DecoderWeights)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(
        cls,
        texts: Iterable[str],
        languages: Iterable[str],
        *,
        order: int = 8,
        weights: DecoderWeights | None = None,
        meta: dict[str, Any] | None = None,
    ) -> LanguageModels:
        """One n-gram per language of ``languages`` (each text's language group) from
        ``texts``, the training transcripts."""
        from domains.speech.audio_features import language_group

        by_language: dict[str, list[str]] = {}
        for text, language in zip(texts, languages, strict=True):
            by_language.setdefault(language_group(language), []).append(text)
        models = {g: CharNgram.fit(v, order) for g, v in sorted(by_language.items())}
        counts = {g: len(v) for g, v in sorted(by_language.items())}
        return cls(
            order,
            models,
            weights or DecoderWeights(),
            {"transcripts_by_language": counts, **(meta or {})},
        )

    def only(self, languages: Iterable[str]) -> LanguageModels:
        """These models for ``languages`` only (a model's alphabet's)."""
        keep = set(languages)
        models = {g: m for g, m in self.models.items() if g in keep}
        return LanguageModels(self.order, models, self.weights, dict(self.meta))

    def get(self, language: str) -> CharNgram | None:
        return self.models.get(language)

    def to_json(self) -> dict[str, Any]:
        w = self.weights
        return {
            "format": FORMAT,
            "order": self.order,
            "weights": {
                "alpha": w.alpha,
                "beta": w.beta,
                "beam": w.beam,
                "token_floor": w.token_floor,
                "tokens_per_frame": w.tokens_per_frame,
            },
            "meta": self.meta,
            "languages": {g: dict(sorted(m.grams.items())) for g, m in self.models.items()},
        }

    @classmethod
    def from_json(cls, payload: Any, *, where: str = "language model") -> LanguageModels:
        """The models of a stored payload; ValueError naming ``where`` and what is wrong."""

        def bad(what: str) -> ValueError:
            return ValueError(f"{where}: {what}; write it again with `cascade asr lm`")

        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise bad(f"not a {FORMAT} file")
        order = payload.get("order")
        if not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
            raise bad(f"order must be an integer in [1, {MAX_ORDER}], got {order!r}")
        raw_weights = payload.get("weights")
        if not isinstance(raw_weights, dict) or set(raw_weights) - set(
            DecoderWeights.__dataclass_fields__
        ):
            raise bad("weights must be an object of DecoderWeights fields")
        try:
            weights = DecoderWeights(**raw_weights)
        except (TypeError, ValueError) as exc:
            raise bad(f"weights: {exc}") from None
        languages = payload.get("languages")
        if not isinstance(languages, dict):
            raise bad("languages must be an object of language -> n-gram counts")
        entries = sum(len(g) for g in languages.values() if isinstance(g, dict))
        if entries > MAX_GRAMS:
            raise bad(f"{entries} n-grams, more than the {MAX_GRAMS} a file may hold")
        models = {}
        for language, grams in languages.items():
            if not isinstance(language, str) or not 0 < len(language) <= 64:
                raise bad(f"language names must be 1-64 characters, got {language!r}")
            if not isinstance(grams, dict) or not all(
                isinstance(k, str) and type(v) is int for k, v in grams.items()
            ):
                raise bad(f"{language}: n-grams must map strings to integer counts")
            try:
                models[language] = CharNgram(order, grams)
            except ValueError as exc:
                raise bad(f"{language}: {exc}") from None
        meta = payload.get("meta") or {}
        if not isinstance(meta, dict):
            raise bad("meta must be an object")
        return cls(order, models, weights, meta)


def dump_language_models(models: LanguageModels) -> bytes:
    """The bytes of ``models``'s file (the model file keeps their digest)."""
    return (json.dumps(models.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def parse_language_models(data: bytes, *, where: str) -> LanguageModels:
    payload = parse_stored_json(data, where=where, max_bytes=MAX_FILE_BYTES)
    return LanguageModels.from_json(payload, where=where)


def lm_beam_decode(
    log_probs: torch.Tensor,
    characters: Sequence[str],
    ngram: CharNgram,
    weights: DecoderWeights,
) -> list[int]:
    """Token ids of the best transcript of one utterance's CTC log-probabilities ``[T, V]``
    (already restricted to its language, :func:`~models.asr.model.restrict`) under the acoustic
    model and ``ngram``; ``characters[i - 1]`` is token ``i``."""
    alpha, beta = weights.alpha, weights.beta
    frames = log_probs.float().cpu().numpy()
    k = min(weights.tokens_per_frame, frames.shape[1])
    # prefix -> [log p ending in blank, log p ending in a token, text]
    beams: dict[tuple[int, ...], tuple[float, float, str]] = {(): (0.0, -math.inf, "")}
    for frame in frames:
        top = np.argpartition(-frame, k - 1)[:k] if k < len(frame) else np.arange(len(frame))
        tokens = [int(t) for t in top if t != BLANK and frame[t] > weights.token_floor]
        blank = float(frame[BLANK])
        nxt: dict[tuple[int, ...], tuple[float, float, str]] = {}
        for prefix, (pb, pnb, text) in beams.items():
            total = log_add(pb, pnb)
            b, nb, _ = nxt.get(prefix, (-math.inf, -math.inf, text))
            nb_same = nb
            if prefix:  # the last token again, no blank between: the same prefix
                nb_same = log_add(nb, pnb + float(frame[prefix[-1]]))
            nxt[prefix] = (log_add(b, total + blank), nb_same, text)
            history = ngram.history(text)
            for token in tokens:
                char = characters[token - 1]
                lm = alpha * ngram.log_prob(history, char)
                gained = pb if prefix and token == prefix[-1] else total
                extended = (*prefix, token)
                eb, enb, _ = nxt.get(extended, (-math.inf, -math.inf, text + char))
                nxt[extended] = (eb, log_add(enb, gained + float(frame[token]) + lm), text + char)
        ranked = sorted(
            nxt.items(),
            key=lambda kv: log_add(kv[1][0], kv[1][1]) + beta * len(kv[0]),
            reverse=True,
        )
        beams = dict(ranked[: weights.beam])

    def final(item: tuple[tuple[int, ...], tuple[float, float, str]]) -> float:
        prefix, (pb, pnb, text) = item
        end = alpha * ngram.log_prob(ngram.history(text), END)
        return log_add(pb, pnb) + beta * len(prefix) + end

    return list(max(beams.items(), key=final)[0])


def corpus_transcripts(corpus: Path, split: str = "train") -> tuple[list[str], list[str]]:
    """The transcripts and languages of ``split`` of a corpus (``jobs.audio_corpus``), each
    utterance id once."""
    import pandas as pd

    files = sorted((Path(corpus) / "shards" / f"split={split}").glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{corpus} has no {split} shards (shards/split={split})")
    columns = ["utterance_id", "transcript", "language"]
    frame = pd.concat([pd.read_parquet(f, columns=columns) for f in files])
    frame = frame.drop_duplicates("utterance_id").sort_values("utterance_id", kind="stable")
    return list(frame["transcript"]), list(frame["language"])


def fit_corpus(
    corpus: Path, languages: Iterable[str] | None = None, *, order: int = 8
) -> LanguageModels:
    """The n-grams of ``corpus``'s training transcripts, for ``languages`` only when given (a
    model's alphabet's)."""
    texts, tagged = corpus_transcripts(corpus)
    models = LanguageModels.fit(texts, tagged, order=order, meta={"corpus": str(corpus)})
    return models if languages is None else models.only(languages)


def attach(model: Path, corpus: Path, *, order: int = 8) -> list[Path]:
    """Fit the n-grams of ``corpus``'s training transcripts and store them with the model at
    ``model`` (a model folder or file, or a training run's folder: its ``fp32`` and ``int8``
    models); returns the model files written. Each keeps its weights, alphabet and metadata;
    its digest changes, as its decoding does."""
    from models.asr.artifact import artifact_file, load_artifact, save_artifact

    model = Path(model)
    folders = [model / kind for kind in ("fp32", "int8") if artifact_file(model / kind).is_file()]
    targets = [artifact_file(f) for f in folders] or [artifact_file(model)]
    models = fit_corpus(corpus, order=order)
    written = []
    for target in targets:
        artifact = load_artifact(target)
        artifact.language_models = models.only(artifact.alphabet.languages)
        written.append(save_artifact(target, artifact))
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="Fit character n-grams from a corpus's training transcripts and store them "
        "with an ASR model, for decoding a known language"
    )
    parser.add_argument("--model", required=True, type=Path, help="model folder or training run")
    parser.add_argument("--corpus", required=True, type=Path, help="corpus (audio_corpus)")
    parser.add_argument("--order", type=int, default=8, help=f"n-gram order (1-{MAX_ORDER})")
    args = parser.parse_args(argv)
    try:
        written = attach(args.model, args.corpus, order=args.order)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"language model: {exc}") from None
    for path in written:
        print(f"[asr lm] {path}: n-grams of order {args.order} from {args.corpus}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
