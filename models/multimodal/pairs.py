"""Image-text pairs for the multimodal model: the corpus shards, or a generator of known content.

The corpus job writes parquet rows with ``pair_id``, ``image`` (64x64x3 uint8 HWC bytes),
``tokens`` (int ids, padding 0; ``token_ids`` is read as well), ``caption``, ``language`` and
``split`` (train/val/test), under ``shards/`` or any folder layout (a ``split=NAME`` folder stands
in for a missing ``split`` column). ``summary.json``'s ``vocab_size``, when present, sizes the
model's vocabulary (:func:`corpus_vocab_size`).
:func:`load_split` reads that into :class:`Pairs`.

Without a corpus, :func:`generate_pairs` draws coloured shapes at known positions and writes a
caption that says what is where ("a small red circle at the top left"), tokenized with the
word vocabulary :data:`WORDS`. Pair ``i`` is a function of ``(seed, i)`` only, and its split a
function of ``i``, so any count reproduces the same pairs. Identical captions describe images
that differ only in jitter and noise: retrieval counts a caption-identical item as a match
(``Pairs.groups``).

Held-out templates: a caption's template is its colour and shape ("red circle",
:func:`template_of`). The templates of :data:`HELDOUT_TEMPLATES` (one shape per colour, a
quarter of them) never appear in the ``train``, ``val`` or ``test`` splits (a pair that draws
one draws again); the ``heldout`` split (:data:`HELDOUT`, generator only) holds as many pairs as
``test``, each of a held-out template. Recall on it measures captions whose colour and shape
the model saw, but never together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.multimodal.model import BOS, EOS, PAD

SPLITS = ("train", "val", "test")
IMAGE_SIZE = 64
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 80, 220),
    "yellow": (235, 215, 40),
    "purple": (150, 60, 190),
    "white": (245, 245, 245),
}
SHAPES = ("square", "circle", "triangle", "cross")
POSITIONS: dict[str, tuple[float, float]] = {
    "top left": (0.25, 0.25),
    "top": (0.5, 0.25),
    "top right": (0.75, 0.25),
    "left": (0.25, 0.5),
    "center": (0.5, 0.5),
    "right": (0.75, 0.5),
    "bottom left": (0.25, 0.75),
    "bottom": (0.5, 0.75),
    "bottom right": (0.75, 0.75),
}
SIZES = {"small": 0.12, "big": 0.2}
WORDS: tuple[str, ...] = (
    "<pad>", "<bos>", "<eos>", "<unk>", "a", "at", "the",
    *SIZES, *COLOURS, *SHAPES, "top", "bottom", "left", "right", "center",
)  # fmt: skip
"""Generator vocabulary: id = index (0 padding, 1 BOS, 2 EOS, 3 unknown)."""
HELDOUT = "heldout"
"""The generator's split of pairs whose templates no other split holds."""
HELDOUT_TEMPLATES: tuple[tuple[str, str], ...] = tuple(
    (colour, SHAPES[index % len(SHAPES)]) for index, colour in enumerate(COLOURS)
)
"""(colour, shape) templates kept out of training: one shape per colour, every colour and every
shape still seen in training with other partners."""


@dataclass
class Pairs:
    """Pairs in memory: ``images`` uint8 ``(N, 64, 64, 3)``, ``tokens`` int64 ``(N, L)``."""

    pair_ids: list[str]
    images: torch.Tensor
    tokens: torch.Tensor
    captions: list[str]

    def __len__(self) -> int:
        return len(self.pair_ids)

    @property
    def groups(self) -> np.ndarray:
        """Equal for pairs whose captions are identical (same described content)."""
        _, inverse = np.unique(np.array(self.captions, dtype=object), return_inverse=True)
        return inverse


def tokenize(caption: str, max_tokens: int) -> list[int]:
    index = {w: i for i, w in enumerate(WORDS)}
    ids = [BOS, *(index.get(w, 3) for w in caption.split()), EOS][:max_tokens]
    return ids + [PAD] * (max_tokens - len(ids))


def split_of(index: int) -> str:
    return {0: "test", 1: "val"}.get(index % 10, "train")


def template_of(caption: str) -> tuple[str, str]:
    """The (colour, shape) of a generator caption ("a small red circle at the top")."""
    words = caption.split()
    if len(words) < 4 or words[2] not in COLOURS or words[3] not in SHAPES:
        raise ValueError(f"not a generator caption: {caption!r}")
    return words[2], words[3]


def draw(
    rng: np.random.Generator, template: tuple[str, str] | None = None
) -> tuple[np.ndarray, str]:
    """One image with one shape, and its caption; ``template`` fixes colour and shape."""
    if template is None:
        colour = str(rng.choice(list(COLOURS)))
        shape = str(rng.choice(SHAPES))
    else:
        colour, shape = template
    position = str(rng.choice(list(POSITIONS)))
    size = str(rng.choice(list(SIZES)))
    n = IMAGE_SIZE
    image = rng.integers(0, 60, size=(n, n, 3)).astype(np.float32)  # dark noisy background
    cx, cy = (np.array(POSITIONS[position]) + rng.uniform(-0.05, 0.05, 2)) * n
    r = SIZES[size] * n
    yy, xx = np.mgrid[0:n, 0:n] + 0.5
    dx, dy = xx - cx, yy - cy
    if shape == "square":
        inside = (np.abs(dx) <= r) & (np.abs(dy) <= r)
    elif shape == "circle":
        inside = dx**2 + dy**2 <= r**2
    elif shape == "triangle":
        inside = (dy <= r) & (dy >= -r) & (np.abs(dx) <= (dy + r) / 2)
    else:
        inside = ((np.abs(dx) <= r / 3) & (np.abs(dy) <= r)) | (
            (np.abs(dy) <= r / 3) & (np.abs(dx) <= r)
        )
    image[inside] = np.array(COLOURS[colour]) * rng.uniform(0.85, 1.0)
    return image.clip(0, 255).astype(np.uint8), f"a {size} {colour} {shape} at the {position}"


def generated_pair(seed: int, index: int, split: str) -> tuple[np.ndarray, str]:
    """Pair ``index`` of ``split``: of a held-out template in :data:`HELDOUT`, of any other
    template elsewhere (a draw of a held-out one draws again, from a seed of its own)."""
    if split == HELDOUT:
        rng = np.random.default_rng([seed, index, 1])
        return draw(rng, HELDOUT_TEMPLATES[int(rng.integers(len(HELDOUT_TEMPLATES)))])
    held_out = set(HELDOUT_TEMPLATES)
    attempt = 0
    while True:
        key = [seed, index] if attempt == 0 else [seed, index, 2, attempt]
        image, caption = draw(np.random.default_rng(key))
        if template_of(caption) not in held_out:
            return image, caption
        attempt += 1


def generate_pairs(count: int, split: str, *, max_tokens: int, seed: int = 0) -> Pairs:
    """The ``split`` pairs among generator pairs ``0 .. count-1`` (:data:`HELDOUT`: one pair of
    a held-out template for each ``test`` index)."""
    if split not in (*SPLITS, HELDOUT):
        raise ValueError(f"split must be one of {(*SPLITS, HELDOUT)}, got {split!r}")
    ids, images, tokens, captions = [], [], [], []
    for i in range(count):
        if split_of(i) != ("test" if split == HELDOUT else split):
            continue
        image, caption = generated_pair(seed, i, split)
        ids.append(f"gen-{seed}-{i}" if split != HELDOUT else f"gen-{seed}-{i}-{HELDOUT}")
        images.append(image)
        captions.append(caption)
        tokens.append(tokenize(caption, max_tokens))
    return Pairs(
        ids,
        torch.from_numpy(np.stack(images))
        if images
        else torch.zeros(0, 64, 64, 3, dtype=torch.uint8),
        torch.tensor(tokens, dtype=torch.int64).reshape(-1, max_tokens),
        captions,
    )


def corpus_files(corpus_dir: Path) -> list[Path]:
    """The corpus's record shards: those under ``shards/`` when there is one (the job also
    writes a manifest and quarantine as parquet), else every parquet file under the folder."""
    root = Path(corpus_dir)
    files = sorted((root / "shards" if (root / "shards").is_dir() else root).rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{corpus_dir} is not a multimodal corpus: no parquet shards in it")
    return files


def corpus_vocab_size(corpus_dir: Path) -> int | None:
    """``vocab_size`` from the corpus's ``summary.json``, if it has one."""
    import json

    summary = Path(corpus_dir) / "summary.json"
    if not summary.exists():
        return None
    value = json.loads(summary.read_text()).get("vocab_size")
    return int(value) if value is not None else None


def load_split(
    corpus_dir: Path, split: str, *, max_tokens: int, vocab_size: int, limit: int | None = None
) -> Pairs:
    """The ``split`` rows of every parquet shard under ``corpus_dir``, sorted by ``pair_id``;
    token lists are cut or padded with 0 to ``max_tokens``."""
    import pandas as pd

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    frames = []
    for path in corpus_files(corpus_dir):
        frame = pd.read_parquet(path)
        if "split" not in frame.columns:
            named = [p.split("=", 1)[1] for p in path.parts if p.startswith("split=")]
            frame["split"] = named[-1] if named else None
        if "tokens" not in frame.columns and "token_ids" in frame.columns:
            frame = frame.rename(columns={"token_ids": "tokens"})
        frames.append(frame[frame["split"] == split])
    frame = pd.concat(frames, ignore_index=True).sort_values("pair_id", kind="stable")
    missing = {"pair_id", "image", "tokens", "caption"} - set(frame.columns)
    if missing:
        raise ValueError(f"{corpus_dir}: the shards lack columns {sorted(missing)}")
    if limit is not None:
        frame = frame.head(limit)
    size = IMAGE_SIZE * IMAGE_SIZE * 3
    images = np.zeros((len(frame), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    tokens = np.zeros((len(frame), max_tokens), dtype=np.int64)
    for row, (pair_id, blob, ids) in enumerate(
        zip(frame["pair_id"], frame["image"], frame["tokens"], strict=True)
    ):
        if len(blob) != size:
            raise ValueError(
                f"pair {pair_id}: image holds {len(blob)} bytes, expected {size} "
                f"({IMAGE_SIZE}x{IMAGE_SIZE}x3 uint8)"
            )
        images[row] = np.frombuffer(blob, dtype=np.uint8).reshape(IMAGE_SIZE, IMAGE_SIZE, 3)
        ids = np.asarray(ids, dtype=np.int64)[:max_tokens]
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(
                f"pair {pair_id}: token ids span [{ids.min()}, {ids.max()}], outside the "
                f"model's vocabulary of {vocab_size}; raise model.vocab_size"
            )
        tokens[row, : len(ids)] = ids
    return Pairs(
        [str(p) for p in frame["pair_id"]],
        torch.from_numpy(images),
        torch.from_numpy(tokens),
        [str(c) for c in frame["caption"]],
    )
