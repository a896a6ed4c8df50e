"""User inputs named like Python builtins or keywords (torchvision's LRASPP has `forward(self, input)`)
keep their names through IR -> FX, lowering and `.pte`, and compute what eager does."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
import torch

from texir.adapters import from_exported_program, to_exported_program
from texir.adapters.fx_signature import SignatureMismatchError
from texir.emit import emit
from texir.ir import (
    CallFunction, DType, GraphBuilder, GraphSignature, Output, Placeholder, Program, Ref, TensorMeta, UserInput,
    UserOutput, verify,
)
from texir.errors import ConversionError
from texir.ir.names import rename_input_spec, rename_node, rename_output_spec
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


# ------------------------------------------------------------------------------------------------
# A graph FX rebuilt (issue 38): `copy.deepcopy(ep)` renames a placeholder named like a builtin
# (`input` -> `input_1`) and leaves the signature as it was; texir matches the signature to the
# graph by position, as torch does, and gives the IR the signature's names.

KEYWORDS = {"input": "lambda", "list": "class", "type": "import"}
"""Names torch.export cannot give an input (Python refuses them as parameters) but a texir Program
may hold; FX steers its own names away from them (`lambda_1`)."""


def _pte(ep: torch.export.ExportedProgram, how: str) -> bytes:
    import texir
    from texir.backends import xnnpack

    if how == "none":
        return dumps(emit(texir.lower(ep, []).program))
    if how == "native":
        with xnnpack.registered():
            return dumps(emit(texir.lower(ep, [xnnpack.partitioner()]).program))
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from texir.executorch import executorch_partitioner

    return dumps(emit(texir.lower(ep, [executorch_partitioner(XnnpackPartitioner())]).program))


def _renamed(program: Program, names: dict[str, str]) -> Program:
    """`program` with its values renamed through `names`, checked."""
    renamed = msgspec.structs.replace(
        program,
        graph=msgspec.structs.replace(program.graph, nodes=tuple(rename_node(n, names) for n in program.graph.nodes)),
        signature=GraphSignature(
            inputs=tuple(rename_input_spec(s, names) for s in program.signature.inputs),
            outputs=tuple(rename_output_spec(s, names) for s in program.signature.outputs),
        ),
    )
    verify(renamed)
    return renamed


@pytest.fixture(scope="module")
def named() -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The zoo's builtin_named export, its args and its eager outputs."""
    from tests.zoo import cached_export, zoo_model

    module, args = zoo_model("builtin_named").build()
    return cached_export("builtin_named", decompose=False), args, module(*args)


@pytest.fixture(scope="module")
def keyword_export(named: Any) -> torch.export.ExportedProgram:
    """builtin_named with its inputs renamed to Python keywords, back as an ExportedProgram."""
    ep, _, _ = named
    renamed = _renamed(from_exported_program(ep), KEYWORDS)
    back = to_exported_program(renamed)
    assert from_exported_program(back) == renamed  # the round trip keeps keyword names
    return back


def test_a_deep_copy_converts_and_decomposes_as_the_export(named: Any) -> None:
    from texir.adapters.local_decompose import decompose_locally

    ep, args, expected = named
    copied = copy.deepcopy(ep)
    # (what makes the case: FX renamed the placeholders, the signature kept the user's names)
    assert [n.name for n in copied.graph.nodes if n.op == "placeholder"][-3:] == ["input_1", "list_1", "type_1"]
    assert list(copied.graph_signature.user_inputs) == ["input", "list", "type"]
    assert from_exported_program(copied) == from_exported_program(ep)
    assert from_exported_program(copied, decompose=True) == from_exported_program(ep, decompose=True)
    local = decompose_locally(copied, functional_only=True)
    assert local is not None
    assert [n.name for n in local.graph.nodes if n.op == "placeholder"][-3:] == ["input", "list", "type"]
    rebuilt = to_exported_program(from_exported_program(copied))
    torch.testing.assert_close(rebuilt.module()(*args), expected)


@pytest.mark.parametrize("how", ["none", "native", "bridge"])
def test_a_deep_copy_lowers_to_the_same_pte(named: Any, how: str) -> None:
    from tests.xnnpack_oracle import run_pte

    ep, args, expected = named
    data = _pte(copy.deepcopy(ep), how)
    assert data == _pte(ep, how)
    torch.testing.assert_close(run_pte(data, args)[0], list(expected), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("how", ["none", "native", "bridge"])
def test_keyword_named_inputs_lower_and_run(named: Any, keyword_export: torch.export.ExportedProgram, how: str) -> None:
    from tests.xnnpack_oracle import run_pte

    ep, args, expected = named
    assert list(keyword_export.graph_signature.user_inputs) == list(KEYWORDS.values())
    torch.testing.assert_close(keyword_export.module()(*args), expected)
    data = _pte(keyword_export, how)
    assert _pte(copy.deepcopy(keyword_export), how) == data
    torch.testing.assert_close(run_pte(data, args)[0], list(expected), rtol=1e-4, atol=1e-5)


def test_an_input_named_self_is_a_typed_error(named: Any) -> None:
    ep, _, _ = named
    renamed = _renamed(from_exported_program(ep), {"input": "self"})
    with pytest.raises(ConversionError, match="placeholder node 'self'.*rename the value"):
        to_exported_program(renamed)


def test_a_signature_that_does_not_describe_the_graph_is_a_typed_error(named: Any) -> None:
    import texir
    from torch.export.graph_signature import ExportGraphSignature, TensorArgument

    ep, _, _ = named
    sig = ep.graph_signature
    short = copy.deepcopy(ep)
    short._graph_signature = ExportGraphSignature(input_specs=list(sig.input_specs[:-1]), output_specs=list(sig.output_specs))
    with pytest.raises(SignatureMismatchError, match="5 placeholders .* has 4 input specs"):
        from_exported_program(short)
    with pytest.raises(SignatureMismatchError, match="5 placeholders .* has 4 input specs"):
        texir.lower(short, [])
    taken = copy.deepcopy(ep)
    specs = [copy.copy(s) for s in sig.input_specs]
    specs[-1].arg = TensorArgument(name="linear")  # another node's name
    taken._graph_signature = ExportGraphSignature(input_specs=specs, output_specs=list(sig.output_specs))
    with pytest.raises(SignatureMismatchError, match="placeholder 'type_1' is the graph signature's input 'linear'"):
        from_exported_program(taken)
