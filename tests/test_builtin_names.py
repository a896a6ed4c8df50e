"""User inputs named like Python builtins or keywords (torchvision's LRASPP has `forward(self, input)`)
keep their names through IR -> FX, lowering and `.pte`, and compute what eager does."""

from __future__ import annotations

import pytest
import torch

from texir.adapters import from_exported_program, to_exported_program
from texir.emit import emit
from texir.ir import (
    CallFunction, DType, GraphBuilder, GraphSignature, Output, Placeholder, Program, Ref, TensorMeta, UserInput,
    UserOutput, verify,
)
from texir.lowering import OpSupportPartitioner, to_backend
from texir.backends import reference as _reference_backend  # noqa: F401  (registers it)
from texir.backends.reference import decode_reference
from texir.serialize.pte import dumps, loads


class Builtins(torch.nn.Module):
    def forward(self, input: torch.Tensor, list: torch.Tensor, type: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return input.relu() + list * type


ARGS = (torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3))


@pytest.fixture(scope="module")
def program() -> Program:
    ep = torch.export.export(Builtins(), ARGS, strict=False)
    return from_exported_program(ep, decompose=True)


def test_round_trip_keeps_the_names_and_runs(program: Program) -> None:
    rebuilt = to_exported_program(program)
    assert [n.name for n in rebuilt.graph.nodes if n.op == "placeholder"] == ["input", "list", "type"]
    assert list(rebuilt.graph_signature.user_inputs) == ["input", "list", "type"]
    torch.testing.assert_close(rebuilt.module()(*ARGS), Builtins()(*ARGS))
    assert from_exported_program(rebuilt) == program


def test_lowering_and_pte_run_equal_to_eager(program: Program) -> None:
    from executorch.runtime import Runtime

    lowered = to_backend(program, OpSupportPartitioner("texir-reference", {"aten::relu.default"}))
    verify(lowered)
    torch.testing.assert_close(to_exported_program(lowered).module()(*ARGS), Builtins()(*ARGS))
    data = dumps(emit(program))  # the runtime reads the buffer in place: keep it alive
    loaded = Runtime.get().load_program(data)
    (got,) = loaded.load_method("forward").execute(list(ARGS))
    torch.testing.assert_close(got, Builtins()(*ARGS))
    # The pip runtime has no texir-reference backend: read the delegated .pte back instead and
    # run the sub-program its delegate blob carries.
    pte = loads(dumps(emit(lowered))).program
    (delegate,) = pte.execution_plan[0].delegates
    assert delegate.id == "texir-reference"
    sub = decode_reference(pte.backend_delegate_data[delegate.processed.index].data.tobytes())
    (relu_out,) = to_exported_program(sub).module()(ARGS[0])
    torch.testing.assert_close(relu_out, ARGS[0].relu())


@pytest.mark.parametrize("name", ["lambda", "class", "print", "getattr", "torch", "x.1"])
def test_hand_built_names_fx_would_change(name: str) -> None:
    b = GraphBuilder()
    meta = TensorMeta(dtype=DType.float32, shape=(2,), strides=(1,))
    b.add(Placeholder(name=name), meta)
    b.add(CallFunction(name="relu", target="aten::relu.default", args=(Ref(name=name),)), meta)
    b.add(Output(args=(Ref(name="relu"),)))
    p = Program(
        graph=b.build(),
        signature=GraphSignature(inputs=(UserInput(arg=Ref(name=name)),), outputs=(UserOutput(arg=Ref(name="relu")),)),
    )
    verify(p)
    ep = to_exported_program(p)
    assert list(ep.graph_signature.user_inputs) == [name]
    out = ep.module()(torch.tensor([-1.0, 2.0]))  # no module call graph: a flat tuple of outputs
    torch.testing.assert_close(out, (torch.tensor([0.0, 2.0]),))
