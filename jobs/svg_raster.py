"""SVG to PNG for the image corpus: cairosvg in a child process, with a timeout per file and caps
on the input's bytes and the raster's pixels.

:class:`SvgRasterizer` (the parent) keeps one child for as long as it is open (one per Spark
partition) and hands it one file at a time. A file that runs past the timeout kills the child,
and the next file starts a new one, so a pathological drawing costs its timeout and never the
job; the child also runs under an address-space limit. The raster's longest side is at most
``max_side`` pixels: the drawing's own size (``width``/``height``, else its ``viewBox``) sets the
aspect ratio, never the number of pixels. External resources (``<image href=...>``, remote
stylesheets) are never fetched, inline ``data:`` URLs are read. XML entities are refused (the
parser runs with its XXE and entity-expansion protection) except plain internal text entities,
which drawing programs write for their namespaces (``<!ENTITY ns_svg "http://...">``) and
:func:`expand_text_entities` replaces first.

The child is this file run as a script; it imports only the standard library and cairosvg
(PyPI ``cairosvg``, on Debian's ``libcairo2``: both installed by ``make venv``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import select
import struct
import subprocess
import sys
import time
from types import SimpleNamespace, TracebackType
from typing import Any

CHILD_MEMORY_BYTES = 2 << 30
"""Address-space limit of the child: a drawing that needs more fails with the parser's error."""


class SvgError(ValueError):
    """An SVG that was not rasterized, with the reason (the parser's message when it failed)."""


class SvgRasterizer:
    """``rasterize(svg_bytes) -> png_bytes`` in a reusable child process; a context manager."""

    def __init__(self, *, max_side: int, max_bytes: int, timeout_s: float) -> None:
        if max_side < 1 or max_bytes < 1 or timeout_s <= 0:
            raise ValueError("need max_side >= 1, max_bytes >= 1 and timeout_s > 0")
        self.max_side = max_side
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._child: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SvgRasterizer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin:
            child.stdin.close()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout:
            child.stdout.close()

    def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait()
            for pipe in (child.stdin, child.stdout):
                if pipe:
                    pipe.close()

    def rasterize(self, content: bytes) -> bytes:
        """PNG bytes of ``content``; :class:`SvgError` naming why not."""
        if importlib.util.find_spec("cairosvg") is None:
            raise SvgError("SVG and no rasterizer installed (pip install cairosvg: make venv)")
        if len(content) > self.max_bytes:
            raise SvgError(f"SVG too large ({len(content)} bytes > {self.max_bytes})")
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                # -P: the script's folder (jobs/) stays off the child's import path.
                [sys.executable, "-P", os.path.abspath(__file__), str(self.max_side)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(struct.pack("<I", len(content)) + content)
            child.stdin.flush()
            header = self._read(child, 5)
            status, length = struct.unpack("<BI", header)
            payload = self._read(child, length)
        except TimeoutError:
            self._kill()
            raise SvgError(f"SVG not rasterized within {self.timeout_s:g} s") from None
        except (BrokenPipeError, EOFError):
            code = child.poll()
            self._kill()
            raise SvgError(f"SVG rasterizer exited (status {code})") from None
        if status != 0:
            raise SvgError(f"SVG not rasterized: {payload.decode(errors='replace')}")
        return payload

    def _read(self, child: subprocess.Popen[bytes], size: int) -> bytes:
        """``size`` bytes of the child's answer within the timeout of the current file."""
        assert child.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        fd = child.stdout.fileno()
        chunks: list[bytes] = []
        left = size
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
            chunk = os.read(fd, left)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


# --- the child ------------------------------------------------------------------------------

DOCTYPE = re.compile(rb"<!DOCTYPE\s[^\[>]*\[(?P<subset>[^\]]*)\]\s*>", re.DOTALL)
TEXT_ENTITY = re.compile(
    rb"<!ENTITY\s+(?P<name>[A-Za-z_][\w.-]*)\s+"
    rb"(?P<q>[\"'])(?P<value>[^&%<\"']{0,256})(?P=q)\s*>"
)
COMMENT = re.compile(rb"<!--.*?-->", re.DOTALL)


def expand_text_entities(content: bytes) -> bytes:
    """``content`` with a DOCTYPE whose internal subset declares only plain text entities (no
    references, no ``SYSTEM``/``PUBLIC`` entities, no parameter entities: nothing that nests or
    reaches outside) replaced by those values, and the DOCTYPE dropped. Anything else is left
    for the parser to refuse."""
    doctype = DOCTYPE.search(content)
    if doctype is None:
        return content
    subset = COMMENT.sub(b"", doctype["subset"])
    entities = {m["name"]: m["value"] for m in TEXT_ENTITY.finditer(subset)}
    if TEXT_ENTITY.sub(b"", subset).strip() or not entities:
        return content
    body = content[: doctype.start()] + content[doctype.end() :]
    return re.sub(rb"&([A-Za-z_][\w.-]*);", lambda m: entities.get(m[1], m[0]), body)


def _no_fetch(url: str, resource_type: Any = None) -> Any:
    """Inline ``data:`` URLs only: nothing outside the file is read."""
    if url.startswith("data:"):
        from urllib.request import urlopen

        with urlopen(url) as inline:  # noqa: S310 - a data: URL, decoded locally
            return inline.read()
    raise ValueError(f"external resource {url[:80]!r} not fetched")


def render(content: bytes, max_side: int) -> bytes:
    """PNG of ``content`` whose longest side is ``max_side`` pixels (cairosvg's errors raise)."""
    import cairosvg  # type: ignore[import-not-found]
    from cairosvg.helpers import node_format  # type: ignore[import-not-found]
    from cairosvg.parser import Tree  # type: ignore[import-not-found]

    content = expand_text_entities(content)
    tree = Tree(bytestring=content, url_fetcher=_no_fetch)
    units = SimpleNamespace(dpi=96, font_size=12, context_width=0, context_height=0)
    width, height, _ = node_format(units, tree)
    options: dict[str, Any] = {"bytestring": content, "url_fetcher": _no_fetch}
    if width > 0 and height > 0:
        scale = max_side / max(width, height)
        options.update(
            output_width=max(1, round(width * scale)), output_height=max(1, round(height * scale))
        )
    else:  # no usable size: a square canvas of max_side
        options.update(output_width=max_side, output_height=max_side)
    png: bytes = cairosvg.surface.PNGSurface.convert(**options)
    return png


def serve(max_side: int) -> None:
    """Answer ``<u32 length><svg>`` requests on stdin with ``<u8 status><u32 length><payload>``
    (status 0: PNG bytes; 1: the error message) until stdin closes."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = requests.read(4)
        if len(header) < 4:
            return
        (length,) = struct.unpack("<I", header)
        content = requests.read(length)
        try:
            status, payload = 0, render(content, max_side)
        except MemoryError:
            status, payload = 1, b"out of memory rasterizing the drawing"
        except Exception as exc:  # noqa: BLE001 - every parse failure is an answer, not a crash
            status, payload = 1, (str(exc) or type(exc).__name__).encode()[:2000]
        answers.write(struct.pack("<BI", status, len(payload)) + payload)
        answers.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
