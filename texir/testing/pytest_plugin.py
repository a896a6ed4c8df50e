"""pytest plugin: the `ir_snapshot` fixture, a syrupy extension storing canonical IR text.

`assert program == ir_snapshot` stores `format_program(canonicalize(program))` in
`__snapshots__/<test file>/<test name>.texir` beside the test, fails with a structural diff (nodes
added, removed or changed, named by canonical position and original name, then the text diff), and
is rewritten by syrupy's `--snapshot-update`. Works for Programs, LoweredBackendModules and
PtePrograms. Registered through the `pytest11` entry point `texir`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from texir.viz.diff import diff_texts, format_diff
from texir.viz.views import text_view

__all__ = ["IRSnapshotExtension", "ir_snapshot"]

try:
    from syrupy.assertion import SnapshotAssertion
    from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
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
                yield from format_diff(diff, limit=60, header=False).splitlines()
                yield "text diff (- snapshot, + received):"
            yield from super().diff_lines(serialized_data, snapshot_data)


    @pytest.fixture
    def ir_snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
        """syrupy's `snapshot`, storing texir programs as canonical text (`*.texir` files)."""
        return snapshot.use_extension(IRSnapshotExtension)

else:

    @pytest.fixture
    def ir_snapshot() -> Any:  # noqa: D103 - stands in when syrupy is missing
        pytest.fail("the ir_snapshot fixture needs syrupy: pip install 'syrupy>=4.6' (texir[test])")
