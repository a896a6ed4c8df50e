"""ExecuTorch's own tests against texir: `pytest -p texir.compat.pytest_plugin --pyargs MODULE`.

Installs the facade (`texir.compat.install()`) when pytest configures the plugin, before the test
modules import ExecuTorch's names, and applies the checked-in manifest (`conformance.json` beside
this file): a test listed `xfail` is a strict xfail (passing fails the run), `skip` is skipped with
its reason, a test the manifest does not list fails. `TEXIR_CONFORMANCE_RECORD=FILE` writes each
test's outcome, its first error line and whether texir's facade ran, as JSON (to review a manifest)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

import texir.compat
from texir.compat import program as _facade

MANIFEST = pathlib.Path(__file__).with_name("conformance.json")

def pytest_configure(config: pytest.Config) -> None:
    # Runs when pytest loads the plugin (-p), before collection imports the test modules; a plain
    # import of this module (to read the manifest) installs nothing.
    texir.compat.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    texir.compat.uninstall()


def test_key(path: str, nodeid: str) -> str:
    """A test's manifest key: its file from `executorch/` on, then its name (`::Class::test`)."""
    at = path.replace(os.sep, "/").rfind("/executorch/")
    where = path[at + 1:] if at >= 0 else path
    return where + "::" + nodeid.split("::", 1)[1] if "::" in nodeid else where


def load_manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(MANIFEST.read_text())
    return data["tests"]  # type: ignore[no-any-return]  # json is untyped; the checked-in file holds a dict


_RECORD: dict[str, dict[str, Any]] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = load_manifest()
    for item in items:
        key = test_key(str(item.path), item.nodeid)
        item.stash[_KEY] = key
        entry = tests.get(key)
        if entry is None:
            continue
        if entry["status"] == "xfail":
            item.add_marker(pytest.mark.xfail(reason=entry["reason"], strict=True))
        elif entry["status"] == "skip":
            item.add_marker(pytest.mark.skip(reason=entry["reason"]))


_KEY = pytest.StashKey[str]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CALLS] = _facade.CALLS[0]
    if os.environ.get("TEXIR_CONFORMANCE_RECORD"):
        return
    if item.stash[_KEY] not in load_manifest():
        pytest.fail(f"{item.stash[_KEY]} is not in {MANIFEST.name}: add it with its status", pytrace=False)


_CALLS = pytest.StashKey[int]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get("TEXIR_CONFORMANCE_RECORD") or report.when == "teardown" and report.passed:
        return
    key = item.stash.get(_KEY, item.nodeid)
    if report.when == "call" or report.failed or report.skipped:
        error = ""
        if call.excinfo is not None:
            lines = str(call.excinfo.value).strip().splitlines()
            error = f"{call.excinfo.type.__name__}: {lines[0][:300] if lines else ''}"
        previous = _RECORD.get(key)
        if previous is None or previous["outcome"] == "passed":
            _RECORD[key] = {
                "outcome": report.outcome, "error": error,
                "texir": _facade.CALLS[0] > item.stash.get(_CALLS, _facade.CALLS[0]),
            }


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("TEXIR_CONFORMANCE_RECORD")
    if path:
        pathlib.Path(path).write_text(json.dumps(_RECORD, indent=1, sort_keys=True))
