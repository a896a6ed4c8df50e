"""Programs that already hold ExecuTorch's work imported as texir IR (`texir.executorch.reimport`):
edge-dialect ops, ExecuTorch's delegate call and `LoweredBackendModule`; and ExecuTorch passes given
as `transform_passes` / `EdgeProgramManager.transform`, run on the edge view and imported back
(`texir.compat.passes`)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch

pytest.importorskip("executorch")

import texir  # noqa: E402
import texir.compat  # noqa: E402  (after the importorskip: the facade needs executorch)
from texir.compat.passes import TransformPassError  # noqa: E402
from texir.emit import emit  # noqa: E402
from texir.executorch import import_executorch_program, run_pte  # noqa: E402
from texir.ir import CallFunction, canonicalize, format_program  # noqa: E402
from texir.ir.names import CALL_DELEGATE  # noqa: E402
from texir.serialize.pte.codec import dumps  # noqa: E402


class LinearAdd(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + x


@pytest.fixture(scope="module")
def model() -> LinearAdd:
    torch.manual_seed(0)
    return LinearAdd().eval()


@pytest.fixture(scope="module")
def example() -> tuple[torch.Tensor]:
    torch.manual_seed(1)
    return (torch.randn(2, 4),)


@pytest.fixture(scope="module")
def executorch_lowered(model: LinearAdd, example: tuple[torch.Tensor]) -> Any:
    """ExecuTorch's own to_edge_transform_and_lower with its XNNPACK partitioner (not texir's)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.program._program import to_edge_transform_and_lower

    return to_edge_transform_and_lower(torch.export.export(model, example), partitioner=[XnnpackPartitioner()])


def _decoded(data: bytes) -> Any:
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(data)


def test_an_executorch_delegated_program_imports_and_emits_the_same_delegate(
    executorch_lowered: Any, model: LinearAdd, example: tuple[torch.Tensor]
) -> None:
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    ep = executorch_lowered.exported_program()
    ((_, et_module, _),) = get_lowered_submodules(ep.graph_module)
    program = import_executorch_program(ep)
    assert program.dialect == "EDGE_PARTITIONABLE"
    ((name, module),) = [(e.name, e.module) for e in program.lowered_modules]
    assert module.backend_id == "XnnpackBackend" and module.processed_bytes == et_module.processed_bytes
    assert [n.target for n in program.graph.nodes if isinstance(n, CallFunction)][0] == CALL_DELEGATE
    ours = dumps(emit({"forward": program}))
    a, b = _decoded(ours), _decoded(executorch_lowered.to_executorch().buffer)
    assert a.program.backend_delegate_data == b.program.backend_delegate_data
    assert a.program.execution_plan[0].delegates == b.program.execution_plan[0].delegates
    assert a.named_data == b.named_data  # the XNNPACK weights, keyed by sha256, as ExecuTorch wrote them
    (out,) = run_pte(ours, list(example))
    torch.testing.assert_close(out, model(*example))


def test_an_executorch_lowered_module_exported_inside_a_module_runs_through_texir(
    executorch_lowered: Any, model: LinearAdd, example: tuple[torch.Tensor]
) -> None:
    """ExecuTorch's `LoweredBackendModule` placed in an nn.Module, exported again and lowered by
    texir's `to_edge`: its blob goes into the file as it is, the module around it is texir's."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    ((_, et_module, _),) = get_lowered_submodules(executorch_lowered.exported_program().graph_module)

    class Around(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = et_module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x * 2.0)[0] - 1.0

    edge = texir.compat.to_edge(torch.export.export(Around(), example, strict=True))
    (entry,) = edge.program().lowered_modules
    assert entry.module.processed_bytes == et_module.processed_bytes
    data = edge.to_executorch().buffer
    assert [d.data for d in _decoded(data).program.backend_delegate_data] == [et_module.processed_bytes]
    (out,) = run_pte(data, list(example))
    torch.testing.assert_close(out, model(example[0] * 2.0) - 1.0)


def _without_requires_grad(text: str) -> str:
    return re.sub(r"\{grad\}", "", text)


def test_an_executorch_edge_program_imports_as_texirs_own_to_edge_form(
    model: LinearAdd, example: tuple[torch.Tensor]
) -> None:
    """Edge-dialect ops import as the ATen ops they wrap: ExecuTorch's to_edge and texir's give the
    same program, but for requires_grad, which ExecuTorch's to_edge keeps on values computed from
    parameters and texir's decomposition does not (the runtime does not read it)."""
    from executorch.exir import to_edge

    ep = torch.export.export(model, example)
    theirs = import_executorch_program(to_edge(copy.deepcopy(ep)).exported_program())
    ours = texir.lower(copy.deepcopy(ep), []).program
    assert theirs.dialect == ours.dialect == "EDGE_PARTITIONABLE"
    ours_text = format_program(canonicalize(ours))
    assert _without_requires_grad(format_program(canonicalize(theirs))) == _without_requires_grad(ours_text)


def _add_to_mul() -> Any:
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass

    class AddToMul(ExportPass):  # type: ignore[misc]  # ExecuTorch's base class is untyped
        def call_operator(self, op: Any, args: Any, kwargs: Any, meta: Any) -> Any:
            if op == exir_ops.edge.aten.add.Tensor:
                op = exir_ops.edge.aten.mul.Tensor
            return super().call_operator(op, args, kwargs, meta)

    return AddToMul()


def test_transform_passes_run_as_executorch_runs_them(model: LinearAdd, example: tuple[torch.Tensor]) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.program._program import to_edge_transform_and_lower

    ep = torch.export.export(model, example)
    theirs = to_edge_transform_and_lower(
        copy.deepcopy(ep), transform_passes=[_add_to_mul()], partitioner=[XnnpackPartitioner()]
    ).to_executorch().buffer
    edge = texir.compat.to_edge_transform_and_lower(
        copy.deepcopy(ep), transform_passes=[_add_to_mul()], partitioner=[XnnpackPartitioner()]
    )
    assert edge.native_xnnpack
    ours = edge.to_executorch().buffer
    assert _decoded(ours).program.backend_delegate_data == _decoded(theirs).program.backend_delegate_data
    (out,) = run_pte(ours, list(example))
    torch.testing.assert_close(out, torch.relu(model.linear(example[0])) * example[0])


def test_edge_program_manager_transform_returns_a_transformed_manager(
    model: LinearAdd, example: tuple[torch.Tensor]
) -> None:
    edge = texir.compat.to_edge(torch.export.export(model, example))
    done = edge.transform({"forward": [_add_to_mul()]})
    targets = {n.target for n in done.program().graph.nodes if isinstance(n, CallFunction)}
    assert "aten::mul.Tensor" in targets and "aten::add.Tensor" not in targets
    assert "aten::add.Tensor" in {n.target for n in edge.program().graph.nodes if isinstance(n, CallFunction)}
    assert edge.transform({"other_method": [_add_to_mul()]}).program() == edge.program()
    from executorch.exir.pass_manager import ExportedProgramPassManager

    assert edge.transform(ExportedProgramPassManager([_add_to_mul()])).program() == done.program()
    (out,) = run_pte(done.to_executorch().buffer, list(example))
    torch.testing.assert_close(out, torch.relu(model.linear(example[0])) * example[0])


def test_bad_transform_passes_are_typed_errors(model: LinearAdd, example: tuple[torch.Tensor]) -> None:
    edge = texir.compat.to_edge(torch.export.export(model, example))
    with pytest.raises(TransformPassError, match="transform_passes is a int"):
        edge.transform(3)

    def broken(gm: torch.fx.GraphModule) -> None:
        raise ValueError("no")

    with pytest.raises(TransformPassError, match=r"method 'forward': ExecuTorch pass \(broken\) raised .*'broken' pass"):
        edge.transform([broken])


def test_a_delegate_called_with_a_dict_takes_its_tensors_in_pytree_order() -> None:
    """ExecuTorch's `executorch_call_delegate` takes the module's arguments as given (here a dict);
    texir's delegate call takes their tensors, flattened as the module's original program takes them."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir import to_edge
    from executorch.exir.backend.backend_api import to_backend

    class Sub(torch.nn.Module):
        def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
            return x["a"] - x["b"]

    inputs = ({"a": torch.randn(2, 2), "b": torch.randn(2, 2)},)
    lowered = to_backend(XnnpackBackend.__name__, to_edge(torch.export.export(Sub(), inputs)).exported_program(), [])

    class Around(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = lowered

        def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
            return self.inner(x) * 2.0  # one output: the call returns the tensor itself

    edge = texir.compat.to_edge(torch.export.export(Around(), inputs, strict=True))
    (call,) = [n for n in edge.program().graph.nodes if isinstance(n, CallFunction) and n.target == CALL_DELEGATE]
    assert [a.name for a in call.args[1:]] == ["x_a", "x_b"]  # type: ignore[union-attr]  # Refs here
    (out,) = run_pte(edge.to_executorch().buffer, [inputs[0]["a"], inputs[0]["b"]])
    torch.testing.assert_close(out, (inputs[0]["a"] - inputs[0]["b"]) * 2.0)


def test_an_edge_program_fed_back_to_to_edge_gives_the_same_program(
    model: LinearAdd, example: tuple[torch.Tensor]
) -> None:
    """`to_edge(manager.exported_program())`: ExecuTorch's edge program, and texir.compat's own view
    of the result, lower to the same texir program (to_edge is idempotent on its own form)."""
    from executorch.exir import to_edge

    first = texir.compat.to_edge(to_edge(torch.export.export(model, example)).exported_program())
    assert first.program().dialect == "EDGE_PARTITIONABLE"
    again = texir.compat.to_edge(first.exported_program())
    assert again.program() == first.program()
    (out,) = run_pte(again.to_executorch().buffer, list(example))
    torch.testing.assert_close(out, model(*example))
