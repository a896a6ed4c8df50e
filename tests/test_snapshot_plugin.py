"""The `ir_snapshot` pytest plugin, run in a subprocess pytest on a temporary test directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from texir.ir.diff import canonical_text
from texir.testing.programs import delegated_program

USER_TEST = textwrap.dedent(
    '''
    import os

    from texir.ir import canonicalize
    from texir.testing.programs import chain_program, delegated_program


    def lower(program, variant):
        """Stands in for a lowering whose output changed between two versions of a backend."""
        if variant == "changed":
            return delegated_program(processed=b"2#relu,0,tanh,1")
        return delegated_program()


    def test_lowering(ir_snapshot):
        assert lower(chain_program(), os.environ.get("VARIANT", "base")) == ir_snapshot


    def test_lowered_module(ir_snapshot):
        module = delegated_program().lowered_modules[0].module
        assert module == ir_snapshot


    def test_graph_change(ir_snapshot):
        ops = ["aten::relu.default", "aten::sin.default"]
        if os.environ.get("VARIANT") == "changed":
            ops[1] = "aten::cos.default"
        assert chain_program(ops, names=["r", "my_sin"]) == ir_snapshot
    '''
)


def _run(root: Path, *args: str, variant: str = "base") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, VARIANT=variant, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "syrupy", "-p", "texir.testing.pytest_plugin",
           "-p", "no:cacheprovider", "--color=no", *args, str(root)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_snapshot_lifecycle(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(USER_TEST)
    snap_dir = tmp_path / "__snapshots__" / "test_user"

    # No snapshots yet: the tests fail and say so; --snapshot-update writes them beside the test.
    first = _run(tmp_path)
    assert first.returncode == 1, first.stdout
    assert "does not exist" in first.stdout
    created = _run(tmp_path, "--snapshot-update")
    assert created.returncode == 0, created.stdout + created.stderr
    stored = (snap_dir / "test_lowering.texir").read_text()
    assert stored == canonical_text(delegated_program())
    assert (snap_dir / "test_lowered_module.texir").read_text().startswith("lowered_module:\n  backend=DemoBackend")

    # Unchanged: passes.
    again = _run(tmp_path)
    assert again.returncode == 0, again.stdout
    assert "3 passed" in again.stdout, again.stdout

    # A changed lowering: fails with a structural diff naming what changed.
    changed = _run(tmp_path, "-vv", variant="changed")
    assert changed.returncode == 1
    out = changed.stdout
    assert "2 failed, 1 passed" in out, out
    assert "lowered_module lowered_module_0:" in out
    assert "~ backend" in out and "processed=16B" in out
    # A changed node is named by canonical position and by its original name.
    assert "~ node %4 (my_sin) [op]" in out
    assert "aten::cos.default(%3)" in out
    assert "text diff (- snapshot, + received):" in out
    # The stored snapshot is untouched by a failing run.
    assert (snap_dir / "test_lowering.texir").read_text() == stored

    # The usual update flag rewrites it, and then the changed version passes.
    updated = _run(tmp_path, "--snapshot-update", variant="changed")
    assert updated.returncode == 0, updated.stdout
    assert "2 snapshots updated" in updated.stdout
    assert "processed=16B" in (snap_dir / "test_lowering.texir").read_text()
    assert _run(tmp_path, variant="changed").returncode == 0
