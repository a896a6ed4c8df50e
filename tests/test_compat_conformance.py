"""ExecuTorch 1.5.1's own delegation tests, from the installed wheel, against `texir.compat`.

One pytest subprocess per module (`-p texir.compat.pytest_plugin --pyargs MODULE`): the plugin
installs the facade before the module imports ExecuTorch's names and applies the checked-in manifest
(texir/compat/conformance.json: every test `pass`, or `xfail`/`skip` with its reason; xfails are
strict). A module's run fails when a `pass` test fails, an `xfail` test passes, or a test is not in
the manifest. `make test` runs every module the manifest lists (about 2 minutes on 2 cores);
`make conformance` runs only these tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("executorch")

from texir.compat.pytest_plugin import MANIFEST, load_manifest  # noqa: E402  (needs executorch)

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> list[str]:
    modules = {key.split("::")[0][: -len(".py")].replace("/", ".") for key in load_manifest()}
    return sorted(modules)


PIPELINE = ["executorch.exir.backend.test.test_partitioner", "executorch.exir.tests.test_delegate"]
"""Modules that go through to_edge, to_backend, to_executorch and emission: the manifest must hold them."""

MODULES = _modules()


def test_the_manifest_lists_every_module_of_the_reference_sheet_with_a_reason_for_each_non_pass() -> None:
    tests = json.loads(MANIFEST.read_text())["tests"]
    assert set(PIPELINE) <= set(_modules())
    for key, entry in tests.items():
        assert entry["status"] in ("pass", "xfail", "skip"), key
        assert entry["status"] == "pass" or len(entry.get("reason", "")) > 20, f"{key}: no reason"


def run_module(module: str, cwd: Path, manifest: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TEXIR_CONFORMANCE_RECORD", None)
    if manifest is not None:
        env["TEXIR_CONFORMANCE_MANIFEST"] = str(manifest)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "--import-mode=importlib",
         "-q", "-p", "texir.compat.pytest_plugin", "--pyargs", module],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=1200,
    )


@pytest.mark.slow
@pytest.mark.parametrize("module", MODULES)
def test_executorchs_own_tests_conform_to_the_manifest(module: str, tmp_path: Path) -> None:
    done = run_module(module, tmp_path)
    assert done.returncode == 0, f"{module}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"


@pytest.mark.parametrize("status", ["xfail", "absent"])
def test_a_test_that_departs_from_the_manifest_fails_the_run(status: str, tmp_path: Path) -> None:
    """A passing test listed xfail (or not listed at all) makes the module's run fail."""
    module = "executorch.exir.tests.test_partitioner_pre_decomposition"
    data = json.loads(MANIFEST.read_text())
    key = next(k for k in data["tests"] if "test_partitioner_pre_decomposition" in k)
    assert data["tests"][key]["status"] == "pass"
    if status == "absent":
        del data["tests"][key]
    else:
        data["tests"][key] = {"status": "xfail", "reason": "a wrong entry: the test passes on texir"}
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(data))
    done = run_module(module, tmp_path, manifest)
    assert done.returncode == 1, done.stdout[-2000:]
    assert key in done.stdout
