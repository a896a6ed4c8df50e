"""The IR core on hand-built programs: verifier errors, canonical form, printer, Blob, import cost."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from texir.errors import IRError
from texir.ir import (
    Blob,
    BufferInput,
    BufferMutation,
    CallFunction,
    DType,
    FloatArg,
    GetAttr,
    Graph,
    build_graph,
    GraphSignature,
    IntArg,
    ListArg,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    RangeConstraint,
    Ref,
    StateEntry,
    Subgraph,
    SubgraphMeta,
    TensorData,
    TensorMeta,
    UserInput,
    UserOutput,
    canonicalize,
    format_program,
    users,
    verify,
)


def _t(*shape: int) -> TensorMeta:
    strides: list[int] = []
    acc = 1
    for size in reversed(shape):
        strides.insert(0, acc)
        acc *= size
    return TensorMeta(dtype=DType.float32, shape=shape, strides=tuple(strides))


def _data(meta: TensorMeta, payload: bytes) -> TensorData:
    blob = Blob(payload)
    return TensorData(meta=meta, sha256=blob.digest(), nbytes=len(payload), data=blob)


def _program(prefix: str = "") -> Program:
    """w: parameter, b: buffer mutated in place, x: user input; returns (y,)."""
    n = lambda s: prefix + s  # noqa: E731  (a tiny renamer keeps both variants in one builder)
    w, b, x = _t(2, 2), _t(2), _t(2, 2)
    graph = build_graph([
        (Placeholder(name=n("p_w")), w, None),
        (Placeholder(name=n("b_buf")), b, None),
        (Placeholder(name=n("x")), x, None),
        (CallFunction(name=n("mm"), target="aten::mm.default", args=(Ref(name=n("x")), Ref(name=n("p_w")))), x, None),
        (CallFunction(name=n("add"), target="aten::add.Tensor", args=(Ref(name=n("b_buf")), FloatArg(value=1.0))), b, None),
        (
            CallFunction(
                name=n("sum"), target="aten::sum.dim_IntList", args=(Ref(name=n("mm")), ListArg(items=(IntArg(value=0),)))
            ),
            b,
            None,
        ),
        (Output(args=(Ref(name=n("add")), Ref(name=n("sum")))), None, None),
    ])
    sig = GraphSignature(
        inputs=(
            ParameterInput(name=n("p_w"), target="w"),
            BufferInput(name=n("b_buf"), target="buf", persistent=True),
            UserInput(arg=Ref(name=n("x"))),
        ),
        outputs=(BufferMutation(name=n("add"), target="buf"), UserOutput(arg=Ref(name=n("sum")))),
    )
    state = (
        StateEntry(target="buf", value=_data(b, bytes(8))),
        StateEntry(target="w", value=_data(w, bytes(range(16)))),
    )
    return Program(graph=graph, signature=sig, state=state)


def test_valid_program_verifies_and_prints_stably() -> None:
    p = _program()
    verify(p)
    text = format_program(p)
    assert text == format_program(_program())
    assert "%mm : f32[2, 2] = aten::mm.default(%x, %p_w)" in text
    assert "%p_w: parameter w" in text
    assert "%add: buffer_mutation buf" in text
    assert text.endswith("\n")


def test_programs_are_frozen_hashable_and_structurally_equal() -> None:
    a, b = _program(), _program()
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.dialect = "EDGE"  # type: ignore[misc]  # assigning to a frozen struct is the point of the test
    assert {a, b} == {a}


def test_canonicalize_ignores_names_and_is_idempotent() -> None:
    a, b = _program(), _program(prefix="renamed_")
    assert a != b
    ca, cb = canonicalize(a), canonicalize(b)
    assert ca == cb
    assert canonicalize(ca) == ca
    verify(ca)


def test_canonicalize_drops_stack_traces_but_keeps_debug_handles() -> None:
    from texir.ir import Provenance

    p = _program()
    entries = p.graph.entries()
    mm, meta, _ = entries[3]
    entries[3] = (mm, meta, Provenance(debug_handle=7, stack_trace="File x.py, line 3", torch_fn=("mm_1", "fn.mm")))
    q = msgspec.structs.replace(p, graph=build_graph(entries))
    assert q.graph.prov(3) == entries[3][2]
    prov = canonicalize(q).graph.prov(3)
    assert prov is not None
    assert prov.debug_handle == 7 and prov.stack_trace is None and prov.torch_fn == ("mm_1", "fn.mm")


def _with_nodes(p: Program, nodes: tuple[object, ...]) -> Program:
    return msgspec.structs.replace(p, graph=Graph(nodes=nodes, metas=p.graph.metas))  # type: ignore[arg-type]  # tests feed malformed graphs on purpose


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: _with_nodes(p, p.graph.nodes[:-1]), "last node must be the Output"),
        (lambda p: _with_nodes(p, (p.graph.nodes[0], *p.graph.nodes)), "defined twice"),
        (
            lambda p: _with_nodes(p, (*p.graph.nodes[:3], p.graph.nodes[4], p.graph.nodes[3], *p.graph.nodes[5:])),
            None,
        ),
        (
            lambda p: _with_nodes(
                p,
                (*p.graph.nodes[:3], CallFunction(name="bad", target="aten::neg.default", args=(Ref(name="nope"),)), *p.graph.nodes[3:]),
            ),
            "uses 'nope' before it is defined",
        ),
        (
            lambda p: _with_nodes(
                p, (*p.graph.nodes[:3], CallFunction(name="bad", target="neg", args=()), *p.graph.nodes[3:])
            ),
            "canonical 'namespace::op.overload'",
        ),
        (
            lambda p: msgspec.structs.replace(p, signature=GraphSignature(inputs=p.signature.inputs[:2], outputs=p.signature.outputs)),
            "3 placeholders",
        ),
        (lambda p: msgspec.structs.replace(p, state=p.state[:1]), "missing from program.state"),
        (
            lambda p: msgspec.structs.replace(
                p,
                signature=GraphSignature(
                    inputs=p.signature.inputs,
                    outputs=(BufferMutation(name="add", target="other"), p.signature.outputs[1]),
                ),
            ),
            "mutates buffer 'other'",
        ),
        (
            lambda p: _with_nodes(
                p, (*p.graph.nodes[:3], GetAttr(name="g", target="true_graph_0"), *p.graph.nodes[3:])
            ),
            "neither a subgraph nor a lowered module",
        ),
        (
            lambda p: msgspec.structs.replace(p, range_constraints=(RangeConstraint(symbol="s0", min=2, max=8, hint=9),)),
            r"range_constraints\[0\] \('s0'\): hint 9 is outside \[2, 8\]",
        ),
        (
            lambda p: msgspec.structs.replace(p, range_constraints=(RangeConstraint(symbol="s0", min=4, max=3),)),
            r"'s0'\): empty range \[4, 3\]",
        ),
    ],
)
def test_verify_rejects_broken_programs(mutate: object, message: str | None) -> None:
    broken = mutate(_program())  # type: ignore[operator]  # parametrized callables
    if message is None:
        verify(broken)  # independent nodes may be reordered: still valid
        return
    with pytest.raises(IRError, match=message):
        verify(broken)


def test_nested_graphs_are_verified_with_their_path() -> None:
    inner = build_graph([(Placeholder(name="a"), _t(1), None), (Output(args=(Ref(name="missing"),)), None, None)])
    p = _program()
    entries = p.graph.entries()
    entries.insert(3, (GetAttr(name="g", target="true_graph_0"), SubgraphMeta(graph="true_graph_0"), None))
    q = msgspec.structs.replace(p, graph=build_graph(entries, (Subgraph(name="true_graph_0", graph=inner),)))
    with pytest.raises(IRError, match=r"graph\.true_graph_0: node 'output' uses 'missing'"):
        verify(q)


def test_users_analysis_in_graph_order() -> None:
    u = users(_program().graph)
    assert u["x"] == ("mm",)
    assert u["mm"] == ("sum",)
    assert u["sum"] == ("output",)


def test_blob_equality_hash_and_zero_copy() -> None:
    raw = bytearray(b"abcd")
    blob = Blob(memoryview(raw))
    assert blob == Blob(b"abcd") and hash(blob) == hash(Blob(b"abcd"))
    assert blob != Blob(b"abce")
    raw[0] = ord("z")  # a view aliases its owner: that is what makes it zero-copy
    assert blob.tobytes() == b"zbcd"
    with pytest.raises(TypeError):
        blob.view()[0] = 1  # read-only view
    with pytest.raises(AttributeError):
        blob.x = 1  # type: ignore[attr-defined]  # immutability is what is tested


def test_import_is_torch_free() -> None:
    code = "import sys, texir.ir; print('torch' in sys.modules, 'flatbuffers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"], "texir.ir must import neither torch nor flatbuffers"


def test_literal_args_spell_special_floats_and_keep_bool_apart_from_int() -> None:
    from texir.ir import BoolArg, NoneArg, StrArg, float_value, literal_arg

    assert literal_arg(True) == BoolArg(value=True)
    assert literal_arg(1) == IntArg(value=1)
    assert literal_arg(None) == NoneArg()
    assert literal_arg("floor") == StrArg(value="floor")
    assert literal_arg(float("-inf")) == FloatArg(value="-inf")
    assert literal_arg(float("nan")) == literal_arg(float("nan"))  # NaN compares equal in the IR
    assert float_value(2.5) == 2.5
    with pytest.raises(TypeError):
        literal_arg(object())
