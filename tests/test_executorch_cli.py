"""`texir lower MODEL --partitioner xnnpack|executorch:xnnpack|MODULE:NAME -o model.pte` (texir's
native XNNPACK, ExecuTorch's partitioners),
and `texir inspect` on the result: the file runs in ExecuTorch's runtime like the eager model."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import torch

from tests.xnnpack_oracle import run_pte
from texir.cli.main import main
from texir.models import conv_relu_tan
from texir.executorch.runtime import load_method
from texir.lowering import PHASES

MODEL = "texir.models:conv_relu_tan"
XNNPACK_CLASS = "executorch.backends.xnnpack.partition.xnnpack_partitioner:XnnpackPartitioner"


def _eager() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    module, args = conv_relu_tan()
    with torch.no_grad():
        return module(*args), args


@pytest.mark.parametrize("partitioner", ["executorch:xnnpack", XNNPACK_CLASS])  # bare `xnnpack` is native
def test_lower_with_an_executorch_partitioner_writes_a_pte_that_runs(
    partitioner: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model.pte"
    assert main(["lower", MODEL, "--partitioner", partitioner, "--no-cache", "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["delegates"]
    assert [r["backend"] for r in rows] == ["XnnpackBackend"]
    assert rows[0]["named_data"] >= 2 and rows[0]["blob_bytes"] > 0  # weights live in named data
    assert rows[0]["cache_hit"] is False and rows[0]["partitioner"].endswith("(XnnpackPartitioner)")
    # XNNPACK takes the convolution and the relu; tan stays with the runtime's kernels
    assert [(u["node"], u["target"], u["reason"]) for u in report["undelegated"]] == [
        ("aten_tan_default", "aten::tan.default", "no_partitioner")]
    assert [p["name"] for p in report["phases"]] == list(PHASES)  # lower's seconds per phase
    expected, args = _eager()
    (got,) = run_pte(out.read_bytes(), args)[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "XnnpackBackend" in text and "named data:" in text and "named_data" in text


def test_table_and_parallel_jobs_give_the_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    serial, parallel = tmp_path / "serial.pte", tmp_path / "parallel.pte"
    assert main(["lower", MODEL, "--partitioner", "xnnpack", "--no-cache", "-o", str(serial)]) == 0
    captured = capsys.readouterr()
    table = captured.out
    assert "XnnpackBackend" in table and "named data" in table and "not delegated: 1 node " in table and "aten::tan.default" in table
    assert "\nseconds: import " in table and ", total " in table  # one line of lower's phases
    assert any(line.split()[:3] == ["aten::tan.default", "1", "no_partitioner"] for line in table.splitlines())
    assert "wrote" not in table and captured.err.count("wrote") == 1 and f"wrote {serial} (" in captured.err
    assert main(["lower", MODEL, "--partitioner", "xnnpack", "--no-cache", "--jobs", "2", "-o", str(parallel)]) == 0
    assert serial.read_bytes() == parallel.read_bytes()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--partitioner", "nosuch"], "--partitioner 'nosuch' is not a known partitioner; texir's own: xnnpack; ExecuTorch's (NAME or executorch:NAME): coreml, ethos-u, example, openvino, tosa, vulkan, webgpu, xnnpack"),
        (["--partitioner", "executorch:nosuch"], "--partitioner 'nosuch' is not a known ExecuTorch partitioner; known: coreml, ethos-u"),
        (["--partitioner", "xnnpack", "--backend", "x"], "drop --backend"),
        (["--partitioner", "xnnpack", "--jobs", "0"], "--jobs: Input should be greater than or equal to 1"),
        (["--partitioner", "xnnpack", "--tag-constants"], "are for texir partitioners"),
        (["--partitioner", "texir.lowering:OpSupportPartitioner"], "is not an ExecuTorch partitioner"),
        (["--partitioner", "texir.nosuchmodule:Thing"], "cannot import 'texir.nosuchmodule'"),
    ],
)
def test_user_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", MODEL, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_external_data_writes_a_ptd_the_runtime_loads_and_inspect_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from executorch.runtime import Runtime

    out = tmp_path / "model.pte"
    assert main(["lower", MODEL, "--partitioner", "xnnpack", "--no-cache", "--external-data", "-o", str(out)]) == 0
    capsys.readouterr()
    ptd = tmp_path / "model.ptd"  # named after its program
    assert ptd.is_file() and not (tmp_path / "_default_external_constant.ptd").exists()
    inline = tmp_path / "inline.pte"
    assert main(["lower", MODEL, "--partitioner", "xnnpack", "--no-cache", "-o", str(inline)]) == 0
    capsys.readouterr()
    assert out.stat().st_size < inline.stat().st_size  # the weights moved out of the .pte
    expected, args = _eager()
    method = load_method(out, data_path=str(ptd))
    (got,) = method.execute(list(args))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

    assert main(["inspect", str(ptd)]) == 0
    assert "entries" in capsys.readouterr().out
    assert main(["inspect", str(out), "--data", str(ptd)]) == 0
    assert "0 EXTERNAL tensors found" in capsys.readouterr().out  # XNNPACK's weights are its named data
    # a truncated .ptd and one missing an entry: each one line, the second naming the key
    from texir.serialize.pte import dumps_ptd, loads_ptd

    bad = tmp_path / "bad" / "_default_external_constant.ptd"
    bad.parent.mkdir()
    bad.write_bytes(ptd.read_bytes()[:-16])
    assert main(["inspect", str(out), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    # without a partitioner the weights are EXTERNAL tensors of the program: inspect checks each by key
    plain = tmp_path / "plain" / "model.pte"
    plain.parent.mkdir()
    assert main(["lower", MODEL, "--external-data", "-o", str(plain)]) == 0
    capsys.readouterr()
    plain_ptd = plain.with_name("model.ptd")
    (got,) = load_method(plain, data_path=str(plain_ptd)).execute(list(args))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    full = loads_ptd(plain_ptd.read_bytes())
    assert len(full.entries) >= 2
    assert main(["inspect", str(plain), "--data", str(plain_ptd)]) == 0
    assert f"{len(full.entries)} EXTERNAL tensors found" in capsys.readouterr().out
    dropped = full.entries[0].key
    bad.write_bytes(dumps_ptd(msgspec.structs.replace(full, entries=full.entries[1:])))
    assert main(["inspect", str(plain), "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert repr(dropped) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_etrecord_flag_writes_a_record_inspector_reads_with_the_ptes_etdump(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    out, record = tmp_path / "model.pte", tmp_path / "model.etrecord"
    # ExecuTorch's backend: its debug handle map names the ops inside the delegate
    assert main(["lower", MODEL, "--partitioner", "executorch:xnnpack", "--no-cache", "-o", str(out),
                 "--etrecord", str(record)]) == 0
    assert f"wrote {record}" in capsys.readouterr().err
    _, args = _eager()
    program = Runtime.get().load_program(out, enable_etdump=True, debug_buffer_size=1 << 24)
    program.load_method("forward").execute(list(args))
    program.write_etdump_result_to_file(str(tmp_path / "run.etdp"), str(tmp_path / "run.debug"))
    inspector = Inspector(etdump_path=str(tmp_path / "run.etdp"), etrecord=str(record))
    events = [(e.name, e.debug_handles, e.op_types) for b in inspector.event_blocks for e in b.events]
    delegate = [e for e in events if e[0] == "DELEGATE_CALL"]
    assert delegate and all(handles and ops for _, handles, ops in delegate)  # the ops inside, named
    assert [ops for name, _, ops in events if name == "OPERATOR_CALL"] == [["aten.tan.default"]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--partitioner", "xnnpack", "--etrecord", "x.etrecord"], "--etrecord needs -o FILE.pte"),
        (["--partitioner", "xnnpack", "--external-data"], "--external-data needs -o FILE.pte"),
        (["--external-data"], "--external-data needs -o FILE.pte"),
        (["--partitioner", "xnnpack", "--external-data", "-o", "x.ptd"], "x.ptd"),
        (["--etrecord", "x.etrecord", "-o", "x.pte"], "--etrecord works with an ExecuTorch --partitioner"),
        (["--partitioner", "xnnpack", "--etrecord", "x.pte", "-o", "x.pte"], "x.pte"),
    ],
)
def test_etrecord_misuse_is_one_line(argv: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["lower", MODEL, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written


POOL = """\
import torch


class Pool(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.avg_pool2d(x, 2, ceil_mode=True).relu()


def build():
    return Pool().eval(), (torch.randn(1, 2, 5, 5),)
"""


def test_explain_gives_the_executorch_partitioners_own_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pool.py").write_text(POOL, encoding="utf-8")
    assert main(["lower", f"{tmp_path / 'pool.py'}:build", "--partitioner", "executorch:xnnpack", "--no-cache",
                 "--explain", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [(d["backend"], len(d["nodes"])) for d in report["delegates"]] == [("XnnpackBackend", 1)]
    (pool,) = report["undelegated"]
    assert pool["target"] == "aten::avg_pool2d.default" and pool["reason"] == "turned_down"
    assert pool["detail"] == "XnnpackPartitioner: ceil mode is not supported"  # its WhyNoPartition log
    assert {e["status"] for e in report["explain"]} == {"delegated", "not delegated"}
    assert "WhyNoPartition" not in captured.err  # collected, not printed
