"""Character n-gram language models: their probabilities, their bounded file, beam search with
them, and the model files that carry them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from models.asr import language_model as lm_module
from models.asr.artifact import artifact_files, language_model_file, load_artifact, save_artifact
from models.asr.inference import decode
from models.asr.language_model import (
    END,
    CharNgram,
    DecoderWeights,
    LanguageModels,
    attach,
    lm_beam_decode,
    parse_language_models,
)
from models.asr.model import Alphabet
from tests.asr_models import tiny_artifact
from tests.models.test_asr_train import labelled_corpus


def test_probabilities_of_each_history_sum_to_one() -> None:
    ngram = CharNgram.fit(["abc abd", "abc", "bad cab"], order=4)
    symbols = sorted({g for g in ngram.grams if len(g) == 1} | {END})
    for text in ("", "a", "ab", "abc ", "zz", "cab"):
        history = ngram.history(text)
        total = sum(math.exp(ngram.log_prob(history, s)) for s in symbols)
        assert total == pytest.approx(1.0, abs=1e-9), text


def test_seen_continuations_are_likelier_and_the_history_is_bounded() -> None:
    ngram = CharNgram.fit(["the cat sat", "the cat ate"], order=3)
    history = ngram.history("the c")
    assert history == " c"
    assert ngram.log_prob(history, "a") > ngram.log_prob(history, "t") + 1.0
    assert CharNgram.fit(["ab"], order=3).history("") == "\x02\x02"


def _log_probs(rows: list[dict[int, float]], vocab: int) -> torch.Tensor:
    """Frames of given token probabilities (the rest spread over the blank)."""
    out = torch.full((len(rows), vocab), 1e-6)
    for t, row in enumerate(rows):
        for token, p in row.items():
            out[t, token] = p
        out[t, 0] += max(0.0, 1.0 - float(out[t].sum()))
    return out.log()


def test_beam_search_lets_the_ngram_settle_what_the_acoustics_leave_open() -> None:
    characters = ["a", "b", "c"]
    # "a", then b or c equally likely, then a blank: the acoustics cannot choose.
    frames = _log_probs([{1: 0.9}, {0: 0.9}, {2: 0.45, 3: 0.45}, {0: 0.95}], 4)
    weights = DecoderWeights(alpha=1.0, beta=0.0, beam=8)
    likes_b = CharNgram.fit(["ab", "ab", "abab"], order=3)
    likes_c = CharNgram.fit(["ac", "ac", "acac"], order=3)
    assert lm_beam_decode(frames, characters, likes_b, weights) == [1, 2]
    assert lm_beam_decode(frames, characters, likes_c, weights) == [1, 3]
    # A clear frame is kept whatever the n-gram thinks; a repeated token needs a blank between.
    clear = _log_probs([{2: 0.99}, {2: 0.99}, {0: 0.99}, {2: 0.99}], 4)
    assert lm_beam_decode(clear, characters, likes_c, weights) == [2, 2]


def test_decoder_weights_are_bounded() -> None:
    with pytest.raises(ValueError, match="alpha"):
        DecoderWeights(alpha=-1.0)
    with pytest.raises(ValueError, match="beam"):
        DecoderWeights(beam=0)


def _models() -> LanguageModels:
    return LanguageModels.fit(
        ["hello world", "hello there", "dobry den"],
        ["en-us", "en", "cs"],
        order=4,
        weights=DecoderWeights(alpha=0.4, beta=1.0, beam=8),
    )


def test_language_models_round_trip_their_json() -> None:
    models = _models()
    assert sorted(models.models) == ["cs", "english"]
    assert models.meta["transcripts_by_language"] == {"cs": 1, "english": 2}
    data = json.dumps(models.to_json()).encode()
    again = parse_language_models(data, where="lm.json")
    assert again.weights == models.weights and again.order == 4
    for language, ngram in models.models.items():
        assert again.models[language].grams == ngram.grams
    assert sorted(models.only(["cs", "dutch"]).models) == ["cs"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update(format="other"), "not a cascade-asr-char-ngram"),
        (lambda p: p.update(order=0), "order must be an integer"),
        (lambda p: p["weights"].update(alpha=99.0), "weights: alpha"),
        (lambda p: p["weights"].update(unknown=1), "DecoderWeights fields"),
        (lambda p: p["languages"]["cs"].update({"ab": 1.5}), "integer counts"),
        (lambda p: p["languages"]["cs"].update({"abcdef": 1}), "outside order"),
        (lambda p: p["languages"].update({"": {}}), "1-64 characters"),
    ],
)
def test_a_bad_language_model_file_is_refused_in_one_line(change, message) -> None:
    payload = _models().to_json()
    change(payload)
    with pytest.raises(ValueError, match=message) as caught:
        parse_language_models(json.dumps(payload).encode(), where="lm.json")
    assert str(caught.value).startswith("lm.json") and "\n" not in str(caught.value)


def test_a_language_model_file_over_its_bounds_is_refused(monkeypatch) -> None:
    data = json.dumps(_models().to_json()).encode()
    monkeypatch.setattr(lm_module, "MAX_GRAMS", 10)
    with pytest.raises(ValueError, match="more than the 10"):
        parse_language_models(data, where="lm.json")
    monkeypatch.setattr(lm_module, "MAX_FILE_BYTES", 10)
    with pytest.raises(ValueError, match="bytes, more than 10"):
        parse_language_models(data, where="lm.json")
    with pytest.raises(ValueError, match="is not JSON"):
        parse_language_models(b"\xff{", where="lm.json")


def test_the_model_file_carries_its_language_models_by_digest(tmp_path: Path) -> None:
    artifact = tiny_artifact(quantized=False)
    folder = tmp_path / "model"
    save_artifact(folder, artifact)
    assert load_artifact(folder).language_models is None
    assert len(artifact_files(folder)) == 2  # weights and vocabulary
    artifact.language_models = _models().only(artifact.alphabet.languages)
    save_artifact(folder, artifact)
    lm_file = language_model_file(folder)
    assert lm_file in artifact_files(folder)
    loaded = load_artifact(folder).language_models
    assert loaded is not None and sorted(loaded.models) == ["english"]
    # Another file in its place is refused; a missing one is named.
    lm_file.write_bytes(lm_file.read_bytes().replace(b'"alpha":0.4', b'"alpha":0.5'))
    with pytest.raises(ValueError, match="sha256 differs"):
        load_artifact(folder)
    lm_file.unlink()
    with pytest.raises(FileNotFoundError, match="asr_model.lm.json, which is missing"):
        load_artifact(folder)
    # Saved again without language models: no stale file beside it.
    artifact.language_models = None
    save_artifact(folder, artifact)
    lm_file.write_text("{}")
    save_artifact(folder, artifact)
    assert not lm_file.exists() and load_artifact(folder).language_models is None


def test_decode_uses_the_language_model_only_for_a_known_language() -> None:
    alphabet = Alphabet(["a", "b", "c", " "], {"english": "abc"}, normalization="n")
    assert alphabet.encode("abc") == [2, 3, 4]  # sorted: the space is 1
    frames = _log_probs([{2: 0.9}, {0: 0.9}, {3: 0.45, 4: 0.45}, {0: 0.95}], 5)
    models = LanguageModels.fit(
        ["ac", "ac", "acac"], ["en", "en", "en"], order=3, weights=DecoderWeights(beta=0.0)
    )
    with_lm = decode(frames, alphabet, 2, language="en", language_models=models)
    assert with_lm.text == "ac"
    greedy = decode(frames, alphabet, 2, language="en")
    assert greedy.text == decode(frames, alphabet, 2, language_models=models).text
    assert greedy.text in {"ab", "ac"}


def test_attach_fits_a_corpus_and_rewrites_both_models_of_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for kind in ("fp32", "int8"):
        save_artifact(run / kind, tiny_artifact(quantized=kind == "int8"))
    corpus = labelled_corpus(
        tmp_path / "corpus",
        {"train": [("hello there", "en-us", "v1"), ("ni hao", "cs", "people-x")]},
    )
    before = {kind: (run / kind / "asr_model.pt").read_bytes() for kind in ("fp32", "int8")}
    written = attach(run, corpus, order=3)
    assert [p.parent.name for p in written] == ["fp32", "int8"]
    for kind in ("fp32", "int8"):
        loaded = load_artifact(run / kind)
        assert (run / kind / "asr_model.pt").read_bytes() != before[kind]
        assert loaded.language_models is not None
        # Only the languages the model's alphabet speaks.
        assert sorted(loaded.language_models.models) == ["english"]
        assert loaded.language_models.order == 3
    assert (load_artifact(run / "int8").quantization or {}).get("bits") == 8
    with pytest.raises(FileNotFoundError, match="no train shards"):
        attach(run, tmp_path / "nothing")
