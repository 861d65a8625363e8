"""Progress of long work: a bar on a terminal, a line now and then in a log.

    for epoch in track(range(epochs), desc="asr train", unit="epoch"):
        ...

    with Progress(total=len(rows), desc="online rows", unit="row") as bar:
        for chunk in chunks:
            write(chunk)
            bar.update(len(chunk))

On a terminal (stderr is a TTY) it is a tqdm bar on stderr. Elsewhere, in an Airflow task log
or a CI log, a bar's carriage returns make a mess, so it prints one plain line on stderr at
each 10% and at least every ``CASCADE_PROGRESS_EVERY_S`` seconds (30) while work goes on,
and one when it ends. ``CASCADE_PROGRESS`` (``auto``, ``bar``, ``lines``, ``off``) forces one.
In a multi-process training only rank 0 should report: pass ``enabled=rank == 0``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")

LINE_STEP_PCT = 10
"""Without a terminal: a line each time this many more percent are done."""


def _mode(requested: str | None, stream: IO[str]) -> str:
    if requested is None:
        from cascade.config import RuntimeSettings, load_group

        requested = load_group(RuntimeSettings).progress
    if requested == "auto":
        isatty = getattr(stream, "isatty", None)
        return "bar" if callable(isatty) and isatty() else "lines"
    return requested


def _every_s() -> float:
    from cascade.config import RuntimeSettings, load_group

    return load_group(RuntimeSettings).progress_every_s


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Counts units of work done and shows it the way :func:`_mode` chose."""

    def __init__(
        self,
        total: int | None = None,
        *,
        desc: str,
        unit: str = "it",
        enabled: bool = True,
        mode: str | None = None,
        stream: IO[str] | None = None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total if total is None or total >= 0 else None
        self.desc, self.unit = desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.mode = _mode(mode, self.stream) if enabled else "off"
        self.every_s = every_s if every_s is not None else (_every_s() if enabled else 30.0)
        self.clock = clock
        self.done = 0
        self.started = self.last_line = clock()
        self.last_pct = 0
        self.closed = False
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=True)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.mode == "bar":
            self._bar.update(n)
        elif self.mode == "lines":
            now = self.clock()
            pct = self._pct()
            step = pct is not None and pct // LINE_STEP_PCT > self.last_pct // LINE_STEP_PCT
            unfinished = self.total is None or self.done < self.total  # close() says the end
            if unfinished and (step or now - self.last_line >= self.every_s):
                self._line(now)

    def _pct(self) -> int | None:
        if not self.total:
            return None
        return min(100, int(100 * self.done / self.total))

    def _line(self, now: float, *, final: bool = False) -> None:
        elapsed = now - self.started
        pct = self._pct()
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        parts = [f"[{self.desc}]", f"{count} {self.unit}"]
        if pct is not None:
            parts.insert(1, f"{pct}%")
        parts.append(f"{_duration(elapsed)}")
        if final:
            parts.append("done" if self.total is None or self.done >= self.total else "stopped")
        elif self.total and 0 < self.done < self.total:
            parts.append(f"eta {_duration(elapsed * (self.total - self.done) / self.done)}")
        if elapsed > 0 and self.done:
            rate = self.done / elapsed
            parts.append(
                f"({rate:,.0f} {self.unit}/s)" if rate >= 100 else f"({rate:.3g} {self.unit}/s)"
            )
        print(" ".join(parts), file=self.stream, flush=True)
        self.last_line, self.last_pct = now, pct or 0

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.mode == "bar":
            self._bar.close()
        elif self.mode == "lines":
            self._line(self.clock(), final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def track(
    iterable: Iterable[T],
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
    **options: Any,
) -> Iterator[T]:
    """``iterable``, item by item, counting each one done when the next is asked for (so a
    line's figures are work finished, not started)."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total, desc=desc, unit=unit, enabled=enabled, **options) as progress:
        for item in iterable:
            yield item
            progress.update()
