"""The image-text corpus on Spark: landed pairs in, deduplicated, tokenized training shards out.

    cascade multimodal sources --landing DIR --generated 1000   # land a batch
    cascade multimodal corpus --landing DIR --out DIR           # build the corpus

A landing batch (:mod:`jobs.multimodal_sources`) is ``images/`` plus ``captions.jsonl``.
:func:`build_corpus` runs four timed stages, each ending in a Spark action:

1. ``decode``: pair every caption with its image file (either missing -> quarantine); decode and
   validate the image (empty, unreadable, truncated, too small, extreme aspect ratio, uniform,
   an SVG that does not rasterize -> quarantine with the reason), pad it to a square on white
   (alpha composited), resize to ``side`` x ``side`` RGB; normalize the caption (NFKC,
   whitespace) and read its language tag: any language (:func:`language_tag`), only a tag
   that is no language code or contradicts the script (``zh`` without Chinese characters,
   ``en`` with them) is quarantined. Accepted: what
   Pillow decodes (PNG, JPEG, GIF, WebP, BMP, TIFF...) and SVG, rasterized by cairosvg in a
   child process with a timeout and size caps (:mod:`jobs.svg_raster`).
2. ``hashing``: a 64-bit perceptual hash (:func:`phash`) per image, cut into
   ``max_hamming + 1`` bands; MinHash signatures (Spark ML ``MinHashLSH``) of each caption's
   shingles.
3. ``dedup``: images whose hashes agree on a band are candidates (by pigeonhole every pair
   within ``max_hamming`` bits shares a band), kept as edges when the Hamming distance is at
   most ``max_hamming``; captions within ``caption_max_distance`` Jaccard distance
   (``approxSimilarityJoin``). Connected components give the groups: a component's pairs all
   go to one split, and within a component of duplicate edges only the smallest ``pair_id``
   stays. An image shared by pairs in different languages (a stamp's English and Chinese
   caption) is one group but not a duplicate: translations are kept.
4. ``write``: a character tokenizer (:mod:`domains.captions.tokenizer`) fitted on the train
   captions, whatever their languages (a model trained on the corpus keeps it), token ids per
   pair, parquet shards ``shards/split=S/shard=K`` with ``pair_id``,
   ``image`` (``side*side*3`` uint8 bytes, HWC), ``token_ids``, ``caption``, ``language``,
   ``source``; ``manifest`` (no pixels), ``quarantine`` and ``duplicates`` (with reasons),
   ``shards.json`` (rows, languages, mean tokens per shard), ``tokenizer.json`` and
   ``summary.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import sys
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from domains.captions.tokenizer import CaptionTokenizer
from jobs.quarantine import count_reasons, empty_files
from jobs.svg_raster import SvgRasterizer

SPLITS = ("train", "val", "test")
LANGUAGE_TAG = re.compile(r"[a-z]{2,3}|und")
"""A caption's language as the corpus stores it: the tag's primary subtag, an ISO 639 code
(``und``: undetermined)."""
STOP_WORDS = frozenset("a an the and of at in on to is with".split())


@dataclass(frozen=True, kw_only=True)
class CorpusConfig:
    """Checks, dedup thresholds and output layout of the corpus job."""

    side: int = 64
    """Output images are ``side`` x ``side`` RGB."""
    min_side: int = 16
    """Smaller input images (either dimension, in pixels) are quarantined."""
    max_aspect: float = 4.0
    """Long side / short side above this is quarantined (strips, banners)."""
    min_pixel_std: float = 1.0
    """An image whose output pixels vary less than this (standard deviation, 0-255 scale) is
    uniform (blank, one colour, fully transparent) and quarantined."""
    svg_max_bytes: int = 1 << 20
    """Larger SVG files are quarantined unparsed."""
    svg_max_side: int = 256
    """Longest side of an SVG's raster in pixels (the drawing's own size sets only its shape)."""
    svg_timeout_s: float = 10.0
    """An SVG that takes longer to rasterize is quarantined (its child process is killed)."""
    max_hamming: int = 3
    """Images whose 64-bit pHashes differ in at most this many bits are near-duplicates."""
    caption_max_distance: float = 0.5
    """Captions within this Jaccard distance of each other's shingle sets are near-duplicates."""
    minhash_tables: int = 3
    max_tokens: int = 256
    """Captions tokenizing longer than this (with BOS/EOS) are quarantined."""
    val_share: float = 0.05
    test_share: float = 0.05
    shards: int = 2
    """Parquet shards per split."""

    def __post_init__(self) -> None:
        if self.side < 8 or self.min_side < 1 or self.max_aspect < 1:
            raise ValueError("need side >= 8, min_side >= 1, max_aspect >= 1")
        if not 0 <= self.max_hamming < 32:
            raise ValueError("max_hamming must be in [0, 32)")
        if not 0 <= self.caption_max_distance < 1 or self.minhash_tables < 1:
            raise ValueError("caption_max_distance in [0, 1) and minhash_tables >= 1")
        if not 0 <= self.val_share + self.test_share < 1 or self.shards < 1:
            raise ValueError("val_share + test_share in [0, 1) and shards >= 1")
        if self.max_tokens < 3:
            raise ValueError("max_tokens must be >= 3")
        if self.min_pixel_std < 0 or self.svg_max_bytes < 1 or self.svg_timeout_s <= 0:
            raise ValueError("need min_pixel_std >= 0, svg_max_bytes >= 1, svg_timeout_s > 0")
        if self.svg_max_side < self.side:
            raise ValueError("svg_max_side must be >= side")

    def svg_rasterizer(self) -> SvgRasterizer:
        return SvgRasterizer(
            max_side=self.svg_max_side, max_bytes=self.svg_max_bytes, timeout_s=self.svg_timeout_s
        )


# --- pure functions (no Spark) --------------------------------------------------------------


def is_cjk(c: str) -> bool:
    return "\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff"


def normalize_caption(text: str) -> str:
    """NFKC, whitespace runs collapsed to one space, trimmed; case and punctuation kept."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def language_tag(declared: str | None, caption: str) -> str:
    """The caption's language, any language: the primary subtag of the declared tag (``zh_CN``,
    ``zh-TW``, ``EN``, ``cs-CZ``...) lower-cased; without a tag, ``zh`` for a caption with
    Chinese characters, ``en`` for plain ASCII, else ``und`` (undetermined).

    ValueError for a tag that is no ISO 639 code, or when the script contradicts ``zh`` or
    ``en`` (the two languages whose script this checks)."""
    has_cjk = any(is_cjk(c) for c in caption)
    if not declared or not declared.strip():
        return "zh" if has_cjk else "en" if caption.isascii() else "und"
    tag = declared.strip().lower().replace("-", "_").split("_")[0]
    if not LANGUAGE_TAG.fullmatch(tag):
        raise ValueError(f"not a language tag: {declared!r} (an ISO 639 code such as en, cs, zh)")
    if tag == "zh" and not has_cjk:
        raise ValueError("tagged zh but has no Chinese characters")
    if tag == "en" and has_cjk:
        raise ValueError("tagged en but has Chinese characters")
    return tag


def shingles(caption: str, n: int = 3) -> list[str]:
    """Dedup units: content words of Latin text, characters of Chinese; their ``n``-grams.

    Word n-grams rather than character n-grams for Latin text: captions drawn from one
    vocabulary share most of their character n-grams, which would put almost every pair in
    the same MinHash bucket."""
    text = "".join(c if (c.isalnum() or c.isspace()) else " " for c in caption.lower())
    units: list[str] = []
    for word in text.split():
        if any(is_cjk(c) for c in word):
            units.extend(word)
        elif word not in STOP_WORDS:
            units.append(word)
    if len(units) <= n:
        return [" ".join(units)] if units else []
    return sorted({" ".join(units[i : i + n]) for i in range(len(units) - n + 1)})


def is_svg(content: bytes, name: str) -> bool:
    return name.lower().endswith(".svg") or b"<svg" in content[:2048]


def decode_image(
    content: bytes, name: str, config: CorpusConfig, rasterizer: SvgRasterizer | None = None
) -> np.ndarray:
    """``[side, side, 3]`` uint8: decoded, checked, alpha on white, padded square, resized.

    ValueError naming what is wrong. An SVG is rasterized by ``rasterizer`` (one is started for
    this file when none is given)."""
    from PIL import Image

    if not content:
        raise ValueError("empty file")
    if is_svg(content, name):
        if rasterizer is None:
            with config.svg_rasterizer() as own:
                content = own.rasterize(content)
        else:
            content = rasterizer.rasterize(content)
    try:
        image: Image.Image = Image.open(io.BytesIO(content))
    except Exception:  # noqa: BLE001 - PIL raises several types for foreign bytes
        raise ValueError("unreadable (not a known image format)") from None
    try:
        image.load()
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"truncated or corrupt data ({exc})") from None
    width, height = image.size
    if min(width, height) < config.min_side:
        raise ValueError(f"too small ({width}x{height} < {config.min_side} px)")
    if max(width, height) / min(width, height) > config.max_aspect:
        raise ValueError(f"extreme aspect ratio ({width}x{height} > {config.max_aspect}:1)")
    if image.mode in ("P", "LA", "PA") or "transparency" in image.info:
        image = image.convert("RGBA")
    side = max(width, height)
    canvas = Image.new("RGB", (side, side), (255, 255, 255))
    offset = ((side - width) // 2, (side - height) // 2)
    if image.mode == "RGBA":
        canvas.paste(image, offset, mask=image.getchannel("A"))
    else:
        canvas.paste(image.convert("RGB"), offset)
    resized = canvas.resize((config.side, config.side), Image.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.uint8)
    spread = float(pixels.std())
    if spread < config.min_pixel_std:
        colour = tuple(int(c) for c in pixels.reshape(-1, 3).mean(axis=0).round())
        raise ValueError(
            f"uniform (pixel std {spread:.2f} < {config.min_pixel_std:g}: every pixel about "
            f"RGB {colour})"
        )
    return pixels


def phash(pixels: np.ndarray) -> int:
    """64-bit perceptual hash: the 8x8 lowest frequencies of the DCT of a 32x32 grey thumbnail,
    one bit per coefficient above their median.

    Rather than a difference hash: stamps and emoji are objects on a flat white background,
    where a difference hash is mostly zero bits and unrelated silhouettes collide; the median
    threshold sets about half of the bits whatever the background."""
    from PIL import Image
    from scipy.fft import dctn

    grey = np.asarray(
        Image.fromarray(pixels).convert("L").resize((32, 32), Image.Resampling.BOX),
        dtype=np.float32,
    )
    low = dctn(grey, norm="ortho")[:8, :8].flatten()
    bits = low > np.median(low[1:])
    return int(sum(1 << i for i, bit in enumerate(bits) if bit))


def signed64(value: int) -> int:
    """The unsigned 64-bit ``value`` as Spark's signed ``long``."""
    return value - (1 << 64) if value >= 1 << 63 else value


def hash_bands(value: int, bands: int) -> list[int]:
    """``value`` cut into ``bands`` bit ranges; each band id is tagged with its index."""
    edges = [round(64 * i / bands) for i in range(bands + 1)]
    return [
        (i << 40) | ((value >> lo) & ((1 << (hi - lo)) - 1))
        for i, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False))
    ]


def split_column(group: Any, config: CorpusConfig) -> Any:
    """Stable split of a group as a Spark column: a hash of the group id, never of one pair,
    so near-duplicates (and a picture's translations) never straddle splits."""
    from pyspark.sql import functions as F

    bucket = F.pmod(F.xxhash64(group), F.lit(1_000_000)) / 1_000_000
    return (
        F.when(bucket < config.test_share, "test")
        .when(bucket < config.test_share + config.val_share, "val")
        .otherwise("train")
    )


def decode_file(
    content: bytes | None,
    name: str,
    config: CorpusConfig,
    rasterizer: SvgRasterizer | None = None,
) -> tuple[str | None, bytes | None]:
    """``(None, pixels)`` or ``(reason, None)`` for one landed image file."""
    try:
        return None, decode_image(content or b"", name, config, rasterizer).tobytes()
    except ValueError as exc:
        return f"image: {exc}", None


def check_pair(
    has_image: bool,
    image_reason: str | None,
    caption: str | None,
    language: str | None,
) -> tuple[str | None, str | None, str | None]:
    """``(reason, normalized caption, language tag)`` of one pair; reason None when it is good.

    The first failing check names the reason: a missing side, the caption, then the image."""
    if not has_image:
        return "image missing", None, None
    normalized = normalize_caption(caption or "")
    if not normalized:
        return "caption missing", None, None
    try:
        tag = language_tag(language, normalized)
    except ValueError as exc:
        return f"language: {exc}", normalized, None
    return image_reason, normalized, tag


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        """Every id that was ever unioned, mapped towards its component's smallest id."""

    def find(self, x: str) -> str:
        root = x
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while x != root:
            self.parent[x], x = root, self.parent.get(x, x)
        return root

    def union(self, a: str, b: str) -> None:
        self.parent.setdefault(a, a)
        self.parent.setdefault(b, b)
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            low, high = sorted((ra, rb))
            self.parent[high] = low  # the smallest id names the component


def resolve_duplicates(
    edges: list[tuple[str, str, str, bool]],
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """From edges ``(a, b, kind, duplicate)``: the ``group`` of every pair on an edge, and the
    removed pairs as ``pair -> (kind, kept pair)``.

    Groups are connected components over all edges (they decide the split). Removal is greedy
    in id order: a pair goes when it is a duplicate of a pair already kept. Not "keep one per
    component": near-duplicate is not transitive, and a chain of small differences can link
    pictures that are nothing alike."""
    groups = UnionFind()
    neighbours: dict[str, dict[str, str]] = {}
    for a, b, kind, duplicate in edges:
        groups.union(a, b)
        if duplicate:
            for x, y in ((a, b), (b, a)):
                known = neighbours.setdefault(x, {})
                known[y] = "image" if "image" in (kind, known.get(y)) else kind
    kept: set[str] = set()
    removed: dict[str, tuple[str, str]] = {}
    for node in sorted(neighbours):
        matches = sorted(n for n in neighbours[node] if n in kept)
        if matches:
            removed[node] = (neighbours[node][matches[0]], matches[0])
        else:
            kept.add(node)
    return {node: groups.find(node) for node in groups.parent}, removed


# --- Spark ----------------------------------------------------------------------------------

DECODED_SCHEMA = (
    "pair_id string, image string, source string, raw_caption string, reason string, "
    "caption string, language string, pixels binary"
)


def decode_stage(spark: Any, landing: Path, config: CorpusConfig) -> Any:
    """Every landed pair with its reason (None = good), normalized caption and pixels.

    Each image file is decoded once, however many captions it has, and the captions are
    full-outer-joined to them so that either side missing is a quarantined row."""
    from pyspark.sql import functions as F

    captions_path = landing / "captions.jsonl"
    if not captions_path.is_file():
        raise FileNotFoundError(f"{captions_path} missing: land a batch first")
    files = (
        spark.read.format("binaryFile")
        .load(str(landing / "images"))
        .select(F.regexp_extract("path", r"([^/]+)$", 1).alias("image"), "content")
        .where(F.length("content") > 0)
    )
    # binaryFile skips 0-byte files: listed here, they are quarantined as empty, not "missing".
    empty = [(p.name, bytearray()) for p in empty_files(landing / "images")]
    if empty:
        files = files.unionByName(spark.createDataFrame(empty, "image string, content binary"))

    def decode(records: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        # RDD partitions, not mapInPandas: the installed PySpark's Python side and its JVM
        # disagree on the pandas-UDF constructor; plain RDD functions work across them.
        # One SVG rasterizer per partition: its child process starts at the first SVG.
        with config.svg_rasterizer() as rasterizer:
            for r in records:
                content = r["content"] and bytes(r["content"])
                reason, pixels = decode_file(content, r["image"], config, rasterizer)
                yield r["image"], reason, pixels

    images = spark.createDataFrame(
        files.rdd.mapPartitions(decode), "image string, image_reason string, pixels binary"
    ).withColumn("present", F.lit(True))
    captions = (
        spark.read.schema(
            "pair_id string, image string, caption string, language string, source string"
        )
        .json(str(captions_path))
        .dropDuplicates(["pair_id"])
    )
    pairs = captions.join(images, "image", "full_outer").select(
        F.coalesce("pair_id", F.concat(F.lit("image:"), "image")).alias("pair_id"),
        "image",
        F.coalesce("source", F.lit("unknown")).alias("source"),
        "caption",
        "language",
        F.coalesce("present", F.lit(False)).alias("present"),
        "image_reason",
        "pixels",
    )

    def check(records: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        for r in records:
            reason, caption, language = check_pair(
                r["present"], r["image_reason"], r["caption"], r["language"]
            )
            pixels = r["pixels"] if reason is None else None
            yield (
                r["pair_id"],
                r["image"],
                r["source"],
                r["caption"],
                reason,
                caption,
                language,
                pixels,
            )

    return spark.createDataFrame(pairs.rdd.mapPartitions(check), DECODED_SCHEMA)


def hashing_stage(spark: Any, valid: Any, config: CorpusConfig) -> tuple[Any, Any]:
    """``(hashed, minhash_model)``: pHash, its bands and caption shingle vectors per pair."""
    from pyspark.ml.feature import HashingTF, MinHashLSH

    bands = config.max_hamming + 1
    side = config.side

    def hash_rows(records: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        for r in records:
            value = phash(np.frombuffer(r["pixels"], dtype=np.uint8).reshape(side, side, 3))
            units = shingles(r["caption"]) or [r["caption"]]
            yield r["pair_id"], r["language"], signed64(value), hash_bands(value, bands), units

    hashed = spark.createDataFrame(
        valid.select("pair_id", "language", "caption", "pixels").rdd.mapPartitions(hash_rows),
        "pair_id string, language string, phash long, bands array<long>, units array<string>",
    )
    vectors = HashingTF(inputCol="units", outputCol="shingles", numFeatures=1 << 20, binary=True)
    hashed = vectors.transform(hashed)
    model = MinHashLSH(
        inputCol="shingles", outputCol="minhash", numHashTables=config.minhash_tables, seed=13
    ).fit(hashed)
    return model.transform(hashed), model


def dedup_stage(hashed: Any, model: Any, config: CorpusConfig) -> list[tuple[str, str, str, bool]]:
    """Edges ``(a, b, kind, duplicate)`` with ``a < b``, from the image bands and MinHash."""
    from pyspark.sql import functions as F

    banded = hashed.select("pair_id", "language", "phash", F.explode("bands").alias("band"))
    left, right = banded.alias("l"), banded.alias("r")
    image_edges = (
        left.join(
            right, (F.col("l.band") == F.col("r.band")) & (F.col("l.pair_id") < F.col("r.pair_id"))
        )
        .select(
            F.col("l.pair_id").alias("a"),
            F.col("r.pair_id").alias("b"),
            (F.col("l.language") == F.col("r.language")).alias("duplicate"),
            F.expr("bit_count(l.phash ^ r.phash)").alias("bits"),
        )
        .where(F.col("bits") <= config.max_hamming)
        .dropDuplicates(["a", "b"])
        .collect()
    )
    caption_edges = (
        model.approxSimilarityJoin(hashed, hashed, config.caption_max_distance, distCol="distance")
        .select(F.col("datasetA.pair_id").alias("a"), F.col("datasetB.pair_id").alias("b"))
        .where(F.col("a") < F.col("b"))
        .collect()
    )
    return [(r["a"], r["b"], "image", bool(r["duplicate"])) for r in image_edges] + [
        (r["a"], r["b"], "caption", True) for r in caption_edges
    ]


def build_corpus(
    spark: Any, landing: Path, out: Path, config: CorpusConfig | None = None
) -> dict[str, Any]:
    """Build the corpus from ``landing`` into ``out``; returns the summary (also written)."""
    from pyspark.sql import functions as F

    config = config or CorpusConfig()
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    def log(message: str) -> None:
        print(f"[multimodal_corpus] {message}", flush=True)

    started = time.perf_counter()
    decoded = decode_stage(spark, landing, config).cache()
    pairs_in = decoded.count()
    seconds["decode"] = time.perf_counter() - started
    log(f"decoded {pairs_in} pairs in {seconds['decode']:.1f} s")
    cached = [decoded]
    try:
        valid = decoded.where(F.col("reason").isNull())
        started = time.perf_counter()
        hashed, model = hashing_stage(spark, valid, config)
        hashed = hashed.cache()
        cached.append(hashed)
        hashed.count()
        seconds["hashing"] = time.perf_counter() - started

        started = time.perf_counter()
        edges = dedup_stage(hashed, model, config)
        groups, removed = resolve_duplicates(edges)
        seconds["dedup"] = time.perf_counter() - started
        log(f"{len(edges)} near-duplicate edges, {len(removed)} pairs removed")

        started = time.perf_counter()
        summary = write_outputs(spark, decoded, valid, groups, removed, out, config)
        seconds["write"] = time.perf_counter() - started
    finally:
        for frame in cached:
            frame.unpersist()
    total = sum(seconds.values())
    summary.update(
        pairs_in=pairs_in,
        seconds=seconds,
        time_share={k: v / total for k, v in seconds.items()},
        config=asdict(config),
        out=str(out),
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    log(
        f"{summary['kept']} kept {summary['splits']}, {summary['quarantined']} quarantined "
        f"{summary['quarantine_reasons']}, duplicates removed {summary['duplicates_removed']}"
    )
    return summary


def write_outputs(
    spark: Any,
    decoded: Any,
    valid: Any,
    groups: dict[str, str],
    removed: dict[str, tuple[str, str]],
    out: Path,
    config: CorpusConfig,
) -> dict[str, Any]:
    """Split, tokenize and write shards, manifest, quarantine, duplicates and statistics."""
    from pyspark.sql import functions as F

    mapping = spark.createDataFrame(
        [(p, g, *removed.get(p, (None, None))) for p, g in groups.items()]
        or [("", "", None, None)],
        "pair_id string, group_id string, duplicate_kind string, kept_pair_id string",
    )
    joined = valid.join(mapping, "pair_id", "left").withColumn(
        "group_id", F.coalesce("group_id", "pair_id")
    )
    duplicates = joined.where(F.col("duplicate_kind").isNotNull()).select(
        "pair_id", "source", "caption", "duplicate_kind", "kept_pair_id"
    )
    kept = joined.where(F.col("duplicate_kind").isNull()).withColumn(
        "split", split_column(F.col("group_id"), config)
    )

    train_chars = (
        kept.where(F.col("split") == "train").select("caption").rdd.flatMap(lambda r: r[0])
    )
    counts = dict(train_chars.map(lambda c: (c, 1)).reduceByKey(lambda a, b: a + b).collect())
    tokenizer = CaptionTokenizer.from_counts(counts)
    tokenizer.save(out / "tokenizer.json")
    chars = tokenizer.chars
    shards = config.shards

    def tokenize(records: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        local = CaptionTokenizer(chars=chars)
        for r in records:
            ids = local.encode(r["caption"])
            shard = int.from_bytes(hashlib.sha256(r["pair_id"].encode()).digest()[:4], "little")
            yield (
                r["pair_id"],
                r["group_id"],
                r["source"],
                r["caption"],
                r["language"],
                r["split"],
                shard % shards,
                ids,
                len(ids),
                r["pixels"],
            )

    records = spark.createDataFrame(
        kept.select(
            "pair_id", "group_id", "source", "caption", "language", "split", "pixels"
        ).rdd.mapPartitions(tokenize),
        "pair_id string, group_id string, source string, caption string, language string, "
        "split string, shard int, token_ids array<int>, num_tokens int, image binary",
    ).cache()
    try:
        too_long = records.where(F.col("num_tokens") > config.max_tokens)
        good = records.where(F.col("num_tokens") <= config.max_tokens)
        good.repartition("split", "shard").write.mode("overwrite").partitionBy(
            "split", "shard"
        ).parquet(str(out / "shards"))
        manifest = good.drop("image", "token_ids")
        manifest.coalesce(1).write.mode("overwrite").parquet(str(out / "manifest"))
        quarantine = decoded.where(F.col("reason").isNotNull()).select(
            "pair_id", "image", "source", F.col("raw_caption").alias("caption"), "reason"
        )
        quarantine = quarantine.unionByName(
            too_long.select(
                "pair_id",
                F.lit(None).cast("string").alias("image"),
                "source",
                "caption",
                F.format_string(
                    f"caption: too long (%d tokens > {config.max_tokens})", "num_tokens"
                ).alias("reason"),
            )
        )
        quarantine.coalesce(1).write.mode("overwrite").parquet(str(out / "quarantine"))
        duplicates.coalesce(1).write.mode("overwrite").parquet(str(out / "duplicates"))
    finally:
        records.unpersist()
    # The manifest and quarantine hold no pixels: small enough to summarize on the driver,
    # which saves two Spark jobs per build.
    import pandas as pd

    reasons = (
        pd.read_parquet(out / "quarantine", columns=["reason"])["reason"]
        .str.extract(r"^([^(]+?)\s*(?:\(|$)", expand=False)
        .value_counts()
    )
    reasons_by_kind = {str(k): int(v) for k, v in reasons.items()}
    by_reason = count_reasons(
        (str(reason), int(count))
        for reason, count in pd.read_parquet(out / "quarantine", columns=["reason"])["reason"]
        .value_counts()
        .items()
    )
    rows = pd.read_parquet(out / "manifest", columns=["split", "shard", "language", "num_tokens"])
    languages = sorted(rows["language"].unique())
    shard_stats = [
        {
            "split": split,
            "shard": int(shard),
            "path": f"shards/split={split}/shard={shard}",
            "rows": len(part),
            "languages": {lang: int((part["language"] == lang).sum()) for lang in languages},
            "mean_tokens": float(part["num_tokens"].mean()),
            "max_tokens": int(part["num_tokens"].max()),
        }
        for (split, shard), part in rows.groupby(["split", "shard"], sort=True)
    ]
    (out / "shards.json").write_text(json.dumps(shard_stats, indent=2))
    by_kind = {"image": 0, "caption": 0}
    for kind, _ in removed.values():
        by_kind[kind] += 1
    splits = {s: sum(x["rows"] for x in shard_stats if x["split"] == s) for s in SPLITS}
    return {
        "kept": sum(splits.values()),
        "splits": splits,
        "quarantined": sum(reasons_by_kind.values()),
        "quarantine_reasons": reasons_by_kind,
        "quarantine_by_reason": by_reason,
        "duplicates_removed": by_kind,
        "groups_spanning_pairs": len(set(groups.values())),
        "vocab_size": tokenizer.vocab_size,
        "image_shape": [config.side, config.side, 3],
        "shards": shard_stats,
    }


def spark_session(master: str | None = None) -> Any:
    from cascade.config import load_settings
    from jobs.spark_sessions import build_session, stack_conf

    settings = load_settings()
    return build_session(
        "cascade.multimodal_corpus",
        master=master or settings.spark_master,
        conf={
            "spark.sql.shuffle.partitions": "8",
            # Landed images are small files: at Spark's default 4 MB cost per opened file, 10k
            # images become hundreds of tiny read tasks, each paying task and Python start-up.
            "spark.sql.files.openCostInBytes": str(256 << 10),
            "spark.sql.files.maxPartitionBytes": str(32 << 20),
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": settings.spark_driver_memory,
            **stack_conf(settings),
        },
        local_ip=settings.host,
        python_workers=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landing", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    summary = build_corpus(spark_session(), args.landing, args.out)
    print(json.dumps({k: v for k, v in summary.items() if k != "shards"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
