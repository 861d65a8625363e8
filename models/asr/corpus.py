"""Reading the speech corpus for training and evaluation: splits, length-bucketed batches,
padding and SpecAugment-style masking.

The corpus is what :func:`jobs.audio_corpus.build_corpus` writes: ``shards/split=NAME/*.parquet``
with one row per utterance (log-mel features stored as float16 bytes, see
:func:`cascade.audio_features.features_of`) and ``summary.json`` with the feature settings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from cascade.audio_features import features_of
from models.asr.model import Alphabet

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
    n_mels: int

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(f) for f in self.features], dtype=np.int64)

    def subset(self, keep: Sequence[bool]) -> Utterances:
        """The utterances where ``keep`` is true, in order."""
        picked = [i for i, k in enumerate(keep) if k]

        def take(values: list[Any]) -> list[Any]:
            return [values[i] for i in picked]

        return Utterances(
            ids=take(self.ids),
            texts=take(self.texts),
            languages=take(self.languages),
            voices=take(self.voices),
            features=take(self.features),
            targets=take(self.targets),
            n_mels=self.n_mels,
        )


def corpus_n_mels(corpus: Path) -> int:
    """Mel bins of the corpus features (its ``summary.json``)."""
    summary = Path(corpus) / "summary.json"
    if not summary.is_file():
        raise FileNotFoundError(
            f"{summary} not found: {corpus} is not a corpus; build one with "
            "`python -m jobs.audio_corpus build --landing DIR --out CORPUS`"
        )
    return int(json.loads(summary.read_text())["config"]["n_mels"])


def load_split(
    corpus: Path, split: str, alphabet: Alphabet, *, limit: int | None = None
) -> Utterances:
    """The utterances of ``split`` ordered by id (the first ``limit`` of them when given)."""
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
        targets=[torch.tensor(alphabet.encode(r["transcript"]), dtype=torch.long) for r in rows],
        n_mels=n_mels,
    )


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


def collate(data: Utterances, indices: np.ndarray, rng: np.random.Generator | None = None) -> Batch:
    """Pad the utterances ``indices`` into one batch; ``rng`` given: augment each."""
    feats = [data.features[int(i)].float() for i in indices]
    if rng is not None:
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
