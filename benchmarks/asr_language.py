"""Language without an oracle in ``cascade bench asr`` (:mod:`benchmarks.asr_path`).

A language identifier (:mod:`models.asr.language_id`: pooled log-mel statistics and the fp32
model's output, a logistic regression) is fitted on the training split of the corpus the model
trained on, at most :data:`PER_LANGUAGE` utterances a language (:data:`QUICK_PER_LANGUAGE` with
``--quick``), split evenly between people and synthetic voices
(:func:`~models.asr.language_id.identifier_draw`, seed 0), unless the model carries the one
training fitted (``asr_model.language_id.json``, what the server uses; ``language_id.source``
says which). Fits on the draws of :data:`DRAW_SEEDS` measure how much the figure owes to the
draw. Every test utterance the benchmark decodes (the synthetic test split, Tux Paint's people,
the recordings' held-out sentences and speakers) is then decoded by the eager fp32 model twice:
restricted to the detected language's characters (unrestricted when the model's alphabet does
not know that language), and restricted to the labelled one. Keys:
``language_id_accuracy`` (over the utterances whose language the identifier knows; the others
are counted in ``language_id_unknown_utterances``), per language, per test part and the
confusions; ``language_id_accuracy_by_draw``, the accuracy of the identifier fitted on each
seed's draw (seed 0's is the one that decodes when the model has none);
``cer_by_language_detected`` and, over the same utterances, ``cer_by_language_oracle``;
``cer_fp32_detected``, the synthetic test split's CER with detected languages (``cer_fp32``
is the same with the label).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

PER_LANGUAGE = 2000
"""Enough that the identifier hardly depends on which utterances were drawn: at 500 a language,
the draw alone moved the accuracy by more than the goal's margin."""
QUICK_PER_LANGUAGE = 50
DRAW_SEEDS = (0, 1, 2, 3, 4)


def language_figures(
    artifact: Any, training: Path, parts: Sequence[tuple[str, pd.DataFrame]], *, quick: bool
) -> dict[str, Any]:
    """The keys of the module docstring for ``artifact`` (the fp32 model) on ``parts``
    (``(name, frame with x)``), the identifier fitted on ``training``'s training split."""
    from domains.speech.audio_features import language_group
    from models.asr.compiled import MIN_FRAMES
    from models.asr.corpus import load_split
    from models.asr.evaluate import decoding_language
    from models.asr.inference import decode, log_probs_of
    from models.asr.language_id import (
        draw_vectors,
        fit_language_identifier,
        identifier_draw,
        utterance_vector,
    )
    from models.asr.metrics import cer

    started = time.perf_counter()
    data = load_split(training, "train", artifact.alphabet)
    per_language = QUICK_PER_LANGUAGE if quick else PER_LANGUAGE
    model, alphabet = artifact.model.eval(), artifact.alphabet
    lms = artifact.language_models  # each language's n-gram, for the language decoded
    draws = {
        seed: identifier_draw(data, per_language=per_language, seed=seed) for seed in DRAW_SEEDS
    }
    needed = sorted(set().union(*draws.values()))
    drawn = dict(zip(needed, draw_vectors(model, alphabet, data, needed), strict=True))
    identifiers = [
        fit_language_identifier(
            np.stack([drawn[i] for i in draws[seed]]),
            [data.languages[i] for i in draws[seed]],
            uses_model=True,
        )
        for seed in DRAW_SEEDS
    ]
    # The model's own identifier (what the server uses) when it has one; else the first draw's.
    identifier = artifact.language_identifier or identifiers[0]
    fit_s = time.perf_counter() - started
    vectors: list[np.ndarray] = []
    rows: list[dict[str, Any]] = []
    for name, frame in parts:
        for x, reference, language in zip(
            frame["x"], frame["transcript"], frame["language"], strict=True
        ):
            if len(x) < MIN_FRAMES:
                continue
            log_probs = log_probs_of(model, x)
            vectors.append(utterance_vector(x, log_probs, alphabet))
            detected = identifier.predict(vectors[-1])[0]
            subsample = model.config.subsample
            oracle = decode(
                log_probs,
                alphabet,
                subsample,
                language=decoding_language(alphabet, language, True),
                language_models=lms,
            ).text
            guided = decode(
                log_probs,
                alphabet,
                subsample,
                language=decoding_language(alphabet, detected, True),
                language_models=lms,
            ).text
            rows.append(
                {
                    "part": name,
                    "group": language_group(language),
                    "detected": detected,
                    "reference": reference,
                    "oracle": oracle,
                    "guided": guided,
                }
            )
    known_at = [i for i, r in enumerate(rows) if r["group"] in identifier.languages]
    known = [rows[i] for i in known_at]
    truth = np.array([r["group"] for r in known])
    by_draw = [
        float(np.mean(np.array(fitted.predict(np.stack([vectors[i] for i in known_at]))) == truth))
        for fitted in identifiers
        if known
    ]
    confusions: dict[str, dict[str, int]] = {}
    for r in known:
        row = confusions.setdefault(r["group"], {})
        row[r["detected"]] = row.get(r["detected"], 0) + 1

    def rate(picked: list[dict[str, Any]], key: str) -> float | None:
        if not picked:
            return None
        return cer([r["reference"] for r in picked], [r[key] for r in picked])

    groups = sorted({r["group"] for r in rows})
    synthetic = [r for r in rows if r["part"] == "synthetic"]
    return {
        "language_id_accuracy": (
            sum(r["detected"] == r["group"] for r in known) / len(known) if known else None
        ),
        "language_id_accuracy_by_language": {
            group: sum(r["detected"] == group for r in known if r["group"] == group)
            / max(1, sum(r["group"] == group for r in known))
            for group in identifier.languages
            if any(r["group"] == group for r in known)
        },
        "language_id_accuracy_by_part": {
            part: sum(r["detected"] == r["group"] for r in known if r["part"] == part)
            / sum(r["part"] == part for r in known)
            for part in sorted({r["part"] for r in known})
        },
        "language_id_accuracy_by_draw": by_draw,
        "language_id_confusions": confusions,
        "language_id_utterances": len(known),
        "language_id_unknown_utterances": len(rows) - len(known),
        "language_id": {
            "languages": identifier.languages,
            "uses_model": identifier.uses_model,
            "inputs": len(identifier.mean),
            "training_utterances_per_language": per_language,
            "draw_seeds": list(DRAW_SEEDS),
            "source": "model" if artifact.language_identifier is not None else "fitted",
            "fit_s": fit_s,
            "parts": sorted({r["part"] for r in rows}),
        },
        "cer_by_language_detected": {
            g: rate([r for r in rows if r["group"] == g], "guided") for g in groups
        },
        "cer_by_language_oracle": {
            g: rate([r for r in rows if r["group"] == g], "oracle") for g in groups
        },
        "cer_fp32_detected": rate(synthetic, "guided"),
    }
