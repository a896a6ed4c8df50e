"""Shared test settings. Golden files (tests/golden/<relpath>) are compared by the `golden` fixture
of texir's pytest plugin (texir.testing.golden); `pytest --snapshot-update` rewrites them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"

# Every edge pass is followed by texir.ir.verify in the tests (texir.edge.pipeline.run_stage), so a
# pass that breaks the IR is named where it happens; subprocesses inherit it. TEXIR_VERIFY=0 turns it off.
os.environ.setdefault("TEXIR_VERIFY", "1")


@pytest.fixture(autouse=True)
def _backend_registry_left_as_found() -> Iterator[None]:
    """A test leaves every backend registered before it as it found it, implicit flag included (a
    helper that restored the registry by hand made the bridge's implicit ExecuTorch backend look
    like the user's choice, and later tests in that worker lowered with it). New registrations may
    stay: the bridge's (implicit); tests' own `texir-*` backends are theirs to change."""
    from texir.lowering import backend as registry

    before, implicit = dict(registry._REGISTRY), set(registry._IMPLICIT)
    yield
    own = ("texir-",)  # tests' own backends, registered again by the tests that use them
    changed = sorted(
        i for i, b in before.items()
        if not i.startswith(own) and (registry._REGISTRY.get(i) is not b or (i in registry._IMPLICIT) != (i in implicit))
    )
    added = sorted(
        i for i in registry._REGISTRY
        if i not in before and i not in registry._IMPLICIT and not i.startswith(own)
    )
    assert not changed and not added, (
        f"the test changed backend registrations {changed} / left {added} registered: use "
        "texir.lowering.backend_registered(...) or xnnpack.registered() as a with block, or monkeypatch"
    )
