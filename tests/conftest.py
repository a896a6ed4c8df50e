"""Shared test fixtures: golden-file comparison (set TEXIR_UPDATE_GOLDENS=1 to rewrite goldens)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Callable

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"

# Every edge pass is followed by texir.ir.verify in the tests (texir.edge.pipeline.run_stage), so a
# pass that breaks the IR is named where it happens; subprocesses inherit it. TEXIR_VERIFY=0 turns it off.
os.environ.setdefault("TEXIR_VERIFY", "1")


def updating_goldens() -> bool:
    return os.environ.get("TEXIR_UPDATE_GOLDENS", "") not in ("", "0")


def check_golden(relpath: str, text: str) -> None:
    """Compare `text` with tests/golden/<relpath>; with TEXIR_UPDATE_GOLDENS=1, rewrite it instead."""
    path = GOLDEN_DIR / relpath
    if updating_goldens():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8", newline="\n")
        os.replace(tmp, path)
        return
    if not path.exists():
        pytest.fail(f"golden {path} is missing; create it with TEXIR_UPDATE_GOLDENS=1 and review it")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=f"golden/{relpath}", tofile="actual", n=2,
            )
        )
        pytest.fail(
            f"output differs from golden/{relpath} (rewrite with TEXIR_UPDATE_GOLDENS=1 if intended):\n"
            + diff[:6000]
        )


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """`golden(relpath, text)`: see `check_golden`."""
    return check_golden
