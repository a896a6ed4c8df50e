"""texir's .pte files call only operators the ExecuTorch 1.5.1 runtime registers: the checked-in
table equals the runtime's registry, every zoo model's .pte keeps to it, a program that does not is
refused naming op and node, and ops the runtime lacks are decomposed as ExecuTorch's to_edge does."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

from tests.zoo import ZOO, cached_export
from texir.adapters import from_exported_program, to_exported_program
from texir.adapters.targets import resolve_target
from texir.adapters.decompositions import EXTRA_EDGE_DECOMPOSITIONS, edge_decomposition_table
from texir.emit import EmitOptions, emit
from texir.emit.runtime_ops import MissingKernelError, operator_name, runtime_operators
from texir.ir import CallFunction, Program
from texir.lowering import OpSupportPartitioner, to_backend
from texir.backends import reference as _reference_backend  # noqa: F401  (registers it)
from texir.serialize.pte import dumps, loads
from texir.testing.golden import updating_goldens

MISSING_IN_RUNTIME = {"topk": "aten::sort.values"}


def _registry() -> frozenset[str]:
    from texir.executorch.runtime import runtime

    return frozenset(runtime().operator_registry.operator_names)


def test_checked_in_table_equals_the_runtime_registry(request: pytest.FixtureRequest) -> None:
    registry = _registry()
    if updating_goldens(request.config):
        path = resources.files("texir.emit").joinpath("executorch_1_5_1_operators.json")
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["operators"] = sorted(registry)
        with resources.as_file(path) as real:
            real.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        runtime_operators.cache_clear()
    assert runtime_operators() == registry, (
        f"table and runtime differ: only in table {sorted(runtime_operators() - registry)[:5]}, "
        f"only in runtime {sorted(registry - runtime_operators())[:5]}; --snapshot-update rewrites it"
    )


@pytest.mark.parametrize("name", [m.name for m in ZOO])
def test_every_zoo_pte_calls_only_registered_operators(name: str) -> None:
    program = from_exported_program(cached_export(name), decompose=False)
    if name in MISSING_IN_RUNTIME:
        with pytest.raises(MissingKernelError, match=MISSING_IN_RUNTIME[name]):
            emit(program)
        return
    pte = loads(dumps(emit(program)))
    used = {operator_name(op.name, op.overload) for plan in pte.program.execution_plan for op in plan.operators}
    assert used and used <= _registry(), sorted(used - _registry())


def test_missing_kernel_is_refused_naming_op_and_node() -> None:
    program = from_exported_program(cached_export("topk"), decompose=False)
    node = next(n for n in program.graph.nodes if isinstance(n, CallFunction) and "sort" in n.target)
    with pytest.raises(MissingKernelError, match=rf"node '{node.name}' \(aten::sort.*aten::sort.values is not registered.*decompose it"):
        emit(program)
    assert emit(program, EmitOptions(check_operators=False)).program.execution_plan  # the escape hatch


class VectorNorm(torch.nn.Module):
    """timm's convnextv2 GlobalResponseNorm reduces with linalg.vector_norm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def _vector_norm_program() -> Program:
    ep = torch.export.export(VectorNorm(), (torch.randn(2, 3, 4),), strict=False)
    return from_exported_program(ep, decompose=True)


def test_vector_norm_is_decomposed_as_to_edge_does() -> None:
    from executorch import exir

    program = _vector_norm_program()
    targets = {n.target for n in program.graph.nodes if isinstance(n, CallFunction)}
    assert not any("linalg_vector_norm" in t for t in targets), targets
    ep = torch.export.export(VectorNorm(), (torch.randn(2, 3, 4),), strict=False)
    theirs = {
        f"{n.target._schema.name}.{n.target._overloadname}"
        for n in exir.to_edge(ep).exported_program().graph.nodes
        if n.op == "call_function" and hasattr(n.target, "_schema")
    }
    assert targets == theirs, (sorted(targets), sorted(theirs))
    table = edge_decomposition_table()
    assert all(resolve_target(name) in table for name in EXTRA_EDGE_DECOMPOSITIONS)
    assert resolve_target("aten::linear.default") not in edge_decomposition_table(keep=["aten::linear.default"])


def test_vector_norm_round_trips_lowers_and_runs_in_the_runtime() -> None:
    from executorch.runtime import Runtime

    x = torch.randn(2, 3, 4)
    expected = VectorNorm()(x)
    program = _vector_norm_program()
    torch.testing.assert_close(to_exported_program(program).module()(x), expected)
    lowered = to_backend(program, OpSupportPartitioner("texir-reference", {"aten::mul.Tensor"}))
    torch.testing.assert_close(to_exported_program(lowered).module()(x), expected)
    data = dumps(emit(program))  # the runtime reads the buffer in place: keep it alive
    loaded = Runtime.get().load_program(data)
    (got,) = loaded.load_method("forward").execute([x])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
