"""The image-text corpus job: its pieces, and a landed batch with planted faults on Spark."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from domains.captions.tokenizer import BOS, EOS, CaptionTokenizer
from jobs.multimodal_corpus import (
    CorpusConfig,
    build_corpus,
    decode_image,
    language_tag,
    normalize_caption,
    phash,
    resolve_duplicates,
    shingles,
)
from jobs.multimodal_corpus_gate import MultimodalGateFailed, validate_corpus
from jobs.multimodal_sources import GeneratorConfig, generated_pair, stamp_captions

CONFIG = CorpusConfig(shards=1, minhash_tables=2)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def bits(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def test_tokenizer_round_trips_any_text_and_saves(tmp_path: Path) -> None:
    tokenizer = CaptionTokenizer.fit(["a red circle", "一只红苹果。", "a red square"])
    for text in ["a red circle", "一只红苹果。", "unseen: Zebra 🦓 字母Q", ""]:
        ids = tokenizer.encode(text)
        assert ids[0] == BOS and ids[-1] == EOS
        assert tokenizer.decode(ids) == text
    # Known characters get one id; an unseen one falls back to its UTF-8 bytes.
    assert len(tokenizer.encode("red")) == 5
    assert len(tokenizer.encode("🦓")) == 2 + 4
    tokenizer.save(tmp_path / "tokenizer.json")
    assert CaptionTokenizer.load(tmp_path / "tokenizer.json") == tokenizer
    # Fitted from captions in any language: Czech and German letters seen twice get their own
    # ids, the ones seen less are counted as unseen and spelled as bytes.
    mixed = CaptionTokenizer.fit(["Žlutý kůň", "žlutá růže", "Die Straße", "große Straße"])
    assert {"ž", "ů", "ß"} <= set(mixed.chars) and "Ž" not in mixed.chars
    assert mixed.unseen("Žlutý kůň") == 4  # Ž ý k ň: once each in training
    assert len(mixed.encode("ß")) == 3 and mixed.decode(mixed.encode("Žlutý kůň")) == "Žlutý kůň"


def test_captions_images_and_duplicate_resolution() -> None:
    assert normalize_caption("  Ａ red\u3000 circle\n") == "A red circle"
    assert language_tag("zh_CN", "一只红苹果") == "zh" and language_tag(None, "葡萄") == "zh"
    assert language_tag("EN", "A grape") == "en"
    with pytest.raises(ValueError, match="no Chinese"):
        language_tag("zh_TW", "A grape")
    # Any language: the tag's primary subtag; an undeclared non-ASCII caption is undetermined.
    assert language_tag("fr", "Un raisin") == "fr" and language_tag("cs-CZ", "Žlutý kůň") == "cs"
    assert language_tag(None, "Žlutý kůň") == "und" and language_tag(" ", "A grape") == "en"
    with pytest.raises(ValueError, match="not a language tag"):
        language_tag("english please", "A grape")
    assert shingles("A big red circle, at the top!") == ["big red circle", "red circle top"]
    assert shingles("字母Q。") == ["字 母 q"]

    config = GeneratorConfig(image_dup_share=0, caption_dup_share=0)
    first, second = generated_pair(0, config)[1], generated_pair(1, config)[1]
    noisy = np.clip(first + np.random.default_rng(0).integers(-6, 7, first.shape), 0, 255)
    decoded = [decode_image(png(p.astype(np.uint8)), "x.png", CONFIG) for p in (first, noisy)]
    assert decoded[0].shape == (64, 64, 3)
    assert bits(phash(decoded[0]), phash(decoded[1])) <= CONFIG.max_hamming
    other = decode_image(png(second), "y.png", CONFIG)
    assert bits(phash(decoded[0]), phash(other)) > 10

    # Transparent pixels land on white, and a wide image is padded, not stretched.
    rgba = np.zeros((20, 40, 4), np.uint8)
    rgba[8:12, 18:22] = (0, 0, 0, 255)
    square = decode_image(png(rgba), "t.png", CONFIG)
    assert square[:16].min() == 255 and square[48:].min() == 255  # padding above and below
    assert square[32, 32].max() < 128  # the opaque dot, in the middle
    # Nothing drawn: a fully transparent image, like an empty SVG, is uniform white.
    with pytest.raises(ValueError, match="uniform"):
        decode_image(png(np.zeros((20, 40, 4), np.uint8)), "t.png", CONFIG)
    with pytest.raises(ValueError, match="uniform"):
        decode_image(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "s.svg", CONFIG)

    # a~b and b~c but a and c differ: greedy keeps a and c, drops b only.
    groups, removed = resolve_duplicates(
        [("a", "b", "image", True), ("b", "c", "caption", True), ("c", "z", "image", False)]
    )
    assert removed == {"b": ("image", "a")}
    assert set(groups.values()) == {"a"}


def test_stamp_caption_files_give_english_and_chinese(tmp_path: Path) -> None:
    caption = tmp_path / "apple.txt"
    caption.write_text("A red apple.\nfr.utf8=Une pomme.\nzh_TW.utf8=蘋果。\nzh_CN.utf8=苹果。\n")
    assert stamp_captions(caption) == {"en": "A red apple.", "zh": "苹果。"}


def land_faults(landing: Path) -> dict[str, str]:
    """Ten generated pairs plus one of each fault; returns pair_id -> expected outcome."""
    images = landing / "images"
    images.mkdir(parents=True)
    config = GeneratorConfig(seed=5, image_dup_share=0, caption_dup_share=0)
    records, expected = [], {}
    pictures = {}
    for index in range(10):
        record, pixels = generated_pair(index, config)
        (images / record["image"]).write_bytes(png(pixels))
        pictures[index] = (record, pixels)
        records.append(record)
        expected[record["pair_id"]] = "kept"

    def add(pair_id: str, image: str, content: bytes | None, caption: str, outcome: str,
            language: str = "en") -> None:  # fmt: skip
        if content is not None:
            (images / image).write_bytes(content)
        records.append(
            {
                "pair_id": pair_id,
                "image": image,
                "caption": caption,
                "language": language,
                "source": "faults",
            }  # fmt: skip
        )
        expected[pair_id] = outcome

    base = pictures[0][1]
    add(
        "corrupt",
        "corrupt.png",
        b"\x89PNG but not really" * 20,
        "a broken file",
        "image: unreadable",
    )
    whole = png(pictures[1][1])
    add("truncated", "truncated.png", whole[: len(whole) // 2], "half a file", "image: truncated")
    add("tiny", "tiny.png", png(base[:8, :8]), "a very small picture", "image: too small")
    add(
        "wide", "wide.png", png(np.zeros((20, 200, 3), np.uint8)), "a black strip", "image: extreme"
    )
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="32" height="32"><circle r="9"/></svg>'
    add("vector", "vector.svg", svg, "a black circle", "kept")
    add("no-image", "nowhere.png", None, "a picture that never landed", "image missing")
    add("wrong-language", "lang.png", png(base[::-1].copy()), "一个红色的圆", "language:")
    (images / "orphan.png").write_bytes(png(base[:, ::-1].copy()))
    expected["image:orphan.png"] = "caption missing"
    noise = np.random.default_rng(1).integers(-6, 7, base.shape)
    near_copy = np.clip(base.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    add("near-image", "near-image.png", png(near_copy), "a quite different caption", "dup image")
    caption = "Picture: " + pictures[3][0]["caption"].upper() + "!"
    fresh = generated_pair(0, GeneratorConfig(seed=99))[1]
    add("near-caption", "near-caption.png", png(fresh), caption, "dup caption")
    # The same picture with a Chinese caption: a translation, kept in the English pair's group.
    chinese = "一幅有几个彩色形状的图画"
    add("gen-5-0000002-zh", pictures[2][0]["image"], None, chinese, "kept", language="zh_CN")
    with (landing / "captions.jsonl").open("w", encoding="utf-8") as out:
        out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return expected


@pytest.mark.slow
def test_landed_batch_faults_are_quarantined_or_deduplicated_and_the_rest_sharded(
    spark, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    landing, out = tmp_path / "landing", tmp_path / "corpus"
    expected = land_faults(landing)
    summary = build_corpus(spark, landing, out, CONFIG)

    quarantine = pd.read_parquet(out / "quarantine").set_index("pair_id")["reason"]
    duplicates = pd.read_parquet(out / "duplicates").set_index("pair_id")
    manifest = pd.read_parquet(out / "manifest").set_index("pair_id")
    for pair_id, outcome in expected.items():
        if outcome == "kept":
            assert pair_id in manifest.index, pair_id
        elif outcome.startswith("dup "):
            assert duplicates.loc[pair_id, "duplicate_kind"] == outcome[4:], pair_id
        else:
            assert quarantine[pair_id].startswith(outcome), (pair_id, quarantine[pair_id])
    assert duplicates.loc["near-image", "kept_pair_id"] == "gen-5-0000000"
    assert duplicates.loc["near-caption", "kept_pair_id"] == "gen-5-0000003"
    kept = sum(outcome == "kept" for outcome in expected.values())
    assert len(manifest) == kept and summary["kept"] == kept >= 11
    assert summary["pairs_in"] == len(expected)
    assert summary["quarantined"] == len(expected) - kept - 2
    assert summary["duplicates_removed"] == {"image": 1, "caption": 1}
    assert set(summary["time_share"]) == {"decode", "hashing", "dedup", "write"}

    # The translation shares its picture's group, hence its split.
    en, zh = manifest.loc["gen-5-0000002"], manifest.loc["gen-5-0000002-zh"]
    assert (zh["language"], zh["group_id"], zh["split"]) == ("zh", en["group_id"], en["split"])

    shards = pd.read_parquet(out / "shards")
    tokenizer = CaptionTokenizer.load(out / "tokenizer.json")
    assert sorted(shards["pair_id"]) == sorted(manifest.index)
    for row in shards.itertuples():
        assert len(row.image) == 64 * 64 * 3
        assert tokenizer.decode(row.token_ids) == row.caption
    stats = json.loads((out / "shards.json").read_text())
    assert sum(s["rows"] for s in stats) == kept
    assert sum(s["languages"]["zh"] for s in stats) == 1

    assert validate_corpus(out, CONFIG)["success"]
    bad = manifest.reset_index()
    bad.loc[0, "pair_id"] = bad.loc[1, "pair_id"]
    bad.loc[2, "language"] = "French"  # any language, but as its code
    bad.loc[3, ["group_id", "split"]] = [bad.loc[4, "group_id"], "test"]
    bad.loc[4, "split"] = "train"
    planted = tmp_path / "planted"
    (planted / "manifest").mkdir(parents=True)
    bad.to_parquet(planted / "manifest" / "part-0.parquet")
    with pytest.raises(MultimodalGateFailed) as failure:
        validate_corpus(planted, CONFIG)
    failed = " ".join(failure.value.report["failed"])
    assert "to_be_unique(pair_id)" in failed and "to_match_regex(language)" in failed
    assert "groups.expect_column_values_to_be_between(splits)" in failed
