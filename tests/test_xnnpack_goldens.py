"""Torch-free goldens of the native XNNPACK backend (issue 40): for each tests/golden/xnnpack/<case>/, the
delegate's input program is parsed from its text with its constants' bytes, compiled by the backend,
and the blob (as `format_blob` text) and the working graph after each pass in `PASSES` compared with
the golden text, in one fresh interpreter where importing torch or executorch fails. The goldens come
from tools/make_xnnpack_goldens.py (run by hand, with torch); the op family each case covers is in
its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.xnnpack_goldens import BLOB, PASS_TEXT, XNNPACK_GOLDENS
from texir.backends.xnnpack.passes import PASSES

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted(p.name for p in XNNPACK_GOLDENS.iterdir() if p.is_dir())

# Any import of torch or executorch (or their submodules) raises, whoever asks for it.
CHILD = """
import json, sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "executorch"):
            raise ImportError(f"{name} is blocked: the XNNPACK goldens run without torch and executorch")
        return None

sys.meta_path.insert(0, Blocked())
from tests.xnnpack_goldens import XNNPACK_GOLDENS, blob_text, load_case, passes_text

out = {}
for case in sorted(p for p in XNNPACK_GOLDENS.iterdir() if p.is_dir()):
    program = load_case(case)
    out[case.name] = {"blob": blob_text(program), "passes": passes_text(program)}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "executorch"))
json.dump({"loaded": loaded, "cases": out}, sys.stdout)
"""


@pytest.fixture(scope="module")
def torch_free() -> dict[str, Any]:
    """What the backend makes of every case, computed in one interpreter with torch and executorch blocked."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_cases_cover_the_op_families() -> None:
    families = ("linear", "conv2d", "conv1d", "bn", "unary", "binary_broadcast", "pooling", "concat", "max_dim",
                "clone", "channels_last", "copy", "int8", "pad")
    assert [f for f in families if not any(f in c for c in CASES)] == []


def test_every_pass_rewrites_some_case() -> None:
    texts = [(XNNPACK_GOLDENS / case / PASS_TEXT).read_text(encoding="utf-8") for case in CASES]
    rewritten = {line[2:] for text in texts for line in text.splitlines()
                 if line.startswith("# ") and not line.endswith(": unchanged")}
    assert [p.name for p in PASSES if p.name not in rewritten] == []


def test_nothing_loads_torch_or_executorch(torch_free: dict[str, Any]) -> None:
    assert torch_free["loaded"] == []
    assert sorted(torch_free["cases"]) == CASES


@pytest.mark.parametrize("case", CASES)
def test_blob_text_matches_golden(case: str, torch_free: dict[str, Any]) -> None:
    assert torch_free["cases"][case]["blob"] == (XNNPACK_GOLDENS / case / BLOB).read_text(encoding="utf-8")


@pytest.mark.parametrize("case", CASES)
def test_pass_pipeline_text_matches_golden(case: str, torch_free: dict[str, Any]) -> None:
    assert torch_free["cases"][case]["passes"] == (XNNPACK_GOLDENS / case / PASS_TEXT).read_text(encoding="utf-8")
