"""The IR core on hand-built programs: verifier errors, canonical form, printer, Blob, import cost."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    ProvenanceTable,
    build_graph,
    GraphSignature,
    IntArg,
    ListArg,
    ModuleFrame,
    Node,
    Output,
    ParameterInput,
    Placeholder,
    Program,
    Provenance,
    RangeConstraint,
    Ref,
    SourceFn,
    StateEntry,
    Subgraph,
    SubgraphMeta,
    TensorData,
    TensorMeta,
    UserInput,
    UserOutput,
    ValueMeta,
    canonicalize,
    format_program,
    users,
    verify,
    verify_graph,
)
from texir.ir.analysis import same_dim_order


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


def _with_graph(p: Program, **fields: object) -> Program:
    return msgspec.structs.replace(p, graph=msgspec.structs.replace(p.graph, **fields))


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
        (
            lambda p: _with_graph(p, metas=(*p.graph.metas, _t(9))),
            r"metas holds 3 entries but nodes use 2; drop unused metadata",
        ),
        (
            lambda p: _with_graph(p, metas=p.graph.metas[::-1], nodes=tuple(
                msgspec.structs.replace(n, meta_id=1 - n.meta_id) if getattr(n, "meta_id", None) is not None else n
                for n in p.graph.nodes
            )),
            r"node #0 'p_w' has meta_id 1, which skips ahead of first use",
        ),
        (
            lambda p: _with_graph(p, metas=p.graph.metas[:1]),
            r"node #1 'b_buf' has meta_id 1, which is out of range \(1 metas\)",
        ),
        (
            lambda p: _with_graph(p, provenance=ProvenanceTable(
                debug_handle=(None,) * 7, ancestor=(None,) * 7, torch_fn_name=(None, None, None, "mm_1", None, None, None),
                location=(None,) * 7)),
            r"provenance\.torch_fn_name\[3\] \(node 'mm'\): a torch_fn name needs a location with torch_fn_type",
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


_frames = st.lists(
    st.builds(ModuleFrame, key=st.sampled_from(["L__self__", "L__self___a"]), path=st.sampled_from(["", "a"]), type=st.just("M")),
    max_size=2,
).map(tuple)
_provs = st.none() | st.builds(
    Provenance,
    debug_handle=st.none() | st.integers(0, 300),
    ancestor=st.none() | st.sampled_from(["add.0", "mul.0"]),
    stack_trace=st.none() | st.sampled_from(['File "m.py", line 3', 'File "m.py", line 4']),
    nn_module_stack=_frames,
    source_fn_stack=st.lists(st.builds(SourceFn, name=st.just("add"), target=st.just("add")), max_size=1).map(tuple),
    torch_fn=st.none() | st.tuples(st.sampled_from(["add_1", "add_2"]), st.just("method_descriptor.add")),
)


@given(rows=st.lists(st.tuples(st.sampled_from([None, (2, 2), (3,)]), _provs), min_size=1, max_size=12))
@settings(max_examples=150, deadline=None)
def test_graph_builder_interns_and_gives_back_every_row(rows: list[tuple[tuple[int, ...] | None, Provenance | None]]) -> None:
    entries: list[tuple[Node, ValueMeta | None, Provenance | None]] = []
    for i, (shape, prov) in enumerate(rows):
        entries.append((Placeholder(name=f"x{i}"), None if shape is None else _t(*shape), prov))
    entries.append((Output(args=()), None, None))
    graph = build_graph(entries)
    verify_graph(graph)
    # Every row comes back (an empty Provenance() reads back as None: nothing to record).
    expected = [(n.name, m, None if p == Provenance() else p) for n, m, p in entries]
    assert [(n.name, m, p) for n, m, p in graph.entries()] == expected
    assert len(graph.metas) == len({m for _, m, _ in entries if m is not None})
    # Rebuilding from the entries gives an equal graph (tables in first-use order), whatever the
    # meta_ids the nodes carried in.
    assert build_graph(graph.entries()) == graph
    if all(p is None for _, _, p in expected):
        assert graph.provenance is None
    else:
        assert graph.provenance is not None
        locations = graph.provenance.locations
        assert len(locations) == len(set(locations))


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ((6, 3, 1), (6, 3, 1), True),           # contiguous, equal strides
        ((3, 1, 1), (12, 4, 1), True),           # different sizes, same order (torch's tie rule)
        ((6, 1, 2), (6, 3, 1), False),           # channels-last vs contiguous
        (("3*s0", 3, 1), ("3*s0", 3, 1), True),  # symbolic: identical expressions
        (("3*s0", 3, 1), (1, "s0", 3), False),   # symbolic and not identical: not known the same
        ((3, 1), (6, 3, 1), False),              # ranks differ
    ],
)
def test_same_dim_order(a: tuple[int | str, ...], b: tuple[int | str, ...], same: bool) -> None:
    def meta(strides: tuple[int | str, ...]) -> TensorMeta:
        return TensorMeta(dtype=DType.float32, shape=(1,) * len(strides), strides=strides)

    assert same_dim_order(meta(a), meta(b)) is same
