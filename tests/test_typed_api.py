"""The public API used exactly as a user would, fully annotated: `make test` type-checks this file
with `mypy --strict` (see mypy.ini), so a change that breaks users' type checking fails here."""

from __future__ import annotations

import msgspec
import pytest
import torch

import texir.backends  # noqa: F401  (registers the demo and reference backends)
from texir.adapters import from_exported_program, to_exported_program
from texir.errors import IRError, SnapshotError, TexirError
from texir.ir import (
    CallFunction,
    DType,
    FloatArg,
    Graph,
    GraphBuilder,
    GraphSignature,
    Output,
    Placeholder,
    Program,
    Ref,
    TensorMeta,
    UserInput,
    UserOutput,
    canonicalize,
    format_program,
    verify,
)
from texir.serialize.snapshot import SnapshotFormat, dumps, loads


def _meta(*shape: int) -> TensorMeta:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return TensorMeta(dtype=DType.float32, shape=tuple(shape), strides=tuple(strides))


def build_program(scale: float = 2.0, name: str = "y") -> Program:
    """y = x * scale, written by hand."""
    builder = GraphBuilder()
    builder.add(Placeholder(name="x"), _meta(2, 3))
    builder.add(CallFunction(name=name, target="aten::mul.Scalar", args=(Ref(name="x"), FloatArg(value=scale))), _meta(2, 3))
    builder.add(Output(args=(Ref(name=name),)))
    graph: Graph = builder.build()
    signature = GraphSignature(
        inputs=(UserInput(arg=Ref(name="x")),), outputs=(UserOutput(arg=Ref(name=name)),)
    )
    return Program(graph=graph, signature=signature)


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.5


def test_hand_built_program() -> None:
    program: Program = build_program()
    verify(program)
    text: str = format_program(program)
    assert "aten::mul.Scalar(%x, 2.0)" in text
    renamed: Program = build_program(name="z")
    assert renamed != program
    assert canonicalize(renamed) == canonicalize(program)
    assert hash(build_program()) == hash(program)
    changed: Program = msgspec.structs.replace(program, dialect="EDGE")
    assert changed.dialect == "EDGE" and program.dialect == "ATEN"


def test_verify_rejects_a_bad_program() -> None:
    good = build_program()
    bad = msgspec.structs.replace(good, graph=Graph(nodes=good.graph.nodes[1:]))
    with pytest.raises(IRError):
        verify(bad)


def test_snapshot_round_trip() -> None:
    program = build_program()
    formats: tuple[SnapshotFormat, ...] = ("json", "msgpack")
    for fmt in formats:
        data: bytes = dumps(program, format=fmt, include_data=True)
        restored: Program = loads(data)
        assert restored == program
    with pytest.raises(SnapshotError):
        loads(b"{not a snapshot")
    with pytest.raises(TexirError):
        loads(b"")


def test_torch_round_trip() -> None:
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    ep: torch.export.ExportedProgram = torch.export.export(Scale(), (x,))
    program: Program = from_exported_program(ep, decompose=True)
    verify(program)
    targets: list[str] = [n.target for n in program.graph.nodes if isinstance(n, CallFunction)]
    assert targets == ["aten::relu.default", "aten::mul.Tensor"]
    back: torch.export.ExportedProgram = to_exported_program(program)
    out: torch.Tensor = back.module()(x)
    assert torch.equal(out, ep.module()(x))


def test_lower_with_a_cache_and_a_node_order() -> None:
    import texir
    from texir.lowering import Lowered, LowerReport, NodeOrder, OpSupportPartitioner, PreprocessCache

    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    ep: torch.export.ExportedProgram = torch.export.export(Scale(), (x,))
    cache = PreprocessCache(decompositions_kept=2)
    order: NodeOrder = "program"
    relu = OpSupportPartitioner("texir-reference", {"aten::relu.default"})
    done: Lowered = texir.lower(ep, [relu], cache=cache, order=order)
    report: LowerReport = done.report
    again: Program = texir.lower(torch.export.export(Scale(), (x,)), [relu], cache=cache).program
    methods: dict[str, Lowered] = texir.lower({"forward": ep}, [relu], cache=None, order=order)
    reused: int = cache.decompositions_reused
    assert reused == 1 and len(done.program.lowered_modules) == len(again.lowered_modules) == 1
    assert [d.backend for d in report.delegates] == ["texir-reference"]
    assert methods["forward"].program == done.program
