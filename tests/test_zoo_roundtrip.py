"""Every zoo model through FX -> IR -> FX: same outputs, same ops and names, `verify` passes,
snapshots round-trip in JSON and msgpack, and the printed IR matches its golden.

Goldens live in tests/golden/ir/<model>.txt (the core-ATen program, `format_program`). After an
intended change to the adapter, printer or zoo, rewrite them with

    .venv/bin/pytest tests/test_zoo_roundtrip.py -q --snapshot-update

and review the diff before committing.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal

import pytest

from texir.ir.canonical import drop_stack_traces
import torch

from tests.zoo import ZOO, cached_export, compare_runs, example_argsets, fresh_module, run_model, zoo_model
from texir.adapters import from_exported_program, to_exported_program
from texir.ir import (
    BufferInput,
    BufferMutation,
    CallFunction,
    ConstantTensorInput,
    Graph,
    IntArg,
    ListArg,
    NoneArg,
    ParameterInput,
    Placeholder,
    Program,
    TensorMeta,
    TupleMeta,
    UserInput,
    canonicalize,
    format_program,
    verify,
)
from texir.ir.types import Argument, FloatArg, TupleArg
from texir.serialize.snapshot import dumps, loads
from texir.testing.golden import Golden

NAMES = [m.name for m in ZOO]


@pytest.fixture(scope="module")
def programs() -> dict[tuple[str, bool], Program]:
    """IR of each (model, decompose), converted once per module."""
    return {}


def _program(programs: dict[tuple[str, bool], Program], name: str, decompose: bool) -> Program:
    key = (name, decompose)
    if key not in programs:
        programs[key] = from_exported_program(cached_export(name, decompose))
    return programs[key]


# ------------------------------------------------------------------------------------------------
# Helpers


def _fx_nodes(gm: torch.fx.GraphModule, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(name, op, target) of every node, recursing into get_attr'd subgraphs (cond branches). A
    placeholder's target is only forward()'s parameter name: for an input named like a builtin
    (builtin_named's `input`) texir keeps FX's unshadowing `input_1` where export writes `input`."""
    for node in gm.graph.nodes:
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if node.op == "call_function":
            target = str(node.target)
        if node.op == "placeholder":
            target = ""
        yield prefix + node.name, node.op, target
        if node.op == "get_attr":
            sub = getattr(gm, node.target)
            if isinstance(sub, torch.fx.GraphModule):
                yield from _fx_nodes(sub, prefix=f"{prefix}{node.target}/")


def _signature(ep: torch.export.ExportedProgram) -> list[tuple[str, str, Any, Any]]:
    sig = ep.graph_signature
    rows = [("in", s.kind.name, s.arg.name if hasattr(s.arg, "name") else s.arg, s.target) for s in sig.input_specs]
    rows += [("out", s.kind.name, getattr(s.arg, "name", s.arg), s.target) for s in sig.output_specs]
    if any(s.kind.name == "BUFFER" for s in sig.input_specs):
        rows += [("persistent", s.arg.name, s.persistent, None) for s in sig.input_specs if s.kind.name == "BUFFER"]
    return rows


def _walk(graph: Graph) -> Iterator[Graph]:
    yield graph
    for sub in graph.subgraphs:
        yield from _walk(sub.graph)


def _all_args(program: Program) -> Iterator[Argument]:
    def flat(arg: Argument) -> Iterator[Argument]:
        yield arg
        if isinstance(arg, (ListArg, TupleArg)):
            for item in arg.items:
                yield from flat(item)

    for graph in _walk(program.graph):
        for node in graph.nodes:
            if isinstance(node, CallFunction):
                for arg in (*node.args, *(v for _, v in node.kwargs)):
                    yield from flat(arg)


# ------------------------------------------------------------------------------------------------
# FX -> IR -> FX


@pytest.mark.parametrize("decompose", [True, False], ids=["core_aten", "aten"])
@pytest.mark.parametrize("name", NAMES)
def test_roundtrip_runs_the_same(programs: dict[tuple[str, bool], Program], name: str, decompose: bool) -> None:
    m = zoo_model(name)
    ep = cached_export(name, decompose)
    program = _program(programs, name, decompose)
    verify(program)
    before = dumps(program, format="msgpack", include_data=True)

    back = to_exported_program(program)
    # Same graph: node names, kinds and targets, nested branches included; same signature.
    assert list(_fx_nodes(back.graph_module)) == list(_fx_nodes(ep.graph_module))
    assert _signature(back) == _signature(ep)
    assert sorted(back.state_dict) == sorted(ep.state_dict)
    assert sorted(back.constants) == sorted(ep.constants)
    for key, value in [*ep.state_dict.items(), *ep.constants.items()]:
        other = back.state_dict.get(key, back.constants.get(key))
        assert isinstance(other, torch.Tensor) and torch.equal(other, value), key
        assert isinstance(other, torch.nn.Parameter) == isinstance(value, torch.nn.Parameter), key
    assert {str(k): (v.lower, v.upper) for k, v in back.range_constraints.items()} == {
        str(k): (v.lower, v.upper) for k, v in ep.range_constraints.items()
    }

    # Same results as the exported program, bit for bit (same ops); undecomposed, also as eager.
    rt = run_model(m, lambda: fresh_module(back))
    compare_runs(rt, run_model(m, lambda: fresh_module(ep)), exact=True, what="round trip")
    if not decompose:
        compare_runs(rt, run_model(m, lambda: m.build()[0]), exact=True, what="round trip vs eager")

    # Running the converted program never writes into the IR's (immutable) payloads.
    back.module()(*example_argsets(m)[0])
    assert dumps(program, format="msgpack", include_data=True) == before


@pytest.mark.parametrize("name", NAMES)
def test_ir_fx_ir_is_a_fixpoint(programs: dict[tuple[str, bool], Program], name: str) -> None:
    program = _program(programs, name, True)
    again = from_exported_program(to_exported_program(program))
    verify(again)
    assert canonicalize(again) == canonicalize(program)
    assert format_program(again) == format_program(program)


# ------------------------------------------------------------------------------------------------
# Snapshots and goldens


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
@pytest.mark.parametrize("name", NAMES)
def test_snapshot_roundtrip(
    programs: dict[tuple[str, bool], Program], name: str, fmt: Literal["json", "msgpack"]
) -> None:
    program = _program(programs, name, True)
    data = dumps(program, format=fmt, include_data=True, include_stack_traces=True)
    restored = loads(data)
    assert restored == program
    assert hash(restored) == hash(program)
    assert dumps(restored, format=fmt, include_data=True, include_stack_traces=True) == data
    # By default: metadata and hashes survive, payloads and stack traces (machine paths) do not.
    meta_only = loads(dumps(program, format=fmt))
    assert meta_only.graph == drop_stack_traces(program).graph and meta_only.signature == program.signature
    assert [(e.target, e.value.sha256, e.value.meta) for e in meta_only.state] == [
        (e.target, e.value.sha256, e.value.meta) for e in program.state
    ]
    assert all(e.value.data is None for e in meta_only.state)


@pytest.mark.parametrize("name", NAMES)
def test_golden_text(programs: dict[tuple[str, bool], Program], name: str, golden: Golden) -> None:
    text = format_program(_program(programs, name, True))
    assert "File \"" not in text and "/work/" not in text and "0x" not in text  # nothing machine-specific
    golden(f"ir/{name}.txt", text)


# ------------------------------------------------------------------------------------------------
# What each tagged model must show in the IR (so the zoo keeps covering what it claims)


def _features(program: Program) -> set[str]:
    found: set[str] = set()
    graphs = list(_walk(program.graph))
    for spec in program.signature.inputs:
        if isinstance(spec, ParameterInput):
            found.add("params")
        elif isinstance(spec, BufferInput):
            found.add("buffers")
            if not spec.persistent:
                found.add("non_persistent")
        elif isinstance(spec, ConstantTensorInput):
            found.add("constants")
    if any(isinstance(s, BufferMutation) for s in program.signature.outputs):
        found.add("mutation")
    for graph in graphs:
        for node in graph.nodes:
            meta = graph.meta(node)
            if isinstance(node, CallFunction):
                if node.target == "higher_order::cond":
                    found.add("cond")
                    if isinstance(meta, TupleMeta) and len(meta.items) > 1:
                        found.add("cond_multi_output")
                    if graph is not program.graph:
                        found.add("nested_cond")
                if isinstance(meta, TupleMeta) and node.target.startswith("aten::"):
                    found.add("multi_output_op")
            if isinstance(node, Placeholder) and isinstance(meta, TensorMeta):
                if any(isinstance(d, str) for d in meta.shape):
                    found.add("dynamic")
    for arg in _all_args(program):
        if isinstance(arg, NoneArg):
            found.add("none_arg")
        elif isinstance(arg, FloatArg):
            found.add("scalars")
        elif isinstance(arg, ListArg) and arg.items and all(isinstance(a, IntArg) for a in arg.items):
            found.add("int_lists")
    if program.range_constraints:
        found.add("range_constraints")
    users = sum(isinstance(s, UserInput) for s in program.signature.inputs)
    if users > 0 and len(program.signature.outputs) > 1:
        found.add("multi_output")
    return found


_REQUIRED: dict[str, set[str]] = {
    "cond": {"cond"},
    "cond_multi_output": {"cond_multi_output"},
    "dynamic": {"dynamic", "range_constraints"},
    "mutation": {"mutation", "buffers"},
    "buffers": {"buffers"},
    "params": {"params"},
    "constants": {"constants"},
    "multi_output_op": {"multi_output_op"},
    "multi_output": {"multi_output"},
    "none_arg": {"none_arg"},
    "scalars": {"scalars"},
    "int_lists": {"int_lists"},
}


@pytest.mark.parametrize("name", NAMES)
def test_model_shows_its_tags(programs: dict[tuple[str, bool], Program], name: str) -> None:
    program = _program(programs, name, True)
    found = _features(program)
    for tag in zoo_model(name).tags:
        missing = _REQUIRED.get(tag, set()) - found
        assert not missing, f"{name} is tagged {tag!r} but its IR shows no {sorted(missing)}"


def test_zoo_shows_special_cases(programs: dict[tuple[str, bool], Program]) -> None:
    assert "non_persistent" in _features(_program(programs, "buffers", True))
    assert "nested_cond" in _features(_program(programs, "cond_closure_nested", True))
    nested = _program(programs, "nested_io", True)
    assert sum(isinstance(s, UserInput) for s in nested.signature.inputs) == 6
