"""`texir demo`: the built-in pipeline writes a .pte ExecuTorch reads and a snapshot texir reloads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from texir.cli import cmd_demo
from texir.errors import TexirError
from texir.ir import LoweredBackendModule, Program, verify
from texir.lowering import get_lowered_submodules
from texir.serialize import snapshot
from texir.serialize.pte import load as load_pte

DEMO_BYTES = (
    b"5#conv_relu_op,0,conv_relu_op,1,sin_decomp_from_tan,2,cos_decomp_from_tan,3,div_decomp_from_tan,4,"
)


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="texir")
    cmd_demo.register(parser.add_subparsers())
    args = parser.parse_args(["demo", *argv])
    result: int = args.func(args)
    return result


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("demo") / "nested" / "out"
    capture = pytest.MonkeyPatch()
    lines: list[str] = []
    capture.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    try:
        assert _run(["--out-dir", str(out), "--partitioner", "ops", "--json"]) == 0
    finally:
        capture.undo()
    return out, json.loads("\n".join(lines))


def test_default_demo_lowers_to_xnnpack_and_runs_in_executorch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default path: texir's native XNNPACK, the .pte run in ExecuTorch's runtime."""
    assert _run(["--out-dir", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["partitioner"] == "xnnpack" and summary["checked_in"] == "ExecuTorch runtime"
    (part,) = summary["partitions"]
    assert part["backend"] == "XnnpackBackend"
    assert [n.rsplit("_default", 1)[0] for n in part["nodes"]] == ["aten_convolution", "aten_relu"] * 2
    assert len(part["named_data"]) == 4  # two conv weights, two biases
    assert summary["remaining_ops"] == ["aten::tan.default"]
    assert summary["max_abs_diff_vs_eager"] < 1e-4
    pte = (tmp_path / "demo.pte").read_bytes()
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    assert [d.id for d in program.execution_plan[0].delegates] == ["XnnpackBackend"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.pte", "demo.snapshot.json"]
    # ExecuTorch's own partitioner and backend write the very same file
    theirs = tmp_path / "executorch"
    assert _run(["--out-dir", str(theirs), "--partitioner", "executorch:xnnpack", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partitioner"] == "executorch:xnnpack"
    assert (theirs / "demo.pte").read_bytes() == pte


def test_json_summary(demo_run: tuple[Path, dict[str, Any]]) -> None:
    out, summary = demo_run
    assert summary["partitioner"] == "ops"
    assert summary["delegated_nodes"] == ["convolution", "relu", "convolution_1", "relu_1", "tan"]
    assert summary["remaining_ops"] == []
    assert summary["max_abs_diff_vs_eager"] == 0.0
    (part,) = summary["partitions"]
    assert part["backend"] == "BackendWithDelegateMappingDemo"
    assert part["processed_bytes"].encode() == DEMO_BYTES
    assert [(e["identifier"], e["debug_handles"]) for e in part["debug_handle_map"]] == [
        (0, [1, 2]), (1, [3, 4]), (2, [5]), (3, [5]), (4, [5]),
    ]
    for kind, name in (("pte", "demo.pte"), ("snapshot", "demo.snapshot.json")):
        info = summary["files"][kind]
        assert Path(info["path"]) == out / name
        assert info["bytes"] == (out / name).stat().st_size > 0
    # Nothing but the two outputs (no temp files left behind).
    assert sorted(p.name for p in out.iterdir()) == ["demo.pte", "demo.snapshot.json"]


def test_snapshot_reloads_as_the_lowered_program(demo_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = demo_run
    program = snapshot.loads((out / "demo.snapshot.json").read_bytes())
    assert isinstance(program, Program)
    verify(program)
    ((_, module, _),) = get_lowered_submodules(program)
    assert isinstance(module, LoweredBackendModule)
    assert module.processed_bytes == DEMO_BYTES


def test_pte_holds_the_delegate(demo_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = demo_run
    pte = load_pte(out / "demo.pte")
    (plan,) = pte.program.execution_plan
    (delegate,) = plan.delegates
    assert delegate.id == "BackendWithDelegateMappingDemo"
    blob = pte.program.backend_delegate_data[delegate.processed.index].data
    assert blob.tobytes() == DEMO_BYTES


def test_executorch_reads_the_pte(demo_run: tuple[Path, dict[str, Any]]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary

    out, _ = demo_run
    program = deserialize_pte_binary((out / "demo.pte").read_bytes()).program
    (plan,) = program.execution_plan
    assert [d.id for d in plan.delegates] == ["BackendWithDelegateMappingDemo"]
    assert bytes(program.backend_delegate_data[plan.delegates[0].processed.index].data) == DEMO_BYTES


def test_text_summary_whole_partitioner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["--out-dir", str(tmp_path), "--partitioner", "whole"]) == 0
    text = capsys.readouterr().out
    assert "1 partition(s), 5/5 call nodes delegated (partitioner: whole)" in text
    assert "debug identifier 1 -> debug handles [3, 4]" in text
    assert f"processed bytes: {DEMO_BYTES.decode()}" in text
    assert f"wrote {tmp_path / 'demo.pte'}" in text
    assert (tmp_path / "demo.snapshot.json").is_file()


def test_out_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(TexirError, match="not a directory"):
        _run(["--out-dir", str(not_a_dir)])
    assert not_a_dir.read_text() == "x"
