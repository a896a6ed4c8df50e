"""Run in a fresh process by tests/test_checkpoints.py: `texir lower hf:DIR` on a checkpoint while
watching the process's anonymous memory, after a warm-up lowering of another checkpoint (so the
modules and caches every lowering loads are in place before the baseline).

    python -m tests.checkpoint_memory WARMUP_DIR DIR OUT_DIR [FLAG ...]   # prints one JSON line

FLAGs go to both lowerings (e.g. `--qlinear 8da4w`).

Measured: RssAnon (/proc/self/status) before, after, and its largest value seen by a thread
reading it every millisecond (a copy of a weight that lives longer than that is seen)."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path


def rss_anon() -> int:
    """The process's resident anonymous memory in bytes (Linux)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class AnonPeak:
    """The largest RssAnon seen while the block runs (sampled each millisecond, and at both ends).
    `limit` (bytes, 0: none): past it the process ends at once (exit 3), before the machine runs
    out of memory: a benchmark's guard where RLIMIT_AS cannot be (mapped files count in it)."""

    def __init__(self, limit: int = 0) -> None:
        self.peak = 0
        self.limit = limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_anon())
            if self.limit and self.peak > self.limit:
                print(f"RssAnon {self.peak / 2**30:.2f} GiB passed the limit {self.limit / 2**30:.2f} GiB: out of memory",
                      file=sys.stderr, flush=True)
                os._exit(3)

    def __enter__(self) -> "AnonPeak":
        self.peak = rss_anon()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


def main(warmup: str, directory: str, out: str, *flags: str) -> dict[str, int]:
    from texir.cli.main import main as texir

    lower = ["lower", "--task", "text-generation", "--max-seq-len", "16", *flags]
    if texir([*lower, f"hf:{warmup}", "-o", str(Path(out) / "warmup.pte")]) != 0:
        raise RuntimeError(f"the warm-up lowering of {warmup} failed (see stderr)")
    weights = sum(p.stat().st_size for p in Path(directory).glob("*.safetensors"))
    before = rss_anon()
    with AnonPeak() as anon:
        code = texir([*lower, f"hf:{directory}", "-o", str(Path(out) / "model.pte")])
    return {"code": code, "weights": weights, "before": before, "after": rss_anon(), "peak": anon.peak}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
