"""A small progress reporter for long CLI work: a status line on a terminal, silence when piped.

Usage (in a command's `run`):

    with Progress("texir diff") as progress:
        with progress.phase("loading A"):
            a = load(spec_a)
        for item in progress.iterate(items, "writing nodes"):
            ...

Nothing is drawn unless stderr is a terminal and the work has taken longer than `delay` seconds
(1 s by default), so quick commands and piped or captured output stay clean. `TEXIR_PROGRESS=0`
turns it off, `TEXIR_PROGRESS=1` forces it on (for testing). The line is cleared on exit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sized
from contextlib import contextmanager
from types import TracebackType
from typing import TextIO, TypeVar

from texir.cli.interrupts import checkpoint

__all__ = ["Progress"]

_T = TypeVar("_T")


def _enabled(stream: TextIO) -> bool:
    setting = os.environ.get("TEXIR_PROGRESS", "")
    if setting in ("0", "1"):
        return setting == "1"
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A status line `label: phase done/total (pct) elapsed`, redrawn at most 10 times a second
    by a daemon thread, so a single long call (an export, a write) still shows it is alive."""

    def __init__(self, label: str, *, stream: TextIO | None = None, delay: float = 1.0,
                 enabled: bool | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay
        self.enabled = _enabled(self.stream) if enabled is None else enabled
        self._phase = ""
        self._done = 0
        self._total: int | None = None
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = 0

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="texir-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
        with self._lock:
            if self._drawn:
                self._write("\r" + " " * self._drawn + "\r")
                self._drawn = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    @contextmanager
    def phase(self, name: str, total: int | None = None) -> Iterator[Progress]:
        """A named step; `advance` counts towards `total` when given. Its start and end are
        interrupt checkpoints (`texir.cli.interrupts`)."""
        checkpoint(f"start {name}")
        with self._lock:
            previous = (self._phase, self._done, self._total)
            self._phase, self._done, self._total = name, 0, total
        try:
            yield self
        finally:
            with self._lock:
                self._phase, self._done, self._total = previous
        checkpoint(f"end {name}")

    def advance(self, n: int = 1) -> None:
        self._done += n  # read by the drawing thread; an int store is atomic under the GIL

    def iterate(self, items: Iterable[_T], name: str, total: int | None = None) -> Iterator[_T]:
        if total is None and isinstance(items, Sized):
            total = len(items)
        with self.phase(name, total):
            for item in items:
                yield item
                self._done += 1

    def render(self) -> str:
        """The status line as it would be drawn now."""
        parts = [f"{self.label}:"]
        if self._phase:
            parts.append(self._phase)
        if self._total:
            pct = 100.0 * self._done / self._total
            parts.append(f"{self._done}/{self._total} ({pct:.0f}%)")
        elif self._done:
            parts.append(str(self._done))
        parts.append(f"{self.elapsed:.1f}s")
        return " ".join(parts)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            if self.elapsed < self.delay:
                continue
            with self._lock:
                line = self.render()
                pad = max(0, self._drawn - len(line))
                self._write("\r" + line + " " * pad)
                self._drawn = len(line)
