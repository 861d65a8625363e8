"""Image-text importers: a dataset in a standard layout in, the landing batch that the image-text
corpus job (:mod:`jobs.multimodal_corpus`) reads out.

    from jobs.image_landing import IMAGE_FORMATS
    counts = IMAGE_FORMATS["coco"](Path("annotations/captions_val2017.json"), dest, ds="2026-11-29")

Each importer is ``(source, dest, *, ds, ...) -> counts`` and writes into the empty folder
``dest`` the layout of :mod:`jobs.multimodal_sources`:

- ``images/NAME``: each accepted image file, its bytes as they came (the corpus job decodes);
- ``captions.jsonl``: one object per pair with ``pair_id``, ``image`` (the name in ``images/``),
  ``caption``, ``language`` (the source's own tag, else the ``language=`` argument, else null:
  nothing is detected here) and ``source`` (the record's own ``source``, else the format name);
- ``quarantine.jsonl``: each image or caption line refused, with its reason
  (:class:`jobs.quarantine.LandingQuarantine`).

It returns ``{"pairs", "images", "quarantined"}``.

Formats (:data:`IMAGE_FORMATS`):

- ``image_folder`` (:func:`land_image_folder`): ``images/`` beside ``captions.jsonl``, today's
  layout; an image no line names is quarantined as caption missing.
- ``coco`` (:func:`land_coco`): a COCO captions file (``images`` with ``id`` and ``file_name``,
  ``annotations`` with ``image_id`` and ``caption``; a ``language`` or ``lang`` on an annotation
  is kept). ``source`` is the JSON file, or a folder holding exactly one JSON file. The images
  are in ``images=`` when given, else the first folder holding the first listed file among
  ``images/`` beside the JSON, the split's folder beside its parent (``captions_val2017.json``
  -> ``../val2017/``, the COCO download's layout) and the JSON's own folder.
- ``webdataset`` (:func:`land_webdataset`): WebDataset tar shards (``source`` is one ``.tar`` or a
  folder of them; ``.tar.gz`` and ``.tgz`` too), each sample ``KEY.jpg|jpeg|png|webp|...`` with
  ``KEY.txt`` (the caption) and/or ``KEY.json`` (``caption`` or ``text``, optional
  ``language``/``lang``); the key is the member's path up to the first dot of its file name, as
  WebDataset groups them. The shards are read with
  the standard ``tarfile`` module rather than PyPI ``webdataset`` (which installs cleanly): its
  readers raise or skip through one exception handler for a whole stream, where this importer
  needs each sample's reason, and it would add two dependencies for a dozen lines of grouping.
  Members are read, never extracted, so member paths cannot write outside ``dest``.

Quarantined, each with its reason (``AREA: KIND (detail)``, :mod:`jobs.quarantine`): an empty
file, bytes Pillow does not know, a truncated or corrupt image, an image over
:data:`MAX_IMAGE_BYTES` or whose header declares more than ``max_pixels`` pixels (checked before
decoding, so a decompression bomb costs nothing), an SVG the project's rasterizer refuses
(:mod:`jobs.svg_raster`: size, time and raster caps, the corpus job's settings); an image or a
caption missing; a caption line or member that does not parse; a name that repeats or is not a
file name; a tar shard cut short (what it held before the cut is kept). A batch where nothing is
left raises one ValueError naming the source and the fix, and writes nothing.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.landing_checks import check_landing, file_name_problem, json_records
from jobs.multimodal_corpus import CorpusConfig, is_svg
from jobs.quarantine import LandingQuarantine
from jobs.svg_raster import SvgRasterizer

CAPTIONS_FILE = "captions.jsonl"
IMAGES_FOLDER = "images"
MAX_PIXELS = 1 << 25
"""Most pixels an image's header may declare (33.5 million: 8,192 x 4,096). The corpus job
decodes every image at full size before it resizes it to ``side`` x ``side``: this bounds its
memory per image (about 130 MB as RGBA), where Pillow's own limit warns at 89 million pixels and
refuses only twice that."""
MAX_IMAGE_BYTES = 1 << 26
"""Larger image files (64 MiB) are quarantined unread."""
SHARD_PATTERNS = ("*.tar", "*.tar.gz", "*.tgz")
"""Shards in a folder (compressed ones are read as tarfile opens them)."""
WEBDATASET_IMAGE_EXTENSIONS = frozenset("jpg jpeg png webp gif bmp tif tiff svg".split())


@dataclass
class Pair:
    pair_id: str
    caption: Any
    language: Any = None
    source: Any = None


@dataclass
class Sample:
    """One image as a reader found it, with its captions; ``content`` None when it is missing."""

    name: str
    content: Callable[[], bytes] | None
    pairs: list[Pair] = field(default_factory=list)
    missing: str = ""
    """Where the missing image was looked for."""
    problem: str | None = None
    """Why the reader already refused it."""


def image_problem(
    content: bytes, name: str, *, max_pixels: int, rasterizer: SvgRasterizer
) -> str | None:
    """Why the image file ``content`` cannot be landed (None when it can)."""
    from PIL import Image

    if not content:
        return "image: empty file"
    if len(content) > MAX_IMAGE_BYTES:
        return f"image: too large ({len(content):,} bytes > {MAX_IMAGE_BYTES:,})"
    if is_svg(content, name):
        try:
            rasterizer.rasterize(content)
        except ValueError as exc:
            return f"image: {exc}"
        return None
    try:
        image = Image.open(io.BytesIO(content))
    except Image.DecompressionBombError as exc:
        return f"image: too large ({exc})"
    except Exception:  # noqa: BLE001 - Pillow raises several types for foreign bytes
        return "image: unreadable (not a known image format)"
    width, height = image.size
    if width * height > max_pixels:
        return f"image: too large ({width}x{height} = {width * height:,} px > {max_pixels:,} px)"
    try:
        image.load()
    except Exception as exc:  # noqa: BLE001
        return f"image: truncated or corrupt data ({exc})"
    return None


def land_samples(
    samples: Iterable[Sample],
    quarantine: LandingQuarantine,
    *,
    source: Path,
    dest: Path,
    format_name: str,
    max_pixels: int,
    fix: str,
) -> dict[str, int]:
    """Check ``samples`` and write the good ones into ``dest``; the counts."""
    records: list[dict[str, Any]] = []
    landed_images: set[str] = set()
    pair_ids: set[str] = set()
    config = CorpusConfig()
    with config.svg_rasterizer() as rasterizer:
        for sample in samples:
            name = sample.name
            problem = file_name_problem(name)
            if problem:
                quarantine.add(repr(name), f"image: not a file name ({problem})")
                continue
            if sample.problem:
                quarantine.add(name, sample.problem)
                continue
            if name in landed_images:
                quarantine.add(name, "image: duplicate name (an earlier image has it)")
                continue
            if not sample.pairs:
                quarantine.add(name, "caption missing")
                continue
            if sample.content is None:
                for pair in sample.pairs:
                    quarantine.add(pair.pair_id, f"image missing ({sample.missing})")
                continue
            try:
                content = sample.content()
            except OSError as exc:
                quarantine.add(name, f"image: unreadable ({exc})")
                continue
            reason = image_problem(content, name, max_pixels=max_pixels, rasterizer=rasterizer)
            if reason:
                quarantine.add(name, reason)
                continue
            good = []
            for pair in sample.pairs:
                if pair.pair_id in pair_ids:
                    quarantine.add(pair.pair_id, "pair id: duplicate (an earlier pair has it)")
                elif not isinstance(pair.caption, str) or not pair.caption.strip():
                    quarantine.add(pair.pair_id, "caption missing")
                else:
                    pair_ids.add(pair.pair_id)
                    good.append(pair)
            if not good:
                continue
            (dest / IMAGES_FOLDER).mkdir(exist_ok=True)
            (dest / IMAGES_FOLDER / name).write_bytes(content)
            landed_images.add(name)
            records.extend(
                {
                    "pair_id": pair.pair_id,
                    "image": name,
                    "caption": pair.caption.strip(),
                    "language": pair.language if isinstance(pair.language, str) else None,
                    "source": pair.source if isinstance(pair.source, str) else format_name,
                }
                for pair in good
            )
    if not records:
        raise quarantine.nothing_landed(source, "images and captions", fix)
    lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (dest / CAPTIONS_FILE).write_text("".join(lines), encoding="utf-8")
    quarantine.write(dest)
    return {"pairs": len(records), "images": len(landed_images), "quarantined": len(quarantine)}


def file_sample(path: Path, name: str | None = None) -> Sample:
    """The image file ``path`` landed as ``name`` (its own name by default)."""
    name = name or path.name
    if not path.is_file():
        return Sample(name, None, missing=f"no {path}")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        return Sample(
            name, None, problem=f"image: too large ({size:,} bytes > {MAX_IMAGE_BYTES:,})"
        )
    return Sample(name, path.read_bytes)


# --- images/ + captions.jsonl ---------------------------------------------------------------


def land_image_folder(
    source: Path,
    dest: Path,
    *,
    ds: str,
    language: str | None = None,
    max_pixels: int = MAX_PIXELS,
) -> Mapping[str, int]:
    """Land ``images/`` + ``captions.jsonl`` (``pair_id``, ``image``, ``caption``, ``language``,
    ``source`` per line); ``language`` fills lines that have none."""
    check_landing(dest, ds)
    captions_file = source / CAPTIONS_FILE
    if not captions_file.is_file():
        raise ValueError(
            f"{source}: no {CAPTIONS_FILE}: point at the folder holding it and images/ (one "
            "JSON object per line: pair_id, image, caption, language)"
        )
    quarantine = LandingQuarantine()
    folder = source / IMAGES_FOLDER
    samples: dict[str, Sample] = {}
    for where, record in json_records(captions_file, quarantine, "captions"):
        if not all(isinstance(record.get(k), str) for k in ("pair_id", "image")):
            quarantine.add(where, "captions: bad line (needs pair_id and image strings)")
            continue
        name = record["image"]
        sample = samples.setdefault(name, file_sample(folder / name, name))
        sample.pairs.append(
            Pair(
                record["pair_id"],
                record.get("caption"),
                record.get("language") or language,
                record.get("source"),
            )
        )
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.name not in samples:
                samples[path.name] = file_sample(path)
    return land_samples(
        samples.values(),
        quarantine,
        source=source,
        dest=dest,
        format_name="image_folder",
        max_pixels=max_pixels,
        fix="fix the image files and the caption lines, then land again",
    )


# --- COCO captions --------------------------------------------------------------------------


def coco_file(source: Path) -> Path:
    if source.is_file():
        return source
    found = sorted(source.glob("*.json")) if source.is_dir() else []
    if len(found) != 1:
        raise ValueError(
            f"{source}: {len(found)} JSON files here ({[p.name for p in found]}): pass the COCO "
            "captions file itself"
        )
    return found[0]


def coco_images_folder(captions: Path, first_file: str | None) -> Path:
    split = captions.stem.removeprefix("captions_")
    candidates = [captions.parent / IMAGES_FOLDER, captions.parent.parent / split, captions.parent]
    for folder in candidates:
        if first_file and (folder / first_file).is_file():
            return folder
    return next((folder for folder in candidates if folder.is_dir()), captions.parent)


def land_coco(
    source: Path,
    dest: Path,
    *,
    ds: str,
    images: Path | None = None,
    language: str | None = None,
    max_pixels: int = MAX_PIXELS,
) -> Mapping[str, int]:
    """Land a COCO captions file and its images; one pair per annotation, ``coco-ID``."""
    check_landing(dest, ds)
    captions = coco_file(source)
    try:
        data = json.loads(captions.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{captions}: not JSON ({exc}): pass a COCO captions file") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations")
    ):
        raise ValueError(
            f"{captions}: no 'images' and 'annotations' lists: pass a COCO captions file"
        )
    quarantine = LandingQuarantine()
    by_id: dict[Any, str] = {}
    for index, entry in enumerate(data["images"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
            quarantine.add(f"images[{index}]", "coco: bad image entry (needs id and file_name)")
            continue
        if "id" not in entry or entry["id"] in by_id:
            quarantine.add(f"images[{index}]", "coco: bad image entry (id missing or repeated)")
            continue
        by_id[entry["id"]] = entry["file_name"]
    first = next(iter(by_id.values()), None)
    folder = images or coco_images_folder(captions, first)
    samples = {image_id: file_sample(folder / name, name) for image_id, name in by_id.items()}
    for index, note in enumerate(data["annotations"]):
        if not isinstance(note, dict) or "image_id" not in note:
            quarantine.add(f"annotations[{index}]", "coco: bad annotation (needs image_id)")
            continue
        pair_id = f"coco-{note['id']}" if "id" in note else f"coco-{note['image_id']}-{index}"
        if note["image_id"] not in samples:
            quarantine.add(pair_id, f"image missing (image_id {note['image_id']} not in images)")
            continue
        tag = note.get("language") or note.get("lang") or language
        samples[note["image_id"]].pairs.append(Pair(pair_id, note.get("caption"), tag))
    return land_samples(
        samples.values(),
        quarantine,
        source=source,
        dest=dest,
        format_name="coco",
        max_pixels=max_pixels,
        fix=f"fix the images in {folder} and the annotations, or pass images=, then land again",
    )


# --- WebDataset shards ----------------------------------------------------------------------

SAMPLE_KEY = re.compile(r"^(?P<key>(?:.*/)?[^/.]+)\.(?P<ext>[^/]+)$")
"""A member name as WebDataset splits it: the key up to the first dot of the file name, the
extension after it (``a/b/000017.seg.png`` -> ``a/b/000017``, ``seg.png``)."""


def shard_members(
    shard: Path, quarantine: LandingQuarantine
) -> Iterator[tuple[str, str, bytes | None]]:
    """``(key, extension, bytes)`` of each regular member in order; bytes None when the member
    is over :data:`MAX_IMAGE_BYTES`. A shard cut short or corrupt is quarantined where it
    breaks, after the members before it."""
    try:
        with tarfile.open(shard, "r:*") as archive:
            for member in archive:
                match = SAMPLE_KEY.match(member.name)
                if not member.isfile() or match is None:
                    continue
                handle = archive.extractfile(member)
                content = None
                if member.size <= MAX_IMAGE_BYTES and handle is not None:
                    content = handle.read()
                yield match["key"], match["ext"].lower(), content
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        quarantine.add(shard.name, f"shard: truncated or corrupt ({exc or type(exc).__name__})")


def webdataset_samples(
    shards: list[Path], quarantine: LandingQuarantine, language: str | None
) -> Iterator[Sample]:
    """One :class:`Sample` per run of members sharing a key (WebDataset keeps them adjacent)."""

    def sample_of(key: str, members: dict[str, bytes | None]) -> Sample:
        pair_id = key.replace("/", "_")
        images = sorted(e for e in members if e in WEBDATASET_IMAGE_EXTENSIONS)
        name = f"{pair_id}.{images[0]}" if images else pair_id
        content = members.get(images[0]) if images else None
        sample = Sample(
            name,
            None if not images else (lambda: content or b""),
            missing=f"no KEY.{'|'.join(sorted(WEBDATASET_IMAGE_EXTENSIONS))} member",
        )
        if images and content is None:
            sample.problem = f"image: too large (over {MAX_IMAGE_BYTES:,} bytes)"
        caption: Any = None
        tag: Any = language
        if "json" in members:
            try:
                meta = json.loads(members["json"] or b"")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return Sample(name, None, problem=f"captions: bad json member ({exc})")
            if isinstance(meta, dict):
                caption = meta.get("caption") or meta.get("text")
                tag = meta.get("language") or meta.get("lang") or language
        if caption is None and "txt" in members:
            try:
                caption = (members["txt"] or b"").decode("utf-8")
            except UnicodeDecodeError as exc:
                return Sample(name, None, problem=f"captions: bad txt member (not UTF-8: {exc})")
        if caption is not None:
            sample.pairs.append(Pair(pair_id, caption, tag))
        return sample

    for shard in shards:
        key: str | None = None
        members: dict[str, bytes | None] = {}
        for member_key, ext, content in shard_members(shard, quarantine):
            if member_key != key and key is not None:
                yield sample_of(key, members)
                members = {}
            key = member_key
            members[ext] = content
        if key is not None:
            yield sample_of(key, members)


def land_webdataset(
    source: Path,
    dest: Path,
    *,
    ds: str,
    language: str | None = None,
    max_pixels: int = MAX_PIXELS,
) -> Mapping[str, int]:
    """Land WebDataset tar shards (one ``.tar`` file, or every ``*.tar`` in a folder)."""
    check_landing(dest, ds)
    shards = (
        [source]
        if source.is_file()
        else sorted(p for pattern in SHARD_PATTERNS for p in source.glob(pattern))
    )
    if not shards:
        raise ValueError(
            f"{source}: no *.tar shards: point at a WebDataset shard or a folder of them"
        )
    quarantine = LandingQuarantine()
    return land_samples(
        webdataset_samples(shards, quarantine, language),
        quarantine,
        source=source,
        dest=dest,
        format_name="webdataset",
        max_pixels=max_pixels,
        fix="fix or rewrite the shards' samples (KEY.jpg|png|webp with KEY.txt|json), then "
        "land again",
    )


ImageImporter = Callable[..., Mapping[str, int]]
IMAGE_FORMATS: dict[str, ImageImporter] = {
    "image_folder": land_image_folder,
    "coco": land_coco,
    "webdataset": land_webdataset,
}
"""The image-text importers by format name."""
