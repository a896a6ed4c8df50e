"""The `ir_snapshot` pytest plugin, run in a subprocess pytest on a temporary test directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from texir.testing.programs import chain_program


USER_TEST = textwrap.dedent(
    '''
    import os

    import texir.backends  # registers texir-reference
    from texir.ir import canonicalize
    from texir.testing.programs import chain_program, delegated_program


    from texir.lowering import OpSupportPartitioner, to_backend

    OPS = ("aten::relu.default", "aten::sin.default", "aten::cos.default")


    def lower(variant):
        """A lowering whose partitioner changed between two versions: it now also claims cos."""
        supported = set(OPS[:2]) if variant == "base" else set(OPS)
        return to_backend(chain_program(OPS), OpSupportPartitioner("texir-reference", ops=supported))


    def test_lowering(ir_snapshot):
        assert lower(os.environ.get("VARIANT", "base")) == ir_snapshot


    def test_lowered_module(ir_snapshot):
        module = delegated_program().lowered_modules[0].module
        assert module == ir_snapshot


    def test_pte_program(ir_snapshot):
        from pathlib import Path

        from texir.serialize.pte import codec

        name = "changed.pte" if os.environ.get("VARIANT") == "changed" else "base.pte"
        assert codec.loads((Path(__file__).parent / name).read_bytes()) == ir_snapshot


    def test_graph_change(ir_snapshot):
        ops = ["aten::relu.default", "aten::sin.default"]
        if os.environ.get("VARIANT") == "changed":
            ops[1] = "aten::cos.default"
        assert chain_program(ops, names=["r", "my_sin"]) == ir_snapshot
    '''
)


def _run(root: Path, *args: str, variant: str = "base") -> subprocess.CompletedProcess[str]:
    # Not an xdist worker's child: syrupy leaves its summary to the controller when PYTEST_XDIST_* is set.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(VARIANT=variant, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "syrupy", "-p", "texir.testing.pytest_plugin",
           "-p", "no:cacheprovider", "--color=no", *args, str(root)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _write_pte_files(root: Path) -> None:
    from texir.serialize.pte import codec
    from texir.emit import emit

    base = ("aten::relu.default", "aten::sin.default")
    changed = ("aten::relu.default", "aten::tanh.default")
    (root / "base.pte").write_bytes(codec.dumps(emit(chain_program(base, with_param=False))))
    (root / "changed.pte").write_bytes(codec.dumps(emit(chain_program(changed, with_param=False))))


def test_snapshot_lifecycle(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    _write_pte_files(tmp_path)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    snap_dir = tmp_path / "__snapshots__" / "test_user"

    # No snapshots yet: the tests fail and say so; --snapshot-update writes them beside the test.
    first = _run(tmp_path)
    assert first.returncode == 1, first.stdout
    assert "does not exist" in first.stdout
    created = _run(tmp_path, "--snapshot-update")
    assert created.returncode == 0, created.stdout + created.stderr
    stored = (snap_dir / "test_lowering.texir").read_text()
    assert "backend=texir-reference" in stored and "%0 : f32[2, 3] = placeholder" in stored
    assert (snap_dir / "test_lowered_module.texir").read_text().startswith("lowered_module:\n  backend=DemoBackend")

    # Unchanged: passes.
    again = _run(tmp_path)
    assert again.returncode == 0, again.stdout
    assert "4 passed" in again.stdout, again.stdout
    assert (snap_dir / "test_pte_program.texir").read_text().startswith("pte version=0\nmethod forward:")

    # A changed lowering: fails with a structural diff naming what changed.
    changed = _run(tmp_path, "-vv", variant="changed")
    assert changed.returncode == 1
    out = changed.stdout
    assert "3 failed, 1 passed" in out, out
    assert "lowered_module lowered_module_0:" in out
    assert "~ backend" in out and "backend=texir-reference" in out
    # Changed nodes are named by canonical position and by their original names.
    assert "- node %6: f32[2, 3] = aten::cos.default(%5)" in out  # stored side: no names
    assert "lowered_module lowered_module_0 > graph:" in out
    assert "+ node %3 (cos_2)" in out
    assert "~ node %4 (my_sin) [op]" in out
    assert "aten::cos.default(%3)" in out
    assert "text diff (- snapshot, + received):" in out
    # .pte programs: operators and instructions by name.
    assert "method forward > operators:" in out and "+ aten::tanh.out" in out
    # The stored snapshot is untouched by a failing run.
    assert (snap_dir / "test_lowering.texir").read_text() == stored

    # The usual update flag rewrites it, and then the changed version passes.
    updated = _run(tmp_path, "--snapshot-update", variant="changed")
    assert updated.returncode == 0, updated.stdout
    assert "3 snapshots updated" in updated.stdout
    assert "aten::cos.default(%2)  # dh=4" in (snap_dir / "test_lowering.texir").read_text()
    assert _run(tmp_path, variant="changed").returncode == 0


TORCH_TEST = textwrap.dedent(
    '''
    import os

    import torch

    from texir.adapters import from_exported_program


    class M(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = torch.nn.Linear(4, width)

        def forward(self, x):
            y = self.fc(x)
            return torch.nn.functional.gelu(y) if os.environ.get("VARIANT") == "changed" else torch.relu(y)


    def test_model(ir_snapshot):
        width = 6 if os.environ.get("VARIANT") == "changed" else 8
        torch.manual_seed(0)
        ep = torch.export.export(M(width), (torch.randn(2, 4),))
        assert from_exported_program(ep, decompose=True) == ir_snapshot
    '''
)


def test_a_failure_shows_the_changed_ops_first_without_torchs_trace_log(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_model.py").write_text(TORCH_TEST)
    assert _run(tmp_path, "--snapshot-update").returncode == 0
    changed = _run(tmp_path, variant="changed")  # no -vv: pytest shows only the first lines
    assert changed.returncode == 1
    shown = [line[1:].strip() for line in changed.stdout.splitlines() if line.startswith("E ")]
    # the op change is among the first lines pytest shows, before any shape change
    assert "ops removed: aten::relu.default" in shown[:4] and "ops added: aten::gelu.default" in shown[:4], shown
    assert any("aten::gelu.default(%4)" in line for line in shown), shown
    assert "torch.__trace" not in changed.stdout and "Captured log" not in changed.stdout


GOLDEN_TEST = textwrap.dedent(
    '''
    import os

    import pytest

    from texir.ir import format_program
    from texir.testing.programs import chain_program

    OPS = ["aten::relu.default", "aten::sin.default"]


    def program_text():
        ops = OPS[:1] + ["aten::cos.default"] if os.environ.get("VARIANT") == "changed" else OPS
        return format_program(chain_program(ops))


    def test_printed(golden):
        golden("chain/printed.txt", program_text())


    @pytest.mark.parametrize("n", [1, 2])
    def test_shared_and_parametrized(golden, n):
        golden("chain/printed.txt", program_text())  # two tests may read one file
        golden(f"counts/{n}.json", "{" + f'"n": {n}' + "}\\n")


    def test_beside_ir_snapshot(golden, ir_snapshot):
        assert chain_program(OPS) == ir_snapshot
        golden("chain/printed.txt", program_text())


    def test_bad_path(golden):
        with pytest.raises(ValueError, match="relative to the golden folder"):
            golden("../escape.txt", "x")
    '''
)


def test_golden_files_lifecycle(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_golden.py").write_text(GOLDEN_TEST)
    golden = tmp_path / "golden"
    orphan = golden / "other" / "orphan.txt"  # no test reads it: never reported unused, never deleted
    orphan.parent.mkdir(parents=True)
    orphan.write_text("kept\n")

    first = _run(tmp_path)
    assert first.returncode == 1, first.stdout
    assert "golden golden/chain/printed.txt is missing: write it with `pytest --snapshot-update" in first.stdout
    assert "test_golden.py::test_printed" in first.stdout

    created = _run(tmp_path, "--snapshot-update", "--snapshot-details")
    assert created.returncode == 0, created.stdout + created.stderr
    printed = golden / "chain" / "printed.txt"
    assert printed.read_bytes().startswith(b"program dialect=ATEN\n")
    assert (golden / "counts" / "2.json").read_bytes() == b'{"n": 2}\n'
    assert "unused" not in created.stdout and orphan.read_text() == "kept\n"
    assert (tmp_path / "__snapshots__" / "test_golden" / "test_beside_ir_snapshot.texir").exists()

    # Unchanged, on two xdist workers (one file each, as `make test` runs): passes, nothing unused.
    again = _run(tmp_path, "-p", "xdist", "-n", "2", "--dist", "loadfile", "--snapshot-details")
    assert again.returncode == 0 and "5 passed" in again.stdout and "7 snapshots passed" in again.stdout, again.stdout
    assert "unused" not in again.stdout

    # A change fails with a unified diff naming the file; the file is untouched.
    stored = printed.read_bytes()
    changed = _run(tmp_path, "-k", "test_printed", variant="changed")
    assert changed.returncode == 1
    out = changed.stdout
    assert "output differs from golden golden/chain/printed.txt" in out, out
    assert "--- golden" in out and "+++ received" in out
    assert "-  %sin_1 : f32[2, 3] = aten::sin.default(%relu_0)  # dh=3" in out, out
    assert "+  %cos_1 : f32[2, 3] = aten::cos.default(%relu_0)  # dh=3" in out, out
    assert printed.read_bytes() == stored

    # The update, on a subset (-k) and then on two xdist workers: the golden is rewritten, the
    # orphan and the goldens the subset did not read stay, no lock or temporary file is left.
    subset = _run(tmp_path, "-k", "test_printed", "--snapshot-update", variant="changed")
    assert subset.returncode == 0 and "1 snapshot updated" in subset.stdout, subset.stdout
    assert b"aten::cos.default" in printed.read_bytes()
    printed.write_bytes(stored)
    updated = _run(tmp_path, "-p", "xdist", "-n", "2", "--dist", "loadfile", "--snapshot-update", variant="changed")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert b"aten::cos.default" in printed.read_bytes()
    files = sorted(str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file())
    assert files == ["chain/printed.txt", "counts/1.json", "counts/2.json", "other/orphan.txt"]
