"""Third-party output a texir user cannot act on, kept off the terminal unless asked for (`-v`)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["NATIVE_NOISE_PREFIXES", "native_stderr_filtered"]

NATIVE_NOISE_PREFIXES: tuple[bytes, ...] = (
    # ExecuTorch's runtime probes ARM CPU identification files on every process's first load and
    # logs each probe (five lines on x86), whatever the program
    b"[cpuinfo_utils.cpp:",
)
"""Starts of lines native libraries write to stderr that say nothing about the user's program."""


@contextlib.contextmanager
def native_stderr_filtered(verbose: bool = False) -> Iterator[None]:
    """Run the block with file descriptor 2 captured (native code writes there, not to
    `sys.stderr`), then write back every line but the known noise: the runtime's own error lines
    stay visible. `verbose`: nothing is captured."""
    if verbose:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (an embedding host): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True)
                    if not line.startswith(NATIVE_NOISE_PREFIXES)]
            if kept:
                os.write(2, b"".join(kept))
