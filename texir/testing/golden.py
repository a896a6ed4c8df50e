"""Golden text files as a syrupy extension: `golden(relpath, text)` compares `text` with the file
`golden/<relpath>` beside the test file, and syrupy's `pytest --snapshot-update` rewrites it.

The files keep their own names and suffixes (`golden/edge/<pass>/after.txt`, `golden/pte/x.json`),
any test may name any file (a text-in test and the export test that wrote its input share one), and
the bytes are exactly the text. syrupy counts them as snapshots but never reports one unused or deletes
it: which golden a test names is in its code, not its name, so a file no test reads is removed by hand.
Imported by texir.testing.pytest_plugin only when syrupy is installed.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.data import SnapshotCollection, SnapshotCollections
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.location import PyTestLocation

__all__ = ["GOLDEN_DIRNAME", "DIFF_LINES", "Golden", "GoldenTextExtension", "golden_path", "updating_goldens"]

GOLDEN_DIRNAME = "golden"
"""The folder, beside the test file, that holds its golden files."""
DIFF_LINES = 200
"""A mismatch shows at most this many lines of unified diff."""


def golden_path(test_file: str | Path, relpath: str) -> Path:
    """Where `relpath` lives for a test in `test_file`: `<its folder>/golden/<relpath>`. Raises
    ValueError for a path that would leave that folder."""
    rel = PurePosixPath(relpath)
    if not relpath or rel.is_absolute() or ".." in rel.parts or "\\" in relpath:
        raise ValueError(
            f"golden path {relpath!r} must be relative to the golden folder, with '/' and no '..' "
            "(e.g. 'edge/remove_noop_ops/after.txt')"
        )
    return Path(test_file).parent / GOLDEN_DIRNAME / rel


def updating_goldens(config: pytest.Config) -> bool:
    """Whether this run rewrites goldens (`--snapshot-update`): for a test that checks a generated
    file outside the golden folder (a packaged table) by hand."""
    return bool(getattr(config.option, "update_snapshots", False))


def _relpath(index: object) -> str:
    if not isinstance(index, str):
        raise ValueError(
            "a golden file is named by the test: use the `golden` fixture, golden('dir/file.txt', text), "
            "or snapshot.use_extension(GoldenTextExtension)(name='dir/file.txt')"
        )
    return index


class GoldenTextExtension(SingleFileSnapshotExtension):
    """One text file per assertion at `golden/<name>` beside the test, `name` being the relpath
    the assertion is given (`snapshot(name=relpath)`)."""

    _write_mode = WriteMode.TEXT
    file_extension = ""  # the relpath carries its own suffix

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(Path(test_location.filepath).parent / GOLDEN_DIRNAME)

    @classmethod
    def discovery_dirname(cls, *, test_location: PyTestLocation) -> str:
        return cls.dirname(test_location=test_location)

    @classmethod
    def get_location(cls, *, test_location: PyTestLocation, index: Any) -> str:
        return str(golden_path(test_location.filepath, _relpath(index)))

    def discover_snapshots(
        self, *, test_location: PyTestLocation, ignore_extensions: list[str] | None = None
    ) -> SnapshotCollections:
        # Nothing is discovered, so nothing is unused: syrupy would otherwise take every golden a
        # run did not read (another test file's, or one a -k left out) for a stale snapshot.
        return SnapshotCollections()

    def delete_snapshots(self, *, snapshot_location: str, snapshot_names: set[str]) -> None:
        """Never called (nothing is discovered); golden files are deleted by hand."""

    @classmethod
    def matches_test_location(cls, *, test_location: PyTestLocation, snapshot_location: str) -> bool:
        return True  # the test names its file: there is no naming rule to check

    @classmethod
    def write_snapshot_collection(
        cls, *, snapshot_collection: SnapshotCollection, name_order: dict[str, int] | None = None
    ) -> None:
        path = Path(snapshot_collection.location)
        data = next(iter(snapshot_collection)).data
        if not isinstance(data, str):
            raise TypeError(f"a golden file holds text, not {type(data).__name__}")
        # Written whole or not at all, with '\n' line ends on every platform.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(data, encoding="utf-8", newline="\n")
        os.replace(tmp, path)

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        lines = list(
            difflib.unified_diff(
                str(snapshot_data).splitlines(keepends=True), str(serialized_data).splitlines(keepends=True),
                fromfile="golden", tofile="received", n=2,
            )
        )
        for line in lines[:DIFF_LINES]:
            yield line.rstrip("\n") if line.endswith("\n") else line + "  (no newline at end)"
        if len(lines) > DIFF_LINES:
            yield f"... {len(lines) - DIFF_LINES} more diff lines"


class Golden:
    """The `golden` fixture: `golden(relpath, text)` passes when `text` equals the file
    `golden/<relpath>` beside the test; otherwise the test fails saying how the file differs (a
    unified diff) or that it is missing, and how to (re)write it: `pytest --snapshot-update`."""

    def __init__(self, snapshot: SnapshotAssertion) -> None:
        self._snapshot = snapshot.use_extension(GoldenTextExtension)

    def __call__(self, relpath: str, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"golden({relpath!r}, ...) compares text, not {type(text).__name__}")
        location = self._snapshot.test_location
        path = golden_path(location.filepath, relpath)  # a bad relpath fails before syrupy sees it
        assertion = self._snapshot(name=relpath)
        if assertion == text:
            return
        result = assertion.executions[assertion.num_executions - 1]
        if result.exception is not None:
            raise result.exception
        update = f"pytest --snapshot-update '{location.nodeid}'"
        shown = _shown(path)
        if result.recalled_data is None:
            pytest.fail(f"golden {shown} is missing: write it with `{update}` and review it", pytrace=False)
        diff = "\n".join(assertion.extension.diff_lines(text, result.recalled_data))
        pytest.fail(
            f"output differs from golden {shown} (if the change is intended: `{update}`)\n{diff}",
            pytrace=False,
        )


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
