"""Structural diffs (texir.viz.diff) and the `texir diff` command."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

import texir.cli.main as cli_main
from texir.ir import Subgraph, build_graph, verify
from texir.viz.diff import canonical_text, diff_programs, diff_texts, format_diff, original_names
from texir.ir.types import Program, CompileSpec, GetAttr, LoweredBackendModule, NamedLoweredModule, SubgraphMeta
from texir.serialize.snapshot import dumps
from texir.testing.programs import chain_program, delegated_program

RELU_SIN = ("aten::relu.default", "aten::sin.default", "aten::cos.default")


def test_equal_up_to_names() -> None:
    a = chain_program(RELU_SIN)
    b = chain_program(RELU_SIN, names=["r", "s", "c"])
    assert a != b
    result = diff_programs(a, b)
    assert result.equal and result.changes == ()
    assert format_diff(result) == "a and b are structurally equal\n"


def test_changed_node_named_by_position_and_original_name() -> None:
    a = chain_program(RELU_SIN)
    b = chain_program(("aten::relu.default", "aten::sigmoid.default", "aten::cos.default"),
                      names=["r", "sig", "c"])
    result = diff_programs(a, b)
    assert len(result.changes) == 1
    change = result.changes[0]
    assert change.is_node and change.kind == "changed" and change.scope == "graph"
    assert change.key == "%4" and change.fields == ("op",)
    assert (change.a_name, change.b_name) == ("sin_1", "sig")
    text = format_diff(result)
    assert "~ node %4 (sin_1 -> sig) [op]" in text
    assert "aten::sigmoid.default(%3)" in text
    assert text.splitlines()[2].startswith("1 difference: 1 node changed")


def test_inserted_node_does_not_shift_everything() -> None:
    a = chain_program(RELU_SIN)
    b = chain_program(("aten::relu.default", "aten::neg.default", *RELU_SIN[1:]))
    result = diff_programs(a, b)
    added = [c for c in result.changes if c.kind == "added"]
    changed = [c for c in result.changes if c.kind == "changed"]
    assert [(c.key, c.b_name) for c in added] == [("%4", "neg_1")]
    # sin now reads neg (args); the later nodes moved but are otherwise the same.
    sin = next(c for c in changed if c.a_name == "sin_1")
    assert "args" in sin.fields and sin.b_key == "%5"
    assert all(c.is_node for c in result.changes)
    assert not any("meta" in c.fields or "op" in c.fields for c in changed)


def test_signature_and_state_changes() -> None:
    a = chain_program(RELU_SIN)
    b = chain_program(RELU_SIN, with_buffer=True)
    result = diff_programs(a, b)
    by_scope = {(c.scope, c.kind, c.b) for c in result.changes if not c.is_node}
    assert ("signature > inputs", "added", "%1: buffer count") in by_scope
    assert any(s == "signature > outputs" and k == "added" and "buffer_mutation count" in (b or "")
               for s, k, b in by_scope)
    assert any(s == "state" and k == "added" and (b or "").startswith("count : f32[2, 3]")
               for s, k, b in by_scope)
    # The new placeholder is matched as the buffer it is, the user input x is not "changed".
    added_nodes = [c.b_name for c in result.changes if c.is_node and c.kind == "added"]
    assert added_nodes == ["b_count", "add_1"]


def test_partition_changes() -> None:
    a = delegated_program()
    b = delegated_program(processed=b"2#relu,0,tanh,1")
    result = diff_programs(a, b)
    (change,) = result.changes
    assert change.scope == "lowered_module lowered_module_0" and change.key == "backend"
    assert "processed=9B" in (change.a or "") and "processed=16B" in (change.b or "")

    lowered = a.lowered_modules[0]
    specs = (CompileSpec(key="level", value=b"\x02"), CompileSpec(key="fast", value=b""))
    c = msgspec.structs.replace(a, lowered_modules=(NamedLoweredModule(
        name=lowered.name, module=msgspec.structs.replace(lowered.module, compile_specs=specs)),))
    kinds = {(x.kind, x.key) for x in diff_programs(a, c).changes}
    assert kinds == {("changed", "compile_spec level"), ("added", "compile_spec fast")}

    more = diff_programs(a, delegated_program(partitions=2))
    assert any(x.kind == "added" and (x.b or "").startswith("lowered_module lowered_module_1: backend=DemoBackend")
               for x in more.changes)
    assert [x.b_name for x in more.changes if x.is_node and x.kind == "added"] == [
        "lowered_module_1", "executorch_call_delegate_1", "getitem_1"]


def test_state_hash_and_module_call_graph() -> None:
    a = chain_program(RELU_SIN)
    entry = a.state[0]
    value = msgspec.structs.replace(entry.value, sha256="f" * 64)
    b = msgspec.structs.replace(a, state=(msgspec.structs.replace(entry, value=value),))
    (change,) = diff_programs(a, b).changes
    assert change.scope == "state" and change.key == "w" and "sha256=ffffffffffffffff" in (change.b or "")


def _with_subgraph(op: str) -> Program:
    inner = chain_program((op,), with_param=False)
    base = chain_program(("aten::relu.default",), with_param=False)
    entries = base.graph.entries()
    entries.insert(1, (GetAttr(name="true_graph_0", target="true_graph_0"), SubgraphMeta(graph="true_graph_0"), None))
    graph = build_graph(entries, (Subgraph(name="true_graph_0", graph=inner.graph),))
    return msgspec.structs.replace(base, graph=graph)


def test_nested_graph_changes_are_scoped() -> None:
    a, b = _with_subgraph("aten::sin.default"), _with_subgraph("aten::cos.default")
    verify(a)
    (change,) = diff_programs(a, b).changes
    assert change.scope == "graph > subgraph true_graph_0"
    assert change.fields == ("op",) and change.a_name == "sin_0"


def test_text_diff_matches_program_diff() -> None:
    a = chain_program(RELU_SIN)
    b = chain_program(("aten::relu.default", "aten::neg.default", *RELU_SIN[1:]), with_buffer=True)
    direct = diff_programs(a, b)
    via_text = diff_texts(canonical_text(a), canonical_text(b), a_names=original_names(a),
                          b_names=original_names(b))
    assert via_text.changes == direct.changes
    # Deterministic: the same inputs give the same report, byte for byte.
    assert format_diff(direct) == format_diff(diff_programs(a, b))


# ------------------------------------------------------------------------------------------------
# CLI


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli_main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _only_diff_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other commands are built by other engineers in parallel; parse only this one here.
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("texir.cli.cmd_diff",))


def test_cli_equal_and_different(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.msgpack", tmp_path / "c.json"
    a.write_bytes(dumps(chain_program(RELU_SIN)))
    b.write_bytes(dumps(chain_program(RELU_SIN, names=["x1", "x2", "x3"]), format="msgpack"))
    c.write_bytes(dumps(chain_program(("aten::relu.default", "aten::tanh.default", "aten::cos.default"))))

    code, out, _ = _cli(["diff", str(a), str(b)], capsys)
    assert code == 0 and "structurally equal" in out

    code, out, _ = _cli(["diff", str(a), str(c)], capsys)
    assert code == 1
    assert "~ node %4 (sin_1 -> tanh_1) [op]" in out

    code, out, _ = _cli(["diff", str(a), str(c), "--json"], capsys)
    assert code == 1
    doc = json.loads(out)
    assert doc["equal"] is False and doc["counts"]["nodes_changed"] == 1
    assert doc["changes"][0]["b_name"] == "tanh_1" and doc["changes"][0]["fields"] == ["op"]

    code, out, _ = _cli(["diff", str(a), str(a), "--json"], capsys)
    assert code == 0 and json.loads(out)["equal"] is True


def test_cli_pte_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.serialize.pte import codec
    from texir.emit import emit

    base = chain_program(RELU_SIN, with_param=False)
    other = chain_program(("aten::relu.default", "aten::tanh.default", "aten::cos.default"),
                          with_param=False)
    pa, pb = tmp_path / "a.pte", tmp_path / "b.pte"
    pa.write_bytes(codec.dumps(emit(base)))
    pb.write_bytes(codec.dumps(emit(other)))
    code, out, _ = _cli(["diff", str(pa), str(pa)], capsys)
    assert code == 0
    code, out, _ = _cli(["diff", str(pa), str(pb)], capsys)
    assert code == 1
    assert "method forward > operators:" in out
    assert "- aten::sin.out" in out and "+ aten::tanh.out" in out
    assert "kernel aten::tanh.out" in out
    # A program against a .pte: the program is emitted first, so its own .pte is equal.
    snap = tmp_path / "base.json"
    snap.write_bytes(dumps(base, include_data=True))
    code, out, _ = _cli(["diff", str(snap), str(pa)], capsys)
    assert code == 0, out


def test_cli_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "a.json"
    good.write_bytes(dumps(chain_program()))
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"not": "a snapshot"')
    code, _, err = _cli(["diff", str(good), str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "cannot read" in err and "Traceback" not in err
    code, _, err = _cli(["diff", str(good), str(bad)], capsys)
    assert code == 2 and err.startswith("texir diff: error:")
    module = tmp_path / "m.json"
    module.write_bytes(_lowered_snapshot())
    code, _, err = _cli(["diff", str(good), str(module)], capsys)
    assert code == 2 and "cannot compare" in err


def _lowered_snapshot() -> bytes:
    from texir.serialize.snapshot import dumps_lowered_module

    module: LoweredBackendModule = delegated_program().lowered_modules[0].module
    return dumps_lowered_module(module)


def test_cli_help_has_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["diff", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "texir diff before.json after.json" in out and "--json" in out


# ------------------------------------------------------------------------------------------------
# Progress reporter


def test_progress_quiet_when_piped_and_drawn_on_a_terminal() -> None:
    import io
    import time

    from texir.cli.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped = io.StringIO()
    with Progress("texir x", stream=piped, delay=0.0) as progress:
        for _ in progress.iterate(range(3), "working"):
            time.sleep(0.15)
    assert piped.getvalue() == ""

    tty = Tty()
    with Progress("texir x", stream=tty, delay=0.0) as progress:
        with progress.phase("loading", total=4):
            progress.advance(2)
            time.sleep(0.35)
            assert progress.render().startswith("texir x: loading 2/4 (50%)")
    drawn = tty.getvalue()
    assert "\rtexir x: loading 2/4 (50%)" in drawn
    assert drawn.endswith("\r")  # the line is cleared when the work ends

    quick = Tty()
    with Progress("texir x", stream=quick, delay=5.0):
        time.sleep(0.15)
    assert quick.getvalue() == ""  # short work draws nothing


def test_ten_thousand_nodes_one_change() -> None:
    from texir.testing.programs import wide_program

    a = wide_program(10_000)
    nodes = list(a.graph.nodes)
    nodes[5000] = msgspec.structs.replace(nodes[5000], target="aten::div.Tensor")
    b = msgspec.structs.replace(a, graph=msgspec.structs.replace(a.graph, nodes=tuple(nodes)))
    (change,) = diff_programs(a, b).changes
    assert change.key == "%5000" and change.fields == ("op",) and change.a_name == nodes[5000].name
    assert diff_programs(a, a).equal


def test_state_compares_by_hash_not_by_attached_payload() -> None:
    from texir.serialize.snapshot import loads

    program = chain_program(RELU_SIN)
    without_data = loads(dumps(program))  # keeps each tensor's hash, drops its bytes
    assert without_data.state[0].value.data is None and program.state[0].value.data is not None
    assert diff_programs(program, without_data).equal
    assert "(no data)" not in canonical_text(without_data)


def test_cli_model_spec_against_its_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from texir.cli.model_spec import load_program

    snap = tmp_path / "demo.json"
    snap.write_bytes(dumps(load_program("texir.models:conv_relu_tan")))  # hashes, no tensor bytes
    code, out, _ = _cli(["diff", "texir.models:conv_relu_tan", str(snap)], capsys)
    assert code == 0, out
    code, _, err = _cli(["diff", "texir.models:no_such_model", str(snap)], capsys)
    assert code == 2 and "no_such_model" in err


def test_stored_texts_are_parsed_and_compared_as_structs() -> None:
    import hashlib

    from texir.viz.diff import canonical_module_text, diff_modules

    a, b = delegated_program(), delegated_program(processed=b"other#relu,0")
    (change,) = diff_texts(canonical_text(a), canonical_text(b)).changes
    # The stored text names the blob by hash only; the report still shows that hash.
    digest = hashlib.sha256(a.lowered_modules[0].module.processed_bytes).hexdigest()
    assert change.key == "backend" and f"processed=9B sha256={digest[:16]}" in (change.a or "")
    assert diff_texts(canonical_text(a), canonical_text(b)).changes == diff_programs(a, b).changes
    ma, mb = a.lowered_modules[0].module, b.lowered_modules[0].module
    via_text = diff_texts(canonical_module_text(ma), canonical_module_text(mb))
    assert via_text.changes == diff_modules(ma, mb).changes
    assert [(c.scope, c.key) for c in via_text.changes] == [("lowered_module", "backend")]


def test_provenance_and_module_calls_are_compared() -> None:
    from texir.ir import ModuleCallEntry, ModuleFrame, Provenance

    a = chain_program(RELU_SIN)
    entries = a.graph.entries()
    node, meta, prov = entries[3]
    frame = ModuleFrame(key="L__self__blk", path="blk", type="Block")
    entries[3] = (node, meta, Provenance(debug_handle=prov.debug_handle if prov else None, nn_module_stack=(frame,)))
    b = msgspec.structs.replace(a, graph=build_graph(entries), module_call_graph=(ModuleCallEntry(fqn="blk"),))
    changes = diff_programs(a, b).changes
    assert [(c.scope, c.kind, c.key, c.fields) for c in changes] == [
        ("graph", "changed", f"%{3}", ("provenance",)),
        ("module_call_graph", "added", "blk", ()),
    ]
