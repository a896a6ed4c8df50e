"""pytest plugin: the `ir_snapshot` fixture, a syrupy extension storing canonical IR text.

`assert program == ir_snapshot` stores `format_program(canonicalize(program))` in
`__snapshots__/<test file>/<test name>.texir` beside the test, fails with a structural diff (nodes
added, removed or changed, named by canonical position and original name, then the text diff), and
is rewritten by syrupy's `--snapshot-update`. Works for Programs, LoweredBackendModules and
PtePrograms.

The `golden` fixture (texir.testing.golden) is syrupy's too: `golden(relpath, text)` compares text
with the file `golden/<relpath>` beside the test, rewritten by the same `--snapshot-update`.
Registered through the `pytest11` entry point `texir`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from texir.viz.diff import Change, ProgramDiff, diff_texts, format_diff
from texir.viz.views import text_view

_OP = re.compile(r"= ([\w:.]+)\(")
_TORCH_TRACE_LOGGER = "torch.__trace"
"""torch logs every export step here at DEBUG; pytest would print it all under a failing test."""


def _op(line: str | None) -> str | None:
    m = _OP.search(line or "")
    return m.group(1) if m else None


def _rank(change: Change) -> int:
    """What a reader needs first: nodes whose op changed, then nodes gone or new, then changed
    arguments, then everything else (metadata such as shapes, signature, state)."""
    if not change.is_node:
        return 4
    if change.kind == "changed":
        return 0 if "op" in change.fields else 2 if "args" in change.fields else 3
    return 1


def op_summary(diff: ProgramDiff) -> list[str]:
    """One line each for the ops that changed, disappeared and appeared (empty when none did)."""
    swapped: dict[str, None] = {}
    gone: dict[str, None] = {}
    new: dict[str, None] = {}
    for c in diff.changes:
        if not c.is_node:
            continue
        a, b = _op(c.a), _op(c.b)
        if c.kind == "changed" and "op" in c.fields and a and b:
            swapped.setdefault(f"{a} -> {b}")
        elif c.kind == "removed" and a:
            gone.setdefault(a)
        elif c.kind == "added" and b:
            new.setdefault(b)
    lines = []
    for title, ops in (("ops changed", swapped), ("ops removed", gone), ("ops added", new)):
        if ops:
            lines.append(f"{title}: {', '.join(ops)}")
    return lines


def ops_first(diff: ProgramDiff) -> ProgramDiff:
    """`diff` with its changes ordered by `_rank` (stable within a rank)."""
    return msgspec.structs.replace(diff, changes=tuple(sorted(diff.changes, key=_rank)))

__all__ = ["IRSnapshotExtension", "golden", "ir_snapshot"]

try:
    from syrupy.assertion import SnapshotAssertion
    from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

    from texir.testing.golden import Golden
except ImportError:  # pragma: no cover - the entry point loads in every pytest run, syrupy or not
    _HAVE_SYRUPY = False
else:
    _HAVE_SYRUPY = True

if _HAVE_SYRUPY:

    class IRSnapshotExtension(SingleFileSnapshotExtension):
        """One readable text file per assertion, holding the canonical text view of the value."""

        _write_mode = WriteMode.TEXT
        file_extension = "texir"

        def __init__(self) -> None:
            super().__init__()
            # Original node names of what was last serialized, keyed by its text: the stored side is
            # text only, the received side still knows its names, and the report shows both.
            self._names: dict[str, dict[int, str]] = {}

        def serialize(self, data: Any, **kwargs: Any) -> str:
            if isinstance(data, str):  # a stored snapshot passed back in (syrupy's diff= option)
                return data
            view = text_view(data)
            self._names[view.text] = view.names
            return view.text

        def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
            received, stored = str(serialized_data), str(snapshot_data)
            if stored:
                diff = diff_texts(
                    stored, received, a_label="snapshot", b_label="received",
                    b_names=self._names.get(received),
                )
                # pytest shows ~8 lines without -vv: the ops that changed come first
                text = format_diff(ops_first(diff), limit=60, header=False).splitlines()
                yield from text[:1]
                yield from op_summary(diff)
                yield from text[1:]
                yield "text diff (- snapshot, + received):"
            yield from super().diff_lines(serialized_data, snapshot_data)


    @pytest.fixture
    def ir_snapshot(snapshot: SnapshotAssertion) -> Iterator[SnapshotAssertion]:
        """syrupy's `snapshot`, storing texir programs as canonical text (`*.texir` files). While
        the test runs, torch's DEBUG trace log (every export step) stays out of pytest's report."""
        # pytest hangs its capture handlers on that logger itself, so only its level keeps the
        # records out; unless the user asked torch for a trace (TORCH_TRACE), which needs them.
        trace = logging.getLogger(_TORCH_TRACE_LOGGER)
        level = trace.level
        if not os.environ.get("TORCH_TRACE"):
            trace.setLevel(max(level, logging.INFO))
        try:
            yield snapshot.use_extension(IRSnapshotExtension)
        finally:
            trace.setLevel(level)

    @pytest.fixture
    def golden(snapshot: SnapshotAssertion) -> Golden:
        """`golden(relpath, text)`: `text` must equal the file `golden/<relpath>` beside the test
        (see texir.testing.golden); `pytest --snapshot-update` writes it."""
        return Golden(snapshot)

else:

    @pytest.fixture
    def ir_snapshot() -> Any:  # noqa: D103 - stands in when syrupy is missing
        pytest.fail("the ir_snapshot fixture needs syrupy: pip install 'syrupy>=4.6' (texir[test])")

    @pytest.fixture
    def golden() -> Any:  # noqa: D103 - stands in when syrupy is missing
        pytest.fail("the golden fixture needs syrupy: pip install 'syrupy>=4.6' (texir[test])")
