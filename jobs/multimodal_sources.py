"""Image-text landing batches: Tux Paint stamps, emoji, and generated pictures of known content.

    cascade multimodal sources --landing DIR [--generated N] [--no-tuxpaint] [--no-emoji]

A landing batch is ``images/`` (one file per image, any format) plus ``captions.jsonl``: one
JSON object per pair with ``pair_id``, ``image`` (file name in ``images/``), ``caption``,
``language`` and ``source``. Several pairs may share one image (a stamp's English and Chinese
captions are two pairs of the same picture).

- Tux Paint (Debian ``tuxpaint-stamps-default``): each stamp image has ``NAME.txt`` beside it,
  English on line 1 and ``LANG.utf8=...`` translations; English and ``zh_CN`` (else ``zh_TW``)
  become separate pairs. Stamps that exist only as SVG land as SVG.
- Emoji (npm ``emoji-datasource-google``, installed by ``infra/install.sh`` under the venv):
  the 64 px PNG of each emoji with its Unicode name as caption.
- Generated: pictures of 3-4 coloured shapes on a mottled background, rendered with PIL from
  a seeded spec, captioned with what was drawn. A share of them are planted near-duplicates:
  ``image`` ones re-render the previous scene with pixel noise (same caption), ``caption``
  ones draw the previous scene's objects on a new background with jittered positions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cascade.progress import track

STAMPS_ROOT = Path("/usr/share/tuxpaint/stamps")
EMOJI_PACKAGE = Path("npm/node_modules/emoji-datasource-google")
"""Relative to the virtual environment's root (where ``infra/install.sh`` puts it)."""

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 20),
    "orange": (250, 140, 0),
    "purple": (130, 40, 170),
    "pink": (250, 120, 190),
    "brown": (120, 70, 20),
    "black": (10, 10, 10),
    "white": (250, 250, 250),
    "grey": (128, 128, 128),
    "cyan": (0, 200, 220),
    "navy": (10, 20, 100),
    "olive": (120, 130, 20),
    "teal": (0, 120, 120),
    "maroon": (120, 0, 30),
}
SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring", "bar", "star")
SIZES = {"small": 0.14, "medium": 0.22, "large": 0.32}
POSITIONS = {
    "top left": (0.2, 0.2),
    "top": (0.5, 0.2),
    "top right": (0.8, 0.2),
    "left": (0.2, 0.5),
    "centre": (0.5, 0.5),
    "right": (0.8, 0.5),
    "bottom left": (0.2, 0.8),
    "bottom": (0.5, 0.8),
    "bottom right": (0.8, 0.8),
}


def emoji_root() -> Path:
    return Path(sys.prefix) / EMOJI_PACKAGE


def append_captions(landing: Path, records: list[dict[str, Any]]) -> None:
    landing.mkdir(parents=True, exist_ok=True)
    with (landing / "captions.jsonl").open("a", encoding="utf-8") as out:
        out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


# --- Tux Paint and emoji --------------------------------------------------------------------


def stamp_captions(caption_file: Path) -> dict[str, str]:
    """``{"en": ..., "zh": ...}`` from a stamp's ``NAME.txt`` (either may be missing)."""
    lines = caption_file.read_text(encoding="utf-8", errors="replace").splitlines()
    found: dict[str, str] = {}
    if lines and lines[0].strip() and ".utf8=" not in lines[0]:
        found["en"] = lines[0].strip()
    translations = dict(line.split("=", 1) for line in lines[1:] if ".utf8=" in line.split(" ")[0])
    for key in ("zh_CN.utf8", "zh_TW.utf8"):
        if translations.get(key, "").strip():
            found["zh"] = translations[key].strip()
            break
    return found


def land_tuxpaint(landing: Path, root: Path = STAMPS_ROOT, limit: int | None = None) -> int:
    """Copy each captioned stamp image (PNG, else SVG) and write its English/Chinese pairs."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root} missing: install tuxpaint-stamps-default (infra/install.sh)"
        )
    images = landing / "images"
    images.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    stamps = sorted(root.rglob("*.txt"))[:limit]
    for caption_file in track(stamps, desc="land tuxpaint", unit="stamps"):
        stem = caption_file.with_suffix("")
        source_image = next(
            (p for p in (stem.with_suffix(".png"), stem.with_suffix(".svg")) if p.is_file()), None
        )
        captions = stamp_captions(caption_file)
        if source_image is None or not captions:
            continue
        name = "tuxpaint-" + "_".join(stem.relative_to(root).parts) + source_image.suffix
        shutil.copyfile(source_image, images / name)
        for language, caption in captions.items():
            records.append(
                {
                    "pair_id": f"{Path(name).stem}-{language}",
                    "image": name,
                    "caption": caption,
                    "language": language,
                    "source": "tuxpaint",
                }
            )
    append_captions(landing, records)
    return len(records)


def land_emoji(landing: Path, root: Path | None = None, limit: int | None = None) -> int:
    """Copy the 64 px Google emoji PNGs and write one pair per emoji (its lower-cased name)."""
    root = root or emoji_root()
    if not (root / "emoji.json").is_file():
        raise FileNotFoundError(f"{root} missing: npm emoji-datasource-google (infra/install.sh)")
    images = landing / "images"
    images.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    entries = json.loads((root / "emoji.json").read_text())[:limit]
    for entry in track(entries, desc="land emoji", unit="emoji"):
        png = root / "img" / "google" / "64" / entry["image"]
        if not entry.get("has_img_google") or not entry.get("name") or not png.is_file():
            continue
        name = f"emoji-{entry['image']}"
        shutil.copyfile(png, images / name)
        records.append(
            {
                "pair_id": Path(name).stem,
                "image": name,
                "caption": f"{entry['name'].lower()} emoji",
                "language": "en",
                "source": "emoji",
            }
        )
    append_captions(landing, records)
    return len(records)


# --- generator ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    """Seeded synthetic pictures; ``image_dup_share`` + ``caption_dup_share`` are planted."""

    seed: int = 0
    side: int = 96
    image_dup_share: float = 0.03
    """Share of pictures that re-render the previous scene with pixel noise."""
    caption_dup_share: float = 0.02
    """Share that redraw the previous scene's objects on a new background (same caption)."""

    def __post_init__(self) -> None:
        if self.side < 32 or not 0 <= self.image_dup_share + self.caption_dup_share < 0.5:
            raise ValueError("side must be >= 32 and planted duplicate shares sum below 0.5")


def scene(index: int, seed: int) -> list[tuple[str, str, str, str]]:
    """Objects ``(size, colour, shape, position)`` of picture ``index``, distinct positions."""
    rng = random.Random(f"scene-{seed}-{index}")
    positions = rng.sample(sorted(POSITIONS), rng.randint(3, 4))
    return [
        (rng.choice(sorted(SIZES)), rng.choice(sorted(COLOURS)), rng.choice(SHAPES), p)
        for p in positions
    ]


def describe(objects: list[tuple[str, str, str, str]]) -> str:
    parts = [
        f"a {size} {colour} {shape} {'in the' if pos == 'centre' else 'at the'} {pos}"
        for size, colour, shape, pos in objects
    ]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def render(
    objects: list[tuple[str, str, str, str]], side: int, background_seed: str, jitter: float = 0.0
) -> np.ndarray:
    """``[side, side, 3]`` uint8: a smooth random background with the objects drawn on it."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(background_seed.encode()).digest()[:8])
    )
    coarse = rng.integers(60, 200, size=(4, 4, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((side, side), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for size, colour, shape, position in objects:
        cx, cy = POSITIONS[position]
        if jitter:
            cx, cy = cx + rng.uniform(-jitter, jitter), cy + rng.uniform(-jitter, jitter)
        r = SIZES[size] * side / 2
        x, y = cx * side, cy * side
        fill = COLOURS[colour]
        box = (x - r, y - r, x + r, y + r)
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "ring":
            draw.ellipse(box, outline=fill, width=max(2, int(r / 3)))
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        elif shape == "bar":
            draw.rectangle((x - r, y - r / 3, x + r, y + r / 3), fill=fill)
        elif shape == "triangle":
            draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
        elif shape == "diamond":
            draw.polygon([(x, y - r), (x - r, y), (x, y + r), (x + r, y)], fill=fill)
        elif shape == "cross":
            draw.rectangle((x - r, y - r / 4, x + r, y + r / 4), fill=fill)
            draw.rectangle((x - r / 4, y - r, x + r / 4, y + r), fill=fill)
        else:  # star: two overlaid triangles
            draw.polygon([(x, y - r), (x - r, y + r / 2), (x + r, y + r / 2)], fill=fill)
            draw.polygon([(x, y + r), (x - r, y - r / 2), (x + r, y - r / 2)], fill=fill)
    return np.asarray(image, dtype=np.uint8)


def planted_kind(index: int, config: GeneratorConfig) -> str:
    """``original``, or the kind of near-duplicate of picture ``index - 1`` planted here."""
    draw = random.Random(f"kind-{config.seed}-{index}").random()
    if index > 0 and draw < config.image_dup_share:
        return "image"
    if index > 0 and draw < config.image_dup_share + config.caption_dup_share:
        return "caption"
    return "original"


def scene_of(index: int, config: GeneratorConfig) -> list[tuple[str, str, str, str]]:
    """The objects picture ``index`` shows (a planted duplicate shows its original's)."""
    while planted_kind(index, config) != "original":
        index -= 1
    return scene(index, config.seed)


def picture_of(index: int, config: GeneratorConfig) -> np.ndarray:
    kind = planted_kind(index, config)
    if kind == "image":
        rng = np.random.default_rng(index)
        noise = rng.integers(-12, 13, size=(config.side, config.side, 3))
        previous = picture_of(index - 1, config).astype(np.int16)
        return np.clip(previous + noise, 0, 255).astype(np.uint8)
    background = f"bg-{config.seed}-{index}"
    jitter = 0.05 if kind == "caption" else 0.0
    return render(scene_of(index, config), config.side, background, jitter=jitter)


def generated_pair(index: int, config: GeneratorConfig) -> tuple[dict[str, Any], np.ndarray]:
    """Pair ``index``: its caption record (``planted`` says what it duplicates) and picture."""
    record = {
        "pair_id": f"gen-{config.seed}-{index:07d}",
        "image": f"gen-{config.seed}-{index:07d}.png",
        "caption": describe(scene_of(index, config)),
        "language": "en",
        "source": "generated",
        "planted": planted_kind(index, config),
    }
    return record, picture_of(index, config)


def land_generated(
    spark: Any, landing: Path, *, count: int, config: GeneratorConfig | None = None, start: int = 0
) -> int:
    """Render pairs ``start .. start + count`` as PNGs into ``landing`` on the Spark executors."""
    config = config or GeneratorConfig()
    images = landing / "images"
    images.mkdir(parents=True, exist_ok=True)

    def write(indices: Iterator[int]) -> Iterator[str]:
        from PIL import Image

        for index in indices:
            record, pixels = generated_pair(index, config)
            Image.fromarray(pixels).save(images / record["image"], compress_level=1)
            yield json.dumps(record)

    slices = max(2, min(64, count // 500))
    lines = spark.sparkContext.parallelize(range(start, start + count), slices)
    records = [json.loads(line) for line in lines.mapPartitions(write).collect()]
    append_captions(landing, records)
    return len(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landing", type=Path, required=True)
    parser.add_argument("--generated", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-tuxpaint", action="store_true")
    parser.add_argument("--no-emoji", action="store_true")
    args = parser.parse_args(argv)
    counts: dict[str, int] = {}
    if not args.no_tuxpaint:
        counts["tuxpaint"] = land_tuxpaint(args.landing)
    if not args.no_emoji:
        counts["emoji"] = land_emoji(args.landing)
    if args.generated:
        from jobs.multimodal_corpus import spark_session

        counts["generated"] = land_generated(
            spark_session(),
            args.landing,
            count=args.generated,
            config=GeneratorConfig(seed=args.seed),
        )
    print(json.dumps({"landing": str(args.landing), "pairs": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
