"""Reading the speech corpus for training and evaluation: splits, length-bucketed batches,
padding and SpecAugment-style masking.

The corpus is what :func:`jobs.audio_corpus.build_corpus` writes: ``shards/split=NAME/*.parquet``
with one row per utterance (log-mel features stored as float16 bytes, see
:func:`domains.speech.audio_features.features_of`) and ``summary.json`` with the feature settings.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from domains.speech.audio_features import HUMAN_VOICE_PREFIX, NORMALIZATION, features_of
from models.asr.model import Alphabet

SOURCES = ("synthetic", "people")


def source_of(voice: str) -> str:
    """``people`` for recordings of people
    (:data:`~domains.speech.audio_features.HUMAN_VOICE_PREFIX`), else ``synthetic``."""
    return "people" if voice.startswith(HUMAN_VOICE_PREFIX) else "synthetic"


SILENCE = math.log(1e-6)
"""The log-mel floor (digital silence): padding looks like the silence around an utterance."""
COLUMNS = ("utterance_id", "transcript", "language", "voice", "num_frames", "features")


@dataclass
class Utterances:
    """One split in memory: features as float16 ``[frames, n_mels]`` tensors, targets as ids."""

    ids: list[str]
    texts: list[str]
    languages: list[str]
    voices: list[str]
    features: list[torch.Tensor]
    targets: list[torch.Tensor]
    """Ids of each transcript's characters the alphabet it was read with has (all of them for
    the training split, whose alphabet is fitted from it)."""
    n_mels: int
    unseen: Counter[str] = field(default_factory=Counter)
    """Characters of the transcripts outside that alphabet, with their counts."""
    unseen_utterances: int = 0
    """Utterances holding at least one of them."""
    alphabet: Alphabet | None = None
    """The alphabet the targets are ids of."""

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(f) for f in self.features], dtype=np.int64)

    def subset(self, keep: Sequence[bool]) -> Utterances:
        """The utterances where ``keep`` is true, in order."""
        return self.take([i for i, k in enumerate(keep) if k])

    def take(self, picked: Sequence[int]) -> Utterances:
        """The utterances at ``picked``, in that order; an index given twice is the same
        utterance twice (its features shared, not copied)."""

        def take(values: list[Any]) -> list[Any]:
            return [values[i] for i in picked]

        picked_data = Utterances(
            ids=take(self.ids),
            texts=take(self.texts),
            languages=take(self.languages),
            voices=take(self.voices),
            features=take(self.features),
            targets=take(self.targets),
            n_mels=self.n_mels,
            alphabet=self.alphabet,
        )
        return picked_data if self.alphabet is None else picked_data.encoded(self.alphabet)

    def encoded(self, alphabet: Alphabet | None) -> Utterances:
        """The same utterances with targets (and unseen characters) of ``alphabet``; ``None``:
        an alphabet fitted from these transcripts (what a model trained on them outputs)."""
        if alphabet is None:
            alphabet = fit_alphabet(self)
        unseen: Counter[str] = Counter()
        holding = 0
        targets = []
        for text in self.texts:
            missing = alphabet.unseen(text)
            unseen.update(missing)
            holding += bool(missing)
            targets.append(torch.tensor(alphabet.encode_known(text), dtype=torch.long))
        return dataclasses.replace(
            self, targets=targets, unseen=unseen, unseen_utterances=holding, alphabet=alphabet
        )

    def unseen_report(self) -> dict[str, Any]:
        """``unseen_characters`` (occurrences), ``unseen_utterances`` and ``unseen`` (each
        character with its count, most frequent first): what summaries report."""
        return {
            "unseen_characters": sum(self.unseen.values()),
            "unseen_utterances": self.unseen_utterances,
            "unseen": dict(self.unseen.most_common()),
        }


def fit_alphabet(data: Utterances) -> Alphabet:
    """The alphabet of ``data``'s transcripts (:meth:`~models.asr.model.Alphabet.fit`): the
    corpus job normalized them with :func:`~domains.speech.audio_features.normalize_transcript`."""
    return Alphabet.fit(data.texts, data.languages, normalization=NORMALIZATION)


def corpus_n_mels(corpus: Path) -> int:
    """Mel bins of the corpus features (its ``summary.json``)."""
    summary = Path(corpus) / "summary.json"
    if not summary.is_file():
        raise FileNotFoundError(
            f"{summary} not found: {corpus} is not a corpus; build one with "
            "`cascade asr corpus --landing DIR --out CORPUS`"
        )
    return int(json.loads(summary.read_text())["config"]["n_mels"])


def load_split(
    corpus: Path, split: str, alphabet: Alphabet | None, *, limit: int | None = None
) -> Utterances:
    """The utterances of ``split`` ordered by id (the first ``limit`` of them when given), their
    targets in ``alphabet`` (a model's; ``None``: one fitted from these transcripts). Characters
    the alphabet lacks are counted in :attr:`Utterances.unseen`, the utterance kept."""
    corpus = Path(corpus)
    n_mels = corpus_n_mels(corpus)
    folder = corpus / "shards" / f"split={split}"
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        frame = pd.DataFrame(columns=list(COLUMNS))
    else:
        frame = pd.concat([pd.read_parquet(f, columns=list(COLUMNS)) for f in files])
    frame = frame.sort_values("utterance_id", kind="stable").reset_index(drop=True)
    if limit is not None:
        frame = frame.head(limit)
    rows: list[dict[str, Any]] = frame.to_dict("records")
    return Utterances(
        ids=[r["utterance_id"] for r in rows],
        texts=[r["transcript"] for r in rows],
        languages=[r["language"] for r in rows],
        voices=[r["voice"] for r in rows],
        features=[torch.from_numpy(features_of(r, n_mels).astype(np.float16)) for r in rows],
        targets=[],
        n_mels=n_mels,
    ).encoded(alphabet)


def epoch_batches(
    lengths: np.ndarray, *, batch_size: int, pool_batches: int, seed: int, epoch: int
) -> list[np.ndarray]:
    """One epoch's batches of utterance indices: shuffled, cut into pools of ``pool_batches``
    batches, each pool sorted by length and cut into batches, then the batches shuffled. A
    function of (seed, epoch) only, so any step can be recomputed after a restart."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    pool = batch_size * pool_batches
    batches: list[np.ndarray] = []
    for start in range(0, len(order), pool):
        chunk = order[start : start + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


@dataclass
class Batch:
    features: torch.Tensor
    """``[B, T, n_mels]`` float32, padded with :data:`SILENCE`."""
    lengths: torch.Tensor
    targets: torch.Tensor
    """Concatenated target ids (CTC's 1-d form)."""
    target_lengths: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        """The batch on ``device`` (the training engine's)."""
        return Batch(
            features=self.features.to(device),
            lengths=self.lengths.to(device),
            targets=self.targets.to(device),
            target_lengths=self.target_lengths.to(device),
        )


@dataclass(frozen=True, kw_only=True)
class Augmentation:
    """On-the-fly augmentation of training utterances, in the log-mel domain the corpus stores
    (the corpus keeps features, not waveforms): each utterance is, with its own probability,
    sped up or slowed down, reverberated and mixed with noise, before SpecAugment's masks. Every
    draw comes from the step's seeded generator (:func:`collate`), so a resumed run sees the
    same batches; a probability of 0 draws nothing."""

    speed: float = 0.0
    """Probability of speed perturbation: a factor from ``speed_range`` scales time by
    ``1 / factor`` and every frequency by ``factor`` (what resampling the waveform does),
    interpolated over frames and over the mel bins' centre frequencies."""
    speed_range: tuple[float, float] = (0.9, 1.1)
    reverb: float = 0.0
    """Probability of a synthetic room impulse: exponentially decaying late reverberation
    (reverberation time from ``rt60_range``, longer in low bands than high ones, at a
    direct-to-reverberant ratio from ``drr_db_range``) convolved with each band's energy over
    time."""
    rt60_range: tuple[float, float] = (0.15, 0.8)
    """Seconds for the reverberation to decay by 60 dB."""
    drr_db_range: tuple[float, float] = (0.0, 12.0)
    noise: float = 0.0
    """Probability of additive noise: coloured (a random spectral tilt), fluctuating per frame
    and band, at a signal-to-noise ratio from ``snr_db_range`` of the utterance's mean energy."""
    snr_db_range: tuple[float, float] = (5.0, 30.0)

    def __post_init__(self) -> None:
        for name in ("speed", "reverb", "noise"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"augmentation {name} is a probability in [0, 1]")
        ranges = {
            "speed_range": self.speed_range,
            "rt60_range": self.rt60_range,
            "drr_db_range": self.drr_db_range,
            "snr_db_range": self.snr_db_range,
        }
        for name, (low, high) in ranges.items():
            if not low <= high:
                raise ValueError(f"augmentation {name} must be (low, high), got {(low, high)}")
        if not (0.5 <= self.speed_range[0] and self.speed_range[1] <= 2.0):
            raise ValueError("augmentation speed_range must lie within [0.5, 2]")
        if self.rt60_range[0] <= 0:
            raise ValueError("augmentation rt60_range must be > 0 s")

    @property
    def enabled(self) -> bool:
        return self.speed > 0 or self.reverb > 0 or self.noise > 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Augmentation:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


FRAME_S = 0.010
"""Feature hop (:func:`domains.speech.audio_features.log_mel`)."""


def _mel_centres(n_mels: int, rate: int = 16_000) -> np.ndarray:
    """Centre frequencies (Hz) of the filterbank's bins (as :func:`~domains.speech.audio_features.
    mel_filterbank` spaces them)."""
    top = 2595.0 * np.log10(1.0 + (rate / 2) / 700.0)
    bottom = 2595.0 * np.log10(1.0 + 20.0 / 700.0)
    mels = np.linspace(bottom, top, n_mels + 2)[1:-1]
    return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)


def speed_perturb(features: np.ndarray, factor: float) -> np.ndarray:
    """``[T, M]`` log-mel features of the waveform played ``factor`` times as fast: about
    ``T / factor`` frames, each band taking the energy of the band at ``1 / factor`` its
    frequency."""
    frames, bins = features.shape
    out_frames = max(1, int(round(frames / factor)))
    positions = np.clip(np.arange(out_frames) * factor, 0, frames - 1)
    lower = np.floor(positions).astype(np.int64)
    upper = np.minimum(lower + 1, frames - 1)
    weight = (positions - lower)[:, None]
    timed = features[lower] * (1 - weight) + features[upper] * weight
    centres = _mel_centres(bins)
    source = np.interp(centres / factor, centres, np.arange(bins, dtype=np.float64))
    low = np.floor(source).astype(np.int64)
    high = np.minimum(low + 1, bins - 1)
    w = (source - low)[None, :]
    return (timed[:, low] * (1 - w) + timed[:, high] * w).astype(np.float32)


def _power(features: np.ndarray) -> np.ndarray:
    return np.clip(np.exp(features.astype(np.float64)) - 1e-6, 0.0, None)


def _log(power: np.ndarray) -> np.ndarray:
    return np.log(power + 1e-6).astype(np.float32)


def reverberate(
    features: np.ndarray, rt60_s: float, drr_db: float, tilt: float = 0.3
) -> np.ndarray:
    """Each band's energy plus its exponentially decaying past: the late part of a synthetic
    room impulse (power decays 60 dB in ``rt60_s``, ``1 + tilt`` times as long in the lowest
    band as ``rt60_s``, ``1 - tilt`` in the highest), its total energy ``drr_db`` below the
    direct sound's."""
    power = _power(features)
    frames, bins = power.shape
    rt60 = rt60_s * np.linspace(1 + tilt, 1 - tilt, bins)
    decay = 10.0 ** (-6.0 * FRAME_S / rt60)
    # sum_{k>=1} decay^k = decay / (1 - decay): the tail's energy relative to the direct path.
    gain = 10.0 ** (-drr_db / 10.0) * (1 - decay) / decay
    late = np.zeros(bins)
    out = power.copy()
    for t in range(1, frames):
        late = decay * (late + power[t - 1])
        out[t] += gain * late
    return _log(out)


def add_noise(features: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """Coloured noise at ``snr_db`` below the utterance's mean energy: a random spectral tilt
    (+-10 dB across the bands) and gamma-distributed fluctuation per frame and band."""
    power = _power(features)
    frames, bins = power.shape
    tilt = rng.uniform(-1.0, 1.0)
    shape = 10.0 ** (tilt * np.linspace(-1.0, 1.0, bins))
    shape /= shape.mean()
    level = power.mean() / 10.0 ** (snr_db / 10.0)
    fluctuation = rng.gamma(4.0, 0.25, size=(frames, bins))
    return _log(power + level * shape[None, :] * fluctuation)


def perturb(
    features: torch.Tensor, augmentation: Augmentation, rng: np.random.Generator
) -> torch.Tensor:
    """Speed, then room, then noise, each with its probability (see :class:`Augmentation`)."""
    if not augmentation.enabled:
        return features
    out = features.numpy()
    if augmentation.speed > 0 and rng.random() < augmentation.speed:
        out = speed_perturb(out, float(rng.uniform(*augmentation.speed_range)))
    if augmentation.reverb > 0 and rng.random() < augmentation.reverb:
        rt60 = float(rng.uniform(*augmentation.rt60_range))
        out = reverberate(out, rt60, float(rng.uniform(*augmentation.drr_db_range)))
    if augmentation.noise > 0 and rng.random() < augmentation.noise:
        out = add_noise(out, float(rng.uniform(*augmentation.snr_db_range)), rng)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def augment(features: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Two frequency masks, two time masks (at most a tenth of the frames each) and a loudness
    shift of up to +-1.5 in the log domain."""
    out = features.clone()
    frames, bins = out.shape
    fill = float(out.mean())
    for _ in range(2):
        width = int(rng.integers(0, max(1, bins // 8) + 1))
        start = int(rng.integers(0, bins - width + 1))
        out[:, start : start + width] = fill
    for _ in range(2):
        width = int(rng.integers(0, max(1, frames // 10) + 1))
        start = int(rng.integers(0, frames - width + 1))
        out[start : start + width] = fill
    return out + float(rng.uniform(-1.5, 1.5))


def collate(
    data: Utterances,
    indices: np.ndarray,
    rng: np.random.Generator | None = None,
    augmentation: Augmentation | None = None,
    *,
    spec_augment: bool = True,
) -> Batch:
    """Pad the utterances ``indices`` into one batch; ``rng`` given: perturb each with
    ``augmentation`` (when given), then mask it (when ``spec_augment``)."""
    feats = [data.features[int(i)].float() for i in indices]
    if rng is not None and augmentation is not None:
        feats = [perturb(f, augmentation, rng) for f in feats]
    if rng is not None and spec_augment:
        feats = [augment(f, rng) for f in feats]
    lengths = torch.tensor([len(f) for f in feats], dtype=torch.long)
    padded = torch.full((len(feats), int(lengths.max()), data.n_mels), SILENCE)
    for row, f in enumerate(feats):
        padded[row, : len(f)] = f
    targets = [data.targets[int(i)] for i in indices]
    return Batch(
        features=padded,
        lengths=lengths,
        targets=torch.cat(targets),
        target_lengths=torch.tensor([len(t) for t in targets], dtype=torch.long),
    )
