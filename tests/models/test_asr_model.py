"""ConvDFSMN + CTC: shapes, bounded look-ahead, decoding, and that it learns."""

from __future__ import annotations

import pytest
import torch

from models.asr.model import (
    BLANK,
    Alphabet,
    ConvDFSMN,
    ConvDFSMNConfig,
    beam_decode,
    ctc_loss,
    greedy_decode,
    utterance_cmvn,
)

SMALL = ConvDFSMNConfig(
    n_mels=16, vocab_size=6, conv_channels=16, hidden=32, memory=16, blocks=3, left=4, right=1
)


def test_output_shape_lengths_and_a_finite_loss_with_gradients() -> None:
    torch.manual_seed(0)
    model = ConvDFSMN(SMALL)
    features = torch.randn(2, 51, 16)
    log_probs = model(features)
    assert log_probs.shape == (2, 26, 6)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 26), atol=1e-5)
    assert model.output_lengths(torch.tensor([51, 30])).tolist() == [26, 15]
    loss = ctc_loss(
        model, features, torch.tensor([51, 30]), torch.tensor([[1, 2, 3], [4, 5, 0]]),
        torch.tensor([3, 2]),
    )  # fmt: skip
    loss.backward()
    assert torch.isfinite(loss) and model.output.weight.grad is not None


def test_cmvn_makes_the_model_deaf_to_a_speakers_level_and_tilt_and_ignores_padding() -> None:
    """With ``cmvn`` a per-bin gain and offset on every frame (a voice's tilt, a microphone's
    level) leaves the output as it was; without it the output moves. A padded batch normalizes
    each utterance over its own frames: its valid frames equal the utterance's alone."""
    torch.manual_seed(0)
    features = torch.randn(1, 60, 16) * 2 - 6
    tilt = torch.linspace(0.5, 2.0, 16) * features + torch.linspace(-3.0, 1.0, 16)
    normalized = ConvDFSMN(ConvDFSMNConfig(**{**SMALL.to_dict(), "cmvn": True})).eval()
    plain = ConvDFSMN(SMALL).eval()
    plain.load_state_dict(normalized.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(normalized(tilt), normalized(features), atol=1e-4, rtol=1e-4)
        assert (plain(tilt) - plain(features)).abs().max() > 0.1
    x = utterance_cmvn(features)
    torch.testing.assert_close(x.mean(1), torch.zeros(1, 16), atol=1e-5, rtol=0)
    torch.testing.assert_close(x.std(1, correction=0), torch.ones(1, 16), atol=1e-4, rtol=0)
    padded = torch.cat([features, torch.full((1, 20, 16), -13.8)], dim=1)
    batch = torch.cat([padded, torch.randn(1, 80, 16)])
    y = utterance_cmvn(batch, torch.tensor([60, 80]))
    torch.testing.assert_close(y[0, :60], x[0], atol=1e-5, rtol=1e-5)
    assert torch.all(y[0, 60:] == 0)
    torch.testing.assert_close(y[1], utterance_cmvn(batch[1:])[0], atol=1e-5, rtol=1e-5)


def test_lookahead_is_bounded() -> None:
    """Output frame k never sees input past k * subsample + lookahead_frames: it streams."""
    torch.manual_seed(0)
    model = ConvDFSMN(SMALL).eval()
    assert model.lookahead_frames == 2 + 3 * 1 * 1 * 2
    features = torch.randn(1, 60, 16)
    k = 10
    edge = k * 2 + model.lookahead_frames
    with torch.no_grad():
        base = model(features)[0, k]
        later = features.clone()
        later[0, edge + 1 :] += 5.0
        assert torch.allclose(model(later)[0, k], base, atol=1e-6)
        # ... but it does look ahead: the next frames change it.
        ahead = features.clone()
        ahead[0, k * 2 + 1 : k * 2 + 3] += 5.0
        assert not torch.allclose(model(ahead)[0, k], base, atol=1e-6)


def test_greedy_and_beam_decoding_collapse_repeats_and_blanks() -> None:
    path = [1, 1, BLANK, 1, 2, 2, BLANK, BLANK, 3]
    peaked = torch.full((len(path), 4), -20.0)
    peaked[torch.arange(len(path)), torch.tensor(path)] = 0.0
    assert greedy_decode(peaked) == [1, 1, 2, 3]
    assert beam_decode(peaked.log_softmax(-1)) == [1, 1, 2, 3]
    assert greedy_decode(peaked, length=3) == [1]
    # Beam search sums paths: blank-blank is the best single path (0.36), but "a" has three
    # paths (a-a, a-blank, blank-a: 0.64 together).
    probs = torch.tensor([[0.6, 0.4], [0.6, 0.4]]).log()
    assert greedy_decode(probs) == [] and beam_decode(probs) == [1]

    alphabet = Alphabet("ab c")
    assert len(alphabet) == 5 and alphabet.decode(alphabet.encode("ab c")) == "ab c"


def test_it_learns_to_transcribe_two_patterns() -> None:
    torch.manual_seed(0)
    model = ConvDFSMN(SMALL)
    features = torch.zeros(2, 40, 16)
    features[0, 5:15, 2] = 3.0  # "1" then "2"
    features[0, 20:30, 9] = 3.0
    features[1, 5:15, 9] = 3.0  # "2" then "3"
    features[1, 20:30, 13] = 3.0
    targets, target_lengths = torch.tensor([[1, 2], [2, 3]]), torch.tensor([2, 2])
    lengths = torch.tensor([40, 40])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        optimizer.zero_grad()
        ctc_loss(model, features, lengths, targets, target_lengths).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        log_probs = model(features)
    assert greedy_decode(log_probs[0]) == [1, 2]
    assert beam_decode(log_probs[1]) == [2, 3]


def test_artifact_round_trip_and_clear_errors(tmp_path) -> None:
    from models.asr.artifact import AsrArtifact, load_artifact, save_artifact

    alphabet = Alphabet("ab c")
    model = ConvDFSMN(ConvDFSMNConfig(vocab_size=len(alphabet), blocks=2, hidden=16, memory=8))
    save_artifact(tmp_path, AsrArtifact(model=model, alphabet=alphabet, n_mels=40, meta={"x": 1}))
    loaded = load_artifact(tmp_path)
    features = torch.randn(1, 30, 40)
    model.eval()
    assert torch.equal(loaded.model(features), model(features))
    assert loaded.alphabet.characters == alphabet.characters and loaded.meta == {"x": 1}
    with pytest.raises(FileNotFoundError, match="no ASR model"):
        load_artifact(tmp_path / "elsewhere")
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not an ASR model"):
        load_artifact(tmp_path / "foreign.pt")


def test_an_alphabet_is_fitted_from_transcripts_in_any_language_and_stored_as_json(
    tmp_path,
) -> None:
    import json

    from domains.speech.audio_features import NORMALIZATION, normalize_transcript
    from models.asr.artifact import (
        AsrArtifact,
        artifact_files,
        load_artifact,
        save_artifact,
        vocabulary_file,
    )

    # Czech diacritics, German ß, digits and Mandarin outside the synthetic phrases.
    corpus = [
        ("Kůň žere 3 jablka", "cs-CZ"),
        ("Příliš žluťoučký", "cs"),
        ("Die Straße 12", "de"),
        ("我爱北京", "zh"),
        ("号码 42", "cmn"),
    ]
    texts = [normalize_transcript(t) for t, _ in corpus]
    alphabet = Alphabet.fit(texts, [lang for _, lang in corpus], normalization=NORMALIZATION)
    assert set("ůňžřčťýß123") <= set(alphabet.characters)
    assert {"我", "爱", "北", "京", "号", "码", "4", "2", " "} <= set(alphabet.characters)
    assert set(alphabet.languages) == {"cs", "de", "mandarin"}
    assert "ß" in alphabet.languages["de"] and "ß" not in alphabet.languages["cs"]
    assert set(alphabet.languages["mandarin"]) == set("我爱北京号码42")
    assert alphabet.counts["ž"] == 2 and alphabet.fitted
    for text in texts:  # every training transcript is covered, round trip exact
        assert alphabet.decode(alphabet.encode(text)) == text
    # A character no training transcript held: counted, never a failure of decoding.
    assert alphabet.unseen("kůň qwq x") == {"q": 2, "w": 1, "x": 1}
    assert alphabet.encode_known("kůň ř") == alphabet.encode("kůň ř")
    assert alphabet.encode_known("kůň ä") == alphabet.encode("kůň ")
    with pytest.raises(ValueError, match=r"outside the alphabet: \['ä'\]"):
        alphabet.encode("ä")

    model = ConvDFSMN(ConvDFSMNConfig(vocab_size=len(alphabet), blocks=2, hidden=16, memory=8))
    save_artifact(tmp_path, AsrArtifact(model=model, alphabet=alphabet, n_mels=40))
    stored = json.loads(vocabulary_file(tmp_path).read_text(encoding="utf-8"))
    assert stored["characters"] == alphabet.characters and stored["normalization"] == NORMALIZATION
    assert artifact_files(tmp_path) == [tmp_path / "asr_model.pt", vocabulary_file(tmp_path)]
    loaded = load_artifact(tmp_path)
    assert loaded.alphabet == alphabet and loaded.alphabet.counts == alphabet.counts

    # The model file names its vocabulary's digest: another file is refused, a missing one too.
    changed = dict(stored, characters=stored["characters"][::-1])
    vocabulary_file(tmp_path).write_text(json.dumps(changed), encoding="utf-8")
    with pytest.raises(ValueError, match="not the vocabulary asr_model.pt was saved with"):
        load_artifact(tmp_path)
    vocabulary_file(tmp_path).unlink()
    with pytest.raises(FileNotFoundError, match="asr_model.vocabulary.json, which is missing"):
        load_artifact(tmp_path)


def test_a_model_stored_before_alphabets_were_fitted_loads_with_its_fixed_alphabet(
    tmp_path,
) -> None:
    from models.asr.artifact import artifact_files, load_artifact
    from models.asr.corpus import Utterances

    fixed = "abcdefghijklmnopqrstuvwxyz' 你好"
    model = ConvDFSMN(ConvDFSMNConfig(vocab_size=len(fixed) + 1, blocks=2, hidden=16, memory=8))
    # The layout of such a file: the alphabet a plain list inside the .pt, no vocabulary file.
    torch.save(
        {
            "config": model.config.to_dict(),
            "alphabet": sorted(fixed),
            "n_mels": 40,
            "state_dict": model.state_dict(),
            "quantization": None,
            "meta": {},
        },
        tmp_path / "asr_model.pt",
    )
    loaded = load_artifact(tmp_path)
    assert loaded.alphabet.characters == sorted(fixed) and not loaded.alphabet.fitted
    assert loaded.alphabet.languages["mandarin"] == ["你", "好"]
    assert artifact_files(tmp_path) == [tmp_path / "asr_model.pt"]
    # Evaluated on a corpus with digits and Czech letters: the utterances stay, the characters
    # it has no output for are counted.
    data = Utterances(
        ids=["a", "b"],
        texts=["kůň 3", "hello"],
        languages=["cs", "en"],
        voices=["v", "v"],
        features=[torch.zeros(5, 40), torch.zeros(5, 40)],
        targets=[],
        n_mels=40,
    ).encoded(loaded.alphabet)
    assert len(data) == 2 and data.unseen_report() == {
        "unseen_characters": 3,
        "unseen_utterances": 1,
        "unseen": {"ů": 1, "ň": 1, "3": 1},
    }
    assert data.subset([True, False]).unseen_report()["unseen_characters"] == 3
    assert data.subset([False, True]).unseen_report()["unseen_characters"] == 0


def test_transcript_has_character_and_word_times() -> None:
    from models.asr.inference import Transcript, emission_times

    # frames: blank, a, a, blank, space, b -> "a b" emitted at output frames 1, 4, 5
    log_probs = torch.full((6, 4), -10.0)
    for frame, token in enumerate([0, 1, 1, 0, 3, 2]):
        log_probs[frame, token] = 0.0
    times = emission_times(log_probs, subsample=2)
    assert times == pytest.approx([0.02, 0.08, 0.10])
    words = Transcript(text="a b", char_times=times).words()
    assert [w["word"] for w in words] == ["a", "b"]
    assert words[1]["start_s"] == pytest.approx(0.10)


LANGUAGES = {"en-us": set("abcdefghijklmnopqrstuvwxyz' "), "cmn": set("你好天气 ")}


def test_decoding_for_a_language_emits_only_its_characters() -> None:
    """Random log-probabilities favour every token alike, foreign ones included: restricted
    greedy and beam decoding never emit one, unrestricted decoding does."""
    from tests.asr_models import ALPHABET

    torch.manual_seed(0)
    unrestricted: set[str] = set()
    for _ in range(10):
        log_probs = torch.log_softmax(3 * torch.randn(30, len(ALPHABET)), -1)
        unrestricted |= set(ALPHABET.decode(greedy_decode(log_probs)))
        for language, allowed in LANGUAGES.items():
            mask = ALPHABET.allowed(language)
            assert mask is not None and bool(mask[BLANK])
            greedy = ALPHABET.decode(greedy_decode(log_probs, allowed=mask))
            beamed = ALPHABET.decode(beam_decode(log_probs, beam=4, allowed=mask))
            assert greedy and set(greedy) <= allowed
            assert set(beamed) <= allowed
            assert ALPHABET.foreign_tokens(greedy, language) == 0
    assert unrestricted & LANGUAGES["en-us"] and unrestricted & set("你好天气")
    assert ALPHABET.allowed(None) is None
    assert ALPHABET.language_of("en-gb-x-rp") == "english"
    assert ALPHABET.language_of("zh") == "mandarin"
    assert ALPHABET.foreign_tokens("ab 你好", "english") == 2
    with pytest.raises(ValueError, match="unknown language 'fr': this model knows english, man"):
        ALPHABET.allowed("fr")


def test_an_untrained_model_decodes_only_the_requested_language(tmp_path) -> None:
    """The tiny untrained model, eager and fake-quantized int8, greedy and beam, after a round
    trip through the artifact (which stores each language's characters)."""
    from models.asr.artifact import load_artifact, save_artifact
    from models.asr.evaluate import int8_model
    from models.asr.inference import transcribe
    from tests.asr_models import tiny_artifact

    save_artifact(tmp_path, tiny_artifact(quantized=True))
    artifact = load_artifact(tmp_path)
    assert artifact.alphabet.languages == {
        "english": sorted("abcdefghijklmnopqrstuvwxyz'"),
        "mandarin": sorted("你好天气"),
    }
    torch.manual_seed(1)
    for model in (artifact.model, int8_model(artifact)):
        for frames in (40, 120):
            features = torch.randn(frames, artifact.n_mels) * 2 - 4
            mixed = transcribe(model, artifact.alphabet, features).text
            assert set(mixed) & LANGUAGES["en-us"] and set(mixed) & LANGUAGES["cmn"] - {" "}
            for language, allowed in LANGUAGES.items():
                for beam in (0, 4):
                    text = transcribe(
                        model, artifact.alphabet, features, beam=beam, language=language
                    ).text
                    assert text and set(text) <= allowed, (language, beam, text)


def test_an_alphabet_stored_without_languages_gets_them_from_the_scripts() -> None:
    alphabet = Alphabet("ab' 你好")
    assert alphabet.languages == {"english": ["'", "a", "b"], "mandarin": ["你", "好"]}
    mask = alphabet.allowed("english")
    assert mask is not None
    assert [alphabet.characters[i - 1] for i in mask.nonzero().flatten().tolist() if i] == [
        " ",
        "'",
        "a",
        "b",
    ]
