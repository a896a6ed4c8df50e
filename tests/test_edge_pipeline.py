"""The named pass pipeline: a failing pass is named, TEXIR_VERIFY names a pass that breaks the IR, a
program records the stage it reached so emission runs only what is missing, and a program in a
dialect the caller does not take is a typed error."""

from __future__ import annotations

import functools
from collections.abc import Callable

import msgspec
import pytest
import torch

import texir.edge.pipeline as pipeline
from texir.adapters import from_exported_program
from texir.edge import (
    DialectError,
    EdgeError,
    NamedPass,
    PassError,
    run_stage,
    to_edge_program,
    to_emittable,
    to_partitionable,
)
from texir.emit import emit
from texir.ir import Program
from texir.serialize.pte import dumps


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x.view(3, 2).t().reshape(3, 2).sum(0) * 2 + self.count[:2]


@functools.cache
def aten() -> Program:
    return from_exported_program(torch.export.export(Small(), (torch.randn(2, 3),)), decompose=True)


def _boom(program: Program) -> Program:
    raise EdgeError("node 'add': cannot rewrite this operand")


def _drop_output(program: Program) -> Program:
    graph = msgspec.structs.replace(program.graph, nodes=program.graph.nodes[:-1])
    return msgspec.structs.replace(program, graph=graph)


def test_a_failing_pass_is_named_with_the_node() -> None:
    stage = (*pipeline.TO_EDGE[:2], NamedPass("boom", _boom, "SomeExecuTorchPass"))
    with pytest.raises(PassError, match=r"edge pass boom \(ExecuTorch's SomeExecuTorchPass\).*node 'add'") as info:
        run_stage(aten(), stage)
    assert info.value.pass_name == "boom"
    assert isinstance(info.value.__cause__, EdgeError)


def test_verify_names_the_pass_that_breaks_the_ir(monkeypatch: pytest.MonkeyPatch) -> None:
    stage = (pipeline.TO_EDGE[0], NamedPass("drop_output", _drop_output, "NoSuchPass"))
    monkeypatch.setenv("TEXIR_VERIFY", "1")
    with pytest.raises(PassError, match="edge pass drop_output .*left an invalid program.*Output") as info:
        run_stage(aten(), stage)
    assert info.value.pass_name == "drop_output"
    monkeypatch.setenv("TEXIR_VERIFY", "0")
    broken = run_stage(aten(), stage)  # unchecked, the broken program goes through
    assert len(broken.graph.nodes) == len(aten().graph.nodes) - 1


def _counting(stage: pipeline.Stage, calls: list[str]) -> pipeline.Stage:
    def wrap(named: NamedPass) -> NamedPass:
        def fn(program: Program) -> Program:
            calls.append(named.name)
            return named.fn(program)

        return msgspec.structs.replace(named, fn=fn)

    return tuple(wrap(p) for p in stage)


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    for name in ("TO_EDGE", "EMIT_TO_EDGE", "TO_EXECUTORCH"):
        monkeypatch.setattr(pipeline, name, _counting(getattr(pipeline, name), calls))
    return calls


def test_emit_runs_only_the_missing_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    partitionable = to_partitionable(aten())
    assert partitionable.dialect == pipeline.PARTITIONABLE_DIALECT
    calls = _count_passes(monkeypatch)
    edge = to_emittable(partitionable)
    assert edge.dialect == pipeline.EDGE_DIALECT
    assert calls == [p.name for p in pipeline.TO_EXECUTORCH]  # not the to_edge rewrites again
    calls.clear()
    assert to_emittable(edge) is edge and to_edge_program(edge) is edge
    assert emit(edge) == emit(partitionable)
    assert calls == [p.name for p in pipeline.TO_EXECUTORCH]  # the second emit only
    calls.clear()
    emit(aten())
    assert calls == [p.name for p in (*pipeline.EMIT_TO_EDGE, *pipeline.TO_EXECUTORCH)]


def test_keeping_view_copies_leaves_out_only_the_view_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    from texir.emit import EmitOptions

    kept = [p.name for p in pipeline.TO_EXECUTORCH_KEEP_VIEW_COPY]
    assert kept == [p.name for p in pipeline.TO_EXECUTORCH
                    if p.name not in ("normalize_view_copy_bases", "replace_view_copies_with_views")]
    calls: list[str] = []
    monkeypatch.setattr(pipeline, "TO_EXECUTORCH_KEEP_VIEW_COPY", _counting(pipeline.TO_EXECUTORCH_KEEP_VIEW_COPY, calls))
    partitionable = to_partitionable(aten())
    copies, views = emit(partitionable, EmitOptions(remove_view_copy=False)), emit(partitionable)
    assert calls == kept
    assert "aten::view_copy" in {op.name for op in copies.program.execution_plan[0].operators}
    assert "aten::view_copy" not in {op.name for op in views.program.execution_plan[0].operators}


def test_an_emitted_partitionable_program_runs() -> None:
    from texir.executorch import load_method

    method = load_method(dumps(emit(to_partitionable(aten()))))
    x = torch.randn(2, 3)
    model = Small()
    for _ in range(2):
        (got,) = method.execute([x])
        torch.testing.assert_close(got, model(x))


@pytest.mark.parametrize(
    ("call", "dialect", "match"),
    [
        (emit, "SOMETHING", "texir.emit takes a program in dialect ATEN or TRAINING, not 'SOMETHING'"),
        (to_partitionable, "EDGE", "to_partitionable takes a program in dialect ATEN or TRAINING, not 'EDGE'"),
        (to_partitionable, pipeline.PARTITIONABLE_DIALECT, "not 'EDGE_PARTITIONABLE'.*texir.orchestrate.lower"),
    ],
)
def test_a_program_in_the_wrong_dialect_is_refused(call: Callable[[Program], object], dialect: str, match: str) -> None:
    with pytest.raises(DialectError, match=match):
        call(msgspec.structs.replace(aten(), dialect=dialect))
