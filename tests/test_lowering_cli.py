"""`texir lower`: the table, --explain, --json, --snapshot, -o .pte, custom partitioners, user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tests.lowering_helpers  # noqa: F401  (registers the test backend)
from texir.cli.main import main
from texir.ir import CallFunction, verify
from texir.serialize import snapshot

MODEL = "tests.lowering_cli_models:build"
OPS = "aten::add.Tensor,aten::mul.Tensor,aten::addmm.default"


def test_table_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", MODEL, "--backend", "texir-test", "--ops", OPS, "--tag-constants", "--explain"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:7] == ["module", "backend", "tag", "nodes", "inputs", "outputs", "consumed"]
    # The buffer update and the final add form tag0, which owns the buffer update's 1.0 (a lifted
    # constant after the to_edge rewrites, as in texir.lower); add, addmm and mul form tag1, which
    # owns fc.bias. Rows come in call order, modules numbered as texir.lower numbers them.
    assert lines[1].split()[:9] == ["lowered_module_0", "texir-test", "tag1", "3", "3", "1", "1", "54", "0"]
    assert lines[2].split()[:9] == ["lowered_module_1", "texir-test", "tag0", "2", "2", "2", "1", "34", "0"]
    assert "not delegated: 2 nodes" in out
    assert [line.split()[:3] for line in lines[6:8]] == [
        ["aten::permute_copy.default", "1", "no_partitioner"], ["aten::sin.default", "1", "no_partitioner"]]
    assert ("aten_sin_default (aten::sin.default): not delegated: op 'aten::sin.default' is not among the "
            "supported ops") in out
    assert "aten_mul_tensor (aten::mul.Tensor): delegated: delegated to texir-test as tag1 (lowered_module_0)" in out


def test_json_snapshot_and_pte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = tmp_path / "lowered.msgpack"
    pte_path = tmp_path / "model.pte"
    code = main([
        "lower", MODEL, "--backend", "texir-test", "--whole", "--tag-constants", "--tag-mutated-buffers",
        "--snapshot", str(snap), "-o", str(pte_path), "--json", "--explain",
    ])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    (row,) = payload["delegates"]
    assert row["tag"] == "tag0" and row["backend"] == "texir-test" and row["module"] == "lowered_module_0"
    assert sorted(row["consumed"]) == ["_lifted_tensor_constant1", "count", "fc.bias", "fc.weight"]
    assert row["blob_bytes"] > 0 and row["cache_hit"] is False and payload["undelegated"] == []
    assert all(e["status"] == "delegated" for e in payload["explain"])
    assert [(w["path"], w["kind"]) for w in payload["written"]] == [
        (str(snap), "snapshot with tensor data"), (str(pte_path), ".pte")]
    program = snapshot.load(snap)
    assert not isinstance(program, type(None))
    verify(program)  # type: ignore[arg-type]  # a Program snapshot
    data = pte_path.read_bytes()
    assert data[4:8] == b"ET12"


def test_custom_partitioner_class(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", MODEL, "--backend", "texir-test", "--partitioner", "tests.lowering_cli_models:MulOnly", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["delegates"]
    assert row["tag"] == "muls" and len(row["nodes"]) == 1


def test_no_backend_writes_undelegated_pte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plain.pte"
    assert main(["lower", MODEL, "-o", str(out)]) == 0
    assert "no delegates" in capsys.readouterr().out
    assert out.read_bytes()[4:8] == b"ET12"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--whole"], "need --backend ID"),
        (["--backend", "texir-test"], "needs one of --whole"),
        (["--backend", "texir-test", "--ops", "add"], "is not canonical"),
        (["--backend", "nope", "--whole"], "--backend 'nope' is not a registered backend"),
        (["--backend", "texir-test", "--partitioner", "tests.lowering_cli_models:Missing"], "has no attribute 'Missing'"),
    ],
)
def test_user_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lower", MODEL, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_help_has_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["lower", "--help"])
    assert "texir lower texir.models:conv_relu_tan" in capsys.readouterr().out


def test_partitioner_function_from_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "my_parts.py"
    source.write_text(
        "from texir.lowering import DelegationSpec, PartitionPlan\n"
        "def sin_only(program):\n"
        "    tags = {n.name: 's' for n in program.graph.nodes if getattr(n, 'target', '') == 'aten::sin.default'}\n"
        "    return PartitionPlan.build(tags, {'s': DelegationSpec(backend_id='texir-test')})\n",
        encoding="utf-8",
    )
    assert main(["lower", MODEL, "--backend", "texir-test", "--partitioner", f"{source}:sin_only", "--json", "--explain"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [row["tag"] for row in payload["delegates"]] == ["s"]
    kept = [e for e in payload["explain"] if e["status"] == "not delegated"]
    assert kept and all(e["reason"].startswith("not tagged by the partitioner") for e in kept)
    assert [u["node"] for u in payload["undelegated"]] == [e["node"] for e in kept]


@pytest.mark.parametrize("how", [["--ops", OPS], ["--whole"]])
def test_cli_lowers_through_lower(how: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`texir lower --ops/--whole` goes the way `texir.lower` does (the to_edge rewrites, then the
    partitioner): the same lowered program, the same report's delegates."""
    from texir.cli.model_spec import load_model
    from texir.lowering import OpSupportPartitioner, WholeProgramPartitioner
    from texir.orchestrate import lower

    snap = tmp_path / "lowered.msgpack"
    assert main(["lower", MODEL, "--backend", "texir-test", *how, "--snapshot", str(snap), "--json", "--no-cache"]) == 0
    rows = json.loads(capsys.readouterr().out)["delegates"]
    partitioner = (OpSupportPartitioner("texir-test", tuple(OPS.split(","))) if how[0] == "--ops"
                   else WholeProgramPartitioner("texir-test"))
    done = lower(load_model(MODEL), [partitioner], cache=None)
    assert done.program.dialect == "EDGE_PARTITIONABLE"  # the to_edge rewrites ran
    mine = tmp_path / "lower.msgpack"
    snapshot.dump(done.program, mine, format=snapshot.format_for_path(mine), include_data=True)
    assert snap.read_bytes() == mine.read_bytes()
    assert [(r["module"], r["nodes"], r["targets"]) for r in rows] == [
        (d.module, list(d.nodes), list(d.targets)) for d in done.report.delegates]
    assert all(t.startswith("aten::") for r in rows for t in r["targets"])
