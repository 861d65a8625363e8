"""On-the-fly augmentation of ASR training features: speed, room impulse, noise; seeded."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from domains.speech.audio_features import SAMPLE_RATE, log_mel
from models.asr.config_registry import get_config
from models.asr.corpus import (
    Augmentation,
    Utterances,
    add_noise,
    collate,
    perturb,
    reverberate,
    speed_perturb,
)


def _tone(hz: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _peak_hz(features: np.ndarray) -> float:
    from models.asr.corpus import _mel_centres

    return float(_mel_centres(features.shape[1])[int(np.argmax(features.mean(axis=0)))])


def test_speed_perturbation_matches_resampling_the_waveform() -> None:
    features = log_mel(_tone(1000), 40)
    faster = speed_perturb(features, 1.1)
    slower = speed_perturb(features, 0.9)
    assert len(faster) == round(len(features) / 1.1) and len(slower) == round(len(features) / 0.9)
    # Played 10% faster, a 1 kHz tone is a 1.1 kHz tone: the peak band moves up, and down.
    assert _peak_hz(faster) > _peak_hz(features) > _peak_hz(slower)
    np.testing.assert_allclose(speed_perturb(features, 1.0), features, atol=1e-5)


def test_a_room_adds_a_decaying_tail_and_noise_fills_the_silence() -> None:
    burst = np.concatenate([_tone(500, 0.2), np.zeros(8000, np.float32)])
    features = log_mel(burst, 40)
    room = reverberate(features, rt60_s=0.6, drr_db=3.0)
    np.testing.assert_allclose(room[0], features[0], atol=1e-4)  # no echo before the sound
    assert (room >= features - 1e-4).all()  # a room only adds energy
    after = slice(25, 45)  # 50-250 ms after the burst ends: silence, now its echo
    assert room[after].mean() > features[after].mean() + 3
    assert room[30].mean() > room[40].mean() > room[60].mean()  # and it decays
    longer = reverberate(features, rt60_s=1.2, drr_db=3.0)
    assert longer[60].mean() > room[60].mean()

    rng = np.random.default_rng(0)
    loud = add_noise(features, snr_db=0.0, rng=rng)
    quiet = add_noise(features, snr_db=30.0, rng=np.random.default_rng(0))
    silence = slice(40, None)
    assert loud[silence].mean() > quiet[silence].mean() + 5 > features[silence].mean() + 5
    assert loud.shape == features.shape and np.isfinite(loud).all()


def test_perturbation_is_seeded_draws_nothing_when_off_and_is_off_in_debug() -> None:
    features = torch.from_numpy(log_mel(_tone(700), 40))
    on = Augmentation(speed=1.0, reverb=1.0, noise=1.0)
    a = perturb(features, on, np.random.default_rng(5))
    assert torch.equal(a, perturb(features, on, np.random.default_rng(5)))
    assert not torch.equal(a, perturb(features, on, np.random.default_rng(6)))
    rng = np.random.default_rng(5)
    assert perturb(features, Augmentation(), rng) is features
    assert rng.random() == np.random.default_rng(5).random()  # no draw was spent
    assert not get_config("debug").augmentation.enabled
    assert get_config("fast").augmentation.enabled and get_config("synthetic").augmentation.enabled
    with pytest.raises(ValueError, match="probability"):
        Augmentation(noise=1.5)
    with pytest.raises(ValueError, match="speed_range"):
        Augmentation(speed_range=(0.2, 1.0))
    assert Augmentation.from_dict(dataclasses.asdict(on) | {"snr_db_range": [1, 2]}) == (
        dataclasses.replace(on, snr_db_range=(1, 2))
    )


def test_a_batch_is_augmented_before_it_is_padded() -> None:
    feats = [torch.from_numpy(log_mel(_tone(300 + 100 * i, 0.5 + 0.1 * i), 40)) for i in range(3)]
    data = Utterances(
        ids=["a", "b", "c"],
        texts=["x", "y", "z"],
        languages=["en"] * 3,
        voices=["v"] * 3,
        features=[f.half() for f in feats],
        targets=[torch.tensor([1]), torch.tensor([2]), torch.tensor([3])],
        n_mels=40,
    )
    indices = np.arange(3)
    plain = collate(data, indices)
    speed = Augmentation(speed=1.0, speed_range=(1.25, 1.25))
    fast = collate(data, indices, np.random.default_rng(0), speed, spec_augment=False)
    assert fast.lengths.tolist() == [round(n / 1.25) for n in plain.lengths.tolist()]
    assert torch.equal(fast.targets, plain.targets)
