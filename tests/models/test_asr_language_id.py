"""The language identifier: learns languages from pooled features, takes the ASR model's output
into its vectors, survives a JSON round trip, and refuses vectors of another shape."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from models.asr.artifact import (
    artifact_files,
    language_identifier_file,
    load_artifact,
    save_artifact,
)
from models.asr.corpus import Utterances
from models.asr.inference import log_probs_of
from models.asr.language_id import (
    LanguageIdentifier,
    dump_language_identifier,
    fit_language_identifier,
    identifier_draw,
    identify,
    parse_language_identifier,
    train_language_identifier,
    utterance_vector,
)
from tests.asr_models import tiny_artifact


def _utterance(language: str, rng: np.random.Generator, n_mels: int = 40) -> np.ndarray:
    """Log-mel frames whose energy leans to the low bands (``en``) or the high ones (``cs``)."""
    tilt = np.linspace(1.0, -1.0, n_mels) * (1 if language == "en" else -1)
    frames = int(rng.integers(60, 120))
    return (rng.standard_normal((frames, n_mels)) + 2 * tilt - 5).astype(np.float32)


def _data(count: int, seed: int) -> Utterances:
    rng = np.random.default_rng(seed)
    languages = ["en-us" if i % 3 else "cs" for i in range(count)]  # two English to one Czech
    return Utterances(
        ids=[str(i) for i in range(count)],
        texts=["x"] * count,
        languages=languages,
        voices=["v"] * count,
        features=[torch.from_numpy(_utterance(lang[:2], rng)).half() for lang in languages],
        targets=[],
        n_mels=40,
    )


def test_it_learns_languages_from_pooled_features_and_round_trips_as_json() -> None:
    identifier = train_language_identifier(None, None, _data(60, seed=0), per_language=30)
    assert identifier.languages == ["cs", "english"] and not identifier.uses_model
    test = _data(30, seed=1)
    guesses = [identify(identifier, None, None, f.float()) for f in test.features]
    truth = ["english" if lang.startswith("en") else "cs" for lang in test.languages]
    assert np.mean([g == t for g, t in zip(guesses, truth, strict=True)]) >= 0.9
    again = LanguageIdentifier.from_json(json.loads(json.dumps(identifier.to_json())))
    vectors = np.stack([utterance_vector(f.float()) for f in test.features])
    assert np.allclose(again.probabilities(vectors), identifier.probabilities(vectors))
    with pytest.raises(ValueError, match="takes 80 inputs, got 3"):
        identifier.predict(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="not a cascade.asr.language_id/1 file"):
        LanguageIdentifier.from_json({"format": "something else"})


def test_the_model_output_joins_the_vector_and_one_language_is_always_the_answer() -> None:
    artifact = tiny_artifact(quantized=False)
    data = _data(12, seed=2)
    identifier = train_language_identifier(artifact.model, artifact.alphabet, data)
    assert identifier.uses_model
    # log-mel mean and std, the posterior profile over the tokens, one share per language
    inputs = 2 * 40 + len(artifact.alphabet) + len(artifact.alphabet.languages)
    assert identifier.mean.shape == (inputs,)
    guess = identify(identifier, artifact.model, artifact.alphabet, data.features[0].float())
    assert guess in ("cs", "english")
    only = fit_language_identifier(np.ones((3, 2)), ["cs", "cs-CZ", "cs"])
    assert only.predict(np.zeros((2, 2))) == ["cs", "cs"]
    with pytest.raises(ValueError, match="one vector per language label"):
        fit_language_identifier(np.ones((3, 2)), ["cs"])
    with pytest.raises(ValueError, match="no utterances"):
        train_language_identifier(None, None, _data(0, seed=0))


def test_the_draw_splits_each_language_between_people_and_synthetic_voices() -> None:
    data = _data(300, seed=3)  # 200 English, 100 Czech
    # A tenth of the English utterances (20) and half of the Czech ones are people's.
    data.voices = [
        ("human-a" if i % 10 == 1 else "en-voice")
        if lang.startswith("en")
        else ("human-b" if i % 2 else "cs-voice")
        for i, lang in enumerate(data.languages)
    ]

    def counts(picked: list[int]) -> Counter[tuple[str, bool]]:
        return Counter((data.languages[i][:2], data.voices[i].startswith("human-")) for i in picked)

    picked = identifier_draw(data, per_language=60, seed=0)
    assert len(set(picked)) == len(picked)
    # English: its 20 people are fewer than half of 60, so the synthetic voices take the rest.
    assert counts(picked) == {
        ("en", True): 20, ("en", False): 40, ("cs", True): 30, ("cs", False): 30
    }  # fmt: skip
    assert identifier_draw(data, per_language=60, seed=0) == picked
    assert identifier_draw(data, per_language=60, seed=1) != picked
    assert len(identifier_draw(data, per_language=None, seed=0)) == 300


def _model_languages(count: int, seed: int) -> Utterances:
    """:func:`_data` in the tiny model's languages (English and Mandarin)."""
    data = _data(count, seed)
    data.languages = ["en-us" if lang.startswith("en") else "cmn" for lang in data.languages]
    return data


def test_the_identifier_is_stored_beside_the_model_and_refused_when_it_does_not_fit(
    tmp_path: Path,
) -> None:
    artifact = tiny_artifact(quantized=False)
    data = _model_languages(12, seed=4)
    artifact.language_identifier = train_language_identifier(
        artifact.model, artifact.alphabet, data
    )
    save_artifact(tmp_path / "ok", artifact)
    stored = language_identifier_file(tmp_path / "ok")
    assert stored in artifact_files(tmp_path / "ok")
    loaded = load_artifact(tmp_path / "ok").language_identifier
    assert loaded is not None and loaded.languages == ["english", "mandarin"]
    vector = utterance_vector(
        data.features[0].float(),
        log_probs_of(artifact.model, data.features[0].float()),
        artifact.alphabet,
    )
    assert np.allclose(
        loaded.probabilities(vector), artifact.language_identifier.probabilities(vector)
    )
    # Another file in its place is refused by the digest the model file keeps.
    stored.write_bytes(stored.read_bytes().replace(b'"uses_model":true', b'"uses_model":false'))
    with pytest.raises(ValueError, match="is not the language identifier"):
        load_artifact(tmp_path / "ok")
    # An identifier whose inputs are not the model's vectors, or whose languages the alphabet
    # lacks, is refused at load with what does not fit.
    features_only = train_language_identifier(None, None, data)
    features_only.uses_model = True
    artifact.language_identifier = features_only
    save_artifact(tmp_path / "inputs", artifact)
    with pytest.raises(ValueError, match=r"takes 80 inputs \(the model's vectors have \d+\)"):
        load_artifact(tmp_path / "inputs")
    artifact.language_identifier = train_language_identifier(
        artifact.model, artifact.alphabet, _data(12, seed=5)
    )
    save_artifact(tmp_path / "languages", artifact)
    with pytest.raises(ValueError, match=r"names languages the alphabet lacks \(cs\)"):
        load_artifact(tmp_path / "languages")
    # Saved without one, the model keeps no stale file.
    artifact.language_identifier = None
    save_artifact(tmp_path / "ok", artifact)
    assert not stored.exists() and load_artifact(tmp_path / "ok").language_identifier is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other"}, "not a cascade.asr.language_id/1 file"),
        ({"languages": []}, "languages must be 1-64 distinct names"),
        ({"languages": ["cs", "cs"]}, "languages must be 1-64 distinct names"),
        ({"uses_model": "yes"}, "uses_model must be true or false"),
        ({"mean": [0.0] * 70_000}, "mean must list 1-65536 numbers"),
        ({"scale": [1.0, 1.0]}, r"scale must be \[3\] finite numbers"),
        ({"scale": [1.0, 0.0, 1.0]}, "scale must be positive"),
        ({"weight": [[1.0, "x", 1.0], [0.0, 0.0, 0.0]]}, "weight must be numbers"),
        ({"bias": [0.0, float("nan")]}, r"bias must be \[2\] finite numbers"),
    ],
)
def test_a_stored_identifier_is_checked_field_by_field(
    change: dict[str, object], message: str
) -> None:
    good = fit_language_identifier(np.arange(12.0).reshape(4, 3) ** 2, ["cs", "en", "cs", "en"])
    payload = {**good.to_json(), **change}
    data = json.dumps(payload).encode()
    with pytest.raises(ValueError, match=message) as caught:
        parse_language_identifier(data, where="id.json")
    assert str(caught.value).startswith("id.json: ") and "\n" not in str(caught.value)
    assert parse_language_identifier(dump_language_identifier(good), where="x").languages == [
        "cs",
        "english",
    ]
    with pytest.raises(ValueError, match="id.json is not JSON"):
        parse_language_identifier(b"\xff{", where="id.json")
