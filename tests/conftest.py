"""Shared test settings. Golden files (tests/golden/<relpath>) are compared by the `golden` fixture
of texir's pytest plugin (texir.testing.golden); `pytest --snapshot-update` rewrites them."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"

# Every edge pass is followed by texir.ir.verify in the tests (texir.edge.pipeline.run_stage), so a
# pass that breaks the IR is named where it happens; subprocesses inherit it. TEXIR_VERIFY=0 turns it off.
os.environ.setdefault("TEXIR_VERIFY", "1")
