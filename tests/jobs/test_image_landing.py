"""The image-text importers: an image folder, a COCO captions file and WebDataset shards, written
here with pictures drawn by Pillow, land as ``images/`` + ``captions.jsonl`` that the corpus job
accepts; corrupt, empty and oversized images and bad caption lines are quarantined with their
reasons; a batch with nothing good raises and writes nothing."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from jobs.image_landing import IMAGE_FORMATS, land_coco, land_image_folder, land_webdataset
from jobs.multimodal_corpus import CorpusConfig, check_pair, decode_file
from tests.pipelines.standard_layouts import picture

DS = "2026-11-29"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="30"><circle cx="20" cy="15" r="9"/></svg>'  # noqa: E501


def bomb() -> bytes:
    """A PNG of a few kilobytes whose header declares 6,000 x 6,000 pixels."""
    out = io.BytesIO()
    Image.new("1", (6000, 6000)).save(out, format="PNG")
    return out.getvalue()


def landed(dest: Path) -> dict[str, dict[str, Any]]:
    """``{pair_id: record}`` after checking that each record's image is in ``images/``."""
    records = {}
    for line in (dest / "captions.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        assert set(record) == {"pair_id", "image", "caption", "language", "source"}
        assert (dest / "images" / record["image"]).is_file()
        records[record["pair_id"]] = record
    assert {p.name for p in (dest / "images").iterdir()} == {r["image"] for r in records.values()}
    return records


def quarantined(dest: Path) -> dict[str, str]:
    lines = (dest / "quarantine.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["item"]: r["reason"] for r in map(json.loads, lines)}


def write_folder(root: Path, files: dict[str, bytes], records: list[dict | str]) -> Path:
    (root / "images").mkdir(parents=True)
    for name, content in files.items():
        (root / "images" / name).write_bytes(content)
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_image_folder_lands_any_format_and_language(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    files = {
        "a.png": picture(1),
        "b.jpg": picture(2, "JPEG"),
        "c.webp": picture(3, "WEBP"),
        "d.svg": SVG,
        "empty.png": b"",
        "cut.png": picture(4)[:150],
        "text.jpg": b"just some text, not a picture",
        "bomb.png": bomb(),
        "broken.svg": b'<svg xmlns="http://www.w3.org/2000/svg"><g></svg>',
        "lonely.png": picture(5),
    }
    records: list[dict | str] = [
        {"pair_id": "a-en", "image": "a.png", "caption": "three boxes", "language": "en"},
        {"pair_id": "a-cs", "image": "a.png", "caption": "tři krabice", "language": "cs"},
        {"pair_id": "b-zh", "image": "b.jpg", "caption": "三个盒子", "source": "shop"},
        {"pair_id": "c", "image": "c.webp", "caption": "Drei Kisten"},
        {"pair_id": "d", "image": "d.svg", "caption": "a circle"},
        {"pair_id": "a-en", "image": "c.webp", "caption": "the same id again"},
        {"pair_id": "c-empty", "image": "c.webp", "caption": "  "},
        {"pair_id": "gone", "image": "gone.png", "caption": "no such file"},
        {"pair_id": "e", "image": "empty.png", "caption": "x"},
        {"pair_id": "f", "image": "cut.png", "caption": "x"},
        {"pair_id": "g", "image": "text.jpg", "caption": "x"},
        {"pair_id": "h", "image": "bomb.png", "caption": "x"},
        {"pair_id": "i", "image": "broken.svg", "caption": "x"},
        {"pair_id": "j", "image": "../escape.png", "caption": "x"},
        '{"pair_id": "k", "image": ',
        {"pair_id": "no image field"},
    ]
    source = write_folder(tmp_path / "batch", files, records)

    counts = land_image_folder(source, dest, ds=DS, language="en")

    pairs = landed(dest)
    assert set(pairs) == {"a-en", "a-cs", "b-zh", "c", "d"}
    assert pairs["a-cs"] == {
        "pair_id": "a-cs",
        "image": "a.png",
        "caption": "tři krabice",
        "language": "cs",
        "source": "image_folder",
    }
    assert pairs["b-zh"]["source"] == "shop" and pairs["c"]["language"] == "en"
    assert (dest / "images" / "b.jpg").read_bytes() == files["b.jpg"]  # bytes as they came
    reasons = quarantined(dest)
    assert reasons == {
        "a-en": "pair id: duplicate (an earlier pair has it)",
        "c-empty": "caption missing",
        "gone": f"image missing (no {source / 'images' / 'gone.png'})",
        "empty.png": "image: empty file",
        "cut.png": reasons["cut.png"],
        "text.jpg": "image: unreadable (not a known image format)",
        "bomb.png": "image: too large (6000x6000 = 36,000,000 px > 33,554,432 px)",
        "broken.svg": reasons["broken.svg"],
        "'../escape.png'": "image: not a file name (holds a path separator)",
        "captions.jsonl line 15": reasons["captions.jsonl line 15"],
        "captions.jsonl line 16": "captions: bad line (needs pair_id and image strings)",
        "lonely.png": "caption missing",
    }
    assert reasons["cut.png"].startswith("image: truncated or corrupt data")
    assert reasons["broken.svg"].startswith("image: SVG not rasterized")
    assert reasons["captions.jsonl line 15"].startswith("captions: bad line (not JSON")
    assert counts == {"pairs": 5, "images": 4, "quarantined": 12}


SVG_HEAD = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'


def svgs_that_expand() -> dict[str, bytes]:
    """Small SVG files that grow without bound when read: nested entities (a billion laughs),
    ``<use>`` references that double at each of 40 levels, and a canvas of 10^8 x 10^8 px."""
    entities = '<!ENTITY a "lol lol lol lol lol">' + "".join(
        f'<!ENTITY {chr(98 + i)} "{f"&{chr(97 + i)};" * 10}">' for i in range(8)
    )
    laughs = (
        f"<!DOCTYPE svg [{entities}]><svg {SVG_HEAD} width='9' height='9'><text>&i;</text></svg>"
    )
    levels = ['<g id="l0"><circle r="1"/></g>'] + [
        f'<g id="l{i}"><use xlink:href="#l{i - 1}"/><use xlink:href="#l{i - 1}" x="1"/></g>'
        for i in range(1, 40)
    ]
    fanout = f'<svg {SVG_HEAD} width="64" height="64"><defs>{"".join(levels)}</defs>'
    fanout += '<use xlink:href="#l39"/></svg>'
    canvas = f'<svg {SVG_HEAD} width="100000000" height="100000000">'
    canvas += '<circle cx="5e7" cy="5e7" r="4e7"/></svg>'
    # The one that times out last: a file after it would pay a new rasterizer's start-up.
    drawings = {"canvas.svg": canvas, "laughs.svg": laughs, "fanout.svg": fanout}
    return {name: drawing.encode() for name, drawing in drawings.items()}


def test_svgs_that_expand_without_bound_are_quarantined_and_a_huge_canvas_is_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The landing checks an SVG by rasterizing it with the corpus job's caps (its raster's
    longest side, its time): what cannot finish within them is quarantined with the reason."""
    import functools

    from jobs import image_landing

    # The corpus job's time cap is 10 s; 5 s (the rasterizer's start-up included, on a loaded
    # machine) tells the same story sooner.
    monkeypatch.setattr(
        image_landing, "CorpusConfig", functools.partial(CorpusConfig, svg_timeout_s=5.0)
    )
    dest = tmp_path / "out"
    dest.mkdir()
    files = {"a.png": picture(1), **svgs_that_expand()}
    records: list[dict | str] = [
        {"pair_id": name.split(".")[0], "image": name, "caption": f"picture {name}"}
        for name in files
    ]
    source = write_folder(tmp_path / "batch", files, records)

    counts = land_image_folder(source, dest, ds=DS, language="en")

    assert set(landed(dest)) == {"a", "canvas"}
    reasons = quarantined(dest)
    assert reasons == {
        "laughs.svg": "image: SVG not rasterized: EntitiesForbidden(name='a', system_id=None, "
        "public_id=None)",
        "fanout.svg": "image: SVG not rasterized within 5 s",
    }
    assert counts == {"pairs": 2, "images": 2, "quarantined": 2}
    # The huge canvas is drawn at the cap, in its own shape.
    with CorpusConfig().svg_rasterizer() as rasterizer:
        raster = Image.open(io.BytesIO(rasterizer.rasterize(files["canvas.svg"])))
    assert raster.size == (CorpusConfig().svg_max_side,) * 2


def test_coco_captions_land_with_images_beside_the_annotations(tmp_path: Path) -> None:
    root, dest = tmp_path / "coco", tmp_path / "out"
    dest.mkdir()
    (root / "val2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    for image_id in (1, 2, 3):
        (root / "val2017" / f"{image_id:012d}.jpg").write_bytes(picture(image_id, "JPEG"))
    whole = picture(3, "JPEG", size=(200, 160))
    (root / "val2017" / "000000000003.jpg").write_bytes(whole[: len(whole) * 2 // 3])
    data = {
        "info": {"description": "a small COCO"},
        "images": [
            {"id": 1, "file_name": "000000000001.jpg", "width": 48, "height": 40},
            {"id": 2, "file_name": "000000000002.jpg"},
            {"id": 3, "file_name": "000000000003.jpg"},
            {"id": 4, "file_name": "000000000004.jpg"},
            {"id": 5},
        ],
        "annotations": [
            {"id": 11, "image_id": 1, "caption": "A red box on a table."},
            {"id": 12, "image_id": 1, "caption": "Boxes, three of them."},
            {"id": 21, "image_id": 2, "caption": "箱が三つ", "language": "ja"},
            {"id": 31, "image_id": 3, "caption": "cut short"},
            {"id": 41, "image_id": 4, "caption": "not on disk"},
            {"id": 91, "image_id": 9, "caption": "no such image"},
            {"id": 92, "caption": "no image id"},
        ],
    }
    captions = root / "annotations" / "captions_val2017.json"
    captions.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    counts = land_coco(captions, dest, ds=DS)

    pairs = landed(dest)
    assert set(pairs) == {"coco-11", "coco-12", "coco-21"}
    assert pairs["coco-11"]["image"] == "000000000001.jpg" and pairs["coco-11"]["language"] is None
    assert pairs["coco-21"]["language"] == "ja" and pairs["coco-21"]["source"] == "coco"
    reasons = quarantined(dest)
    assert reasons["000000000003.jpg"].startswith("image: truncated or corrupt data")
    assert reasons["coco-41"].startswith("image missing (no ") and "val2017" in reasons["coco-41"]
    assert reasons["coco-91"] == "image missing (image_id 9 not in images)"
    assert reasons["annotations[6]"] == "coco: bad annotation (needs image_id)"
    assert reasons["images[4]"] == "coco: bad image entry (needs id and file_name)"
    assert counts == {"pairs": 3, "images": 2, "quarantined": 5}

    # The images folder can be named; a folder with one JSON file is taken as that file.
    elsewhere, again = tmp_path / "pictures", tmp_path / "again"
    (root / "val2017").rename(elsewhere)
    again.mkdir()
    assert land_coco(root / "annotations", again, ds=DS, images=elsewhere)["pairs"] == 3
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    (tmp_path / "third").mkdir()
    with pytest.raises(ValueError, match=r"broken.json: not JSON .*pass a COCO captions file"):
        land_coco(broken, tmp_path / "third", ds=DS)


def add_member(shard: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    shard.addfile(info, io.BytesIO(content))


def test_webdataset_shards_land_samples_and_quarantine_bad_members(tmp_path: Path) -> None:
    shards, dest = tmp_path / "shards", tmp_path / "out"
    shards.mkdir()
    dest.mkdir()
    with tarfile.open(shards / "train-000000.tar", "w") as shard:
        add_member(shard, "000000.jpg", picture(1, "JPEG"))
        add_member(shard, "000000.txt", b"a box and two more")
        add_member(shard, "000001.png", picture(2))
        add_member(shard, "000001.json", json.dumps({"caption": "两个盒子", "lang": "zh"}).encode())
        add_member(shard, "000001.cls", b"7")
        add_member(shard, "part/000002.webp", picture(3, "WEBP"))
        add_member(shard, "part/000002.json", json.dumps({"text": "Boxes", "id": 2}).encode())
        add_member(shard, "000003.png", picture(4))
        add_member(shard, "000003.json", b"{broken")
        add_member(shard, "000004.txt", b"a caption without a picture")
        add_member(shard, "000005.jpg", picture(5, "JPEG"))
        add_member(shard, "000006.png", b"")
        add_member(shard, "000006.txt", b"empty picture")
        add_member(shard, "000007.png", picture(8))
        add_member(shard, "000007.txt", "caf\xe9".encode("latin-1"))
    with tarfile.open(tmp_path / "whole.tar", "w") as shard:
        add_member(shard, "100000.png", picture(6))
        add_member(shard, "100000.txt", b"kept before the cut")
        add_member(shard, "100001.png", picture(7, size=(400, 300)))
        add_member(shard, "100001.txt", b"lost in the cut")
    with tarfile.open(tmp_path / "whole.tar") as shard:
        cut_at = shard.getmember("100001.png").offset_data + 100
    whole = (tmp_path / "whole.tar").read_bytes()
    (shards / "train-000001.tar").write_bytes(whole[:cut_at])
    (shards / "notes.txt").write_text("not a shard")

    counts = land_webdataset(shards, dest, ds=DS)

    pairs = landed(dest)
    assert set(pairs) == {"000000", "000001", "part_000002", "100000"}
    assert pairs["000000"]["caption"] == "a box and two more"
    assert pairs["000001"]["language"] == "zh" and pairs["000001"]["image"] == "000001.png"
    assert pairs["part_000002"]["caption"] == "Boxes" and pairs["part_000002"]["source"] == (
        "webdataset"
    )
    reasons = quarantined(dest)
    assert reasons["000003.png"].startswith("captions: bad json member")
    assert reasons["000004"].startswith("image missing (no KEY.")
    assert reasons["000005.jpg"] == "caption missing"
    assert reasons["000006.png"] == "image: empty file"
    assert reasons["000007.png"].startswith("captions: bad txt member (not UTF-8")
    assert reasons["train-000001.tar"].startswith("shard: truncated or corrupt")
    assert set(reasons) == {
        "000003.png", "000004", "000005.jpg", "000006.png", "000007.png", "train-000001.tar",
    }  # fmt: skip
    assert counts == {"pairs": 4, "images": 4, "quarantined": 6}


def test_an_all_bad_batch_raises_one_line_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    files = {"a.png": b"", "b.png": picture(1)[:100]}
    records: list[dict | str] = [
        {"pair_id": "a", "image": "a.png", "caption": "x"},
        {"pair_id": "b", "image": "b.png", "caption": "y"},
        "not json",
    ]
    source = write_folder(tmp_path / "batch", files, records)
    with pytest.raises(ValueError) as error:
        land_image_folder(source, dest, ds=DS)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{source}: nothing landed, all 3 ")
    assert "'image:empty file': 1" in message and "'captions:bad line': 1" in message
    assert message.endswith("fix the image files and the caption lines, then land again")
    assert not any(dest.iterdir())
    with pytest.raises(ValueError, match=r"no \*\.tar shards: point at a WebDataset shard"):
        land_webdataset(tmp_path / "batch", dest, ds=DS)


def test_landed_pairs_pass_the_corpus_jobs_checks(tmp_path: Path) -> None:
    """Every landed pair becomes a corpus row: its image decodes, its caption and tag pass."""
    dest = tmp_path / "out"
    dest.mkdir()
    with tarfile.open(tmp_path / "shard.tar", "w") as shard:
        for key, (fmt, caption, language) in enumerate(
            [("JPEG", "a box", "en"), ("PNG", "三个盒子", "zh"), ("WEBP", "boxes", None)]
        ):
            add_member(shard, f"{key:06d}.{fmt.lower()}", picture(key, fmt))
            meta = {"caption": caption, "language": language}
            add_member(shard, f"{key:06d}.json", json.dumps(meta, ensure_ascii=False).encode())
        add_member(shard, "000009.svg", SVG)
        add_member(shard, "000009.txt", b"a black circle")
    assert land_webdataset(tmp_path / "shard.tar", dest, ds=DS)["pairs"] == 4
    config = CorpusConfig()
    with config.svg_rasterizer() as rasterizer:
        for record in landed(dest).values():
            content = (dest / "images" / record["image"]).read_bytes()
            image_reason, pixels = decode_file(content, record["image"], config, rasterizer)
            reason, normalized, tag = check_pair(
                True, image_reason, record["caption"], record["language"]
            )
            assert reason is None, (record, reason)
            assert pixels is not None and len(pixels) == config.side * config.side * 3
            assert tag == (record["language"] or "en") and normalized == record["caption"]


def test_every_format_has_an_importer() -> None:
    assert set(IMAGE_FORMATS) == {"image_folder", "coco", "webdataset"}
