"""A preprocess worker process (`python -m texir.lowering._worker`): reads length-prefixed pickled
tasks on stdin, answers each with a length-prefixed pickled (ok, payload) on stdout. Started by
`texir.lowering.preprocess` for `jobs > 1`; a plain subprocess, so the caller's `__main__` is never
re-imported (multiprocessing's spawn and forkserver would)."""

from __future__ import annotations

import pickle
import sys
from typing import BinaryIO

from texir.lowering.preprocess import run_task


def _read(stream: BinaryIO, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever a backend prints must not corrupt the answers
    while True:
        header = _read(stdin, 8)
        if header is None:
            return
        body = _read(stdin, int.from_bytes(header, "little"))
        if body is None:
            return
        try:
            answer = run_task(pickle.loads(body))
        except Exception as exc:  # e.g. the backend's class cannot be imported here
            answer = (False, f"preprocess worker: {type(exc).__name__}: {exc}")
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(len(data).to_bytes(8, "little") + data)
        stdout.flush()


if __name__ == "__main__":
    main()
