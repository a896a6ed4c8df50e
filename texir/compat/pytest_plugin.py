"""ExecuTorch's own tests against texir: `pytest -p texir.compat.pytest_plugin --pyargs MODULE`.

Installs the facade (`texir.compat.install()`) when pytest configures the plugin, before the test
modules import ExecuTorch's names, and judges the run by the checked-in manifest (`conformance.json`
beside this file): the run passes when every `pass` test passes and every `xfail` test fails (any of
its reports, unittest subtests included: a marker-based xfail would see a test whose subtests fail
as passing), `skip` tests are skipped with their reason, and a test the manifest does not list
fails. `TEXIR_CONFORMANCE_RECORD=FILE` instead writes each test's outcome, its first error line and
whether texir's facade ran in it, as JSON (tools/compat_manifest.py turns that into the manifest)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

import texir.compat
from texir.compat import program as _facade

MANIFEST = pathlib.Path(os.environ.get("TEXIR_CONFORMANCE_MANIFEST") or pathlib.Path(__file__).with_name("conformance.json"))
"""The manifest (`TEXIR_CONFORMANCE_MANIFEST` names another, as the plugin's own test does)."""


def test_key(path: str, nodeid: str) -> str:
    """A test's manifest key: its file from `executorch/` on, then its name (`::Class::test`)."""
    at = path.replace(os.sep, "/").rfind("/executorch/")
    where = path[at + 1:] if at >= 0 else path
    return where + "::" + nodeid.split("::", 1)[1] if "::" in nodeid else where


def load_manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(MANIFEST.read_text())
    return data["tests"]  # type: ignore[no-any-return]  # json is untyped; the checked-in file holds a dict


def _recording() -> str | None:
    return os.environ.get("TEXIR_CONFORMANCE_RECORD") or None


_KEYS: dict[str, str] = {}
"""pytest node id -> manifest key."""
_SEEN: dict[str, dict[str, Any]] = {}
"""manifest key -> outcome ('passed', 'failed' if any report failed, 'skipped'), first error, texir."""
_START: dict[str, int] = {}


def pytest_configure(config: pytest.Config) -> None:
    # Runs when pytest loads the plugin (-p), before collection imports the test modules; a plain
    # import of this module (to read the manifest) installs nothing.
    texir.compat.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    texir.compat.uninstall()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = load_manifest()
    for item in items:
        key = _KEYS[item.nodeid] = test_key(str(item.path), item.nodeid)
        entry = tests.get(key)
        if entry is not None and entry["status"] == "skip" and not _recording():
            item.add_marker(pytest.mark.skip(reason=entry["reason"]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    key = _KEYS.get(report.nodeid, report.nodeid)
    if report.when == "setup":
        _START[key] = _facade.CALLS[0]
    seen = _SEEN.setdefault(key, {"outcome": "passed", "error": "", "texir": False})
    seen["texir"] = seen["texir"] or _facade.CALLS[0] > _START.get(key, _facade.CALLS[0])
    if report.failed and seen["outcome"] != "failed":
        crash = getattr(report.longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(report.longrepr or "")
        seen["outcome"], seen["error"] = "failed", (text.strip().splitlines() or [""])[0][:300]
    elif report.skipped and seen["outcome"] == "passed":
        seen["outcome"] = "skipped"


def _verdicts() -> list[str]:
    """Each way the run departs from the manifest."""
    tests = load_manifest()
    problems = []
    for key, seen in sorted(_SEEN.items()):
        entry = tests.get(key)
        if entry is None:
            problems.append(f"{key}: not in {MANIFEST.name}; add it with its status")
        elif entry["status"] == "pass" and seen["outcome"] != "passed":
            problems.append(f"{key}: listed pass, {seen['outcome']}: {seen['error']}")
        elif entry["status"] == "xfail" and seen["outcome"] != "failed":
            problems.append(f"{key}: listed xfail ({entry['reason'][:80]}...), but {seen['outcome']}: update the manifest")
    return problems


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = _recording()
    if path:
        pathlib.Path(path).write_text(json.dumps(_SEEN, indent=1, sort_keys=True))
        return
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return  # collection or usage errors stand
    problems = _verdicts()
    session.config.stash[_PROBLEMS] = problems
    session.exitstatus = pytest.ExitCode.TESTS_FAILED if problems else pytest.ExitCode.OK


_PROBLEMS = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _recording():
        return
    problems = config.stash.get(_PROBLEMS, None)
    if problems is None:
        return
    terminalreporter.section("texir conformance (against texir/compat/conformance.json)")
    for line in problems or ["every test as the manifest says"]:
        terminalreporter.write_line(line)
