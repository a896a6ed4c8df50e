"""Regression tests of defects found using texir as a new user would (issue 14), through the real
`texir` entry point in a subprocess where the defect was in the command line."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from texir._io import atomic_write
from texir.cli.main import main
from texir.errors import PteError, TexirError

ROOT = Path(__file__).resolve().parent.parent
TEXIR = Path(sys.executable).with_name("texir")  # the installed console-script entry point


def _texir(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TEXIR), *args], cwd=cwd or ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "TEXIR_PROGRESS": "0", **(env or {})},
    )


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    done = _texir("demo", "--out-dir", str(out))
    assert done.returncode == 0, done.stderr
    assert "cpuinfo_utils" not in done.stderr, done.stderr  # the runtime's probes stay off unless -v
    return out


def test_an_output_that_is_an_input_is_refused(demo_dir: Path, tmp_path: Path) -> None:
    snap = tmp_path / "s.json"
    snap.write_bytes((demo_dir / "demo.snapshot.json").read_bytes())
    before = snap.read_bytes()
    for args in (
        ("snapshot", str(snap), "-o", str(snap)),
        ("show", str(snap), "-o", str(snap)),
        ("show", str(snap), "--html", str(snap)),
        ("lower", str(snap), "--backend", "texir-reference", "--ops", "aten::relu.default", "-o", str(snap)),
    ):
        result = _texir(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and "would overwrite it" in result.stderr, result.stderr
        assert snap.read_bytes() == before
    twice = _texir("lower", str(snap), "--backend", "texir-reference", "--ops", "aten::relu.default",
                   "--snapshot", str(tmp_path / "x"), "-o", str(tmp_path / "x"))
    assert twice.returncode == 2 and "both name" in twice.stderr


def test_silent_no_ops_are_errors_or_warnings() -> None:
    model = "texir.models:conv_relu_tan"
    for args, message in (
        (("--backend", "texir-reference", "--ops", "aten::nosuch.default"), "not a registered torch operator"),
        (("--backend", "texir-reference", "--ops", "aten::relu"), "names no overload; did you mean aten::relu.default"),
        (("--backend", "nosuch", "--ops", "aten::relu.default"), "is not a registered backend"),
    ):
        result = _texir("lower", model, *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    absent = _texir("lower", model, "--backend", "texir-reference", "--ops", "aten::conv2d.default")
    assert absent.returncode == 0
    assert "warning: --ops aten::conv2d.default" in absent.stderr
    assert "decomposed into aten::convolution.default" in absent.stderr


def test_lower_and_snapshot_say_what_they_wrote(tmp_path: Path) -> None:
    model = "texir.models:conv_relu_tan"
    lowered = _texir("lower", model, "--backend", "texir-reference", "--ops", "aten::relu.default",
                     "--snapshot", str(tmp_path / "l.json"), "-o", str(tmp_path / "l.pte"))
    assert lowered.returncode == 0, lowered.stderr
    assert f"wrote {tmp_path / 'l.json'}" in lowered.stderr and f"wrote {tmp_path / 'l.pte'}" in lowered.stderr
    snap = _texir("snapshot", str(tmp_path / "l.json"), "-o", str(tmp_path / "s.msgpack"))
    assert snap.returncode == 0 and f"wrote {tmp_path / 's.msgpack'}" in snap.stderr


def test_commands_on_files_do_not_import_torch(demo_dir: Path) -> None:
    pte_file, snap = str(demo_dir / "demo.pte"), str(demo_dir / "demo.snapshot.json")
    script = (
        "import runpy, sys, time; t = time.perf_counter(); sys.argv = [sys.argv[1], *sys.argv[2:]]\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', round(time.perf_counter() - t, 3), file=sys.stderr)\n"
    )
    for args in (["--help"], ["inspect", pte_file], ["show", pte_file], ["show", snap], ["diff", pte_file, pte_file],
                 ["diff", snap, snap], ["show", snap, "--html", str(demo_dir / "x.html")]):
        result = subprocess.run([sys.executable, "-c", script, str(TEXIR), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert "NO-TORCH" in result.stderr, (args, result.stderr[-500:])


def test_decoder_refuses_out_of_range_indices(demo_dir: Path, tmp_path: Path) -> None:
    import msgspec

    from texir.serialize import pte

    program = pte.load(demo_dir / "demo.pte")
    plan = program.program.execution_plan[0]
    bad_plan = msgspec.structs.replace(plan, inputs=(len(plan.values) + 3,))
    bad = msgspec.structs.replace(program, program=msgspec.structs.replace(program.program, execution_plan=(bad_plan,)))
    with pytest.raises(PteError, match=r"ExecutionPlan 'forward'.inputs\[0\] = \d+ is outside values"):
        pte.dump(bad, tmp_path / "bad.pte")
    assert not list(tmp_path.iterdir())
    data = pte.dumps(bad)  # written anyway through the codec's raw path, as a hostile file would be
    with pytest.raises(PteError, match="is outside values"):
        pte.loads(data)
    (tmp_path / "bad.pte").write_bytes(data)
    for args in (("inspect", str(tmp_path / "bad.pte")), ("show", str(tmp_path / "bad.pte"), "--html", str(tmp_path / "b.html"))):
        result = _texir(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr and "outside values" in result.stderr, result.stderr


def test_temp_files_are_cleaned_up(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    stale = tmp_path / ".out.bin.abc123.tmp"
    stale.write_bytes(b"x" * 100)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = tmp_path / ".out.bin.def456.tmp"  # could be a writer still running: kept
    fresh.write_bytes(b"y")
    atomic_write(target, [b"data"])
    assert target.read_bytes() == b"data" and not stale.exists() and fresh.exists()
    # SIGTERM while writing removes the temporary file.
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import time, sys; from texir._io import atomic_write\n"
         "def chunks():\n    yield b'a' * 1000\n    print('writing', flush=True)\n    time.sleep(60)\n    yield b'b'\n"
         f"atomic_write({str(tmp_path / 'slow.bin')!r}, chunks())\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=300)  # a hang guard, generous for a loaded 2-core machine
    assert child.returncode == -signal.SIGTERM
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".slow.bin.")]
    assert not (tmp_path / "slow.bin").exists()


def test_existing_outputs_keep_their_mode_and_read_only_ones_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "o.bin"
    target.write_bytes(b"old")
    target.chmod(0o640)
    atomic_write(target, [b"new"])
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and target.read_bytes() == b"new"
    target.chmod(0o444)
    if os.geteuid() == 0:
        pass  # root may write anything; the check still refuses read-only files by their mode
    with pytest.raises(TexirError, match="read-only"):
        atomic_write(target, [b"newer"])
    assert target.read_bytes() == b"new"


def test_many_partitions_get_distinct_colours_and_tips_show_full_names() -> None:
    from texir.viz.html import partition_color

    colours = [partition_color(i) for i in range(60)]
    assert len(set(colours)) == 60
    js = (ROOT / "texir" / "viz" / "static" / "viewer.js").read_text(encoding="utf-8")
    assert "label.length > 22 ? label" in js  # the hover tip starts with the uncut name


def test_library_decomposition_prints_no_torch_leafspec_warning() -> None:
    import warnings

    import torch

    from texir.adapters import from_exported_program

    class Gelu(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(x)

    ep = torch.export.export(Gelu(), (torch.randn(2),), strict=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_exported_program(ep, decompose=True)
    assert not [w for w in caught if "LeafSpec" in str(w.message)]


def test_inspect_spells_tensors_as_show_does(demo_dir: Path) -> None:
    out = _texir("inspect", str(demo_dir / "demo.pte")).stdout
    assert "Tensor float[4, 3, 64, 64]" in out and "FLOAT[" not in out


def test_bad_inputs_give_one_line_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "junk.pt2").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "junk.json").write_bytes(b"\x07" + bytes(range(200)))
    (tmp_path / "part.py").write_text("def part(program):\n    raise KeyError('boom')\n", encoding="utf-8")
    (tmp_path / "pred.py").write_text(
        "from texir.lowering.partitioners import OpSupportPartitioner\n"
        "def _pred(node, meta):\n    raise ValueError('pred boom')\n"
        "class P(OpSupportPartitioner):\n    def __init__(self, backend_id):\n        super().__init__(backend_id, _pred)\n",
        encoding="utf-8",
    )
    cases = (
        (("show", str(tmp_path / "junk.pt2")), "cannot load"),
        (("show", str(tmp_path / "junk.json")), "neither a JSON nor a msgpack envelope"),
        (("lower", "texir.models:conv_relu_tan", "--backend", "texir-reference",
          "--partitioner", f"{tmp_path / 'part.py'}:part"), "partitioner part.part raised KeyError: 'boom'"),
        (("lower", "texir.models:conv_relu_tan", "--backend", "texir-reference",
          "--partitioner", f"{tmp_path / 'pred.py'}:P"), "the support predicate raised ValueError on node"),
    )
    for args, message in cases:
        result = _texir(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr


UNFOLD = """
import torch


class Unfold(torch.nn.Module):
    def forward(self, x):
        return x.unfold(0, 2, 1) * 2


def build():
    return Unfold(), (torch.randn(5),)
"""


def test_lower_refuses_non_core_ops_unless_allow_non_core(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`unfold` is outside core ATen, which ExecuTorch's to_edge refuses: so does `texir lower`, in one
    line naming the op, the node and the flag; `--allow-non-core` writes a .pte that runs."""
    (tmp_path / "m.py").write_text(UNFOLD, encoding="utf-8")
    out = tmp_path / "m.pte"
    assert main(["lower", f"{tmp_path / 'm.py'}:build", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "aten::unfold.default is not a core ATen operator" in err and "--allow-non-core" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["lower", f"{tmp_path / 'm.py'}:build", "--allow-non-core", "-o", str(out)]) == 0
    import torch

    from texir.executorch import run_pte

    x = torch.randn(5)
    (got,) = run_pte(out.read_bytes(), (x,))
    torch.testing.assert_close(got, x.unfold(0, 2, 1) * 2)
