"""Running one side of a benchmark in a fresh Python process (the benchmarks share it)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spawn(script: str, args: list[str], label: str) -> dict[str, Any]:
    """Run `python script *args` from the project root; its last stdout line is a JSON object."""
    proc = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed:\n{proc.stderr[-3000:]}")
    parsed: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return parsed


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file, read 16 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


STAGE = "bench stage: "
"""A child announces each stage on stderr with this prefix, so a failed run says where it failed."""


def try_spawn(script: str, args: list[str]) -> tuple[dict[str, Any] | None, str]:
    """`spawn` for a run that may fail (out of memory under a limit): (result or None, the end of stderr)."""
    proc = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        stages = [line for line in proc.stderr.splitlines() if line.startswith(STAGE)]
        during = f"during {stages[-1][len(STAGE):]}; " if stages else ""
        return None, f"{during}exit {proc.returncode}: {proc.stderr.strip()[-800:]}"
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed, ""


def time_backend_preprocess(backend_class: Any = None) -> list[float]:
    """Accumulate, in the returned one-element list, the seconds spent inside `backend_class`'s
    `preprocess` (default: ExecuTorch backends' own, what both sides pay; the rest of texir's time
    is its own)."""
    import time

    if backend_class is None:
        from texir.executorch.backend import ExecutorchBackend as backend_class

    inside = [0.0]
    original = backend_class.preprocess

    def timed(self: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            inside[0] += time.perf_counter() - start

    backend_class.preprocess = timed  # benchmark instrumentation
    return inside
